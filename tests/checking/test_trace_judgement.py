"""`check_trace` judges each snapshot with `cut.check_snapshot` (the trace read as
logs) and says the problems in its own words: a hand-written two-node trace passes,
and each planted error is named by the message of the rule that catches it (so
each test fails if that judgement is taken away)."""

from __future__ import annotations

from typing import Any

import pytest

from snapmesh.bank.trace import BANK, BankTrace
from snapmesh.checking.trace import InvariantViolation, check_trace

# B starts s1 while A's transfer m1 of 10 is on the wire: m1 is in flight on A->B.
HONEST: list[dict[str, Any]] = [
    {"event": "node", "node": "A", "balance": 100},
    {"event": "node", "node": "B", "balance": 100},
    {"event": "channel", "src": "A", "dst": "B"},
    {"event": "channel", "src": "B", "dst": "A"},
    {"event": "send", "node": "A", "pos": 1, "dst": "B", "msg": "m1", "amount": 10},
    {"event": "cut", "node": "B", "pos": 10, "snapshot": "s1", "balance": 100},
    {"event": "marker_sent", "node": "B", "pos": 11, "dst": "A", "snapshot": "s1"},
    {"event": "marker_received", "node": "A", "pos": 2, "src": "B", "snapshot": "s1"},
    {"event": "cut", "node": "A", "pos": 3, "snapshot": "s1", "balance": 90},
    {"event": "marker_sent", "node": "A", "pos": 4, "dst": "B", "snapshot": "s1"},
    {"event": "channel_recorded", "snapshot": "s1", "src": "B", "dst": "A", "msgs": [], "amounts": []},
    {"event": "completed", "node": "A", "snapshot": "s1"},
    {"event": "receive", "node": "B", "pos": 12, "src": "A", "msg": "m1", "amount": 10},
    {"event": "marker_received", "node": "B", "pos": 13, "src": "A", "snapshot": "s1"},
    {"event": "channel_recorded", "snapshot": "s1", "src": "A", "dst": "B", "msgs": ["m1"], "amounts": [10]},
    {"event": "completed", "node": "B", "snapshot": "s1"},
]


def trace(*changes: tuple[int, dict[str, Any]], extra: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """HONEST with event i updated by each (i, fields), plus `extra` events."""
    events = [dict(e) for e in HONEST]
    for i, fields in changes:
        events[i] = {**events[i], **fields}
    return events + list(extra)


def problems(events: list[dict[str, Any]], **kwargs: Any) -> list[str]:
    with pytest.raises(InvariantViolation) as info:
        check_trace(events, **{"app": BANK, **kwargs})
    return str(info.value).splitlines()


RECORDED_AB = 14
CUT_A = 8
CUT_B = 5


def test_the_honest_trace_passes() -> None:
    report = check_trace(trace(), app=BANK)
    assert report.snapshots == {"s1": True} and report.transfers == 1


@pytest.mark.parametrize("require_complete", [True, False])
def test_a_receive_before_the_receivers_cut_of_a_send_after_the_senders_cut(require_complete: bool) -> None:
    # A pays m2 after its cut; B takes it before its own cut (and counts it in its balance).
    events = trace(
        (CUT_B, {"balance": 105}),
        extra=({"event": "send", "node": "A", "pos": 5, "dst": "B", "msg": "m2", "amount": 5},
               {"event": "receive", "node": "B", "pos": 9, "src": "A", "msg": "m2", "amount": 5}),
    )
    said = problems(events, require_complete=require_complete)
    assert "snapshot s1: transfer m2 was sent after A's cut but received before B's cut" in said


def test_a_recorded_transfer_sent_after_the_cut() -> None:
    events = trace(
        (RECORDED_AB, {"msgs": ["m1", "m2"], "amounts": [10, 5]}),
        extra=({"event": "send", "node": "A", "pos": 5, "dst": "B", "msg": "m2", "amount": 5},
               {"event": "receive", "node": "B", "pos": 14, "src": "A", "msg": "m2", "amount": 5}),
    )
    said = problems(events)
    assert "snapshot s1: transfer m2 was sent after A's cut but is recorded in flight" in said


def test_a_recorded_transfer_sent_after_the_cut_with_no_cut_at_the_receiver() -> None:
    # B has no cut (only its recording): "after A's cut" is then A's positions alone.
    events = [e for i, e in enumerate(trace(
        (RECORDED_AB, {"msgs": ["m1", "m2"], "amounts": [10, 5]}),
        extra=({"event": "send", "node": "A", "pos": 5, "dst": "B", "msg": "m2", "amount": 5},
               {"event": "receive", "node": "B", "pos": 14, "src": "A", "msg": "m2", "amount": 5}),
    )) if i != CUT_B]
    said = problems(events, require_complete=False)
    assert "snapshot s1: transfer m2 was sent after A's cut but is recorded in flight" in said


def test_a_missing_in_flight_transfer() -> None:
    said = problems(trace((RECORDED_AB, {"msgs": [], "amounts": []})))
    assert "snapshot s1: A->B recorded []; sent before A's cut and received after B's cut: [('m1', 10)]" in said
    assert "snapshot s1: recorded balances + in-flight = 190, but the total is 200" in said


def test_an_open_recording_is_not_judged_until_its_receiver_completes() -> None:
    events = [e for e in trace((RECORDED_AB, {"msgs": [], "amounts": []})) if e != HONEST[-1]]
    said = problems(events, require_complete=False)
    assert not [line for line in said if "recorded []" in line]
    assert "snapshot s1: recorded balances + in-flight = 190, but the total is 200" in said


def test_money_not_conserved() -> None:
    said = problems(trace((RECORDED_AB, {"amounts": [11]})))
    assert "snapshot s1: recorded balances + in-flight = 201, but the total is 200" in said


def test_a_recorded_balance_the_trace_does_not_give() -> None:
    said = problems(trace((CUT_A, {"balance": 95})))
    assert "snapshot s1: A recorded 95, but its trace before the cut gives 90" in said


def test_a_recorded_transfer_never_sent_and_a_channel_the_topology_lacks() -> None:
    said = problems(trace(
        (RECORDED_AB, {"msgs": ["m1", "ghost"], "amounts": [10, 0]}),
        extra=({"event": "channel_recorded", "snapshot": "s1", "src": "A", "dst": "C", "msgs": [], "amounts": []},),
    ))
    assert "snapshot s1: A->B records transfer ghost, which was never sent" in said
    assert "snapshot s1: recorded a state for A->C, which the topology lacks" in said


class _Overdrawn(BankTrace):
    """The bank's rules but for one: a balance may go below zero (an app part of its own)."""

    @staticmethod
    def history_problems(node: str, initial: int, history: Any) -> list[str]:
        return []


def test_the_app_part_is_a_parameter() -> None:
    # A's transfer of 150 overdraws it: the bank's part says so; an app part that allows it does not.
    events = trace((0, {"balance": 100}), (4, {"amount": 150}), (8, {"balance": -50}), (12, {"amount": 150}),
                   (14, {"amounts": [150]}))
    assert problems(events) == ["node A: balance -50 < 0 after position 1"]
    assert check_trace(events, app=_Overdrawn()).snapshots == {"s1": True}
    assert check_trace(trace(), app=BANK).snapshots == {"s1": True}
