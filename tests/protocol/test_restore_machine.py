"""Restore on the pure node machine (node rule N8), its epoch fence, and its recovery.

Two machines over in-memory links (the test_node_machine harness): a restore
sets the balance, replays the recorded in-flight transfers exactly once, starts
the channels over in the new epoch, and a crash at any point of it recovers to
the same state (or is redone from the start when the replays were cut short).
"""

from __future__ import annotations

import pytest
from support.machines import Machines, balance, bank_restore, kinds, pay

from snapmesh.protocol.node import core, recovery
from snapmesh.bank import v1records
from snapmesh.protocol import wal
from snapmesh.protocol.node.epochs import EpochFenced
from snapmesh.protocol.node.effects import Append, EndStreams, RestoreReply, Transmit
from support.machines import _restore_all, _snapshot_with_one_in_flight



def test_restore_sets_recorded_balances_replays_in_flight_and_new_traffic_flows() -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    pay(m.nodes["a"], "b", 10)  # after the snapshot: undone by the restore
    m.settle()
    _restore_all(m, parts, epoch=2)
    assert (balance(m.nodes["a"]), balance(m.nodes["b"])) == (70, 80)  # 50 recorded + 30 replayed
    assert m.nodes["b"].epoch == 2 and kinds(m.records("b"))[-2:] == ["restore", "replay"]
    pay(m.nodes["a"], "b", 5)  # epoch-2 traffic starts at seq 1 again
    m.settle()
    assert (balance(m.nodes["a"]), balance(m.nodes["b"])) == (65, 85)
    assert [r.seq for r in m.records("b") if isinstance(r, wal.Recv)][-1] == 1


def test_a_repeat_is_a_no_op_and_an_older_epoch_is_refused() -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    _restore_all(m, parts, epoch=2)
    before = len(m.records("b"))
    assert bank_restore(m.nodes["b"], snapshot_id="s1", epoch=2, balance=50, in_flight=[("a", "a:b:1", 1, 30)]) is False
    m.route("b")
    assert len(m.records("b")) == before and balance(m.nodes["b"]) == 80
    with pytest.raises(core.RemoteProtocolError, match="stale"):
        bank_restore(m.nodes["b"], snapshot_id="s1", epoch=1, balance=50, in_flight=[])


def test_the_restore_is_answered_by_an_effect_once_its_records_are_durable() -> None:
    """Issue 33: RestoreState's answer is the machine's `RestoreReply`, not a shell's wait:
    it comes once the restore's last record is durable (a crash before could take the
    restore back after the controller heard it was done), and a repeat waits too."""
    m = Machines({"a": 100, "b": 50})
    _snapshot_with_one_in_flight(m)
    b = m.nodes["b"]
    assert bank_restore(b, snapshot_id="s1", epoch=2, balance=50, in_flight=[("a", "a:b:1", 1, 30)], reply_to="call 1")
    effects = b.drain()
    assert not [e for e in effects if isinstance(e, RestoreReply)]  # nothing durable yet
    last = max(e.record.lsn for e in effects if isinstance(e, Append))
    assert bank_restore(b, snapshot_id="s1", epoch=2, balance=50, in_flight=[("a", "a:b:1", 1, 30)], reply_to="call 2") is False
    assert b.drain() == []  # the repeat rests on the same records: it waits as well
    b.durable(last - 1)
    assert not [e for e in b.drain() if isinstance(e, RestoreReply)]
    b.durable(last)
    assert [e for e in b.drain() if isinstance(e, RestoreReply)] == [
        RestoreReply("call 1", 2), RestoreReply("call 2", 2)
    ]
    assert bank_restore(b, snapshot_id="s1", epoch=2, balance=50, in_flight=[], reply_to="call 3") is False
    assert b.drain() == [RestoreReply("call 3", 2)]  # all durable already: answered in the step


