"""The controller machine (snapmesh/protocol/controller/machine.py): events in, effects out, no I/O.

The gRPC engine and the fault simulator drive this object; these tests drive it
by hand and read the effects it asks for, in order. The cluster runs the bank app
(tests/support/bank_reports.py): balances and amounts travel as bytes.
"""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import restoregate, restoreplan
from snapmesh.protocol.topology import Topology
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, IN_PROGRESS, Now, UnknownSnapshot
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

T0 = Now(mono=100.0, wall=1_700_000_000.0)


def machine(deadline_s: float = 5.0) -> M.Controller:
    topology = Topology.build(["a", "b"], None)
    return M.Controller(bank.tracker(topology, expected_total=100, deadline_s=deadline_s))


def part(sid: str, node: str, balance: int, in_flight: list[int] = ()) -> pb.FullState:
    other = "b" if node == "a" else "a"
    return bank.report(sid, node, balance, {other: bank.items(other, node, in_flight)})


def kinds(effects: list[M.Effect]) -> list[str]:
    return [type(e).__name__ + (f":{type(e.record).__name__}" if isinstance(e, M.Journal) else "") for e in effects]


def complete(m: M.Controller, sid: str = "s1") -> pb.Snapshot:
    m.trigger(sid, "a", T0)
    m.reported(part(sid, "a", 60), T0)
    snapshot, _ = m.reported(part(sid, "b", 30, [10]), T0)
    m.drain()
    return snapshot


def test_a_trigger_journals_the_start_before_it_is_shown_or_sent() -> None:
    m = machine()
    snapshot = m.trigger("s1", "a", T0)
    effects = m.drain()
    assert kinds(effects) == ["Journal:Started", "Publish", "StartAt"]
    assert effects[0].record == R.Started(snapshot_id="s1", initiator="a", wall=T0.wall, epoch=1)
    assert effects[2] == M.StartAt("a", "s1", 1)
    assert snapshot.status == IN_PROGRESS and m.drain() == []


def test_reports_journal_then_publish_and_the_last_one_finishes_in_the_same_step() -> None:
    m = machine()
    m.trigger("s1", "a", T0)
    m.drain()
    m.reported(part("s1", "a", 60), T0)
    assert kinds(m.drain()) == ["Journal:Reported", "Publish"]
    snapshot, duplicate = m.reported(part("s1", "b", 30, [10]), T0)
    assert not duplicate and snapshot.status == COMPLETE and snapshot.conserved
    effects = m.drain()
    assert kinds(effects) == ["Journal:Reported", "Journal:Finished", "Finished"]
    assert effects[1].record.status == COMPLETE
    # a repeat of a report already taken changes nothing, but waits for the first copy's record
    assert m.reported(part("s1", "a", 60), T0).duplicate
    assert kinds(m.drain()) == ["Barrier"]


def test_a_refused_report_asks_for_nothing() -> None:
    m = machine()
    m.trigger("s1", "a", T0)
    m.drain()
    with pytest.raises(M.TrackerError, match="node 'c' is not in the topology"):
        m.reported(part("s1", "c", 60), T0)
    assert m.drain() == []


def test_a_tick_past_the_deadline_fails_and_journals_the_outcome() -> None:
    m = machine(deadline_s=5.0)
    m.trigger("s1", "a", T0)
    m.drain()
    assert m.next_deadline() == T0.mono + 5.0
    assert (m.timer(T0.mono + 1.0), m.timer(T0.mono + 9.0), machine().timer(T0.mono)) == (4.0, 0.0, None)
    assert m.tick(Now(mono=T0.mono + 4.9, wall=T0.wall)) == [] and m.drain() == []
    [failed] = m.tick(Now(mono=T0.mono + 5.0, wall=T0.wall + 5))
    assert failed.status == FAILED and "no report from a, b" in failed.reason
    effects = m.drain()
    assert kinds(effects) == ["Journal:Finished", "Finished", "AbortAt", "AbortAt"]  # persist, show, then send
    assert effects[2:] == [M.AbortAt("a", "s1", failed.reason), M.AbortAt("b", "s1", failed.reason)]


