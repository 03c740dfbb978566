"""A node SIGKILLed after its cut and its report's one sync, before the controller
got the report, sends it again after its restart from what is on its disk, and
the controller takes it once: the snapshot completes with that node's part listed
once, conserved and matching every node's log.

On a ring p1 -> p2 -> p3 -> p1 a snapshot starts at p2 while p3 is stopped, so
p2's marker waits in p3's socket. The controller is stopped next, then p3 goes
on: it cuts, its part is finished and synced (its pending report on disk), and
its report cannot be answered. p3 is SIGKILLed there, the controller goes on,
p3 restarts on its log and pending reports."""

from __future__ import annotations

import json

import pytest

from support.cluster_helpers import check_against_logs, controller_stub
from support.polling import wait_for
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

RING = [("p1", "p2"), ("p2", "p3"), ("p3", "p1")]


@pytest.fixture()
def cluster(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=3, topology=RING, deadline=30.0, data_dir=tmp_path / "data")
    with Cluster(path) as running:
        yield running


def pending(cluster, node: str) -> list[str]:
    directory = cluster.config.data_dir / f"{node}.reports"
    return sorted(p.name for p in directory.glob("*.fullstate")) if directory.exists() else []


def records(cluster, node: str) -> list[dict]:
    path = cluster.config.data_dir / f"{node}.log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_a_node_killed_between_its_cut_and_its_report_reports_once_after_its_restart(cluster) -> None:
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        cluster.pause_node("p3")
        paused_controller = False
        try:
            sid = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2"), timeout=30).snapshot_id
            # p2 cut and its marker to p3 is durable, so on its way to p3's socket
            wait_for(lambda: records(cluster, "p2"), what="p2's marker to p3",
                     until=lambda rs: any(r["kind"] == "marker_sent" and r.get("dst") == "p3" for r in rs))
            cluster.pause_controller()
            paused_controller = True
            cluster.resume_node("p3")
            wait_for(lambda: pending(cluster, "p3"), what="p3's report on its disk", until=lambda files: len(files) == 1)
            assert any(r["kind"] == "cut" and r["snapshot_id"] == sid for r in records(cluster, "p3"))
            cluster.kill_node("p3")
        finally:
            if cluster.alive().get("p3"):  # a failure before the kill: let it go on
                cluster.resume_node("p3")
            if paused_controller:
                cluster.resume_controller()
        assert len(pending(cluster, "p3")) == 1  # what the restart reports from
        cluster.start_node("p3")
        snapshot = wait_for(lambda: stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=10),
                            timeout=60, what="the snapshot's end", until=lambda s: s.status != pb.Snapshot.IN_PROGRESS)
    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
    assert [n.node_id for n in snapshot.nodes] == ["p1", "p2", "p3"]  # p3 once
    assert snapshot.conserved and snapshot.total == snapshot.expected_total
    check_against_logs(cluster, [snapshot])
    log = (cluster.log_dir / "p3.log").read_text()
    assert f"snapshot {sid}: reporting the state finished before the restart" in log
    for node in cluster.node_ids:  # every report acknowledged, none left to send again
        wait_for(lambda node=node: pending(cluster, node), what=f"{node}'s pending reports gone",
                 until=lambda files: files == [])
