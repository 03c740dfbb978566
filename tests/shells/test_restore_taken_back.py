"""A transfer answered only once durable is answered "paid" only if no restore
took it back meanwhile (node rule N8, epochs.py `taken_back`).

On the machine: a transfer applied at lsn L and a restore to a snapshot whose
cut here is before L -> taken back (naming the snapshot); a cut after L -> it
stands; a transfer after the restore stands. Through the node's gRPC servicer
with an in-process engine and a real transfer log held back from the disk: a
Transfer waiting for its fsync while RestoreState takes it back is answered
ABORTED, and a TransferBatch fails that item the way it fails a refusal. In
the fault simulator: the seed that found it passes, and fails on a node that
never asks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from support.engine_harness import Aborted, ServicerContext, held_node, outcome
from support.machines import Machines, bank_restore, pay

from snapmesh.protocol.node import epochs
from snapmesh.protocol import wal
from snapmesh.protocol.node.machine import Node
from snapmesh.services.app import bank, kvshard
from snapmesh.fuzzer import fuzz
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.timeout(60)


def _cut(m: Machines, node: str, snapshot_id: str) -> int:
    return next(r.lsn for r in m.records(node) if isinstance(r, wal.Cut) and r.snapshot_id == snapshot_id)


def test_a_restore_to_a_cut_before_the_transfer_takes_it_back() -> None:
    m = Machines({"a": 100, "b": 50})
    a = m.nodes["a"]
    a.start_snapshot("s1")
    m.route("a")
    answer = pay(a, "b", 10, "r1")  # after s1's cut at a: not in s1
    assert _cut(m, "a", "s1") < answer.lsn and a.taken_back(answer) is None
    bank_restore(a, snapshot_id="s1", epoch=2, balance=100)
    m.route("a")
    assert a.taken_back(answer) == "s1"
    later = pay(a, "b", 5, "r2")  # in the new epoch: it stands
    assert a.taken_back(later) is None
    again = pay(a, "b", 10, "r1")  # the retry: the restore forgot r1, so it is paid anew, and stands
    assert not again.repeated and a.taken_back(again) is None


def test_a_restore_to_a_cut_after_the_transfer_keeps_it() -> None:
    m = Machines({"a": 100, "b": 50})
    a = m.nodes["a"]
    answer = pay(a, "b", 10, "r1")
    a.start_snapshot("s1")  # its cut holds the transfer
    m.route("a")
    assert _cut(m, "a", "s1") > answer.lsn
    bank_restore(a, snapshot_id="s1", epoch=2, balance=90)
    m.route("a")
    assert a.taken_back(answer) is None
    assert pay(a, "b", 10, "r1").repeated  # and the window still answers its retry


def test_a_later_restore_to_an_older_cut_takes_back_what_an_earlier_one_kept() -> None:
    m = Machines({"a": 100, "b": 50})
    a = m.nodes["a"]
    a.start_snapshot("s0")
    answer = pay(a, "b", 10)
    a.start_snapshot("s1")
    m.route("a")
    bank_restore(a, snapshot_id="s1", epoch=2, balance=90)
    assert a.taken_back(answer) is None
    bank_restore(a, snapshot_id="s0", epoch=3, balance=100)
    assert a.taken_back(answer) == "s0"


def test_a_restore_of_an_unknown_cut_takes_back_and_past_the_kept_restores_too() -> None:
    state = epochs.EpochState("a")
    state.entered(2, "old", cut=None)  # its cut is older than every one the node kept
    assert state.taken_back(19, 1) == "old" and state.taken_back(21, 2) is None
    for k in range(epochs.RESTORES_KEPT):
        state.entered(3 + k, f"s{k}", cut=35 + 10 * k)
    assert len(state.restores) == epochs.RESTORES_KEPT  # bounded: nothing per transfer, a few restores
    assert state.taken_back(19, 1) == "old"  # dropped from the kept ones: still not "paid"
    assert state.taken_back(36, 2) == "s0" and state.taken_back(46, 3) == "s1"
    assert state.taken_back(34, 2) is None  # before every later cut
    assert state.taken_back(19, 3 + epochs.RESTORES_KEPT) is None  # answered after every restore: stands


# ------------------------------------------------------- the servicer path


async def _taken_back_while_waiting(tmp_path: Path, batch: bool) -> object:
    engine, log, servicer = await held_node(tmp_path, bank.app, {"initial_balance": 100})  # the v1 calls: its edge's
    engine.start_snapshot("s1")
    log.flush_sync()
    if batch:
        request = pb.TransferBatchRequest(transfers=[pb.TransferRequest(to="p2", amount=7, request_id="r1")])
        call = asyncio.ensure_future(servicer.TransferBatch(request, ServicerContext()))
    else:
        request = pb.TransferRequest(to="p2", amount=7, request_id="r1")
        call = asyncio.ensure_future(servicer.Transfer(request, ServicerContext()))
    await asyncio.sleep(0.05)
    assert not call.done()  # applied and logged, waiting for its fsync
    engine.restore("s1", 2, [], state=b"100")  # s1's cut is before the transfer
    log.flush_sync()
    try:
        return await outcome(call)
    finally:
        await log.close()


def test_a_transfer_a_restore_took_back_before_its_fsync_is_answered_aborted(tmp_path: Path) -> None:
    answer = asyncio.run(_taken_back_while_waiting(tmp_path, batch=False))
    assert isinstance(answer, Aborted) and answer.code is grpc.StatusCode.ABORTED, answer
    assert "restore of snapshot s1" in answer.details and "not paid" in answer.details


def test_a_batch_item_a_restore_took_back_fails_like_a_refusal(tmp_path: Path) -> None:
    response = asyncio.run(_taken_back_while_waiting(tmp_path, batch=True))
    [result] = response.results
    assert result.code == grpc.StatusCode.ABORTED.value[0] and not result.msg_id
    assert "restore of snapshot s1" in result.message


# ------------------------------------------------------- the fault simulator

# The simulator's answer rule is the one for every app's command (`Node.taken_back`; the
# fuzzer runs the bank as an app too): clients race the settling restore, so kvshard at
# this seed has a command with a request id paid, then taken back by a restore to a cut
# before it.
TAKEN_BACK_SEED = 18


def test_the_simulator_answers_the_taken_back_transfer_aborted() -> None:
    print(f"seed {TAKEN_BACK_SEED}: {fuzz.replay_command(TAKEN_BACK_SEED, 'kvshard')}")
    assert fuzz.run_case(TAKEN_BACK_SEED, kvshard.app).faults["command taken back by a restore"] > 0


def test_the_simulator_notices_a_node_that_answers_it_paid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Node, "taken_back", lambda self, answer: None)
    with pytest.raises(Violation, match="after a restore took its run back"):
        fuzz.run_case(TAKEN_BACK_SEED, kvshard.app)