def test_start_failed_fails_once() -> None:
    m = machine()
    m.trigger("s1", "a", T0)
    m.drain()
    assert m.start_failed("s1", "initiator a unreachable", T0).reason == "initiator a unreachable"
    assert kinds(m.drain()) == ["Journal:Finished", "Finished", "AbortAt", "AbortAt"]
    assert m.start_failed("s1", "again", T0) is None and m.drain() == []


def test_a_restore_moves_the_epoch_fails_what_runs_and_journals_restoring_before_any_node_hears() -> None:
    m = machine()
    target = complete(m)
    m.trigger("s2", "b", T0)
    m.drain()
    decision = m.restore(target, "k1", T0)
    assert isinstance(decision, restoregate.Start)
    assert m.epoch == 2 and M.stale_report(1, m.epoch) and not M.stale_report(2, m.epoch) and not M.stale_report(0, 2)
    effects = m.drain()
    assert kinds(effects) == [
        "Journal:Finished", "Finished", "AbortAt", "AbortAt", "Journal:Restored", "RestoreAt", "RestoreAt"
    ]
    assert effects[1].snapshot.reason == "restored to s1"
    assert effects[4].record.restore.status == pb.Restore.RESTORING
    parts = {e.node: e.request for e in effects if isinstance(e, M.RestoreAt)}
    assert parts["a"].state == b"60" and parts["b"].state == b"30" and parts["b"].epoch == 2
    assert [t.payload for c in parts["b"].channels for t in c.in_flight] == [b"10"]
    # a second call joins, another snapshot is busy, and the same key is not answered before the outcome is durable
    assert isinstance(m.restore(target, "k1", T0), restoregate.Join)
    assert m.node_restored("a", pb.RestoreStateResponse(epoch=2), T0) is None
    done = m.node_restored("b", pb.RestoreStateResponse(epoch=2), T0)
    assert done.status == pb.Restore.RESTORED and [n.balance for n in done.nodes] == [60, 40]
    assert kinds(m.drain()) == ["Journal:Restored", "RestoreDone"]
    assert isinstance(m.restore(target, "k1", T0), restoregate.Join)
    m.restore_settled()
    answer = m.restore(target, "k1", T0)
    assert isinstance(answer, restoregate.Answer) and answer.result == done and m.epoch == 2
    assert m.last_restore == done


def test_a_node_that_cannot_take_its_part_fails_the_restore_and_names_it() -> None:
    m = machine()
    target = complete(m)
    m.restore(target, "", T0)
    m.drain()
    m.node_restored("b", "UNAVAILABLE: down", T0)
    done = m.node_restored("a", pb.RestoreStateResponse(epoch=2), T0)
    assert done.status == pb.Restore.FAILED
    assert done.reason == "not restored on b: UNAVAILABLE: down (the cluster is fenced at epoch 2)"


def test_a_snapshot_that_cannot_be_restored_is_refused_and_nothing_changes() -> None:
    m = machine()
    m.trigger("s1", "a", T0)
    running = m.trigger("s2", "a", T0)
    m.drain()
    decision = m.restore(running, "", T0)
    assert isinstance(decision, restoregate.Refuse) and "IN_PROGRESS, not COMPLETE" in decision.message
    assert m.epoch == 1 and m.drain() == []


def test_the_journal_replayed_gives_back_the_epoch_and_resumes_a_restore_under_way() -> None:
    m = machine()
    target = complete(m)
    m.restore(target, "k1", T0)
    journaled = [e.record for e in m.drain() if isinstance(e, M.Journal)]
    records = [
        R.Started(snapshot_id="s1", initiator="a", wall=T0.wall),
        R.Reported(state=part("s1", "a", 60), wall=T0.wall),
        R.Reported(state=part("s1", "b", 30, [10]), wall=T0.wall),
        R.Finished(snapshot_id="s1", status=COMPLETE, reason="", wall=T0.wall),
        *journaled,
    ]
    again = machine()
    replayed = again.replayed(records, T0)
    assert (replayed.finished, replayed.warnings, again.epoch) == (["s1"], [], 2)
    assert again.to_resume == "s1"  # the machine names the restore to run again, not a shell (issue 33)
    assert again.drain() == [M.File(again.get("s1"))]  # finished in the journal only: filed (replay.py S3)
    assert isinstance(again.restore(target, "k1", T0), restoregate.Join)  # the key's restore runs
    again.resume(again.tracker.get("s1"))
    assert kinds(again.drain()) == ["RestoreAt", "RestoreAt"]  # RESTORING is already durable
    assert again.to_resume == ""


