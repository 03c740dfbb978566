"""snapmesh/protocol/node/machine.py and snapmesh/protocol/node/recovery.py: whole node machines over in-memory links.

Also the pure half of: aborts replayed, a marker never without its cut,
checkpoints and segments, a full channel refuses at once, and a retried
request is not paid twice (across restarts too).
"""

from __future__ import annotations

import pytest

from snapmesh.protocol.node import core, link, recovery
from snapmesh.protocol import overtake, wal
from snapmesh.protocol.node.effects import Append, Transmit
from support.machines import Machines, balance, kinds, pay



def test_two_machines_move_money_and_take_a_snapshot() -> None:
    m = Machines({"a": 100, "b": 50})
    answer = pay(m.nodes["a"], "b", 30)
    assert (answer.reply, answer.lsn, answer.sent_to, answer.first_seq) == (b"70", 2, ("b",), 1)  # its send, carrying the command
    m.nodes["b"].start_snapshot("s1")  # b records before the payment reaches it
    m.route("a")
    m.route("b")
    m.settle()
    assert balance(m.nodes["a"]) == 70 and balance(m.nodes["b"]) == 80
    assert {s.node_id: s.state for s in m.reports} == {"a": b"70", "b": b"50"}
    in_flight = {s.node_id: s.channels for s in m.reports}
    assert [(t.msg_id, t.payload) for t in in_flight["b"]["a"]] == [("a:b:1", b"30")]
    assert all(s.unacked == 0 for n in m.nodes.values() for s in n.senders.values())


def test_a_frame_leaves_only_once_its_send_record_is_durable() -> None:
    m = Machines({"a": 100, "b": 0})
    m.connect_all()
    pay(m.nodes["a"], "b", 5)
    effects = m.nodes["a"].drain()
    assert not [e for e in effects if isinstance(e, Transmit)]
    m.logs["a"][-1] += [e.record for e in effects if isinstance(e, Append)]
    m.flush("a")
    assert m.wires[("a", "b")] and m.wires[("a", "b")][-1][2][0].seq == 1


def test_restart_rebuilds_balance_and_resends_the_unacknowledged() -> None:
    m = Machines({"a": 100, "b": 0})
    for amount in (1, 2, 3):
        pay(m.nodes["a"], "b", amount)
    m.route("a")
    m.flush("a")
    m.crash("a")
    m.crash("b")
    m.start("a")
    m.start("b")
    assert balance(m.nodes["a"]) == 94 and m.nodes["a"].senders["b"].unacked == 3
    m.settle()
    assert balance(m.nodes["b"]) == 6 and m.nodes["a"].senders["b"].unacked == 0


def test_a_full_channel_refuses_at_once_and_moves_no_money() -> None:
    m = Machines({"a": 100, "b": 0}, bound=2)
    pay(m.nodes["a"], "b", 1)
    pay(m.nodes["a"], "b", 1)
    m.route("a")
    with pytest.raises(link.ChannelFull):
        pay(m.nodes["a"], "b", 1)
    assert balance(m.nodes["a"]) == 98 and m.nodes["a"].drain() == []  # nothing logged, nothing debited
    m.settle()
    pay(m.nodes["a"], "b", 1)  # room again once acknowledged


def test_a_retried_request_is_answered_not_paid_again_across_restarts() -> None:
    m = Machines({"a": 100, "b": 0})
    first = pay(m.nodes["a"], "b", 10, request_id="r1")
    again = pay(m.nodes["a"], "b", 10, request_id="r1")
    assert again.reply == first.reply == b"90" and again.first_seq == first.first_seq == 1 and again.repeated
    m.route("a")
    m.flush("a")
    m.crash("a")
    m.start("a")
    after = pay(m.nodes["a"], "b", 10, request_id="r1")
    assert (after.reply, after.first_seq, after.repeated) == (b"90", 1, True)
    assert balance(m.nodes["a"]) == 90
    assert [c.request_id for r in m.records("a") if (c := wal.step_command(r)) is not None] == ["r1"]
    assert len([r for r in m.records("a") if isinstance(r, wal.Send)]) == 1


