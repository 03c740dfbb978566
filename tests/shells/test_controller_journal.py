"""The controller's journal file and its replay, without a network: frames, a torn
tail, the rewrite that drops filed snapshots, and the tracker rebuilt from records."""

from __future__ import annotations

import asyncio

from snapmesh.services.controller import journal as J
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, IN_PROGRESS, Now, Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

NODES = ("p1", "p2")


def report(sid: str, node: str, balance: int, amounts=()) -> pb.FullState:
    src = "p2" if node == "p1" else "p1"
    return bank.report(sid, node, balance, {src: bank.items(src, node, amounts)})


RECORDS = [
    R.Started(snapshot_id="a", initiator="p1", wall=1000.0),
    R.Reported(state=report("a", "p1", 60, [5]), wall=1000.1),
    R.Started(snapshot_id="b", initiator="p2", wall=1000.2),
    R.Reported(state=report("a", "p2", 35), wall=1000.3),
    R.Finished(snapshot_id="a", status=COMPLETE, reason="", wall=1000.3),
    R.Reported(state=report("b", "p2", 40), wall=1000.4),
    R.Started(snapshot_id="c", initiator="p1", wall=1000.5),
    R.Finished(snapshot_id="c", status=FAILED, reason="initiator p1 unreachable", wall=1000.6),
]


def tracker() -> Tracker:
    return bank.tracker(Topology.build(NODES, None), expected_total=100, deadline_s=5)


def live_tracker() -> Tracker:
    """The same history, as the servicer drove it live."""
    t = tracker()
    t.start("a", "p1", Now(1.0, 1000.0))
    t.report(report("a", "p1", 60, [5]), Now(1.1, 1000.1))
    t.start("b", "p2", Now(1.2, 1000.2))
    t.report(report("a", "p2", 35), Now(1.3, 1000.3))
    t.report(report("b", "p2", 40), Now(1.4, 1000.4))
    t.start("c", "p1", Now(1.5, 1000.5))
    t.fail("c", "initiator p1 unreachable", Now(1.6, 1000.6))
    return t


def test_records_round_trip_and_a_torn_or_corrupt_tail_ends_the_journal():
    data = b"".join(R.encode(r) for r in RECORDS)
    records, good, problem = R.decode_all(data)
    assert records == RECORDS and good == len(data) and problem is None
    last = len(R.encode(RECORDS[-1]))
    for cut in (1, 7, last - 1):  # a crash mid-write
        records, good, problem = R.decode_all(data[:-cut])
        assert records == RECORDS[:-1] and good == len(data) - last and "torn" in problem
    flipped = bytearray(data)
    flipped[-2] ^= 0xFF
    records, good, problem = R.decode_all(bytes(flipped))
    assert records == RECORDS[:-1] and "checksum" in problem


def test_replay_rebuilds_exactly_what_was_answered():
    rebuilt = tracker()
    finished, warnings = R.replay(RECORDS, rebuilt, Now(mono=500.0, wall=2000.0), skip=set())
    assert finished == ["a", "c"] and warnings == []
    assert rebuilt.all() == live_tracker().all()
    assert rebuilt.get("a").status == COMPLETE and rebuilt.get("b").status == IN_PROGRESS
    # a snapshot already filed is left alone
    skipped = tracker()
    R.replay(RECORDS, skipped, Now(mono=500.0, wall=2000.0), skip={"a"})
    assert [s.snapshot_id for s in skipped.all()] == ["b", "c"]


def test_the_file_survives_reopening_cuts_a_torn_tail_and_drops_filed_snapshots_when_rewritten(tmp_path):
    path = tmp_path / "journal"

    async def write(records, *, rotate_bytes=1 << 30, forget=()):
        journal = J.Journal(path, rotate_bytes=rotate_bytes)
        found, warnings = journal.open()
        for sid in forget:
            journal.forget(sid)
        await asyncio.gather(*(journal.append(r) for r in records))
        await journal.close()
        return found, warnings

    assert asyncio.run(write(RECORDS[:4])) == ([], [])
    with path.open("ab") as f:  # a crash in the middle of the next frame
        f.write(R.encode(RECORDS[4])[:9])
    found, warnings = asyncio.run(write(RECORDS[4:]))
    assert found == RECORDS[:4] and "torn" in warnings[0]
    found, warnings = asyncio.run(write([]))
    assert found == RECORDS and warnings == []
    # "a" and "c" are filed: a tiny rotation threshold makes the next sync rewrite the file
    found, _ = asyncio.run(write([R.Reported(state=report("b", "p1", 60), wall=1000.7)], rotate_bytes=1, forget="ac"))
    found, warnings = asyncio.run(write([]))
    assert {r.snapshot_id for r in found} == {"b"} and warnings == []
    assert len(found) == 3  # b's start, its two reports


def test_restore_records_round_trip_set_the_epoch_and_the_newest_one_is_resumed():
    restoring = pb.Restore(snapshot_id="a", epoch=2, status=pb.Restore.RESTORING)
    restored = pb.Restore(
        snapshot_id="a", epoch=2, status=pb.Restore.RESTORED, nodes=[pb.NodeBalance(node_id="p1", balance=60)]
    )
    records = [
        *RECORDS[:5],
        R.Restored(restore=restoring),
        R.Started(snapshot_id="d", initiator="p2", wall=1001.0, epoch=2),
        R.Restored(restore=restored),
    ]
    decoded, _, problem = R.decode_all(b"".join(R.encode(r) for r in records))
    assert decoded == records and problem is None
    assert R.Restored(restore=restoring).snapshot_id == "restore@2"  # its own journal key, never filed
    rebuilt = tracker()
    R.replay(decoded, rebuilt, Now(mono=500.0, wall=2000.0), skip=set())
    assert rebuilt.epoch == 2 and rebuilt.get("d").epoch == 2 and rebuilt.get("a").epoch == 1
    assert R.last_restore(decoded) == restored
    assert R.last_restore(decoded[:-2]) == restoring  # a crash mid-restore: resumed from this one
    assert R.last_restore(RECORDS) is None


