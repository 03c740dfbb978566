"""The one supervisor's fault operations on a real 2-node cluster: pause and
resume, kill and restart a node on its log, restart the controller on its
snapshots, and the errors for operations that cannot apply."""

from __future__ import annotations

import pytest

from support.cluster_helpers import controller_stub, first_complete
from snapmesh.checking.node_logs import read_logs
from snapmesh.settings.config import ConfigError, write_cluster
from snapmesh.settings.ports import port_is_free
from snapmesh.processes.child import SupervisorError, wait_serving
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def test_fault_operations_keep_the_data_dir(tmp_path) -> None:
    with Cluster(write_cluster(tmp_path / "cluster.toml", nodes=2, deadline=5)) as cluster:
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            first = first_complete(stub, "p1")
            assert first.status == pb.Snapshot.COMPLETE

            cluster.pause_node("p2")
            with pytest.raises(SupervisorError, match="not SERVING"):
                wait_serving(cluster.node_address("p2"), timeout=1.0)
            cluster.resume_node("p2")
            wait_serving(cluster.node_address("p2"), timeout=10)

            pid = cluster.node_pid("p1")
            cluster.restart_node("p1", kill=True)
            assert cluster.node_pid("p1") != pid and cluster.nodes["p1"].starts == 2
            assert [r["kind"] for r in read_logs(cluster.data_dir, ["p1"])["p1"]].count("restart") == 1

            pid = cluster.controller_pid
            cluster.restart_controller()
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            assert cluster.controller_pid != pid
            kept = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=first.snapshot_id), timeout=30)
            assert kept == first
            after = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
            assert after.status == pb.Snapshot.COMPLETE

        assert cluster.kill_node("p2") == -9
        with pytest.raises(SupervisorError, match="not running"):
            cluster.pause_node("p2")
        with pytest.raises(ConfigError, match="no node 'p9'"):
            cluster.kill_node("p9")
    assert not any(cluster.alive().values())


def test_a_cluster_without_its_controller_refuses_controller_operations(tmp_path) -> None:
    cluster = Cluster(write_cluster(tmp_path / "cluster.toml", nodes=2), controller=False)
    with pytest.raises(SupervisorError, match="controller=False"):
        cluster.restart_controller()
    assert set(cluster.alive()) == {"p1", "p2"}


def test_a_child_that_exits_at_start_fails_with_its_output(tmp_path) -> None:
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    (tmp_path / "p1.log.jsonl").write_text("not json\n{}\n")  # a corrupt log: the node refuses to start
    cluster = Cluster(path, controller=False)
    with pytest.raises(SupervisorError) as info:
        cluster.start("p1")
    assert "node p1" in str(info.value) and "exited before serving (exit status 2)" in str(info.value)
    assert "p1.log.jsonl:1" in str(info.value)
    assert not any(cluster.alive().values())
    node = cluster.config.node("p1")
    assert port_is_free(node.host, node.port)