def test_a_replay_whose_newest_restore_ended_resumes_nothing() -> None:
    m = machine()
    target = complete(m)
    m.restore(target, "k1", T0)
    records = [e.record for e in m.drain() if isinstance(e, M.Journal)]
    answer = pb.RestoreStateResponse(epoch=2)
    m.node_restored("a", answer, T0)
    m.node_restored("b", answer, T0)
    records += [e.record for e in m.drain() if isinstance(e, M.Journal)]
    again = machine()
    again.replayed(
        [R.Started(snapshot_id="s1", initiator="a", wall=T0.wall), R.Reported(state=part("s1", "a", 60), wall=T0.wall),
         R.Reported(state=part("s1", "b", 30, [10]), wall=T0.wall),
         R.Finished(snapshot_id="s1", status=COMPLETE, reason="", wall=T0.wall), *records],
        T0,
    )
    assert again.last_restore.status == pb.Restore.RESTORED and again.to_resume == ""


def test_a_report_of_an_older_epoch_is_refused_by_the_machine_changing_nothing() -> None:
    m = machine()
    target = complete(m)
    m.restore(target, "", T0)
    m.drain()
    started = m.trigger("s2", "a", T0)
    m.drain()
    assert started.epoch == 2
    old = part("s2", "a", 60)
    old.epoch = 1
    with pytest.raises(M.StaleReport, match="a report from epoch 1; the cluster is in epoch 2") as refused:
        m.reported(old, T0)
    assert isinstance(refused.value, M.TrackerError)  # the shells map it with the tracker's refusals
    assert m.drain() == [] and m.tracker.get("s2").status == IN_PROGRESS
    copy = part("s1", "b", 30, [10])  # a late copy of a report the COMPLETE snapshot took: refused too
    copy.epoch = 1
    with pytest.raises(M.StaleReport):
        m.reported(copy, T0)
    current, unknown = part("s2", "a", 60), part("s2", "b", 40)
    current.epoch = 2  # the cluster's epoch, or 0 (a node that does not say): taken
    m.reported(current, T0)
    snapshot, _ = m.reported(unknown, T0)
    assert snapshot.status == COMPLETE


def test_a_trigger_at_the_admission_limit_is_refused_and_starts_nothing() -> None:
    topology = Topology.build(["a", "b"], None)
    m = M.Controller(bank.tracker(topology, expected_total=100, deadline_s=5.0), max_concurrent=2)
    m.trigger("s1", "a", T0)
    m.trigger("s2", "b", T0)
    m.drain()
    with pytest.raises(M.TooManySnapshots, match="^2 snapshots in progress, the limit is 2$"):
        m.trigger("s3", "a", T0)
    assert m.drain() == [] and m.tracker.ids() == ["s1", "s2"]
    named = M.Controller(bank.tracker(topology, expected_total=100, deadline_s=5.0), max_concurrent=1, cluster_file="c.toml")
    named.trigger("s1", "a", T0)
    with pytest.raises(M.TooManySnapshots) as refused:  # the machine says how to raise the limit, not a shell
        named.trigger("s2", "a", T0)
    assert str(refused.value) == ("1 snapshots in progress, the limit is 1 (controller.max_concurrent_snapshots in c.toml, "
                                  "or snapmesh controller --max-concurrent-snapshots N); retry once one finishes")
    m.start_failed("s1", "initiator a unreachable", T0)  # one ends: the next is admitted
    m.drain()
    m.trigger("s3", "a", T0)
    assert m.tracker.in_progress == 2
    unlimited = machine()
    for n in range(50):
        unlimited.trigger(f"s{n}", "a", T0)
    assert unlimited.tracker.in_progress == 50
    with pytest.raises(ValueError, match="max_concurrent must not be negative, got -1"):
        M.Controller(unlimited.tracker, max_concurrent=-1)


