"""The controller's snapshot bookkeeping, driven directly: no clock, no network.

The cluster runs the bank app (tests/support/bank_reports.py): reports carry the
balance as state bytes and each amount as a payload, and the bank's checker fills
the v1 figures the assertions read."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller.tracker import (
    COMPLETE,
    FAILED,
    IN_PROGRESS,
    DuplicateReport,
    InvalidReport,
    NotInProgress,
    Now,
    Tracker,
    TrackerMisuse,
    UnknownSnapshot,
    duration_s,
    new_snapshot_id,
)
from snapmesh.protocol.controller.snapshot_ids import StartClock
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

NODES = ("p1", "p2", "p3")
T0 = 1_700_000_000.0  # wall clock
MONO0 = 50.0  # the monotonic clock: deadlines count from it, never from the wall


def at(dt: float = 0.0) -> Now:
    return Now(mono=MONO0 + dt, wall=T0 + dt)


def tracker(channels=None, deadline_s: float = 5.0, balance: int = 100) -> Tracker:
    topology = Topology.build(NODES, channels)
    return bank.tracker(topology, expected_total=balance * len(NODES), deadline_s=deadline_s)


def state(t: Tracker, sid: str, node: str, balance: int, in_flight: dict[str, list[int]] | None = None) -> pb.FullState:
    """A well-formed report: every incoming channel, amounts per source as given."""
    in_flight = in_flight or {}
    channels = {src: [bank.item(f"{src}-{i}", a, i + 1) for i, a in enumerate(in_flight.get(src, []))]
                for src in t.topology.incoming(node)}
    return bank.report(sid, node, balance, channels)


def test_a_snapshot_completes_when_every_node_reported_and_lists_the_whole_topology():
    t = tracker()
    started = t.start("s1", "p2", at())
    # The expected total is the app's figure: the checker fills it once the snapshot is whole.
    assert started.status == IN_PROGRESS and started.initiator == "p2" and not started.HasField("expected_total")
    assert t.in_progress == 1
    assert t.report(state(t, "s1", "p3", 80, {"p1": [5, 15]}), at(0.1)).snapshot.status == IN_PROGRESS
    assert t.report(state(t, "s1", "p1", 100), at(0.2)).snapshot.status == IN_PROGRESS
    done = t.report(state(t, "s1", "p2", 100), at(0.25)).snapshot

    assert done.status == COMPLETE and done.reason == ""
    assert [(n.node_id, n.balance) for n in done.nodes] == [("p1", 100), ("p2", 100), ("p3", 80)]
    assert [(c.src, c.dst) for c in done.channels] == list(t.topology.channels)
    p1_p3 = next(c for c in done.channels if (c.src, c.dst) == ("p1", "p3"))
    assert [(i.msg_id, i.amount, i.seq) for i in p1_p3.in_flight] == [("p1-0", 5, 1), ("p1-1", 15, 2)]
    assert done.total == 300 and done.expected_total == 300 and done.conserved
    assert [(i.name, i.ok) for i in done.app.invariants] == [("conserved", True)]
    assert duration_s(done) == pytest.approx(0.25)
    assert t.in_progress == 0 and t.next_deadline() is None
    assert t.get("s1") == done


def test_a_total_that_differs_from_the_money_in_the_system_is_not_conserved():
    t = tracker()
    t.start("s1", "p1", at())
    t.report(state(t, "s1", "p1", 100), at())
    t.report(state(t, "s1", "p2", 100, {"p3": [7]}), at())
    done = t.report(state(t, "s1", "p3", 100), at()).snapshot
    assert done.status == COMPLETE and done.total == 307 and not done.conserved
    assert "307" in done.reason and "300" in done.reason


def test_a_ring_snapshot_has_one_channel_per_node():
    t = tracker(channels=[["p1", "p2"], ["p2", "p3"], ["p3", "p1"]])
    t.start("s1", "p1", at())
    for node in NODES:
        done = t.report(state(t, "s1", node, 100), at()).snapshot
    assert done.status == COMPLETE and done.conserved
    assert [(c.src, c.dst) for c in done.channels] == [("p1", "p2"), ("p2", "p3"), ("p3", "p1")]


def test_deadline_expiry_fails_the_snapshot_naming_the_nodes_that_did_not_report():
    t = tracker(deadline_s=3.0)
    t.start("s1", "p1", at())
    t.start("s2", "p3", at(1))
    t.report(state(t, "s1", "p2", 100), at(0.5))
    assert t.next_deadline() == at(3.0).mono
    assert t.expire(at(2.999)) == []

    [failed] = t.expire(at(3.0))
    assert failed.snapshot_id == "s1" and failed.status == FAILED
    assert "p1" in failed.reason and "p3" in failed.reason and "p2" not in failed.reason
    assert "3s" in failed.reason
    assert failed.finished_at.seconds == int(at(3.0).wall)
    assert t.get("s1").status == FAILED
    assert t.get("s2").status == IN_PROGRESS and t.next_deadline() == at(4.0).mono
    # A late report for a failed snapshot is refused, and changes nothing.
    with pytest.raises(NotInProgress):
        t.report(state(t, "s1", "p1", 100), at(3.5))
    assert t.get("s1") == failed


def test_several_snapshots_in_progress_at_once_are_independent():
    t = tracker()
    for sid, initiator in (("a", "p1"), ("b", "p2"), ("c", "p3")):
        t.start(sid, initiator, at())
    assert t.in_progress == 3
    for node in NODES:
        t.report(state(t, "b", node, 100), at(1))
    assert t.get("b").status == COMPLETE
    assert t.get("a").status == IN_PROGRESS and t.get("c").status == IN_PROGRESS
    assert [s.snapshot_id for s in t.all()] == ["a", "b", "c"]


def test_fail_is_final_and_ignores_finished_or_unknown_snapshots():
    t = tracker()
    t.start("s1", "p1", at())
    failed = t.fail("s1", "initiator p1 unreachable", at(0.1))
    assert failed.status == FAILED and failed.reason == "initiator p1 unreachable"
    assert t.fail("s1", "again", at(0.2)) is None
    assert t.fail("nope", "x", at()) is None
    assert t.expire(at(100)) == []


@pytest.mark.parametrize(
    "mutate, error, words",
    [
        (lambda s: setattr(s, "snapshot_id", ""), InvalidReport, "snapshot_id"),
        (lambda s: setattr(s, "snapshot_id", "zzz"), UnknownSnapshot, "zzz"),
        (lambda s: setattr(s, "node_id", "p9"), InvalidReport, "p9"),
        (lambda s: setattr(s, "node_id", ""), InvalidReport, "node_id"),
        (lambda s: setattr(s.channels[0], "dst", "p2"), InvalidReport, "does not end"),
        (lambda s: setattr(s.channels[0], "src", "p9"), InvalidReport, "not in the topology"),
        (lambda s: s.channels.append(pb.ChannelState(src="p2", dst="p1")), InvalidReport, "twice"),
        (lambda s: s.channels.pop(), InvalidReport, "p3->p1"),
    ],
)
def test_a_bad_report_is_refused_with_a_typed_error_and_changes_nothing(mutate, error, words):
    t = tracker()
    t.start("s1", "p1", at())
    before = t.get("s1")
    report = state(t, "s1", "p1", 100)  # p1's incoming channels: p2->p1, p3->p1
    mutate(report)
    with pytest.raises(error, match=words):
        t.report(report, at(1))
    assert t.get("s1") == before
    # The good report is still accepted afterwards.
    t.report(state(t, "s1", "p1", 100), at(1))


@pytest.mark.parametrize("mutate, words", [
    (lambda s: setattr(s, "state", b"-1"), "the state of p1 is not decimal ASCII"),
    (lambda s: s.channels[0].in_flight.add(msg_id="m", seq=1, payload=b"0x10"), "the message p2->p1 seq 1"),
])
def test_bytes_the_bank_would_not_write_complete_a_snapshot_that_names_them_and_is_not_conserved(mutate, words):
    """The controller reads no app's bytes in a report: the bank's invariant judges
    them once the snapshot is whole, and says what is wrong where."""
    t = tracker()
    t.start("s1", "p1", at())
    report = state(t, "s1", "p1", 100)
    mutate(report)
    t.report(report, at())
    for node in ("p2", "p3"):
        done = t.report(state(t, "s1", node, 100), at()).snapshot
    assert done.status == COMPLETE and words in done.reason and "invariant broken" in done.reason
    assert [(i.name, i.ok) for i in done.app.invariants] == [("conserved", False)]
    assert not done.HasField("conserved") and not done.HasField("total")  # F1: no figure from such bytes


def test_an_identical_repeat_of_a_report_is_accepted_and_changes_nothing():
    """A node retrying after a lost answer sends the same FullState again."""
    t = tracker()
    t.start("s1", "p1", at())
    first = t.report(state(t, "s1", "p1", 100, {"p2": [4]}), at(0.1))
    assert not first.duplicate
    again = t.report(state(t, "s1", "p1", 100, {"p2": [4]}), at(0.2))
    assert again.duplicate and again.snapshot == first.snapshot == t.get("s1")
    for node in ("p2", "p3"):
        done = t.report(state(t, "s1", node, 100 - 4 * (node == "p2")), at(0.3)).snapshot
    assert done.status == COMPLETE and done.conserved
    # and once the snapshot is COMPLETE too: the answer to the last report may be the one lost
    late = t.report(state(t, "s1", "p1", 100, {"p2": [4]}), at(9))
    assert late.duplicate and late.snapshot == done == t.get("s1")


@pytest.mark.parametrize("complete_first", [False, True])
def test_a_conflicting_repeat_is_refused_naming_the_node_and_snapshot(complete_first):
    t = tracker()
    t.start("s1", "p1", at())
    t.report(state(t, "s1", "p1", 100, {"p2": [4]}), at())
    if complete_first:
        for node in ("p2", "p3"):
            t.report(state(t, "s1", node, 100), at())
    before = t.get("s1")
    for conflicting in (state(t, "s1", "p1", 90, {"p2": [4]}), state(t, "s1", "p1", 100, {"p2": [5]})):
        with pytest.raises(DuplicateReport, match=r"node 'p1' already reported snapshot 's1'.*different"):
            t.report(conflicting, at(1))
    assert t.get("s1") == before


def test_deadlines_follow_the_monotonic_clock_not_the_wall_clock():
    t = tracker(deadline_s=3.0)
    t.start("s1", "p1", Now(mono=10.0, wall=T0))
    # the wall clock jumps a day ahead: no deadline fires
    assert t.expire(Now(mono=11.0, wall=T0 + 86_400)) == []
    # the wall clock steps back: the deadline still fires on time
    [failed] = t.expire(Now(mono=13.0, wall=T0 - 3600))
    assert failed.status == FAILED and "deadline of 3s" in failed.reason


def test_after_a_restart_an_unfinished_snapshot_completes_from_reports_or_fails_as_controller_restarted():
    t = tracker(deadline_s=3.0)
    for sid in ("a", "b"):  # as taken back from the journal
        t.start(sid, "p1", at())
        t.report(state(t, sid, "p1", 100), at(0.1))
    restart = at(100)
    assert t.restarted(restart) == ["a", "b"]
    assert t.next_deadline() == restart.mono + 3.0
    for node in ("p2", "p3"):  # the nodes re-send what was never acknowledged
        done = t.report(state(t, "a", node, 100), at(101)).snapshot
    assert done.status == COMPLETE and done.conserved
    assert t.expire(at(102.9)) == []
    [failed] = t.expire(at(103))
    assert failed.snapshot_id == "b" and failed.status == FAILED
    assert failed.reason.startswith("controller restarted")
    assert "p2, p3" in failed.reason and "p1" not in failed.reason.split("from")[1]


def test_stats_in_flinks_vocabulary_per_node_and_per_snapshot():
    t = tracker()
    t.start("s1", "p1", at())
    trigger_ns = int(T0 * 1e9)
    reports = {"p1": (100, {}), "p2": (90, {"p1": [4, 6]}), "p3": (100, {})}
    for i, (node, (balance, in_flight)) in enumerate(reports.items()):
        report = state(t, "s1", node, balance, in_flight)
        report.cut_at_unix_ns = trigger_ns + (i + 1) * 1_000_000  # cut 1, 2, 3 ms after the trigger
        report.done_at_unix_ns = report.cut_at_unix_ns + 10_000_000  # last marker 10 ms later
        done = t.report(report, at(0.02 + i * 0.001)).snapshot  # received 7 ms after done
    stats = done.stats
    assert [n.node_id for n in stats.nodes] == ["p1", "p2", "p3"]
    for i, n in enumerate(stats.nodes):
        assert n.start_delay_ms == pytest.approx(i + 1, abs=1e-3)
        assert n.recording_duration_ms == pytest.approx(10, abs=1e-3)
        assert n.report_time_ms == pytest.approx(9, abs=1e-2)
    p2 = stats.nodes[1]
    assert p2.in_flight_messages == 2 and p2.in_flight_bytes > 0
    assert stats.in_flight_messages == 2 and stats.in_flight_bytes == p2.in_flight_bytes
    assert stats.end_to_end_duration_ms == pytest.approx(22, abs=1e-3)
    assert stats.state_size_bytes > stats.in_flight_bytes
    assert stats.nodes[2].ack_timestamp.ToNanoseconds() == done.finished_at.ToNanoseconds()


def test_a_report_without_node_times_gives_zero_times_not_nonsense():
    t = tracker()
    t.start("s1", "p1", at())
    t.report(state(t, "s1", "p1", 100), at(0.5))
    [n] = t.get("s1").stats.nodes
    assert (n.start_delay_ms, n.recording_duration_ms, n.report_time_ms) == (0, 0, 0)


def test_caller_misuse_is_its_own_error():
    t = tracker()
    t.start("s1", "p1", at())
    with pytest.raises(TrackerMisuse):
        t.start("s1", "p2", at())
    with pytest.raises(TrackerMisuse):
        t.start("s2", "p9", at())
    with pytest.raises(TrackerMisuse):
        t.start("", "p1", at())
    with pytest.raises(UnknownSnapshot):
        t.get("nope")
    assert [s.snapshot_id for s in t.all()] == ["s1"]


def test_restored_snapshots_are_served_and_listed_in_id_order():
    t = tracker()
    old = pb.Snapshot(snapshot_id="a-old", initiator="p1", status=COMPLETE, total=300, conserved=True)
    t.restore(old)
    t.start("b-new", "p2", at())
    assert [s.snapshot_id for s in t.all()] == ["a-old", "b-new"]
    assert t.get("a-old") == old
    with pytest.raises(TrackerMisuse):
        t.restore(pb.Snapshot(snapshot_id="c", status=IN_PROGRESS))


def test_snapshot_ids_sort_by_start_time_and_carry_the_random_suffix():
    a = new_snapshot_id(T0, b"\x00\x01")
    b = new_snapshot_id(T0 + 0.000001, b"\x00\x00")
    c = new_snapshot_id(T0 + 1.9999996, b"\x00\x00")  # rounds up to the next second
    assert a < b < c
    assert a == "20231114T221320.000000Z-0001"
    assert c == "20231114T221322.000000Z-0000"


def test_start_times_move_forward_within_one_tick_and_when_the_clock_steps_back():
    starts = StartClock()
    first, at = starts.start(T0, b"\x09")
    assert (first, at) == (new_snapshot_id(T0, b"\x09"), T0)
    second, later = starts.start(T0, b"\x00")  # the same tick, a smaller suffix: still after
    third, last = starts.start(T0 - 5, b"\x00")  # the clock stepped back
    assert first < second < third and at < later < last
    assert starts.start(T0 + 10, b"\x00")[1] == T0 + 10  # a clock ahead is taken as it is


def test_many_starts_within_one_tick_each_get_their_own_microsecond_in_start_order():
    starts = StartClock()  # a float of ~1.7e9 s plus 1e-6 per start drifted: the 13th shared the 12th's microsecond
    ids = [starts.start(T0, bytes([255 - i]))[0] for i in range(200)]
    assert ids == sorted(ids) and len({sid.split("Z-")[0] for sid in ids}) == 200


# ------------------------------------------------------------ overtake mode


def overtake_state(t: Tracker, sid: str, node: str, balance: int, positions: dict[str, int],
                   outbox: dict[str, list[tuple[int, int]]], recorded: dict[str, list[int]] | None = None,
                   *, packed: bool = True) -> pb.FullState:
    """A report in overtake mode: positions per incoming channel, (seq, amount) outboxes per
    outgoing one, as `outbox_runs` (what nodes send) or, `packed=False`, as the older `outbox`."""
    report = state(t, sid, node, balance, recorded)
    report.snapshot_mode = "overtake"
    report.positions.extend(pb.ChannelPosition(src=s, dst=node, seq=q) for s, q in positions.items())
    for dst, items in outbox.items():
        if packed:
            report.outbox_runs.append(bank.outbox_run(node, dst, [q for q, _ in items], [a for _, a in items]))
        else:
            report.outbox.add(src=node, dst=dst, in_flight=[bank.item(f"{node}:{dst}:{q}", a, q) for q, a in items])
    return report


@pytest.mark.parametrize("packed", [True, False], ids=["outbox_runs", "outbox (older nodes)"])
def test_overtake_channels_are_what_the_receiver_recorded_plus_the_senders_outbox_past_its_position(packed):
    t = bank.tracker(Topology.build(("p1", "p2"), None), expected_total=200, deadline_s=5, snapshot_mode="overtake")
    t.start("s1", "p1", at())
    # p1's outbox to p2 at its cut: seqs 3..5 (12 in all); p2 had applied up to 3 at its cut.
    t.report(overtake_state(t, "s1", "p1", 100 - 12, {"p2": 0}, {"p2": [(3, 2), (4, 4), (5, 6)]}, packed=packed), at())
    done = t.report(overtake_state(t, "s1", "p2", 100 + 2, {"p1": 3}, {}, packed=packed), at()).snapshot
    p1_p2 = next(c for c in done.channels if (c.src, c.dst) == ("p1", "p2"))
    assert [(i.msg_id, i.seq, i.amount) for i in p1_p2.in_flight] == [("p1:p2:4", 4, 4), ("p1:p2:5", 5, 6)]
    assert done.status == COMPLETE and done.conserved


def test_overtake_a_repeat_after_complete_is_a_duplicate_not_a_different_state():
    """A node's call that timed out while its report was held sends it again, and the
    copy may come after COMPLETE: the channels shown were merged (O3), the entry was not."""
    t = bank.tracker(Topology.build(("p1", "p2"), None), expected_total=200, deadline_s=5, snapshot_mode="overtake")
    t.start("s1", "p1", at())
    p1 = overtake_state(t, "s1", "p1", 100 - 12, {"p2": 0}, {"p2": [(3, 2), (4, 4), (5, 6)]})
    t.report(p1, at())
    p2 = overtake_state(t, "s1", "p2", 100 + 2, {"p1": 3}, {}, {"p1": [7]})
    assert t.report(p2, at()).snapshot.status == COMPLETE
    for again in (p1, p2):
        t.report(again, at())  # no DuplicateReport
    other = overtake_state(t, "s1", "p2", 100 + 3, {"p1": 3}, {})
    with pytest.raises(DuplicateReport, match="different state"):
        t.report(other, at())


def test_overtake_a_transfer_both_ends_hold_is_in_the_channel_once_in_seq_order():
    t = bank.tracker(Topology.build(("p1", "p2"), None), expected_total=200, deadline_s=5, snapshot_mode="overtake")
    t.start("s1", "p1", at())
    # p2 cut at position 2 and then applied seqs 3 and 4 (recorded); p1's outbox at its
    # cut still held 4 (its ack had not come back), 6 and 7 (5 was a marker of another snapshot).
    t.report(overtake_state(t, "s1", "p1", 70, {"p2": 0}, {"p2": [(4, 4), (6, 6), (7, 7)]}), at())
    p2 = overtake_state(t, "s1", "p2", 100, {"p1": 2}, {})
    del p2.channels[:]
    p2.channels.add(src="p1", dst="p2", in_flight=bank.items("p1", "p2", [3, 4], first_seq=3))
    p2.state = bank.money(200 - 70 - (3 + 4 + 6 + 7))  # what the total leaves it
    done = t.report(p2, at()).snapshot
    p1_p2 = next(c for c in done.channels if (c.src, c.dst) == ("p1", "p2"))
    assert [(i.seq, i.amount) for i in p1_p2.in_flight] == [(3, 3), (4, 4), (6, 6), (7, 7)]
    assert done.status == COMPLETE and done.conserved


@pytest.mark.parametrize(
    ("run", "words"),
    [
        (dict(src="p1", dst="p2", seqs=[3, 4], payloads=[b"1"]), "2 seqs but 1 payloads"),
        (dict(src="p1", dst="p2", seqs=[4, 3], payloads=[b"1", b"1"]), "positive and increasing"),
        (dict(src="p1", dst="p2", seqs=[0, 3], payloads=[b"1", b"1"]), "positive and increasing"),
        (dict(src="p2", dst="p1", seqs=[3], payloads=[b"1"]), "outbox of p2->p1, not its own"),
    ],
)
def test_a_bad_outbox_run_is_refused_naming_the_channel_and_nothing_is_taken(run, words):
    t = bank.tracker(Topology.build(("p1", "p2"), None), expected_total=200, deadline_s=5, snapshot_mode="overtake")
    t.start("s1", "p1", at())
    bad = overtake_state(t, "s1", "p1", 100, {"p2": 0}, {})
    bad.outbox_runs.add(**run)
    with pytest.raises(InvalidReport, match=words):
        t.report(bad, at())
    # The same node's good report is still taken: the bad one changed nothing.
    t.report(overtake_state(t, "s1", "p1", 100, {"p2": 0}, {}), at())


def test_a_report_in_another_snapshot_mode_is_refused_naming_the_field():
    t = tracker()
    t.start("s1", "p1", at())
    with pytest.raises(InvalidReport, match="snapshot_mode 'overtake', the controller 'classic'"):
        t.report(overtake_state(t, "s1", "p1", 100, {"p2": 0, "p3": 0}, {}), at())
    with pytest.raises(InvalidReport, match="one position per incoming channel"):
        t2 = bank.tracker(t.topology, expected_total=300, deadline_s=5, snapshot_mode="overtake")
        t2.start("s1", "p1", at())
        t2.report(overtake_state(t2, "s1", "p1", 100, {"p2": 0}, {}), at())


def test_snapshot_id_stamps_match_the_time_module_utc_formatting():
    # The tracker formats UTC itself (the pure layer has no time module): it must
    # agree with time.strftime(gmtime) across leap years, century rules and the epoch.
    import random
    import time

    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    samples = [0, 59, 86_399, 86_400, 951_782_400, 4_107_542_399, 4_107_542_400, 1_709_164_800]
    samples += [rng.randrange(0, 10**10) for _ in range(2_000)]
    for seconds in samples:
        expected = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
        assert new_snapshot_id(seconds, b"\x01").startswith(expected + ".000000Z-"), (seed, seconds)
