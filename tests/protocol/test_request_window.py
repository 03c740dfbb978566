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
- One request per id (W5): the same id with another transfer or command is
   refused, naming the id, and nothing is paid or run; the identical retry is
   still answered; the digest survives a restart (checkpoint and records), and
   a checkpoint written before digests still loads. A replayed Submit answers
   the epoch its command ran in after a restore moved the node on (W6), across
   a restart too. The byte budget (W2) refuses a new id, never evicts, and
   the bytes it holds go down by age.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from support.machines import Machines, balance, bank_restore, pay
from support.machines import _restore_all, _snapshot_with_one_in_flight

from snapmesh.protocol.node import core, recovery, requests
from snapmesh.protocol import wal
from snapmesh.protocol.node.effects import Append, Seal, Submitted
from snapmesh.protocol.node.machine import Node
from snapmesh.services.app import kvshard


def test_a_burst_of_ten_thousand_ids_does_not_push_out_the_first() -> None:
    m = Machines({"a": 100_000, "b": 0})
    a = m.nodes["a"]
    first = pay(a, "b", 1, "r-0")
    for i in range(1, 10_001):
        pay(a, "b", 1, f"r-{i}")
    m.route("a")
    held = balance(a)
    retry = pay(a, "b", 1, "r-0")
    assert retry.repeated and (retry.reply, retry.first_seq) == (first.reply, first.first_seq) == (b"99999", 1)
    assert balance(a) == held, "the retry was paid twice"


def test_after_a_checkpoint_the_oldest_ids_are_kept_in_age_order() -> None:
    m = Machines({"a": 100_000, "b": 0}, segment_records=2_000)  # a few checkpoints
    a = m.nodes["a"]
    pay(a, "b", 1, "z-oldest")
    firsts = {f"a-{i:05d}": pay(a, "b", 1, f"a-{i:05d}").first_seq for i in range(10_000)}
    m.route("a")
    assert sum(isinstance(r, wal.Checkpoint) for r in m.records("a")) >= 4
    m.flush("a")
    m.crash("a")
    m.start("a")  # from the last segment: a checkpoint and a few records
    a = m.nodes["a"]
    pay(a, "b", 1, "new-one")
    held = balance(a)
    for rid, seq in list(firsts.items())[:3] + list(firsts.items())[-3:]:
        retry = pay(a, "b", 1, rid)
        assert retry.repeated and retry.first_seq == seq, rid
    assert pay(a, "b", 1, "z-oldest").repeated
    assert balance(a) == held, "a retry was paid twice"


def test_ids_leave_by_age_and_a_retry_older_than_the_window_is_refused() -> None:
    m = Machines({"a": 100, "b": 0}, wall=1000.0, request_ttl_s=60.0, request_capacity=2)
    a = m.nodes["a"]
    pay(a, "b", 1, "r1", wall=1000.0)
    pay(a, "b", 1, "r2", wall=1030.0)
    with pytest.raises(requests.WindowFull, match="limit 2") as full:
        pay(a, "b", 1, "r3", wall=1050.0)  # both still younger than 60 s: neither is evicted
    assert full.value.kind is core.Refusal.REQUESTS_FULL and balance(a) == 98
    assert pay(a, "b", 1, "r2", wall=1050.0).repeated
    pay(a, "b", 1, "r3", wall=1070.0)  # r1 (70 s old) has left the window: room again
    assert balance(a) == 97
    with pytest.raises(requests.RequestExpired, match="older than the request-id window") as old:
        pay(a, "b", 1, "r1", wall=1080.0, first_sent_unix_ms=1_000_000)
    assert old.value.kind is core.Refusal.REQUEST_UNKNOWN and balance(a) == 97
    # After a restart the ids read from send records are as old as the restart
    # (W3): kept longer, never less; r1's retry is answered, not paid.
    m.route("a")
    m.flush("a")
    m.crash("a")
    m.node_kw["wall"] = 1090.0
    m.start("a")
    a = m.nodes["a"]
    assert pay(a, "b", 1, "r3", wall=1090.0).repeated
    assert pay(a, "b", 1, "r1", wall=1090.0, first_sent_unix_ms=1_000_000).repeated
    assert balance(a) == 97


