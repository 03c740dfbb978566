"""The controller SIGKILLed and restarted on real processes: nothing it started or
answered is forgotten, though its files are written off the reply path. Every
snapshot ends COMPLETE or FAILED("controller restarted"), never
NOT_FOUND or stuck, and one answered COMPLETE comes back the same."""

from __future__ import annotations

import json
import signal

import pytest
from google.protobuf import json_format

from support.cluster_helpers import check_against_logs, controller_stub
from support.polling import wait_for
from snapmesh.checking.node_logs import read_logs
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster
from snapmesh.checking import snapshot_file
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

COMPLETE, FAILED, IN_PROGRESS = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED, pb.Snapshot.IN_PROGRESS
DEADLINE_S = 4.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_cluster(tmp_path_factory.mktemp("restart") / "cluster.toml", nodes=3, deadline=DEADLINE_S)
    with Cluster(path) as running:
        yield running


def log_records(cluster, node: str, sid: str, kind: str) -> int:
    return sum(r.get("kind") == kind and r.get("snapshot_id") == sid for r in read_logs(cluster.config.data_dir, [node])[node])


def get(cluster, sid: str) -> pb.Snapshot:
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        return stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=5)


def trigger(cluster, initiator: str, wait: bool = False) -> pb.Snapshot:
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        return stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator=initiator, wait=wait), timeout=30)


def kill_and_restart_controller(cluster) -> None:
    assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    cluster.start_controller()


def test_a_snapshot_in_progress_completes_from_the_reports_the_nodes_resend(cluster):
    # p3 stopped: p1 and p2 cut, but cannot finish until p3's markers come.
    cluster.signal_node("p3", signal.SIGSTOP)
    try:
        sid = trigger(cluster, "p1").snapshot_id
        wait_for(lambda: log_records(cluster, "p1", sid, "cut"), until=lambda n: n == 1)
        assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    finally:
        cluster.signal_node("p3", signal.SIGCONT)
    # every node finishes and tries to report to a controller that is not there
    for node in cluster.node_ids:
        wait_for(lambda node=node: log_records(cluster, node, sid, "marker_recv"), until=lambda n: n == 2)
    cluster.start_controller()
    snapshot = wait_for(lambda: get(cluster, sid), until=lambda s: s.status != IN_PROGRESS)
    assert snapshot.status == COMPLETE, snapshot.reason
    assert snapshot.conserved and snapshot.total == snapshot.expected_total
    check_against_logs(cluster, [snapshot])


def test_a_snapshot_that_cannot_complete_fails_as_controller_restarted(cluster):
    # The initiator is stopped: StartSnapshot hangs, nobody records anything.
    cluster.signal_node("p1", signal.SIGSTOP)
    try:
        sid = trigger(cluster, "p1").snapshot_id
        kill_and_restart_controller(cluster)
        assert get(cluster, sid).status == IN_PROGRESS
        failed = wait_for(lambda: get(cluster, sid), until=lambda s: s.status != IN_PROGRESS, timeout=DEADLINE_S + 20)
    finally:
        cluster.signal_node("p1", signal.SIGCONT)
    assert failed.status == FAILED
    assert failed.reason.startswith("controller restarted"), failed.reason
    # and it stays that way, also across another restart
    kill_and_restart_controller(cluster)
    assert get(cluster, sid) == failed


def test_a_snapshot_answered_complete_survives_a_kill_right_after_the_answer(cluster):
    answered = []
    for initiator in ("p1", "p2", "p3"):
        snapshot = trigger(cluster, initiator, wait=True)
        assert snapshot.status == COMPLETE, snapshot.reason
        assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL  # before the files, most likely
        answered.append(snapshot)
        cluster.start_controller()
    for snapshot in answered:
        assert get(cluster, snapshot.snapshot_id) == snapshot
        # the proto JSON export is (re)written in the background, same content
        path = cluster.config.snapshots_dir / f"{snapshot.snapshot_id}.json"
        text = wait_for(lambda path=path: path.read_text() if path.exists() else "", until=bool)
        stored = json_format.Parse(text, pb.Snapshot())
        assert stored.checksum == snapshot_file.checksum(snapshot)  # the files carry it; answers do not
        stored.ClearField("checksum")
        assert stored == snapshot
        assert json.loads(text)["status"] == "COMPLETE"
