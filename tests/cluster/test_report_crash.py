"""A node SIGKILLed after its cut and its report's one sync, before the controller
got the report, sends it again after its restart from what is on its disk, and
the controller takes it once: the snapshot completes with that node's part listed
once, conserved and matching every node's log.

On a ring p1 -> p2 -> p3 -> p1 a snapshot starts at p2 while p3 is stopped, so
p2's marker waits in p3's socket. The controller is stopped next, then p3 goes
on: it cuts, its part is finished and synced (its report a record in its log,
services/node/loggedreports.py), and its report cannot be answered. p3 is
SIGKILLed there, the controller goes on, p3 restarts on its log. A pending-report
file an older version left (the way a small report was kept before) is sent too."""

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


def logged(cluster, node: str, sid: str) -> list[dict]:
    return [r for r in records(cluster, node) if r["kind"] == "report" and r["snapshot_id"] == sid and r.get("fullstate")]


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
            # written after the cut and the marker_recv it rests on, in the same round, in the same file
            wait_for(lambda: logged(cluster, "p3", sid), what="p3's report in its log", until=lambda rs: len(rs) == 1)
            assert any(r["kind"] == "cut" and r["snapshot_id"] == sid for r in records(cluster, "p3"))
            cluster.kill_node("p3")
        finally:
            if cluster.alive().get("p3"):  # a failure before the kill: let it go on
                cluster.resume_node("p3")
            if paused_controller:
                cluster.resume_controller()
        assert len(logged(cluster, "p3", sid)) == 1 and pending(cluster, "p3") == []  # what the restart reports from
        cluster.start_node("p3")
        snapshot = wait_for(lambda: stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=10),
                            timeout=60, what="the snapshot's end", until=lambda s: s.status != pb.Snapshot.IN_PROGRESS)
    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
    assert [n.node_id for n in snapshot.nodes] == ["p1", "p2", "p3"]  # p3 once
    assert snapshot.conserved and snapshot.total == snapshot.expected_total
    check_against_logs(cluster, [snapshot])
    log = (cluster.log_dir / "p3.log").read_text()
    assert f"snapshot {sid}: reporting the state finished before the restart" in log
    assert f"snapshot {sid}: reported state to the controller" in log.split("before the restart", 1)[1]
    for node in cluster.node_ids:  # no file: every report was in its log
        assert pending(cluster, node) == []
