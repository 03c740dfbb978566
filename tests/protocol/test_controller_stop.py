"""Stop with a snapshot on the controller machine (snapmesh/protocol/controller/stopping.py, ST1-ST5):
fences first, the snapshot at every node once all are fenced, STOP at its COMPLETE, LIFT at a failure."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.stopping import FENCE, LIFT, STOP, FenceAt, StopFailed, StopRefused
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, Now
from snapmesh.protocol.retry import Failed
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

T0 = Now(mono=100.0, wall=1_700_000_000.0)
ENTROPY = bytes(8)
CALL = "the stop's call"


def machine() -> M.Controller:
    return M.Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=5.0))


def fences(effects: list) -> list[tuple[str, int]]:
    return [(e.node, e.step) for e in effects if isinstance(e, FenceAt)]


def part(sid: str, node: str, balance: int) -> pb.FullState:
    other = "b" if node == "a" else "a"
    return bank.report(sid, node, balance, channels=[pb.ChannelState(src=other, dst=node)])


def all_fenced(m: M.Controller, sid: str) -> list:
    for node in ("a", "b"):
        m.called(FenceAt(node, sid, FENCE), None, T0)
    return m.drain()


def test_every_node_is_fenced_before_the_snapshot_starts_at_every_node_then_stops_at_its_complete() -> None:
    m = machine()
    sid = m.stop("a", T0, ENTROPY, call=CALL)
    effects = m.drain()
    assert fences(effects) == [("a", FENCE), ("b", FENCE)]
    assert {e.request.lift_after_ms for e in effects} == {2 * (5 + 15 + 5) * 1000}  # ST6: with a 5 s deadline
    assert m.ids() == []  # ST2: nothing starts before every fence is answered
    m.called(FenceAt("a", sid, FENCE), None, T0)
    assert m.drain() == [] and m.ids() == []
    effects = all_fenced(m, sid)
    assert [e.node for e in effects if isinstance(e, M.StartAt)] == ["a", "b"]  # B1: at every node
    m.reported(part(sid, "a", 60), T0)
    m.reported(part(sid, "b", 40), T0)
    effects = m.drain()
    assert fences(effects) == [("a", STOP), ("b", STOP)]
    assert not any(isinstance(e, M.AnswerTrigger) for e in effects)  # answered once the nodes stopped
    m.called(FenceAt("a", sid, STOP), None, T0)
    m.called(FenceAt("b", sid, STOP), None, T0)
    (answer,) = m.drain()
    assert answer.calls == (CALL,) and answer.outcome.status == COMPLETE and answer.outcome.snapshot_id == sid
    assert m.stopping.under_way == ""


def test_a_snapshot_that_fails_lifts_every_fence_and_answers_the_failed_snapshot() -> None:
    m = machine()
    sid = m.stop("", T0, ENTROPY, call=CALL)
    m.drain()
    all_fenced(m, sid)
    m.tick(Now(mono=T0.mono + 10, wall=T0.wall + 10))  # past its deadline
    effects = m.drain()
    assert fences(effects) == [("a", LIFT), ("b", LIFT)]
    answer = next(e for e in effects if isinstance(e, M.AnswerTrigger))
    assert answer.outcome.status == FAILED
    assert m.stopping.under_way == ""


def test_a_fence_that_fails_lifts_the_others_and_starts_no_snapshot() -> None:
    m = machine()
    sid = m.stop("a", T0, ENTROPY, call=CALL)
    m.drain()
    m.called(FenceAt("a", sid, FENCE), None, T0)
    m.called(FenceAt("b", sid, FENCE), Failed("UNAVAILABLE", "connection refused"), T0)
    effects = m.drain()
    assert fences(effects) == [("a", LIFT), ("b", LIFT)] and m.ids() == []
    answer = next(e for e in effects if isinstance(e, M.AnswerTrigger))
    assert isinstance(answer.outcome, StopFailed)
    assert "cannot fence b: UNAVAILABLE: connection refused" in str(answer.outcome)
    assert "the cluster runs and accepts commands again" in str(answer.outcome)


def test_a_stop_while_a_restore_runs_or_another_stop_is_under_way_is_refused_changing_nothing() -> None:
    m = machine()
    m.trigger("s1", "a", T0)
    m.reported(part("s1", "a", 60), T0)
    target, _ = m.reported(part("s1", "b", 40), T0)
    m.restore(target, "k1", T0)
    m.drain()
    with pytest.raises(StopRefused, match=r"^a restore to s1 is running: stop with a snapshot once it ends$"):
        m.stop("a", T0, ENTROPY, call=CALL)
    assert m.drain() == [] and m.stopping.under_way == ""

    other = machine()
    sid = other.stop("a", T0, ENTROPY, call=CALL)
    other.drain()
    with pytest.raises(StopRefused, match=f"a stop with snapshot {sid} is under way"):
        other.stop("a", T0, ENTROPY, call="another")
    assert other.drain() == []


def test_an_unknown_initiator_is_refused_before_anything() -> None:
    m = machine()
    with pytest.raises(M.UnknownInitiator):
        m.stop("zz", T0, ENTROPY, call=CALL)
    assert m.drain() == [] and m.stopping.under_way == ""


def test_a_restarted_controller_forgets_the_stop_its_snapshot_ends_as_an_ordinary_one() -> None:
    """ST7, as documented: the stop is not journaled; its snapshot's Started record is, so a
    restarted controller finishes the snapshot, but sends no STOP (the fences lift at their time)."""
    m = machine()
    sid = m.stop("a", T0, ENTROPY, call=CALL)
    m.drain()
    records = [e.record for e in all_fenced(m, sid) if isinstance(e, M.Journal)]
    restarted = machine()
    restarted.replayed(records, T0)
    assert restarted.stopping.under_way == "" and restarted.status(sid) == pb.Snapshot.IN_PROGRESS
    restarted.reported(part(sid, "a", 60), T0)
    restarted.reported(part(sid, "b", 40), T0)
    effects = restarted.drain()
    assert restarted.status(sid) == COMPLETE and fences(effects) == []
    assert restarted.stop("a", T0, bytes([1] * 8), call=CALL) != sid, "a new stop may begin: it is a new snapshot"