def test_the_read_api_answers_from_the_tracker_without_changing_anything() -> None:
    m = machine()
    done = complete(m, "s1")
    m.trigger("s2", "b", T0)
    m.drain()
    assert m.ids() == ["s1", "s2"] and [s.snapshot_id for s in m.all()] == ["s1", "s2"]
    assert (m.status("s1"), m.status("s2"), m.in_progress) == (COMPLETE, IN_PROGRESS, 1)
    copy = m.get("s1")
    assert copy == done
    copy.total = -1  # a copy: the machine's snapshot is not touched
    assert m.get("s1").total == done.total
    with pytest.raises(UnknownSnapshot):
        m.get("nope")
    m.filed("s1")  # an event: within the working set, nothing leaves memory; its records are dead
    assert m.get("s1") == done and m.drain() == [M.Forget("s1")]


def test_a_restore_of_a_missing_snapshot_is_refused_by_the_gate_which_alone_checks_the_key() -> None:
    m = machine()
    target = complete(m)
    refused = m.restore(None, "k0", T0, snapshot_id="gone")
    assert refused == restoregate.Refuse("NOT_FOUND", "no snapshot 'gone'") and m.epoch == 1
    too_long = m.restore(None, "x" * 200, T0, snapshot_id="gone")
    assert isinstance(too_long, restoregate.Refuse) and too_long.code == "INVALID_ARGUMENT"
    done = _restored(m, target, "k1")
    m.drain()
    assert m.restore(None, "k1", T0, snapshot_id="s1") == restoregate.Answer(done)  # its file gone since
    assert m.epoch == 2 and m.drain() == []
    with pytest.raises(ValueError, match="no snapshot and no snapshot_id"):
        m.restore(None, "k1", T0)
    with pytest.raises(ValueError, match="is not the snapshot's"):
        m.restore(target, "k1", T0, snapshot_id="s9")


def _restored(m: M.Controller, target: pb.Snapshot, key: str) -> pb.Restore:
    """Run a restore of `target` under `key` to its end; its records are in the journal list."""
    assert isinstance(m.restore(target, key, T0), restoregate.Start)
    m.node_restored("a", pb.RestoreStateResponse(epoch=2), T0)
    done = m.node_restored("b", pb.RestoreStateResponse(epoch=2), T0)
    m.restore_settled()
    return done


def _journal(m: M.Controller) -> list[R.Record]:
    return [e.record for e in m.drain() if isinstance(e, M.Journal)]


def _s1() -> list[R.Record]:
    """The journal of `complete(m, "s1")`."""
    return [
        R.Started(snapshot_id="s1", initiator="a", wall=T0.wall),
        R.Reported(state=part("s1", "a", 60), wall=T0.wall),
        R.Reported(state=part("s1", "b", 30, [10]), wall=T0.wall),
        R.Finished(snapshot_id="s1", status=COMPLETE, reason="", wall=T0.wall),
    ]


def test_a_key_that_joined_a_restore_is_journaled_and_answered_by_it_after_a_restart() -> None:
    """Issue 33, bug 1: K2 joins K1's running restore; a retry of K2 after the end, and
    after a controller restart, gets that restore's answer and rolls nothing back."""
    m = machine()
    target = complete(m)
    records = _s1()
    assert isinstance(m.restore(target, "k1", T0), restoregate.Start)
    records += _journal(m)
    joined = m.restore(target, "k2", T0)
    assert joined == restoregate.Join("s1", "k2")
    effects = m.drain()
    assert kinds(effects) == ["Journal:Joined"] and effects[0].record == R.Joined(request_id="k2", epoch=2)
    records.append(effects[0].record)
    assert m.restore(target, "k2", T0) == restoregate.Join("s1") and m.drain() == []  # known now: nothing more
    m.node_restored("a", pb.RestoreStateResponse(epoch=2), T0)
    done = m.node_restored("b", pb.RestoreStateResponse(epoch=2), T0)
    records += _journal(m)
    m.restore_settled()
    assert m.restore(target, "k2", T0) == restoregate.Answer(done) and m.epoch == 2
    again = machine()
    assert again.replayed(records, T0).warnings == []
    assert again.drain() == [M.File(again.get("s1"))]  # the replay files s1 (replay.py S3)
    assert again.restore(again.tracker.get("s1"), "k2", T0) == restoregate.Answer(done)
    assert again.epoch == 2 and again.drain() == []


