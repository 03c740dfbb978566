"""Who a restore answers, and a record that cannot be made durable (the controller
machine's R5 and J1-J3): every RestoreSnapshot call that starts or joins a restore
is answered by an AnswerRestore effect, once what it shows is durable; a record the
journal cannot keep ends its step, and the machine answers what it would have shown."""

from __future__ import annotations

from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller import restoregate
from snapmesh.protocol.controller.tracker import Now
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

T0 = Now(mono=100.0, wall=1_700_000_000.0)
FULL = OSError(28, "No space left on device")


def machine() -> M.Controller:
    return M.Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=5.0))


def part(sid: str, node: str, balance: int) -> pb.FullState:
    return bank.report(sid, node, balance,
                       channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)])


def kinds(effects: list[M.Effect]) -> list[str]:
    return [type(e).__name__ + (f":{type(e.record).__name__}" if isinstance(e, M.Journal) else "") for e in effects]


def complete(m: M.Controller) -> pb.Snapshot:
    """s1, COMPLETE (60 at a, 40 at b), its effects drained."""
    m.trigger("s1", "a", T0)
    m.reported(part("s1", "a", 60), T0)
    snapshot, _ = m.reported(part("s1", "b", 40), T0)
    m.drain()
    return snapshot


def _both_nodes(m: M.Controller) -> pb.Restore:
    m.node_restored("a", pb.RestoreStateResponse(), T0)
    return m.node_restored("b", pb.RestoreStateResponse(), T0)


def test_the_calls_that_start_or_join_a_running_restore_are_answered_when_it_settles() -> None:
    m = machine()
    target = complete(m)
    assert isinstance(m.restore(target, "k1", T0, call=1), restoregate.Start)
    assert m.restore(target, "k2", T0, call=2) == restoregate.Join("s1", "k2")
    assert m.restore(target, "", T0, call=3) == restoregate.Join("s1")
    assert not any(isinstance(e, M.AnswerRestore) for e in m.drain())
    done = _both_nodes(m)
    assert kinds(m.drain()) == ["Journal:Restored", "RestoreDone"]  # nobody answered before the outcome is durable
    m.restore_settled()
    assert m.drain() == [M.AnswerRestore((1, 2, 3), done)]
    m.restore_settled()
    assert m.drain() == []  # each call once


def test_a_call_that_joins_a_restore_that_ended_is_answered_after_the_records_before_it() -> None:
    m = machine()
    target = complete(m)
    m.restore(target, "k1", T0, call=1)
    done = _both_nodes(m)
    m.drain()
    assert m.restore(target, "k2", T0, call=2) == restoregate.Join("s1", "k2")
    assert kinds(m.drain()) == ["Journal:Joined", "AnswerRestore"]  # after its own record, itself after the outcome's
    m.restore(target, "", T0, call=3)
    assert m.drain() == [M.Barrier(), M.AnswerRestore((3,), done)]
    m.restore_settled()
    assert m.drain() == [M.AnswerRestore((1,), done)]
    m.restore(target, "k2", T0, call=4)  # a retry once settled: its answer at once, nothing rolled back
    assert m.drain() == [M.AnswerRestore((4,), done)] and m.epoch == 2


def test_a_refused_call_is_never_answered_by_the_machine() -> None:
    m = machine()
    complete(m)
    assert isinstance(m.restore(None, "k9", T0, snapshot_id="s9", call=1), restoregate.Refuse)
    assert m.drain() == []


def test_a_start_that_cannot_be_journaled_fails_the_snapshot_j1() -> None:
    m = machine()
    m.trigger("s1", "a", T0)
    effects = m.drain()
    m.unjournaled(effects, FULL, T0)
    failed = m.get("s1")
    assert failed.status == pb.Snapshot.FAILED and failed.reason == f"cannot journal the start: {FULL}"


def test_a_restore_whose_record_cannot_be_journaled_answers_its_calls_the_error_j2() -> None:
    for cut_at in ("start", "end"):
        m = machine()
        target = complete(m)
        m.restore(target, "k1", T0, call=1)
        m.restore(target, "k2", T0, call=2)
        effects = m.drain()
        if cut_at == "end":
            _both_nodes(m)
            effects = m.drain()
        at = next(i for i, e in enumerate(effects) if isinstance(e, M.Journal) and isinstance(e.record, R.Restored))
        m.unjournaled(effects[at:], FULL, T0)
        assert m.drain() == [M.AnswerRestore((1, 2), FULL)], cut_at
        answer = m.restore(target, "k1", T0, call=3)  # settled: a retry of its key gets the restore as it was
        assert isinstance(answer, restoregate.Answer) and answer.result == m.last_restore


def test_a_join_whose_record_cannot_be_journaled_answers_that_call_the_error_only_j3() -> None:
    m = machine()
    target = complete(m)
    m.restore(target, "k1", T0, call=1)
    m.drain()
    m.restore(target, "k2", T0, call=2)
    m.unjournaled(m.drain(), FULL, T0)
    assert m.drain() == [M.AnswerRestore((2,), FULL)]
    done = _both_nodes(m)
    m.drain()
    m.restore(target, "", T0, call=3)  # joins the ended restore: its Barrier fails, so does its answer
    m.unjournaled(m.drain(), FULL, T0)
    assert m.drain() == [M.AnswerRestore((3,), FULL)]
    m.restore_settled()
    assert m.drain() == [M.AnswerRestore((1,), done)]


def test_what_is_not_a_start_a_restore_a_join_or_an_answer_changes_nothing() -> None:
    m = machine()
    m.trigger("s1", "a", T0)
    m.drain()
    m.reported(part("s1", "a", 60), T0)
    m.unjournaled(m.drain(), FULL, T0)
    assert m.drain() == [] and m.get("s1").status == pb.Snapshot.IN_PROGRESS
