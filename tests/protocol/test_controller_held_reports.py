"""Reports held until their snapshot ends (held.py H1-H4): one log round per snapshot."""

from __future__ import annotations

from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, Now
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

T0 = Now(mono=100.0, wall=1_700_000_000.0)
NODES = ["a", "b", "c"]


def machine() -> M.Controller:
    return M.Controller(bank.tracker(Topology.build(NODES, None), expected_total=90, deadline_s=30))


def state(sid: str, node: str) -> pb.FullState:
    return bank.report(sid, node, 30,
                       channels=[pb.ChannelState(src=o, dst=node) for o in NODES if o != node])


def started(m: M.Controller, sid: str = "s1") -> None:
    m.trigger(sid, "a", T0)
    m.drain()


def test_a_report_with_a_call_that_does_not_complete_is_held_journaling_and_showing_nothing() -> None:
    m = machine()
    started(m)
    m.reported(state("s1", "a"), T0, call="ca")
    assert m.drain() == [] and m.holding("ca")
    m.reported(state("s1", "b"), T0, call="cb")
    assert m.drain() == [] and m.holding("cb")


def test_the_completing_report_journals_every_held_report_then_the_end_in_one_step_then_answers() -> None:
    m = machine()
    started(m)
    m.reported(state("s1", "a"), T0, call="ca")
    m.reported(state("s1", "b"), T0, call="cb")
    m.reported(state("s1", "c"), T0, call="cc")
    assert not m.holding("cc"), "the completing report is answered by its own step, not held"
    effects = m.drain()
    records = [e.record for e in effects if isinstance(e, M.Journal)]
    assert sorted(r.state.node_id for r in records if isinstance(r, R.Reported)) == NODES
    assert isinstance(records[-1], R.Finished) and records[-1].status == COMPLETE
    kinds = [type(e) for e in effects]
    (answer,) = [e for e in effects if isinstance(e, M.AnswerReport)]
    assert kinds.index(M.AnswerReport) > max(i for i, k in enumerate(kinds) if k is M.Journal)
    assert sorted(answer.calls) == ["ca", "cb"] and answer.outcome is None
    assert not m.holding("ca") and not m.holding("cb")


def test_the_journal_of_a_held_snapshot_replays_to_the_same_complete_snapshot() -> None:
    m = machine()
    started(m)
    log = [R.Started(snapshot_id="s1", initiator="a", wall=T0.wall)]
    for node in NODES:
        m.reported(state("s1", node), T0, call=node)
    log += [e.record for e in m.drain() if isinstance(e, M.Journal)]
    again = machine()
    done = again.replayed(log, T0)
    assert "s1" in done.finished and again.status("s1") == COMPLETE


def test_a_repeat_of_a_held_report_joins_its_calls() -> None:
    m = machine()
    started(m)
    m.reported(state("s1", "a"), T0, call=1)
    m.reported(state("s1", "a"), T0, call=2)  # the node's call timed out; it tried again
    assert m.drain() == [], "a repeat of a held report has no record to wait for"
    assert m.holding(2)
    m.reported(state("s1", "b"), T0, call=3)
    m.reported(state("s1", "c"), T0, call=4)
    (answer,) = [e for e in m.drain() if isinstance(e, M.AnswerReport)]
    assert sorted(answer.calls) == [1, 2, 3]


def test_a_snapshot_that_fails_drops_its_held_reports_and_answers_after_failed_is_journaled() -> None:
    m = machine()
    started(m)
    m.reported(state("s1", "a"), T0, call="ca")
    m.tick(Now(mono=T0.mono + 31, wall=T0.wall + 31))
    effects = m.drain()
    records = [e.record for e in effects if isinstance(e, M.Journal)]
    assert [type(r) for r in records] == [R.Finished] and records[0].status == FAILED
    kinds = [type(e) for e in effects]
    assert kinds.index(M.AnswerReport) > kinds.index(M.Journal)
    assert not m.holding("ca")


def test_held_calls_whose_end_was_not_journaled_are_answered_the_error() -> None:
    m = machine()
    started(m)
    m.reported(state("s1", "a"), T0, call="ca")
    m.reported(state("s1", "b"), T0, call="cb")
    m.reported(state("s1", "c"), T0, call="cc")
    error = OSError("disk full")
    m.unjournaled(m.drain(), error, T0)
    answers = [e for e in m.drain() if isinstance(e, M.AnswerReport)]
    assert len(answers) == 1 and answers[0].outcome is error and sorted(answers[0].calls) == ["ca", "cb"]


def test_a_report_without_a_call_is_journaled_at_once_as_before() -> None:
    m = machine()
    started(m)
    m.reported(state("s1", "a"), T0)
    kinds = [type(e) for e in m.drain()]
    assert kinds == [M.Journal, M.Publish]


def test_the_completing_report_is_journaled_after_the_held_ones_so_a_replay_completes_at_it() -> None:
    """The snapshot's finish time and statistics come from the report that completed
    it: a replay that met a held report last would complete at that one instead."""
    m = machine()
    started(m)
    m.reported(state("s1", "a"), T0, call="ca")
    m.reported(state("s1", "b"), Now(mono=T0.mono + 1, wall=T0.wall + 1), call="cb")
    m.reported(state("s1", "c"), Now(mono=T0.mono + 2, wall=T0.wall + 2), call="cc")
    records = [e.record for e in m.drain() if isinstance(e, M.Journal)]
    assert [r.state.node_id for r in records if isinstance(r, R.Reported)] == ["a", "b", "c"]
    again = machine()
    again.replayed([R.Started(snapshot_id="s1", initiator="a", wall=T0.wall), *records], T0)
    assert again.get("s1") == m.get("s1")