def test_a_key_that_joins_after_the_outcome_but_before_it_is_durable_gets_that_outcome() -> None:
    m = machine()
    target = complete(m)
    records = _s1()
    m.restore(target, "k1", T0)
    m.node_restored("a", pb.RestoreStateResponse(epoch=2), T0)
    done = m.node_restored("b", pb.RestoreStateResponse(epoch=2), T0)
    records += _journal(m)  # RESTORED is journaled, not yet durable: the gate still runs it
    assert m.restore(target, "k5", T0) == restoregate.Join("s1", "k5")
    records += _journal(m)
    assert records[-1] == R.Joined(request_id="k5", epoch=2)
    m.restore_settled()
    assert m.restore(target, "k5", T0) == restoregate.Answer(done)
    again = machine()
    again.replayed(records, T0)
    assert again.restore(target, "k5", T0) == restoregate.Answer(done) and again.epoch == 2


def test_a_key_that_joined_a_restore_under_way_at_a_restart_joins_it_again() -> None:
    m = machine()
    target = complete(m)
    records = _s1()
    m.restore(target, "k1", T0)
    m.restore(target, "k2", T0)
    records += _journal(m)  # the controller dies here, mid-restore
    again = machine()
    again.replayed(records, T0)
    assert again.drain() == [M.File(again.get("s1"))]  # the replay files s1 (replay.py S3)
    assert again.restore(target, "k2", T0) == restoregate.Join("s1") and again.drain() == []
    assert isinstance(again.restore(target, "k9", T0), restoregate.Join)


def test_after_a_restart_every_kept_restore_key_is_answered_not_only_the_newest() -> None:
    """Issue 33, bug 2: a client retrying K1 after a later restore (K3) and a controller
    restart rolled the cluster back to K1's snapshot again."""
    m = machine()
    s1 = complete(m, "s1")
    first = _restored(m, s1, "k1")
    s2 = complete(m, "s2")
    second = _restored(m, s2, "k3")
    records = [*_s1(), R.Restored(restore=first), R.Restored(restore=second)]
    again = machine()
    again.replayed(records, T0)
    assert again.drain() == [M.File(again.get("s1"))]  # the replay files s1 (replay.py S3)
    assert again.epoch == 3 and again.last_restore == second
    assert again.restore(again.tracker.get("s1"), "k1", T0) == restoregate.Answer(first)
    assert again.epoch == 3 and again.drain() == []


def test_a_replay_takes_back_the_snapshots_in_progress_with_a_fresh_deadline_from_the_restart() -> None:
    """S1: the machine's replay, not a shell, gives each snapshot still in progress a whole
    deadline from the restart; one whose reports do not come in fails "controller restarted"."""
    records = [
        *_s1(),
        R.Started(snapshot_id="s2", initiator="a", wall=T0.wall),
        R.Reported(state=part("s2", "a", 60), wall=T0.wall),
        R.Started(snapshot_id="s3", initiator="b", wall=T0.wall),
    ]
    again = machine(deadline_s=5.0)
    restart = Now(mono=T0.mono + 100.0, wall=T0.wall + 100.0)  # long past the journaled starts
    replayed = again.replayed(records, restart)
    assert replayed == M.Replayed(finished=["s1"], in_progress=["s2", "s3"], warnings=[])
    assert again.next_deadline() == restart.mono + 5.0 and again.drain() == [M.File(again.get("s1"))]
    assert again.tick(Now(mono=restart.mono + 4.9, wall=restart.wall + 4.9)) == []
    again.reported(part("s2", "b", 30, [10]), restart)  # a node sends its report again: s2 completes
    assert again.get("s2").status == COMPLETE
    expired = again.tick(Now(mono=restart.mono + 5.0, wall=restart.wall + 5.0))
    assert [s.snapshot_id for s in expired] == ["s3"] and expired[0].status == FAILED
    assert expired[0].reason.startswith("controller restarted; ") and "within 5s of the restart" in expired[0].reason
    assert machine().replayed(_s1(), restart).in_progress == []  # nothing in progress: nothing taken back