@pytest.mark.parametrize("restart", [False, True])
def test_a_restore_forgets_the_ids_paid_after_the_cut(restart: bool) -> None:
    m = Machines({"a": 100, "b": 50})
    before = pay(m.nodes["a"], "b", 5, "before-cut")
    parts = _snapshot_with_one_in_flight(m)  # a: 65 at the cut
    after = pay(m.nodes["a"], "b", 10, "after-cut")
    m.settle()
    _restore_all(m, parts, epoch=2)
    if restart:
        m.flush("a")
        m.crash("a")
        m.start("a")
    a = m.nodes["a"]
    assert balance(a) == 65
    retry = pay(a, "b", 10, "after-cut")  # taken back by the restore: paid again, in epoch 2
    assert not retry.repeated and balance(a) == 55 and (retry.reply, retry.first_seq) == (b"55", 1)
    assert after.first_seq == 4 and a.epoch == 2  # the seq it had in epoch 1, after s1's marker
    again = pay(a, "b", 5, "before-cut")  # part of the restored state: answered, not paid
    assert again.repeated and (again.reply, again.first_seq) == (before.reply, before.first_seq) and balance(a) == 55


def test_with_the_cut_forgotten_a_retry_is_refused_not_answered() -> None:
    m = Machines({"a": 100, "b": 50})
    pay(m.nodes["a"], "b", 5, "r")
    parts = _snapshot_with_one_in_flight(m)
    m.nodes["a"]._cuts.clear()  # as if s1's cut had left the window of recent cuts
    _restore_all(m, parts, epoch=2)
    with pytest.raises(requests.RequestInDoubt, match="restore"):
        pay(m.nodes["a"], "b", 5, "r")


def test_a_checkpoint_keeps_the_last_restore() -> None:
    m = Machines({"a": 100, "b": 50}, segment_records=4)
    parts = _snapshot_with_one_in_flight(m)
    _restore_all(m, parts, epoch=2)
    m.settle()
    b = m.nodes["b"]
    assert balance(b) == 80
    for _ in range(5):  # seal: the restore record is in a sealed segment now
        pay(m.nodes["a"], "b", 1)
        m.settle()
    assert not any(isinstance(r, wal.Restore) for r in m.logs["b"][-1])
    held = balance(b)
    m.crash("b")
    m.start("b")
    b = m.nodes["b"]
    assert (b.epoch, b.restored, balance(b)) == (2, "s1", held)
    assert bank_restore(b, snapshot_id="s1", epoch=2, balance=50, in_flight=[("a", "a:b:1", 1, 30)]) is False
    with pytest.raises(core.RemoteProtocolError, match="restored 's1' in epoch 2"):
        bank_restore(b, snapshot_id="s-other", epoch=2, balance=7)


# -------------------------------------------------- one request per id (W5), its epoch (W6), the bytes (W2)


def test_the_same_id_for_another_transfer_is_refused_naming_it_and_nothing_is_paid() -> None:
    m = Machines({"a": 100, "b": 0, "c": 0})
    a = m.nodes["a"]
    first = pay(a, "b", 10, "order-17")
    m.route("a")
    sends = sum(isinstance(r, wal.Send) for r in m.records("a"))
    for dst, amount in (("c", 50), ("b", 11)):  # another destination, another amount
        with pytest.raises(core.LocalProtocolError, match="request_id 'order-17' was used for another request") as info:
            pay(a, dst, amount, "order-17")
        assert info.value.kind is core.Refusal.INVALID_INPUT  # INVALID_ARGUMENT at the servicer
    m.route("a")
    assert balance(a) == 90 and sum(isinstance(r, wal.Send) for r in m.records("a")) == sends, "the other request was paid"
    retry = pay(a, "b", 10, "order-17")  # the identical retry: still the first answer
    assert retry.repeated and (retry.reply, retry.first_seq) == (first.reply, first.first_seq) and balance(a) == 90