def test_an_abort_is_remembered_across_a_restart() -> None:
    m = Machines({"a": 100, "b": 0})
    m.nodes["b"].abort_snapshot("s1", "deadline")  # b never recorded s1
    m.route("b")
    m.flush("b")
    m.crash("b")
    m.start("b")
    assert m.nodes["b"].process.phase("s1") is core.Phase.ABANDONED
    m.nodes["a"].start_snapshot("s1")  # a late marker reaches b
    m.route("a")
    m.settle()
    assert not any(isinstance(r, wal.Cut) for r in m.records("b")), "a zombie recording started"
    assert m.nodes["b"].stale_markers == 1


def test_a_marker_recv_is_logged_after_its_cut_and_recovery_never_sees_one_alone() -> None:
    m = Machines({"a": 100, "b": 0})
    m.nodes["a"].start_snapshot("s1")
    m.route("a")
    m.settle()
    b = m.records("b")
    cut = next(r for r in b if isinstance(r, wal.Cut))
    marker = next(r for r in b if isinstance(r, wal.MarkerRecv))
    assert cut.lsn < marker.lsn
    # An old log with the marker_recv but no cut: recovery still abandons the snapshot.
    old = [wal.Init(lsn=1), wal.MarkerRecv(lsn=2, snapshot_id="s1", src="a", dst="b", seq=1)]
    state = recovery.recover([("b.log.jsonl:%d" % r.lsn, r) for r in old], node_id="b",
                             incoming=["a"], outgoing=["a"])
    assert "s1" in state.abandoned


def test_segments_checkpoint_and_recovery_reads_only_the_active_one() -> None:
    m = Machines({"a": 1000, "b": 0}, segment_records=5)
    for i in range(40):
        pay(m.nodes["a"], "b", 1, request_id=f"r{i}")
        m.route("a")
        if i % 7 == 0:
            m.settle()
    m.nodes["a"].abort_snapshot("old", "x")
    m.route("a")
    m.flush("a")
    assert len(m.logs["a"]) > 6
    assert all(isinstance(seg[0], wal.Checkpoint) for seg in m.logs["a"][1:])
    unacked = m.nodes["a"].senders["b"].unacked
    m.crash("a")
    m.start("a")  # from the active segment alone
    a = m.nodes["a"]
    # The outbox is what the last checkpoint's ack watermark left plus the active segment's sends.
    assert balance(a) == 960 and unacked <= a.senders["b"].unacked <= unacked + 10
    assert a.process.phase("old") is core.Phase.ABANDONED
    assert pay(a, "b", 1, request_id="r3").repeated
    m.settle()
    assert balance(m.nodes["b"]) == 40 and a.senders["b"].unacked == 0


def test_a_segment_seals_once_the_log_says_it_holds_segment_bytes() -> None:
    """N7 by bytes: the shell reports the active segment's bytes after its checkpoint
    (`log_size`); past `segment_bytes` the next step boundary seals, below it none does,
    and a seal starts the count again (until the shell reports the new segment)."""
    from snapmesh.protocol.node.effects import Seal

    m = Machines({"a": 100, "b": 0}, segment_records=10**6, segment_bytes=1000)
    a = m.nodes["a"]
    a.drain()
    a.log_size(999)
    pay(a, "b", 1)
    assert not [e for e in a.drain() if isinstance(e, Seal)]
    a.log_size(1000)
    pay(a, "b", 1)  # the step past the budget ends in a seal
    effects = a.drain()
    seals = [e for e in effects if isinstance(e, Seal)]
    assert len(seals) == 1 and isinstance(effects[-1], Seal) and seals[0].checkpoint.lsn == a.last_lsn
    pay(a, "b", 1)  # the count starts again at the seal
    a.start_snapshot("s1")
    assert not [e for e in a.drain() if isinstance(e, Seal)]


def test_a_recording_past_its_ttl_is_dropped_and_logged_as_an_abort() -> None:
    m = Machines({"a": 100, "b": 0}, recording_ttl=6.0)
    a = m.nodes["a"]
    a.tick(1.0)
    a.start_snapshot("s1")
    assert a.next_timer() == 7.0
    a.tick(6.9)
    assert a.process.phase("s1") is core.Phase.RECORDING
    a.tick(7.0)
    assert a.process.phase("s1") is core.Phase.ABANDONED
    m.route("a")
    assert kinds(m.records("a"))[-1] == "abort"


