"""The controller's log lines of an effect (snapmesh/protocol/controller/loglines.py): the
words users grep, each at its level."""

from __future__ import annotations

from snapmesh.protocol.controller import loglines
from snapmesh.protocol.controller.effects import AbortAt, Finished, Publish, RestoreDone, StartAt
from snapmesh.protocol.controller.replay import Replayed
from snapmesh.protocol.retry import Failed
from snapmesh.v1 import snapmesh_pb2 as pb


def _snapshot(**fields) -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id="s1", total=100, **fields)
    snapshot.started_at.FromNanoseconds(1_000_000_000)
    snapshot.finished_at.FromNanoseconds(1_250_000_000)
    return snapshot


def test_a_finished_snapshot() -> None:
    complete = _snapshot(status=pb.Snapshot.COMPLETE, conserved=True)
    assert loglines.of(Finished(complete)) == ("INFO", "snapshot s1 COMPLETE in 0.250s: total 100, conserved")
    broken = _snapshot(status=pb.Snapshot.COMPLETE, conserved=False, reason="total 100, expected 90")
    assert loglines.of(Finished(broken)) == (
        "INFO", "snapshot s1 COMPLETE in 0.250s: total 100, NOT conserved (total 100, expected 90)")
    failed = _snapshot(status=pb.Snapshot.FAILED, reason="deadline 5s passed")
    assert loglines.of(Finished(failed)) == ("WARNING", "snapshot s1 FAILED: deadline 5s passed")


def test_a_finished_restore_and_nothing_else() -> None:
    restored = pb.Restore(snapshot_id="s1", epoch=3, status=pb.Restore.RESTORED)
    assert loglines.of(RestoreDone(restored)) == ("INFO", "restored s1 in epoch 3")
    failed = pb.Restore(snapshot_id="s1", epoch=3, status=pb.Restore.FAILED, reason="not restored on b: x")
    assert loglines.of(RestoreDone(failed)) == ("ERROR", "restore of s1: not restored on b: x")
    assert loglines.of(Publish(pb.Snapshot())) is None


def test_an_abort_given_up_on_and_no_other_call() -> None:
    down = Failed("UNAVAILABLE", "connection refused")
    assert loglines.called(AbortAt("b", "s1", "deadline"), down) == ("INFO", "AbortSnapshot s1 at b: UNAVAILABLE")
    assert loglines.called(AbortAt("b", "s1", "deadline"), pb.AbortSnapshotResponse()) is None
    assert loglines.called(StartAt("b", "s1", 1), down) is None  # the machine's: the snapshot fails, naming it


def test_the_snapshot_files_read_at_a_start() -> None:
    assert loglines.loaded(0, "/d/controller/snapshots", []) == []
    assert loglines.loaded(2, "/d/controller/snapshots", ["snapshot file x.pb: unreadable; skipped"]) == [
        ("WARNING", "snapshot file x.pb: unreadable; skipped"),
        ("INFO", "loaded 2 finished snapshot(s) from /d/controller/snapshots"),
    ]


def test_the_journal_read_back_at_a_start() -> None:
    assert loglines.replayed(Replayed(finished=[], in_progress=[], warnings=[]), []) == []
    taken = Replayed(finished=["s1"], in_progress=["s2", "s3"], warnings=["journal: skipping a reported record"])
    assert loglines.replayed(taken, ["journal j: torn frame at byte 9; keeping the 4 records before it"]) == [
        ("WARNING", "journal j: torn frame at byte 9; keeping the 4 records before it"),
        ("WARNING", "journal: skipping a reported record"),
        ("INFO", "journal: 1 finished snapshot(s) rebuilt, 2 still in progress taken back (s2, s3)"),
    ]
    assert loglines.replayed(Replayed(finished=["s1"], in_progress=[], warnings=[]), [])[-1] == (
        "INFO", "journal: 1 finished snapshot(s) rebuilt, 0 still in progress taken back (none)")


def test_a_periodic_snapshot_not_started() -> None:
    from snapmesh.protocol.controller.refusals import TooManySnapshots

    assert loglines.skipped(TooManySnapshots("2 snapshots in progress, the limit is 2")) == (
        "WARNING", "periodic snapshot skipped: 2 snapshots in progress, the limit is 2")
    assert loglines.skipped(OSError("disk full")) == ("ERROR", "periodic snapshot: disk full")