def test_the_live_byte_count_is_kept_per_write_and_matches_the_frames_and_the_rewritten_file(tmp_path):
    """The live size is kept as frames come and go (no sum over every
    snapshot not yet filed on each write); it must equal that sum, before and
    after a rewrite, and be the rewritten file's size."""
    path = tmp_path / "journal"

    def summed(journal: J.Journal) -> int:
        return len(journal._live.rewritten())

    async def run():
        journal = J.Journal(path)
        journal.open()
        await asyncio.gather(*(journal.append(r) for r in RECORDS))
        assert journal._live.bytes == summed(journal) == path.stat().st_size
        journal.forget("a")
        await journal.barrier()
        assert journal._live.bytes == summed(journal) < path.stat().st_size
        await journal.close()
        reopened = J.Journal(path, rotate_bytes=1)  # every frame live again until forgotten
        reopened.open()
        assert reopened._live.bytes == summed(reopened) == path.stat().st_size
        for sid in ("a", "b", "c"):  # every frame read comes back live, "a"'s too
            reopened.forget(sid)  # only the next frame stays live: under half the file, so it is rewritten
        await reopened.append(R.Reported(state=report("b", "p1", 60), wall=1000.7))
        await reopened.barrier()  # the rewrite runs after the append's waiters heard, before the next round
        assert reopened._live.bytes == summed(reopened) == path.stat().st_size
        await reopened.close()

    asyncio.run(run())


def test_joined_records_round_trip_and_go_with_their_restore_oldest_first():
    first = pb.Restore(snapshot_id="a", epoch=2, status=pb.Restore.RESTORED, request_id="k1")
    second = pb.Restore(snapshot_id="b", epoch=3, status=pb.Restore.RESTORING, request_id="k3")
    records = [
        R.Restored(restore=pb.Restore(snapshot_id="a", epoch=2, status=pb.Restore.RESTORING, request_id="k1")),
        R.Joined(request_id="k2", epoch=2),
        R.Restored(restore=first),
        R.Restored(restore=second),
        R.Joined(request_id="k4", epoch=3),
        R.Joined(request_id="k5", epoch=3),
        R.Joined(request_id="lost", epoch=9),
    ]
    decoded, _, problem = R.decode_all(b"".join(R.encode(r) for r in records))
    assert decoded == records and problem is None
    assert R.Joined(request_id="k2", epoch=2).snapshot_id == "restore@2"  # kept with its restore, never filed
    restores, warnings = R.restores(decoded)
    assert restores == [(first, ["k2"]), (second, ["k4", "k5"])]
    assert warnings == ["journal: key 'lost' joined no restore of epoch 9; ignored"]
    rebuilt = tracker()
    assert R.replay(decoded, rebuilt, Now(mono=500.0, wall=2000.0), skip=set()) == ([], [])
    assert rebuilt.epoch == 3


def test_a_failed_sync_breaks_the_journal_and_every_later_append_fails_with_its_error(tmp_path, monkeypatch) -> None:
    path = tmp_path / "journal"

    async def run() -> tuple[list[str], int]:
        journal = J.Journal(path)
        journal.open()
        await journal.append(RECORDS[0])
        size = path.stat().st_size

        def full(fd: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(J.os, "fdatasync", full)
        answers = []
        for record in RECORDS[1:3]:
            try:
                await journal.append(record)
            except OSError as exc:
                answers.append(exc.strerror)
        monkeypatch.undo()
        try:
            await journal.barrier()
        except OSError as exc:
            answers.append(exc.strerror)
        await journal.close()
        return answers, size

    answers, size = asyncio.run(run())
    assert answers == ["No space left on device"] * 3, "an append after the failure was answered otherwise"
    # The failing round's bytes reached the file before its sync failed; nothing after them.
    assert path.stat().st_size == size + len(R.encode(RECORDS[1])), "the journal wrote after it broke"


def test_close_writes_what_is_queued_and_is_safe_when_the_journal_never_opened(tmp_path) -> None:
    path = tmp_path / "journal"

    async def run() -> list[asyncio.Future[None]]:
        await J.Journal(path).close()  # never opened: nothing to end, no file
        journal = J.Journal(path)
        journal.open()
        queued = [journal.append(r) for r in RECORDS]  # nobody waits: close must still write them
        await journal.close()
        return queued

    queued = asyncio.run(run())
    assert all(f.done() and f.exception() is None for f in queued), "close ended the writer before the queue"
    assert R.decode_all(path.read_bytes())[0] == RECORDS


def test_a_writer_that_fails_with_a_bug_fails_its_waiters_instead_of_hanging_them(tmp_path, monkeypatch) -> None:
    async def run() -> list[str]:
        journal = J.Journal(tmp_path / "journal")
        journal.open()
        monkeypatch.setattr(J.os, "fdatasync", lambda fd: 1 / 0)  # not an OSError: a bug in the write path
        answers = []
        for record in RECORDS[:2]:
            try:
                await asyncio.wait_for(journal.append(record), 5)
            except OSError as exc:
                answers.append(str(exc))
        monkeypatch.undo()
        await journal.close()
        return answers

    assert asyncio.run(run()) == ["journal writer failed: ZeroDivisionError('division by zero')"] * 2
