"""Restore on real processes: RestoreSnapshot rolls a running cluster
back to a COMPLETE snapshot in a new epoch.

One 3-node cluster for the module, the tests in order: a restore under load;
a restore to an older snapshot after newer ones (and a snapshot in progress
FAILED "restored to S"); a node SIGKILLed during a restore; the controller
SIGKILLed during a restore; stale-epoch messages refused and counted; the CLI
and the error codes. Every epoch's snapshots are checked against that epoch's
logs, and every restore against the logs (recorded balance + replays).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from functools import partial
import urllib.request

import grpc
import pytest

from support.cluster_helpers import controller_stub, node_stub
from support.polling import wait_for as _wait_for
import snapmesh.bank.logs as bank_logs
from snapmesh.checking.logcheck import check_logs_by_epoch, check_restore
from snapmesh.checking.node_logs import read_logs
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.load.background import BackgroundLoad
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

COMPLETE, FAILED = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED
RESTORED = pb.Restore.RESTORED


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_cluster(tmp_path_factory.mktemp("restore") / "cluster.toml", nodes=3, deadline=5.0)
    with Cluster(path) as running:
        yield running


@pytest.fixture(scope="module")
def history():
    """Every COMPLETE snapshot taken and every (snapshot, epoch) restored, for the final check."""
    return {"snapshots": [], "restores": []}


# Restores move every node: a minute before a wait fails.
wait_for = partial(_wait_for, timeout=60.0, interval=0.1)


def snapshot(cluster, history, initiator: str = "p1") -> pb.Snapshot:
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        taken = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator=initiator, wait=True), timeout=60)
    assert taken.status == COMPLETE and taken.conserved, taken.reason
    history["snapshots"].append(taken)
    return taken


def restore(cluster, history, snapshot_id: str, timeout: float = 90) -> pb.Restore:
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        answer = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=snapshot_id), timeout=timeout)
    if answer.status == RESTORED:
        history["restores"].append((snapshot_id, answer.epoch))
    return answer


def state(cluster, node: str) -> pb.NodeStateResponse | None:
    channel, stub = node_stub(cluster.node_address(node))
    with channel:
        try:
            return stub.GetState(pb.GetStateRequest(), timeout=5)
        except grpc.RpcError:
            return None


def states(cluster) -> dict[str, pb.NodeStateResponse | None]:
    return {n: state(cluster, n) for n in cluster.node_ids}


def expected_after(snap: pb.Snapshot) -> dict[str, int]:
    """Each node's balance right after restoring `snap`: recorded + in flight towards it."""
    balances = {n.node_id: n.balance for n in snap.nodes}
    for c in snap.channels:
        balances[c.dst] += sum(t.amount for t in c.in_flight)
    return balances


def quiet_balances(cluster, epoch: int) -> dict[str, int]:
    """The balances once every node is in `epoch` and the channels are drained (no load)."""
    def settled():
        now = states(cluster)
        if any(s is None or s.epoch != epoch for s in now.values()):
            return None
        balances = {n: s.balance for n, s in now.items()}
        return balances if sum(balances.values()) == cluster.config.expected_total else None

    return wait_for(settled, until=lambda b: b is not None)


def test_a_restore_under_load(cluster, history):
    with BackgroundLoad.for_cluster(cluster, batch=20) as load:
        wait_for(lambda: load.stats.accepted, until=lambda n: n > 200)
        s1 = snapshot(cluster, history)
        assert s1.epoch == 1
        wait_for(lambda: load.stats.accepted, until=lambda n: n > 600)  # money moves on after s1: the restore undoes it
        answer = restore(cluster, history, s1.snapshot_id)
        assert answer.status == RESTORED, answer.reason
        assert answer.epoch == 2 and answer.snapshot_id == s1.snapshot_id
        assert {n.node_id: n.balance for n in answer.nodes} == expected_after(s1)
        assert answer.finished_at.ToNanoseconds() >= answer.started_at.ToNanoseconds() > 0
        wait_for(lambda: load.stats.accepted, until=lambda n: n > 1200)  # and the load goes on in epoch 2
    assert sum(quiet_balances(cluster, 2).values()) == cluster.config.expected_total
    after = snapshot(cluster, history)
    assert after.epoch == 2


def test_a_restore_to_an_older_snapshot_after_newer_ones_fails_the_one_in_progress(cluster, history):
    with BackgroundLoad.for_cluster(cluster, batch=10) as load:
        wait_for(lambda: load.stats.accepted, until=lambda n: n > 100)
        older = snapshot(cluster, history)
        for _ in range(3):
            wait_for(lambda: load.stats.accepted, until=lambda n, before=load.stats.accepted: n > before + 100)
            snapshot(cluster, history)
    # A snapshot in progress at the restore: p3 paused, so it cannot finish.
    cluster.signal_node("p3", signal.SIGSTOP)
    try:
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            hanging = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=10)
        answers: list = []
        thread = threading.Thread(target=lambda: answers.append(restore(cluster, history, older.snapshot_id)))
        thread.start()
        time.sleep(1.0)  # the restore waits for p3, retrying
    finally:
        cluster.signal_node("p3", signal.SIGCONT)
    thread.join(120)
    (answer,) = answers
    assert answer.status == RESTORED, answer.reason
    assert answer.epoch == 3
    assert {n.node_id: n.balance for n in answer.nodes} == expected_after(older)
    assert quiet_balances(cluster, 3) == expected_after(older)  # nothing moved since: exactly the snapshot
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        failed = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=hanging.snapshot_id), timeout=5)
    assert failed.status == FAILED and failed.reason == f"restored to {older.snapshot_id}"