@pytest.mark.parametrize("segment_records", [4, 10**6])  # the ids in a checkpoint, or in send records after one
def test_the_digest_survives_a_restart(segment_records: int) -> None:
    m = Machines({"a": 100, "b": 0, "c": 0}, segment_records=segment_records)
    a = m.nodes["a"]
    firsts = {f"r{i}": pay(a, "b", i, f"r{i}").first_seq for i in range(1, 4)}
    pay(a, "c", 1)  # and one more, so that with 4 records a segment the ids are in a checkpoint
    m.route("a")
    assert any(isinstance(r, wal.Checkpoint) for r in m.logs["a"][-1]) == (segment_records == 4)
    m.flush("a")
    m.crash("a")
    m.start("a")
    a = m.nodes["a"]
    for rid, seq in firsts.items():
        with pytest.raises(core.LocalProtocolError, match=f"request_id {rid!r} was used for another request"):
            pay(a, "c", 1, rid)
        again = pay(a, "b", int(rid[1:]), rid)
        assert again.repeated and again.first_seq == seq
    assert balance(a) == 100 - 1 - 2 - 3 - 1


def test_a_checkpoint_from_before_the_digest_still_loads_and_answers_its_retries() -> None:
    # A node upgraded over an older log: its checkpoint's ids have no digest and no
    # epoch (W5, W6), so a retry is answered as before, whatever it asks for.
    m = Machines({"a": 100, "b": 0, "c": 0}, segment_records=4)
    a = m.nodes["a"]
    first = pay(a, "b", 10, "old")
    for _ in range(4):
        pay(a, "b", 1)
    m.route("a")
    m.flush("a")
    [checkpoint] = [r for r in m.logs["a"][-1] if isinstance(r, wal.Checkpoint)]
    assert "old" in checkpoint.requests
    m.logs["a"][-1][0] = dataclasses.replace(checkpoint, requests={k: v[:4] for k, v in checkpoint.requests.items()})
    m.crash("a")
    m.start("a")
    a = m.nodes["a"]
    retry = pay(a, "c", 50, "old")  # digest unknown: answered, not paid, not refused
    assert retry.repeated and (retry.reply, retry.first_seq) == (first.reply, first.first_seq) and balance(a) == 86
    assert requests.from_checkpoint({"old": ["a:b:1", 90, 5.0, 2]}) == [("old", requests.Paid("a:b:1", 90, 5.0, 2, "", 0))]


def test_the_byte_budget_refuses_a_new_id_and_frees_by_age() -> None:
    cost = requests.entry_bytes("r1", requests.Paid(wal.pack(b"99"), 1, 0.0, 0, requests.command_digest(b"1 b")))
    m = Machines({"a": 100, "b": 0}, wall=1000.0, request_ttl_s=60.0, reply_window_bytes=2 * cost)
    a = m.nodes["a"]
    assert a.request_window_bytes == 0
    pay(a, "b", 1, "r1", wall=1000.0)
    assert a.request_window_bytes == cost
    pay(a, "b", 1, "r2", wall=1030.0)
    assert a.request_window_bytes == 2 * cost
    with pytest.raises(requests.WindowFull, match="reply_window_bytes") as full:
        pay(a, "b", 1, "r3", wall=1050.0)  # both younger than 60 s: neither is evicted
    assert full.value.kind is core.Refusal.REQUESTS_FULL and balance(a) == 98
    assert pay(a, "b", 1, "r1", wall=1050.0).repeated  # a retry is still answered
    pay(a, "b", 1, wall=1050.0)  # and a transfer without an id is not affected
    pay(a, "b", 1, "r3", wall=1070.0)  # r1 (70 s old) has left: room again
    assert a.request_window_bytes == 2 * cost and balance(a) == 96