def test_checkpoint_round_trips_through_the_log() -> None:
    state = recovery.fresh(incoming=["b"], outgoing=["b"])
    state.outbox["b"] = [link.Entry(1, 0, "", 0, b"m1"), link.Entry(2, 0, "s1")]  # an app message, a marker
    state.next_seq["b"] = 3
    cp = wal.Checkpoint(lsn=9, **recovery.checkpoint_fields(state))
    again = recovery.recover([("f:1", wal.parse(wal.encode(cp, "a"), "f:1"))], node_id="a",
                             incoming=["b"], outgoing=["b"])
    assert again.outbox == state.outbox and again.next_seq == state.next_seq


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ([wal.Restart(lsn=1)], "first record must be init"),
        ([wal.Init(lsn=1), wal.Restart(lsn=3)], "lsn 3 where 2 was expected"),
        ([wal.Init(lsn=1), wal.Init(lsn=2)], "a second init"),
        ([wal.Init(lsn=1), wal.Checkpoint(lsn=2, next_seq={"b": 1}, acked={"b": 0},
                                                     received={"b": 0}, outbox={"b": []}, abandoned=[], requests={})],
         "checkpoint must be the first record"),
    ],
)
def test_recovery_refuses_a_log_it_cannot_trust(records, problem: str) -> None:
    with pytest.raises(recovery.CorruptLog) as info:
        recovery.recover([(f"a.log.jsonl:{i}", r) for i, r in enumerate(records, start=1)], node_id="a",
                         incoming=["b"], outgoing=["b"])
    assert problem in str(info.value) and str(info.value).startswith("a.log.jsonl:")


# ------------------------------------------------------------ overtake mode


def test_overtake_an_early_marker_finishes_the_receiver_ahead_of_a_queued_backlog() -> None:
    m = Machines({"a": 100, "b": 0}, snapshot_mode="overtake")
    m.connect_all()
    for _ in range(10):
        pay(m.nodes["a"], "b", 1)
    m.route("a")
    m.flush("a")  # ten transfers on the wire to b, none delivered
    m.nodes["a"].start_snapshot("s1")
    m.route("a")
    m.flush("a")
    frames = m.wires[("a", "b")]
    early = frames[-1][2][0]
    assert (early.seq, early.last_seq, early.snapshot_id) == (0, 10, "s1")  # ahead of the FIFO marker, seq 11
    # b gets the early marker before the backlog: it cuts and is done with a->b at once.
    kind, conn_no, entries = frames.pop()
    for e in entries[:1]:
        m.nodes["b"].received("a", conn_no, e.seq, last_seq=e.last_seq, snapshot_id=e.snapshot_id)
    m.nodes["b"].end_frame()
    m.route("b")
    m.flush("b")
    b_state = next(s for s in m.reports if s.node_id == "b")
    assert b_state.state == b"0" and b_state.positions == {"a": 0} and b_state.channels == {"a": ()}
    m.wires[("a", "b")].append((kind, conn_no, entries[1:]))
    m.settle()  # the backlog, then the FIFO marker (ignored: the channel is closed)
    reports = {s.node_id: s for s in m.reports}
    assert [t.seq for t in overtake.channel_state(reports, "a", "b")] == list(range(1, 11))
    assert overtake.channel_state(reports, "b", "a") == ()
    assert int(reports["a"].state) + int(reports["b"].state) + 10 == 100
    assert [type(r).KIND for r in m.records("b")].count("marker_recv") == 1  # one marker per channel
    assert balance(m.nodes["b"]) == 10


def test_overtake_drops_an_early_marker_behind_transfers_past_the_cut() -> None:
    """Its in-band copy came first (or it was never sent): applying it would cut b
    after a transfer sent past a's cut. Found by the long fuzz run, seed 1202109."""
    m = Machines({"a": 100, "b": 0}, snapshot_mode="overtake")
    m.connect_all()
    pay(m.nodes["a"], "b", 1)
    m.route("a")
    m.settle()
    records = len(m.records("b"))
    m.nodes["b"].received("a", m.conn_nos[("a", "b")], 0, last_seq=0, snapshot_id="s9")
    assert not list(m.nodes["b"].process.in_progress())  # no recording started
    assert len(m.records("b")) == records  # no cut, nothing logged
    assert m.nodes["b"].stale_markers == 1


def test_classic_mode_sends_no_early_marker() -> None:
    m = Machines({"a": 100, "b": 0})
    m.connect_all()
    pay(m.nodes["a"], "b", 1)
    m.nodes["a"].start_snapshot("s1")
    m.route("a")
    m.flush("a")
    assert [e.seq for _, _, entries in m.wires[("a", "b")] for e in entries] == [1, 2]