def test_the_restore_names_the_connections_to_end_and_a_repeat_names_none() -> None:
    """Issue 33: which streams end at a restore is the machine's `EndStreams`, not a
    shell's choice: every channel, in and out (the links of the older epoch are gone),
    after the restore's records; a repeat changes no link and ends nothing."""
    m = Machines({"a": 100, "b": 50, "c": 10})
    parts = _snapshot_with_one_in_flight(m)
    b = m.nodes["b"]
    bank_restore(b, snapshot_id="s1", epoch=2, balance=int(parts["b"].state), in_flight=[("a", "a:b:1", 1, 30)])
    effects = b.drain()
    ends = [e for e in effects if isinstance(e, EndStreams)]
    assert ends == [EndStreams(("a", "c"), ("a", "c"), "b restored s1 in epoch 2")]
    assert effects.index(ends[0]) > max(i for i, e in enumerate(effects) if isinstance(e, Append))
    assert bank_restore(b, snapshot_id="s1", epoch=2, balance=int(parts["b"].state), in_flight=[("a", "a:b:1", 1, 30)]) is False
    assert not [e for e in b.drain() if isinstance(e, EndStreams)]


def test_a_snapshot_in_progress_is_aborted_as_restored_to_s() -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    m.nodes["a"].start_snapshot("s2")
    m.route("a")
    _restore_all(m, parts, epoch=2)
    aborts = [r for r in m.records("a") if isinstance(r, wal.Abort)]
    assert [(r.snapshot_id, r.reason) for r in aborts] == [("s2", "restored to s1")]
    assert not m.nodes["a"].process.in_progress()


@pytest.mark.parametrize("cut", ["after_restore", "after_replay", "durable"])
def test_a_crash_during_or_after_a_restore_recovers_exactly_once(cut: str) -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    _restore_all(m, parts, epoch=2)
    lsns = [r.lsn for r in m.records("b")]
    restore_lsn = next(r.lsn for r in m.records("b") if isinstance(r, wal.Restore))
    m.durable["b"] = {"after_restore": restore_lsn, "after_replay": restore_lsn + 1, "durable": lsns[-1]}[cut]
    m.crash("b")
    m.start("b")
    b = m.nodes["b"]
    assert b.epoch == 2
    if cut == "after_restore":  # the replay is lost: the restore must be done again, and it is, once
        assert b.restore_incomplete
        part = parts["b"]
        assert bank_restore(b, snapshot_id="s1", epoch=2, balance=int(part.state), in_flight=[("a", "a:b:1", 1, 30)]) is True
        m.route("b")
    assert balance(b) == 80 and not b.restore_incomplete
    m.durable["b"] = m.records("b")[-1].lsn
    m.crash("b")  # and once more from the complete log
    m.start("b")
    assert balance(m.nodes["b"]) == 80


def test_a_node_redoing_a_restore_may_dial_out_it_has_nothing_of_an_epoch_to_send() -> None:
    """Issue 33: whether a node whose restore was cut short dials is no decision for a
    shell (the gRPC node dials, the simulator too): its peer's fence takes the open
    (same epoch); its links started over at the restore record and clients and
    snapshots are refused, so the bank sends nothing (an app only its replies to the
    replays logged, which the redo makes again); the redo ends that connection
    (EndStreams) before the new epoch's traffic flows."""
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    _restore_all(m, parts, epoch=2)
    m.durable["b"] = next(r.lsn for r in m.records("b") if isinstance(r, wal.Restore))
    m.crash("b")  # the replay is lost: b redoes the restore
    m.start("b")
    a, b = m.nodes["a"], m.nodes["b"]
    assert b.restore_incomplete and b.epoch == 2
    conn_no = m.conn_nos[("b", "a")] = m.conn_nos.get(("b", "a"), 0) + 1
    m.wires[("b", "a")] = []
    a.opened("b", conn_no, epoch=b.epoch)  # a is in epoch 2: the open is taken
    m.route("a")
    b.connect("a", conn_no)
    assert not [e for e in b.drain() if isinstance(e, Transmit)]
    bank_restore(b, snapshot_id="s1", epoch=2, balance=int(parts["b"].state), in_flight=[("a", "a:b:1", 1, 30)])
    m.route("b")  # its EndStreams ends that connection
    assert ("b", "a") not in m.wires and not b.restore_incomplete
    pay(b, "a", 5)
    m.route("b")
    m.settle()
    assert (balance(a), balance(b)) == (75, 75) and a.receivers["b"].last_seq == 1


