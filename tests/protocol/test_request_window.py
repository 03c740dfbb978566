"""Retry keys on the pure node machine (snapmesh/protocol/node/requests.py, machine.py, recovery.py).

- A retry with the same request_id is never paid twice: one burst of 10,001
   ids does not push the first out, and after a restart from a checkpoint the
   ids are still kept oldest first (not in key order). Ids leave by age only; a
   retry older than the window that says so is refused, a full window refuses
   new ids.
- A restore forgets the ids paid after the restored snapshot's cut (a retry
   pays again in the new epoch) and keeps those paid before it, across a
   restart too; with the cut forgotten, a retry is refused, never answered.
- A checkpoint keeps the last restore: after restore, seal and restart, a
   repeated RestoreState answers the restored balance and another snapshot in
   the same epoch is refused.
"""

from __future__ import annotations

import pytest
from support.machines import Machines
from support.machines import _restore_all, _snapshot_with_one_in_flight

from snapmesh.protocol.node import core, requests
from snapmesh.protocol import wal


def test_a_burst_of_ten_thousand_ids_does_not_push_out_the_first() -> None:
    m = Machines({"a": 100_000, "b": 0})
    a = m.nodes["a"]
    first = a.transfer("b", 1, "r-0")
    for i in range(1, 10_001):
        a.transfer("b", 1, f"r-{i}")
    m.route("a")
    balance = a.tally
    retry = a.transfer("b", 1, "r-0")
    assert retry.repeated and retry.msg_id == first.msg_id
    assert a.tally == balance, "the retry was paid twice"


def test_after_a_checkpoint_the_oldest_ids_are_kept_in_age_order() -> None:
    m = Machines({"a": 100_000, "b": 0}, segment_records=2_000)  # a few checkpoints
    a = m.nodes["a"]
    a.transfer("b", 1, "z-oldest")
    firsts = {f"a-{i:05d}": a.transfer("b", 1, f"a-{i:05d}").msg_id for i in range(10_000)}
    m.route("a")
    assert sum(isinstance(r, wal.Checkpoint) for r in m.records("a")) >= 4
    m.flush("a")
    m.crash("a")
    m.start("a")  # from the last segment: a checkpoint and a few records
    a = m.nodes["a"]
    a.transfer("b", 1, "new-one")
    balance = a.tally
    for rid, msg_id in list(firsts.items())[:3] + list(firsts.items())[-3:]:
        retry = a.transfer("b", 1, rid)
        assert retry.repeated and retry.msg_id == msg_id, rid
    assert a.transfer("b", 1, "z-oldest").repeated
    assert a.tally == balance, "a retry was paid twice"


def test_ids_leave_by_age_and_a_retry_older_than_the_window_is_refused() -> None:
    m = Machines({"a": 100, "b": 0}, wall=1000.0, request_ttl_s=60.0, request_capacity=2)
    a = m.nodes["a"]
    a.transfer("b", 1, "r1", wall=1000.0)
    a.transfer("b", 1, "r2", wall=1030.0)
    with pytest.raises(requests.WindowFull, match="limit 2") as full:
        a.transfer("b", 1, "r3", wall=1050.0)  # both still younger than 60 s: neither is evicted
    assert full.value.kind is core.Refusal.REQUESTS_FULL and a.tally == 98
    assert a.transfer("b", 1, "r2", wall=1050.0).repeated
    a.transfer("b", 1, "r3", wall=1070.0)  # r1 (70 s old) has left the window: room again
    assert a.tally == 97
    with pytest.raises(requests.RequestExpired, match="older than the request-id window") as old:
        a.transfer("b", 1, "r1", wall=1080.0, first_sent_unix_ms=1_000_000)
    assert old.value.kind is core.Refusal.REQUEST_UNKNOWN and a.tally == 97
    # After a restart the ids read from send records are as old as the restart
    # (W3): kept longer, never less; r1's retry is answered, not paid.
    m.route("a")
    m.flush("a")
    m.crash("a")
    m.node_kw["wall"] = 1090.0
    m.start("a")
    a = m.nodes["a"]
    assert a.transfer("b", 1, "r3", wall=1090.0).repeated
    assert a.transfer("b", 1, "r1", wall=1090.0, first_sent_unix_ms=1_000_000).repeated
    assert a.tally == 97


@pytest.mark.parametrize("restart", [False, True])
def test_a_restore_forgets_the_ids_paid_after_the_cut(restart: bool) -> None:
    m = Machines({"a": 100, "b": 50})
    before = m.nodes["a"].transfer("b", 5, "before-cut")
    parts = _snapshot_with_one_in_flight(m)  # a: 65 at the cut
    after = m.nodes["a"].transfer("b", 10, "after-cut")
    m.settle()
    _restore_all(m, parts, epoch=2)
    if restart:
        m.flush("a")
        m.crash("a")
        m.start("a")
    a = m.nodes["a"]
    assert a.tally == 65
    retry = a.transfer("b", 10, "after-cut")  # taken back by the restore: paid again, in epoch 2
    assert not retry.repeated and a.tally == 55 and retry.msg_id == "a:b:1"
    assert retry.msg_id != after.msg_id or a.epoch == 2
    again = a.transfer("b", 5, "before-cut")  # part of the restored state: answered, not paid
    assert again.repeated and again.msg_id == before.msg_id and a.tally == 55


def test_with_the_cut_forgotten_a_retry_is_refused_not_answered() -> None:
    m = Machines({"a": 100, "b": 50})
    m.nodes["a"].transfer("b", 5, "r")
    parts = _snapshot_with_one_in_flight(m)
    m.nodes["a"]._cuts.clear()  # as if s1's cut had left the window of recent cuts
    _restore_all(m, parts, epoch=2)
    with pytest.raises(requests.RequestInDoubt, match="restore"):
        m.nodes["a"].transfer("b", 5, "r")


def test_a_checkpoint_keeps_the_last_restore() -> None:
    m = Machines({"a": 100, "b": 50}, segment_records=4)
    parts = _snapshot_with_one_in_flight(m)
    _restore_all(m, parts, epoch=2)
    m.settle()
    b = m.nodes["b"]
    assert b.restored_tally == 80
    for _ in range(5):  # seal: the restore record is in a sealed segment now
        m.nodes["a"].transfer("b", 1)
        m.settle()
    assert not any(isinstance(r, wal.Restore) for r in m.logs["b"][-1])
    m.crash("b")
    m.start("b")
    b = m.nodes["b"]
    assert (b.epoch, b.restored, b.restored_tally) == (2, "s1", 80)
    assert b.restore(snapshot_id="s1", epoch=2, tally=50, in_flight=[("a", "a:b:1", 1, 30)]) is False
    with pytest.raises(core.RemoteProtocolError, match="restored 's1' in epoch 2"):
        b.restore(snapshot_id="s-other", epoch=2, tally=7, in_flight=[])
