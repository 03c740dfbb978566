"""Restore keys on real processes (issue 33): a key answers its own restore, never rolls back twice.

One 3-node cluster (controller and node processes, real gRPC), the tests in order:

- K1 starts a restore (p3 paused, so it cannot end), K2 joins it; p1 then pays
  250; a retry of K2 (and, after the controller is SIGKILLed and restarted, again)
  answers that restore: the 250 stays, the epoch does not move.
- A later restore under K3 and a controller restart: a retry of K1 still answers
  K1's restore, it does not roll the cluster back to K1's snapshot again.
- A restore of a snapshot that does not exist: the gate checks the key first
  (INVALID_ARGUMENT), then NOT_FOUND.
- A report of an older epoch is refused (by the controller machine) and counted.
- A FAILED snapshot is aborted at the nodes with the controller's reason (AbortAt).
"""

from __future__ import annotations

import signal
import time
import urllib.request

import grpc
import pytest

from support.cluster_helpers import controller_stub, node_stub
from support.polling import wait_for
from snapmesh.checking.node_logs import read_node_log
from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol.controller import journal as controller_journal
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

RESTORED = pb.Restore.RESTORED
TOTAL = 3 * 10_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_cluster(tmp_path_factory.mktemp("keys") / "cluster.toml", nodes=3, initial_balance=10_000)
    with Cluster(path) as running:
        yield running


@pytest.fixture(scope="module")
def answers():
    """Each key's first answer, for the later tests."""
    return {}


def balances(cluster, nodes: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Each node's (epoch, balance)."""
    out = {}
    for n in nodes or cluster.node_ids:
        channel, stub = node_stub(cluster.node_address(n))
        with channel:
            state = stub.GetState(pb.GetStateRequest(), timeout=10)
        out[n] = (state.epoch, state.balance)
    return out


def settled(cluster) -> dict[str, tuple[int, int]]:
    """The balances once every node is in one epoch and nothing is in flight."""
    def quiet(now):
        return len({e for e, _ in now.values()}) == 1 and sum(b for _, b in now.values()) == TOTAL

    return wait_for(lambda: balances(cluster), until=quiet, timeout=60.0, interval=0.1)


def take_snapshot(stub) -> pb.Snapshot:
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=60)
    assert snapshot.status == pb.Snapshot.COMPLETE and snapshot.conserved, snapshot.reason
    return snapshot


def restore(stub, snapshot_id: str, key: str) -> pb.Restore:
    return stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=snapshot_id, request_id=key), timeout=90)


def pay(cluster, amount: int) -> None:
    channel, node = node_stub(cluster.node_address("p1"))
    with channel:
        node.Transfer(pb.TransferRequest(to="p2", amount=amount), timeout=10)


def test_a_key_that_joined_a_restore_never_rolls_back_a_payment_made_after_it(cluster, answers):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        pay(cluster, 100)
        snapshot = take_snapshot(stub)
        epoch = settled(cluster)["p1"][0]
        cluster.signal_node("p3", signal.SIGSTOP)  # the restore cannot end until p3 is back
        try:
            first = stub.RestoreSnapshot.future(
                pb.RestoreSnapshotRequest(snapshot_id=snapshot.snapshot_id, request_id="K1"), timeout=90
            )
            wait_for(lambda: balances(cluster, ("p1",))["p1"][0], until=lambda e: e == epoch + 1)  # K1 claimed the restore
            joined = stub.RestoreSnapshot.future(
                pb.RestoreSnapshotRequest(snapshot_id=snapshot.snapshot_id, request_id="K2"), timeout=90
            )
            time.sleep(1.0)  # K2 reaches the controller while K1's restore waits for p3
        finally:
            cluster.signal_node("p3", signal.SIGCONT)
        k1, k2 = first.result(), joined.result()
        assert k1.status == RESTORED and k1.epoch == epoch + 1, k1.reason
        assert k2 == k1, "K2 did not join K1's restore"
        answers["K1"] = k1
        pay(cluster, 250)  # answered "paid" in the new epoch: no retry of K2 may take it back
        before = settled(cluster)
        assert before["p1"][1] == k1.nodes[0].balance - 250
        assert restore(stub, snapshot.snapshot_id, "K2") == k1
        assert settled(cluster) == before, "the retry of K2 rolled the cluster back again"
        cluster.restart_controller(kill=True)  # K2 is known from the journal alone now
        channel2, stub2 = controller_stub(cluster.controller_address)
        with channel2:
            assert restore(stub2, snapshot.snapshot_id, "K2") == k1
            assert restore(stub2, snapshot.snapshot_id, "K1") == k1
        assert settled(cluster) == before, "a retry after a controller restart rolled the cluster back again"
    records, _, problem = controller_journal.decode_all((cluster.data_dir / "controller" / "journal").read_bytes())
    assert problem is None
    assert controller_journal.Joined(request_id="K2", epoch=k1.epoch) in records