def test_after_a_restart_the_window_keeps_the_newest_keys() -> None:
    restores = [
        (pb.Restore(snapshot_id="s1", epoch=e, status=pb.Restore.RESTORED, request_id=f"k{e}"), [f"j{e}"])
        for e in (2, 3)
    ]
    m = M.Controller(machine().tracker, keys_kept=3)
    m.taken_back(restores)
    assert list(m.gate._by_key) == ["j2", "k3", "j3"]  # oldest first; k2 went first
    assert m.epoch == 3 and m.last_restore == restores[-1][0]


def test_plan_and_problem() -> None:
    m = machine()
    target = complete(m)
    assert restoreplan.problem(target) == ""
    assert set(restoreplan.plan(target, 3)) == {"a", "b"}
    target.conserved = False
    assert "not conserved" in restoreplan.problem(target)


def _kept(keep: int) -> M.Controller:
    topology = Topology.build(["a", "b"], None)
    return M.Controller(bank.tracker(topology, expected_total=100, deadline_s=5.0), keep=keep)


def _complete_effects(m: M.Controller, sid: str) -> list[M.Effect]:
    m.trigger(sid, "a", T0)
    m.reported(part(sid, "a", 60), T0)
    m.drain()
    m.reported(part(sid, "b", 30, [10]), T0)
    return m.drain()


def test_retention_retires_past_the_n_newest_complete_after_the_finish_each_once_never_the_restored() -> None:
    m = _kept(2)
    assert [kinds(_complete_effects(m, sid)) for sid in ("s1", "s2")][-1] == ["Journal:Reported", "Journal:Finished", "Finished"]
    m.trigger("s3", "a", T0)
    m.start_failed("s3", "initiator down", T0)  # a FAILED one goes too once two newer COMPLETE ones are kept
    m.drain()
    effects = _complete_effects(m, "s4")
    assert kinds(effects) == ["Journal:Reported", "Journal:Finished", "Finished", "Retire"]  # after the outcome
    assert effects[-1] == M.Retire("s1")
    assert m.restore(m.get("s2"), "k", T0) and m.drain()  # s2 is the one last restored: it stays
    m.node_restored("a", pb.RestoreStateResponse(epoch=2), T0)
    m.node_restored("b", pb.RestoreStateResponse(epoch=2), T0)
    m.restore_settled()
    m.drain()
    assert [e for e in _complete_effects(m, "s5") if isinstance(e, M.Retire)] == [M.Retire("s3")]
    assert [e for e in _complete_effects(m, "s6") if isinstance(e, M.Retire)] == [M.Retire("s4")]  # not s1 again
    with pytest.raises(ValueError, match="keep must not be negative"):
        _kept(-1)


def test_retention_runs_once_after_a_restart_over_everything_replayed() -> None:
    records: list[R.Record] = []  # the journal of three COMPLETE snapshots
    for sid in ("s1", "s2", "s3"):
        records += [
            R.Started(snapshot_id=sid, initiator="a", wall=T0.wall),
            R.Reported(state=part(sid, "a", 60), wall=T0.wall),
            R.Reported(state=part(sid, "b", 30, [10]), wall=T0.wall),
            R.Finished(snapshot_id=sid, status=COMPLETE, reason="", wall=T0.wall),
        ]
    again = _kept(1)
    again.replayed(records, T0)
    assert again.drain() == [M.File(again.get("s3")), M.Retire("s1"), M.Retire("s2")]
    none = _kept(0)
    none.replayed(records, T0)
    assert none.drain() == [M.File(none.get(sid)) for sid in ("s1", "s2", "s3")]  # keep 0: every file stays