def test_the_epoch_fence_refuses_older_calls_and_holds_newer_ones_until_restored() -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    b = m.nodes["b"]
    assert b.fence(1, "channel a->b") is None and b.fence_clients() is None
    ahead = b.fence(2, "snapshot s2")
    assert ahead is not None and not ahead.stale and ahead.reason == "b has not restored epoch 2 yet"
    _restore_all(m, parts, epoch=2)
    stale = b.fence(1, "snapshot s2")
    assert stale is not None and stale.stale and stale.reason == "snapshot s2 is from epoch 1; b is in epoch 2"
    assert b.fence(2, "snapshot s2") is None
    restore_lsn = next(r.lsn for r in m.records("b") if isinstance(r, wal.Restore))
    m.durable["b"] = restore_lsn  # a crash loses the replay: the restore is unfinished
    m.crash("b")
    m.start("b")
    b = m.nodes["b"]
    unfinished = b.fence(2, "channel a->b")
    assert unfinished is not None and not unfinished.stale
    client = b.fence_clients()
    assert client is not None and not client.stale and client.reason == "b is finishing a restore"
    bank_restore(b, snapshot_id="s1", epoch=2, balance=int(parts["b"].state), in_flight=[("a", "a:b:1", 1, 30)])
    assert b.fence(2, "channel a->b") is None and b.fence_clients() is None


def test_the_events_that_carry_an_epoch_are_fenced_by_the_node_itself_and_change_nothing() -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    b = m.nodes["b"]
    with pytest.raises(EpochFenced, match="b has not restored epoch 2 yet") as ahead:
        b.start_snapshot("s2", epoch=2)
    assert not ahead.value.stale
    _restore_all(m, parts, epoch=2)
    before = len(m.records("b"))
    with pytest.raises(EpochFenced, match="snapshot s3 is from epoch 1; b is in epoch 2") as stale:
        b.start_snapshot("s3", epoch=1)
    assert stale.value.stale and not b.process.in_progress()
    with pytest.raises(EpochFenced, match="channel a->b is from epoch 1") as stale:
        b.opened("a", 7, epoch=1)
    assert stale.value.stale and b.receivers["a"].conn_no != 7
    with pytest.raises(EpochFenced, match="a restore for epoch 1 is stale") as stale:
        bank_restore(b, snapshot_id="s1", epoch=1, balance=int(parts["b"].state), in_flight=[])
    assert stale.value.stale
    m.route("b")
    assert len(m.records("b")) == before  # nothing logged for any of them
    b.start_snapshot("s4", epoch=2)  # the node's own epoch goes through
    assert "s4" in b.process.in_progress()


def test_a_channel_open_of_another_epoch_is_refused_by_the_node_itself_changing_nothing() -> None:
    """N8 at a channel's open: the shells (the gRPC Channel stream, the simulator's network)
    call `opened` with the sender's epoch and only act on the refusal. An open of an older
    epoch is refused for good, one of a newer epoch until this node has restored; neither
    touches the live connection, the log or the effects."""
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    b = m.nodes["b"]
    live = b.receivers["a"].conn_no
    with pytest.raises(EpochFenced, match="b has not restored epoch 2 yet") as ahead:
        b.opened("a", live + 1, epoch=2)
    assert not ahead.value.stale and b.receivers["a"].conn_no == live and b.drain() == []
    _restore_all(m, parts, epoch=2)
    m.settle()  # the channels open again in epoch 2
    live, held, records = b.receivers["a"].conn_no, b.receivers["a"].last_seq, len(m.records("b"))
    with pytest.raises(EpochFenced, match="channel a->b is from epoch 1; b is in epoch 2") as stale:
        b.opened("a", live + 5, epoch=1)  # a newer connection number does not help a stale epoch
    assert stale.value.stale and b.drain() == [] and len(m.records("b")) == records
    assert (b.receivers["a"].conn_no, b.receivers["a"].last_seq) == (live, held)
    pay(m.nodes["a"], "b", 5)  # the live connection still carries epoch 2's traffic
    m.route("a")
    m.settle()
    assert balance(b) == 85 and b.receivers["a"].last_seq == held + 1
    b.opened("a", live + 5, epoch=2)  # the node's own epoch goes through: the newer connection takes over
    assert b.receivers["a"].conn_no == live + 5


def test_an_open_that_names_no_epoch_is_epoch_1_to_the_node_itself() -> None:
    """Issue 33: a sender from before restores sends no epoch (0 on the wire). The node
    machine reads it as epoch 1, not the shell: taken in epoch 1, stale after a restore."""
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    b = m.nodes["b"]
    b.opened("a", b.receivers["a"].conn_no + 1)  # epoch 1: taken
    _restore_all(m, parts, epoch=2)
    live = b.receivers["a"].conn_no
    with pytest.raises(EpochFenced, match="channel a->b is from epoch 1; b is in epoch 2") as stale:
        b.opened("a", live + 1, epoch=0)
    assert stale.value.stale and b.receivers["a"].conn_no == live and b.drain() == []