def test_a_node_sigkilled_during_a_restore(cluster, history):
    target = history["snapshots"][-1]
    assert cluster.kill_node("p2") == -signal.SIGKILL
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(restore(cluster, history, target.snapshot_id)))
    thread.start()
    wait_for(lambda: [state(cluster, n) for n in ("p1", "p3")], until=lambda s: all(x is not None and x.epoch == 4 for x in s))
    cluster.start_node("p2")  # the restore reaches it once it is back
    thread.join(120)
    (answer,) = answers
    assert answer.status == RESTORED, answer.reason
    assert quiet_balances(cluster, 4) == expected_after(target)
    # ... and a crash right after the restore recovers it from the log (restore + replays)
    assert cluster.kill_node("p2") == -signal.SIGKILL
    cluster.start_node("p2")
    assert quiet_balances(cluster, 4) == expected_after(target)


def test_the_controller_restarted_during_a_restore(cluster, history):
    target = history["snapshots"][0]
    cluster.signal_node("p3", signal.SIGSTOP)
    try:
        errors: list = []

        def call():
            try:
                restore(cluster, history, target.snapshot_id, timeout=60)
            except grpc.RpcError as error:
                errors.append(error.code())

        thread = threading.Thread(target=call)
        thread.start()
        wait_for(lambda: [state(cluster, n) for n in ("p1", "p2")],
                 until=lambda s: all(x is not None and x.epoch == 5 for x in s))
        assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
        thread.join(30)
        assert errors == [grpc.StatusCode.UNAVAILABLE]
    finally:
        cluster.signal_node("p3", signal.SIGCONT)
    cluster.start_controller()  # resumes the journaled restore: p3 gets epoch 5 too
    assert quiet_balances(cluster, 5) == expected_after(target)
    history["restores"].append((target.snapshot_id, 5))
    assert snapshot(cluster, history).epoch == 5  # the controller knows its epoch after the restart


def _metric(cluster, node: str, name: str) -> float:
    address = cluster.config.node(node).metrics_address
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_stale_epoch_messages_are_refused_and_counted(cluster, history):
    before = _metric(cluster, "p2", "snapmesh_stale_epoch_refused_total")
    channel, stub = node_stub(cluster.node_address("p2"))
    with channel:
        with pytest.raises(grpc.RpcError) as start:
            stub.StartSnapshot(pb.StartSnapshotRequest(snapshot_id="from-the-past", epoch=1), timeout=5)
        frames = iter([pb.ChannelFrame(open=pb.ChannelOpen(src="p1", dst="p2", epoch=2))])
        with pytest.raises(grpc.RpcError) as stream:
            list(stub.Channel(frames, timeout=5))
        with pytest.raises(grpc.RpcError) as again:
            stub.RestoreState(pb.RestoreStateRequest(snapshot_id="x", epoch=2, balance=1), timeout=5)
    assert start.value.code() == stream.value.code() == again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "epoch 1" in start.value.details() and "epoch 2" in stream.value.details()
    assert _metric(cluster, "p2", "snapmesh_stale_epoch_refused_total") == before + 3


def _controller_metric(cluster, line_start: str) -> float:
    text = urllib.request.urlopen(f"http://{cluster.config.controller.metrics_address}/metrics", timeout=5).read().decode()
    return float(next(line for line in text.splitlines() if line.startswith(line_start + " ")).split()[-1])


def test_the_cli_and_the_refusals(cluster, history):
    target = history["snapshots"][-1]
    restored = 'snapmesh_restores_total{status="RESTORED"}'
    before = _controller_metric(cluster, restored)
    run = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "restore", "--yes", "--controller", cluster.controller_address,
         target.snapshot_id],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert f"snapshot {target.snapshot_id}  epoch 6  RESTORED" in run.stdout and "total" in run.stdout
    history["restores"].append((target.snapshot_id, 6))
    assert _controller_metric(cluster, restored) == before + 1
    assert _controller_metric(cluster, "snapmesh_controller_epoch") == 6
    unknown = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "restore", "--yes", "--controller", cluster.controller_address,
         "20260101T000000.000000Z-00000000"],
        capture_output=True, text=True, timeout=60,
    )
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        failed = next(s for s in stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=5).snapshots if s.status == FAILED)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=failed.snapshot_id), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert quiet_balances(cluster, 6) == expected_after(target)  # the refusal changed nothing


def test_every_epoch_and_every_restore_against_the_logs(cluster, history):
    logs = read_logs(cluster.config.data_dir, cluster.node_ids)
    by_id = {s.snapshot_id: s for s in history["snapshots"]}
    for sid, epoch in history["restores"]:
        check_restore(logs, by_id[sid], epoch, bank_logs)
    reports = check_logs_by_epoch(
        logs, history["snapshots"], channels=cluster.config.topology.channels, total=cluster.config.expected_total,
        app=bank_logs,
    )
    assert sorted(reports) == [1, 2, 3, 4, 5, 6]
