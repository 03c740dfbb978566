"""The controller's admission limit on snapshots in progress (Flink's
max-concurrent-checkpoints): a trigger past it is answered RESOURCE_EXHAUSTED,
naming the limit and how to change it, and starts nothing."""

from __future__ import annotations

import signal
import tomllib
from pathlib import Path

import grpc
import pytest
import tomli_w

from support.cluster_helpers import controller_stub, first_complete
from support.polling import wait_for
from snapmesh.services.controller.process import main as controller_main
from snapmesh.settings import config as cluster_config
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

IN_PROGRESS, COMPLETE = pb.Snapshot.IN_PROGRESS, pb.Snapshot.COMPLETE


def _with_limit(path: Path, limit) -> Path:
    document = tomllib.loads(path.read_text())
    document["controller"]["max_concurrent_snapshots"] = limit
    path.write_text(tomli_w.dumps(document))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_cluster(tmp_path_factory.mktemp("admission") / "cluster.toml", nodes=2, deadline=60)
    with Cluster(_with_limit(path, 2)) as running:
        channel, stub = controller_stub(running.controller_address)
        with channel:  # the controller reaches both nodes before the test holds p1
            assert first_complete(stub, "p1").status == COMPLETE
        yield running


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_trigger_past_the_limit_is_refused_with_resource_exhausted_and_starts_nothing(cluster):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        cluster.signal_node("p1", signal.SIGSTOP)  # StartSnapshot hangs: both stay IN_PROGRESS
        try:
            # Each is answered once journaled; a loaded machine's fsyncs take seconds, hence the timeouts.
            held = [stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=30) for _ in range(2)]
            assert [s.status for s in held] == [IN_PROGRESS, IN_PROGRESS]
            before = stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=30).snapshots
            with pytest.raises(grpc.RpcError) as info:
                stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2"), timeout=30)
            error = info.value
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "2 snapshots in progress, the limit is 2" in error.details()
            assert "controller.max_concurrent_snapshots" in error.details()
            assert "--max-concurrent-snapshots" in error.details()
            assert stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=30).snapshots == before  # nothing started
        finally:
            cluster.signal_node("p1", signal.SIGCONT)
        # Once they finish, triggers are admitted again; a loaded machine: fsyncs and a resumed p1.
        wait_for(lambda: [stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=s.snapshot_id), timeout=30).status for s in held],
                 until=lambda statuses: IN_PROGRESS not in statuses, timeout=90, interval=0.05,
                 what="both held snapshots to finish")
        again = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=60)
        assert again.status == COMPLETE, again.reason
        metrics = cluster.config.controller.metrics_address
        import urllib.request

        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30).read().decode()
        assert "snapmesh_snapshot_triggers_refused_total 1.0" in text


@pytest.mark.parametrize("bad", [0, -1, "8", True])
def test_a_bad_limit_in_the_cluster_file_is_refused_naming_the_key(tmp_path, bad):
    path = _with_limit(write_cluster(tmp_path / "cluster.toml", nodes=2), bad)
    with pytest.raises(cluster_config.ConfigError, match="controller.max_concurrent_snapshots"):
        cluster_config.load(path)


def test_the_limit_defaults_and_loads(tmp_path):
    assert cluster_config.load(write_cluster(tmp_path / "a.toml", nodes=2)).controller.max_concurrent_snapshots == 32
    loaded = cluster_config.load(_with_limit(write_cluster(tmp_path / "b.toml", nodes=2), 3))
    assert loaded.controller.max_concurrent_snapshots == 3


def test_a_bad_limit_flag_is_a_usage_error(tmp_path, capsys):
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    assert controller_main(["--config", str(path), "--max-concurrent-snapshots", "0"]) == 2
    assert "--max-concurrent-snapshots" in capsys.readouterr().err