def test_every_refused_report_names_its_status_code():
    from snapmesh.protocol.controller.machine import StaleReport
    from snapmesh.protocol.controller.tracker import DuplicateReport, InvalidReport, NotInProgress, UnknownSnapshot

    codes = {kind: kind.code for kind in (UnknownSnapshot, InvalidReport, DuplicateReport, NotInProgress, StaleReport)}
    assert codes == {
        UnknownSnapshot: "NOT_FOUND", InvalidReport: "INVALID_ARGUMENT", DuplicateReport: "ALREADY_EXISTS",
        NotInProgress: "FAILED_PRECONDITION", StaleReport: "FAILED_PRECONDITION",
    }


def test_a_trigger_naming_no_node_is_refused_before_admission_and_starts_nothing() -> None:
    topology = Topology.build(["a", "b"], None)
    m = M.Controller(bank.tracker(topology, expected_total=100, deadline_s=5.0), max_concurrent=1)
    with pytest.raises(M.UnknownInitiator, match=r"^unknown initiator 'zz' \(nodes: a, b\)$") as refused:
        m.trigger("s1", "zz", T0)
    assert refused.value.code == "INVALID_ARGUMENT" and m.drain() == [] and m.tracker.ids() == []
    m.trigger("s1", "a", T0)
    with pytest.raises(M.UnknownInitiator):  # A2 before A1: at the limit, the name is what is wrong
        m.trigger("s2", "", T0)
    assert M.TooManySnapshots.code == "RESOURCE_EXHAUSTED"


def test_a_restart_files_again_only_what_retention_keeps() -> None:
    records: list[R.Record] = []
    for sid in ("s2", "s4"):  # finished in the journal only
        records += [
            R.Started(snapshot_id=sid, initiator="a", wall=T0.wall),
            R.Reported(state=part(sid, "a", 60), wall=T0.wall),
            R.Reported(state=part(sid, "b", 30, [10]), wall=T0.wall),
            R.Finished(snapshot_id=sid, status=COMPLETE, reason="", wall=T0.wall),
        ]
    source, again = _kept(0), _kept(2)
    for sid in ("s1", "s3"):  # filed: loaded from their files before the replay
        _complete_effects(source, sid)
    again.loaded([source.get("s1"), source.get("s3")])
    replayed = again.replayed(records, T0)
    assert again.drain() == [M.Forget("s3"), M.File(again.get("s4")), M.Retire("s1"), M.Retire("s2")]
    assert (replayed.finished, replayed.filed) == (["s4"], ["s3"])  # retired: neither filed again nor kept
    assert _kept(0).replayed(records, T0).finished == ["s2", "s4"]


def test_a_client_start_names_its_snapshot_in_start_order_and_draws_an_initiator_only_when_none_is_given() -> None:
    from snapmesh.protocol.controller.snapshot_ids import snapshot_id_problem

    topology = Topology.build(["a", "b", "c"], None)
    m = M.Controller(bank.tracker(topology, expected_total=100, deadline_s=5.0))
    named = m.start("b", T0, bytes(8))
    drawn = [m.start("", T0, bytes([9, 9, 9, 255 - i, 0, 0, 0, i])) for i in range(30)]  # one wall clock for all
    ids = [named.snapshot_id, *(s.snapshot_id for s in drawn)]
    assert named.initiator == "b" and all(snapshot_id_problem(sid) == "" for sid in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # each after the last, whatever its random suffix
    assert [s.initiator for s in drawn] == [["a", "b", "c"][i % 3] for i in range(30)]  # the entropy draws the node
    assert drawn[0].snapshot_id.endswith("-090909ff")  # the first 4 bytes are the suffix
    assert m.tracker.ids() == sorted(ids)
    with pytest.raises(M.UnknownInitiator):  # a named initiator is checked as `trigger` checks it (A2)
        m.start("zz", T0, bytes(8))