# An app node: p1 hosting kvshard (p1 <-> p2; p2 never runs here). Every record is
# durable at once; a Seal opens a new segment, and a restart reads the last one.
# One wall clock throughout: the window's age is not the subject.
WALL = 1000.0


class _AppNode:
    def __init__(self, **node_kw) -> None:
        self.node_kw = node_kw
        self.segments: list[list[wal.Record]] = [[]]
        self.start()

    def start(self) -> None:
        lines = [(f"p1.log.jsonl:{i}", wal.parse(wal.encode(r, "p1"), "x", node_id="p1"))
                 for i, r in enumerate(self.segments[-1], start=1)]
        state = recovery.recover(lines, node_id="p1", incoming=("p2",), outgoing=("p2",), app=kvshard.app)
        self.node = Node(node_id="p1", incoming=("p2",), outgoing=("p2",), recovered=state, app=kvshard.app,
                         wall=WALL, **self.node_kw)
        self.route()

    def route(self) -> None:
        for effect in self.node.drain():
            if isinstance(effect, Append):
                self.segments[-1].append(effect.record)
                self.node.durable(effect.record.lsn)
            elif isinstance(effect, Seal):
                self.segments.append([effect.checkpoint])
                self.node.durable(effect.checkpoint.lsn)

    def submit(self, command: dict, request_id: str) -> Submitted:
        answer = self.node.submit(json.dumps(command).encode(), request_id, wall=WALL)
        self.route()
        return answer

    def commands(self) -> int:
        return sum(isinstance(r, wal.Command) for segment in self.segments for r in segment)


def test_the_same_id_for_another_command_is_refused_and_the_app_does_not_run() -> None:
    p1 = _AppNode()
    put = {"op": "put", "key": "p1/a", "value": 1}
    first = p1.submit(put, "c-1")
    with pytest.raises(core.LocalProtocolError, match="request_id 'c-1' was used for another request") as info:
        p1.submit({**put, "value": 2}, "c-1")
    assert info.value.kind is core.Refusal.INVALID_INPUT
    assert p1.commands() == 1
    assert json.loads(p1.submit({"op": "get", "key": "p1/a"}, "c-2").reply)["value"] == 1, "the other command ran"
    again = p1.submit(put, "c-1")  # the identical retry: the first reply, not run again
    assert again.repeated and again.reply == first.reply and p1.commands() == 2


@pytest.mark.parametrize("segment_records", [5, 10**6])  # after the restart: from a checkpoint, or from the records
def test_a_replayed_submit_answers_the_epoch_its_command_ran_in(segment_records: int) -> None:
    p1 = _AppNode(segment_records=segment_records)
    put = {"op": "put", "key": "p1/a", "value": 1}
    first = p1.submit(put, "c-1")
    assert (first.epoch, first.ran_in) == (1, 1)
    state = p1.node.app_state()
    p1.node.start_snapshot("s1")  # its cut holds c-1: the restore keeps it (W4)
    p1.route()
    assert p1.node.restore(snapshot_id="s1", epoch=2, in_flight=[], state=state)
    p1.route()
    newer = p1.submit({"op": "put", "key": "p1/b", "value": 2}, "c-2")
    for _ in range(2):
        again = p1.submit(put, "c-1")
        assert p1.node.epoch == 2 and again.repeated and again.reply == first.reply
        assert again.ran_in == 1, "a replayed Submit reports the node's epoch now, not the one its command ran in"
        assert p1.submit({"op": "put", "key": "p1/b", "value": 2}, "c-2").ran_in == newer.ran_in == 2
        with pytest.raises(core.LocalProtocolError, match="'c-1' was used for another request"):
            p1.submit({**put, "value": 3}, "c-1")
        p1.start()  # and after a restart (with 5 records a segment, from a checkpoint)
    assert any(isinstance(r, wal.Checkpoint) and "c-1" in r.requests for r in p1.segments[-1]) == (segment_records == 5)
