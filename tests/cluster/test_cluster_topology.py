"""`snapmesh cluster up --topology`: the channels it writes, a snapshot over a ring, and its bad input."""

from __future__ import annotations

import re
import signal

import grpc
import pytest

from snapmesh.processes import launcher
from snapmesh.settings import config as cluster_config
from snapmesh.settings import topologies
from snapmesh.v1 import snapmesh_pb2 as pb
from support.cluster_helpers import controller_stub, node_stub
from support.processes import cluster_up, read_line

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

RING_5 = [("p1", "p2"), ("p2", "p3"), ("p3", "p4"), ("p4", "p5"), ("p5", "p1")]


def test_a_ring_of_five_is_written_into_cluster_toml_and_a_snapshot_over_it_is_complete(tmp_path):
    proc = cluster_up("--nodes", "5", "--topology", "ring", "--data-dir", str(tmp_path), "--ui", "off")
    try:
        line = read_line(proc, 90)
        assert re.fullmatch(r"controller: 127\.0\.0\.1:\d+\n", line), line
        cfg = cluster_config.load(tmp_path / "cluster.toml", env={})
        assert list(cfg.topology.channels) == RING_5
        assert "--topology ring" in (tmp_path / "cluster.toml").read_text().splitlines()[0]
        channel, nodes = node_stub(cfg.node("p1").address)
        with channel:
            assert nodes.Transfer(pb.TransferRequest(to="p2", amount=5), timeout=30).msg_id
            with pytest.raises(grpc.RpcError) as refused:  # no channel p1 -> p3: refused as on any topology
                nodes.Transfer(pb.TransferRequest(to="p3", amount=5), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        channel, control = controller_stub(line.split()[1])
        with channel:
            snapshot = control.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p3", wait=True), timeout=60)
        assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
        assert [(c.src, c.dst) for c in snapshot.channels] == RING_5
        assert snapshot.conserved and snapshot.total == cfg.expected_total
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


@pytest.mark.parametrize("flags, says", [
    (["--nodes", "4", "--topology", "random-regular:4"], "K must be below N, at most 3"),
    (["--nodes", "4", "--topology", "random-regular:9"], "K must be below N"),
    (["--nodes", "4", "--topology", "random-regular:0"], "K must be at least 1"),
    (["--nodes", "4", "--topology", "star"], "unknown topology 'star': mesh, ring or random-regular:K"),
    (["--topology", "ring"], "apply with --nodes N"),
])
def test_bad_topologies_are_one_line_exit_2_and_write_nothing(flags, says, tmp_path, capsys):
    data_dir = tmp_path / "data"
    assert launcher.main(["up", *flags, "--data-dir", str(data_dir), "--ui", "off"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err
    assert err.startswith("snapmesh cluster: --topology")
    assert not data_dir.exists()


def test_a_data_dir_keeps_its_channels(tmp_path, capsys):
    ids = [f"p{i}" for i in range(1, 6)]
    cluster_config.write_cluster(tmp_path / "cluster.toml", nodes=ids, topology="ring")
    before = (tmp_path / "cluster.toml").read_text()
    flags = ["up", "--nodes", "5", "--data-dir", str(tmp_path), "--ui", "off", "--topology", "random-regular:2"]
    assert launcher.main(flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a cluster with other channels" in err, err
    assert (tmp_path / "cluster.toml").read_text() == before
    assert topologies.channels("ring", ids) == RING_5