def test_a_finished_part_is_handed_out_once_with_its_epoch_and_wall_times() -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    _restore_all(m, parts, epoch=2)
    m.settle()
    a, b = m.nodes["a"], m.nodes["b"]
    a.tick(0.0, wall=1000.5)
    a.start_snapshot("s2", epoch=2)
    m.route("a")
    b.tick(0.0, wall=1001.25)
    m.settle()
    finished = [e for e in m.handed_out if type(e).__name__ == "Finished" and e.state.snapshot_id == "s2"]
    got = sorted((f.state.node_id, f.epoch, f.cut_at_ns, f.done_at_ns) for f in finished)
    assert got == [("a", 2, 1000_500_000_000, 1000_500_000_000), ("b", 2, 1001_250_000_000, 1001_250_000_000)]
    assert sorted(s.node_id for s in m.reports if s.snapshot_id == "s2") == ["a", "b"]  # sent once each


def test_a_clients_step_while_a_restore_is_redone_is_refused_by_the_node() -> None:
    m = Machines({"a": 100, "b": 50})
    parts = _snapshot_with_one_in_flight(m)
    _restore_all(m, parts, epoch=2)
    m.durable["b"] = next(r.lsn for r in m.records("b") if isinstance(r, wal.Restore))  # the replay is lost
    m.crash("b")
    m.start("b")
    b = m.nodes["b"]
    before = (balance(b), b.last_lsn)
    with pytest.raises(core.LocalProtocolError, match="b is finishing a restore") as refused:
        pay(b, "a", 5, "r1")
    assert refused.value.kind is core.Refusal.RESTORING and (balance(b), b.last_lsn) == before
    bank_restore(b, snapshot_id="s1", epoch=2, balance=int(parts["b"].state), in_flight=[("a", "a:b:1", 1, 30)])
    assert pay(b, "a", 5, "r1").reply == b"75"


@pytest.mark.parametrize(
    "in_flight, state, refusal",
    [
        ([("c", "c:b:1", 1, 0, b"30")], b"50", r"cannot replay 'c:b:1' \(0\) from 'c'"),  # no channel c->b
        ([("a", "a:b:1", 1, 0, "30")], b"50", r"cannot replay 'a:b:1' \(0\) from 'a'"),  # a payload not bytes
        ([("a", "", 1, 0, b"30")], b"50", r"cannot replay '' \(0\) from 'a'"),
        ([("a", "a:b:1", 1, 30, b"30")], b"50", r"cannot replay 'a:b:1' \(30\) from 'a'"),  # a native tally
        ([], None, "a restore without app state"),
    ],
)
def test_a_restore_that_cannot_be_right_is_refused_and_changes_nothing(in_flight, state, refusal: str) -> None:
    m = Machines({"a": 100, "b": 50})
    m.settle()
    b = m.nodes["b"]
    before = len(m.records("b"))
    with pytest.raises(core.RemoteProtocolError, match=refusal):
        b.restore(snapshot_id="s1", epoch=2, in_flight=in_flight, state=state)
    m.route("b")
    assert len(m.records("b")) == before and (b.epoch, balance(b), b.restored) == (1, 50, "")
    assert b.fence(1) is None and b.fence(2) is not None


def test_restore_and_replay_records_round_trip_and_recovery_refuses_a_stray_replay() -> None:
    r = wal.Restore(lsn=7, snapshot_id="s1", epoch=3, deliveries=2, state=wal.pack(b"40"))
    assert wal.parse(wal.encode(r, "b"), "x", node_id="b") == r
    native = v1records.Restore(lsn=7, snapshot_id="s1", epoch=3, tally=40, deliveries=2)
    assert v1records.parse(wal.encode(native, "b"), "x", node_id="b") == native
    lines = [
        ("b.log.jsonl:1", wal.Init(lsn=1)),
        ("b.log.jsonl:2", wal.Replay(lsn=2, snapshot_id="s1", msg_id="a:b:1", src="a", dst="b", seq=1,
                                     payload=wal.pack(b"5"))),
    ]
    with pytest.raises(recovery.CorruptLog, match="b.log.jsonl:2: replay of a:b:1 that no restore announced"):
        recovery.recover(lines, node_id="b", incoming=["a"], outgoing=["a"])
