"""A report the controller holds until its snapshot ends (the machine's held.py H1-H4),
on real processes: it is not acknowledged while held, so the node keeps it and sends
it again when the controller is SIGKILLed and restarted, and the snapshot completes
with it. On a ring p1 -> p2 -> p3 -> p1 with p1 stopped, a snapshot started at p2
finishes at p3 alone: p3's report is the one held."""

from __future__ import annotations

import json
import signal

import pytest

from support.cluster_helpers import check_against_logs, controller_stub
from support.polling import wait_for
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

RING = [("p1", "p2"), ("p2", "p3"), ("p3", "p1")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_cluster(tmp_path_factory.mktemp("held") / "cluster.toml", nodes=3, topology=RING, deadline=20.0)
    with Cluster(path) as running:
        yield running


def get(cluster, sid: str) -> pb.Snapshot:
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        return stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=5)


def acknowledged(cluster, node: str, sid: str) -> bool:
    """Whether the controller took `node`'s report of `sid` (until then the node keeps it, in its log)."""
    return f"snapshot {sid}: reported state to the controller" in (cluster.log_dir / f"{node}.log").read_text()


def logged(cluster, node: str, sid: str) -> bool:
    """Whether `node`'s transfer log holds its report of `sid` (what a restart sends again)."""
    lines = (cluster.config.data_dir / f"{node}.log.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.endswith("}")]
    return any(r["kind"] == "report" and r["snapshot_id"] == sid and r.get("fullstate") for r in records)


def test_a_held_report_is_not_acknowledged_so_it_survives_a_controller_kill_and_completes(cluster):
    cluster.signal_node("p1", signal.SIGSTOP)
    try:
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            sid = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2"), timeout=30).snapshot_id
        # p3 finished (its one incoming channel is p2's) and reported: the controller holds it
        held = wait_for(lambda: get(cluster, sid), until=lambda s: [n.node_id for n in s.nodes] == ["p3"])
        assert held.status == pb.Snapshot.IN_PROGRESS
        assert logged(cluster, "p3", sid)
        assert not acknowledged(cluster, "p3", sid), "a held report was acknowledged"
        assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
        assert not acknowledged(cluster, "p3", sid)
        cluster.start_controller()
    finally:
        cluster.signal_node("p1", signal.SIGCONT)
    snapshot = wait_for(lambda: get(cluster, sid), until=lambda s: s.status != pb.Snapshot.IN_PROGRESS)
    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
    assert sorted(n.node_id for n in snapshot.nodes) == ["p1", "p2", "p3"]
    assert snapshot.conserved and snapshot.total == snapshot.expected_total
    check_against_logs(cluster, [snapshot])
    for node in cluster.node_ids:  # every report acknowledged once the snapshot ended
        wait_for(lambda node=node: acknowledged(cluster, node, sid), until=bool)


def test_reports_held_until_the_last_are_all_answered_when_it_completes(cluster):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        sids = []
        for initiator in ("p1", "p2", "p3"):
            snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator=initiator, wait=True), timeout=30)
            assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
            sids.append(snapshot.snapshot_id)
    for node in cluster.node_ids:
        for sid in sids:
            wait_for(lambda node=node, sid=sid: acknowledged(cluster, node, sid), until=bool)
