"""The machine answers a TriggerSnapshot that waits (W1), as it answers restores (R5)."""

from __future__ import annotations

from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, Now
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

T0 = Now(mono=100.0, wall=1_700_000_000.0)


def machine() -> M.Controller:
    return M.Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=30))


def state(sid: str, node: str, balance: int) -> pb.FullState:
    other = "b" if node == "a" else "a"
    return bank.report(sid, node, balance, channels=[pb.ChannelState(src=other, dst=node)])


def test_a_waiting_trigger_is_answered_right_after_the_outcomes_record_and_only_then() -> None:
    m = machine()
    m.trigger("s1", "a", T0, call=7)
    m.trigger("s2", "a", T0)  # nobody waits for this one
    assert not [e for e in m.drain() if isinstance(e, M.AnswerTrigger)]
    m.reported(state("s1", "a", 60), T0)
    assert not [e for e in m.drain() if isinstance(e, M.AnswerTrigger)]
    m.reported(state("s1", "b", 40), T0)
    effects = m.drain()
    kinds = [type(e) for e in effects]
    at = kinds.index(M.AnswerTrigger)
    assert kinds[at - 1] is M.Journal and isinstance(effects[at - 1].record, R.Finished), \
        "answered before the outcome was journaled"
    assert kinds[at + 1] is M.Finished, "not answered first of all the end does (W1)"
    answer = effects[at]
    assert answer.calls == (7,) and answer.outcome.status == COMPLETE
    m.reported(state("s2", "a", 60), T0)
    m.reported(state("s2", "b", 40), T0)
    assert not [e for e in m.drain() if isinstance(e, M.AnswerTrigger)], "a trigger nobody waits for was answered"


def test_a_waiting_trigger_is_answered_a_failed_snapshot_once() -> None:
    m = machine()
    m.trigger("s1", "a", T0, call="c")
    m.drain()
    m.tick(Now(mono=T0.mono + 31, wall=T0.wall + 31))
    (answer,) = [e for e in m.drain() if isinstance(e, M.AnswerTrigger)]
    assert answer.calls == ("c",) and answer.outcome.status == FAILED
    m.start_failed("s1", "late", T0)
    assert not [e for e in m.drain() if isinstance(e, M.AnswerTrigger)]


def test_a_waiting_trigger_whose_answer_was_not_carried_out_is_answered_the_error() -> None:
    m = machine()
    m.trigger("s1", "a", T0, call=1)
    error = OSError("disk full")
    m.unjournaled(m.drain(), error, T0)  # J1: the start is not durable, the snapshot fails
    effects = m.drain()
    (answer,) = [e for e in effects if isinstance(e, M.AnswerTrigger)]
    assert answer.outcome.status == FAILED and "cannot journal the start" in answer.outcome.reason
    m.unjournaled(effects, error, T0)  # J3: nor was its end
    assert m.drain() == [M.AnswerTrigger((1,), error)]


def test_a_refused_trigger_waits_for_nothing() -> None:
    m = machine()
    try:
        m.trigger("s1", "zz", T0, call=1)
    except M.UnknownInitiator:
        pass
    assert m.drain() == [] and m._waiting == {}