def test_after_a_later_restore_and_a_restart_an_older_key_is_still_answered(cluster, answers):
    k1 = answers["K1"]
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        later = take_snapshot(stub)
        k3 = restore(stub, later.snapshot_id, "K3")
        assert k3.status == RESTORED and k3.epoch == k1.epoch + 1, k3.reason
        pay(cluster, 70)
        before = settled(cluster)
    cluster.restart_controller(kill=True)
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        assert restore(stub, k1.snapshot_id, "K1") == k1  # not a third restore, back to K1's snapshot
        assert restore(stub, later.snapshot_id, "K3") == k3
    assert settled(cluster) == before, "a retry of an older key rolled the cluster back again"


@pytest.mark.parametrize(("key", "code", "says"), [
    ("", grpc.StatusCode.NOT_FOUND, "no snapshot '20200101T000000.000000Z-0badc0de'"),
    ("K1", grpc.StatusCode.INVALID_ARGUMENT, "request_id 'K1' started the restore of"),
    ("x" * 129, grpc.StatusCode.INVALID_ARGUMENT, "request_id is longer than 128 bytes"),
])
def test_a_restore_of_a_missing_snapshot_is_refused_by_the_gate_key_first(cluster, key, code, says):
    before = settled(cluster)
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        with pytest.raises(grpc.RpcError) as refused:
            restore(stub, "20200101T000000.000000Z-0badc0de", key)
    assert refused.value.code() == code and says in refused.value.details(), refused.value.details()
    assert settled(cluster) == before


def _stale_refused(cluster) -> float:
    address = cluster.config.controller.metrics_address
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    name = "snapmesh_stale_epoch_reports_refused_total "
    return float(next(line for line in text.splitlines() if line.startswith(name)).split()[-1])


def test_the_controller_machine_refuses_a_report_of_an_older_epoch(cluster):
    """The servicer no longer asks first: the machine refuses it, and the refusal is counted."""
    before = _stale_refused(cluster)
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        with pytest.raises(grpc.RpcError) as refused:
            stub.ReportState(pb.FullState(snapshot_id="20200101T000000.000000Z-0badc0de", node_id="p1", epoch=1), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a report from epoch 1; the cluster is in epoch" in refused.value.details()
    assert _stale_refused(cluster) == before + 1


def test_a_failed_snapshot_is_aborted_at_the_nodes_by_the_machines_abort_effects(cluster):
    """AbortAt: the controller machine names every node of a FAILED snapshot; the engine only sends."""
    cluster.signal_node("p3", signal.SIGSTOP)  # p3 never reports: the snapshot fails at its deadline
    try:
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            started = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=10)
            request = pb.GetSnapshotRequest(snapshot_id=started.snapshot_id)
            failed = wait_for(lambda: stub.GetSnapshot(request, timeout=5), until=lambda s: s.status == pb.Snapshot.FAILED,
                          timeout=60.0, interval=0.2)
        assert "p3" in failed.reason

        def aborts(node: str) -> list[str]:
            return [r["reason"] for r in read_node_log(cluster.data_dir, node)
                    if r["kind"] == "abort" and r.get("snapshot_id") == failed.snapshot_id]

        for node in ("p1", "p2"):  # the controller's reason, not a node's own expiry
            assert wait_for(lambda node=node: aborts(node), until=bool, timeout=30.0, interval=0.1) == [failed.reason], node
    finally:
        cluster.signal_node("p3", signal.SIGCONT)
