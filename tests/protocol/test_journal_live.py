"""LiveFrames (snapmesh/protocol/controller/journal.py): which journal frames still matter
and when the file is rewritten with only them, without a file."""

from __future__ import annotations

from snapmesh.protocol.controller import journal as R


def _frames() -> tuple[bytes, list[R.Record]]:
    records = [R.Started(snapshot_id=sid, initiator="p1", wall=1000.0, epoch=1) for sid in ("a", "b", "a")]
    return b"".join(R.encode(r) for r in records), records


def test_every_frame_read_starts_live_under_its_snapshot() -> None:
    data, records = _frames()
    live = R.LiveFrames(rotate_bytes=1 << 20)
    live.read(data, records)
    assert live.size == live.bytes == len(data)
    assert live.rewritten() == R.encode(records[0]) + R.encode(records[2]) + R.encode(records[1])  # by snapshot
    live.forget("a")
    assert live.rewritten() == R.encode(records[1]) and live.bytes == len(R.encode(records[1]))
    live.forget("a")  # twice, or a snapshot with no frame: nothing changes
    live.forget("zz")
    assert live.bytes == len(R.encode(records[1]))


def test_the_file_is_rewritten_once_past_the_bound_and_mostly_dead() -> None:
    data, records = _frames()
    live = R.LiveFrames(rotate_bytes=len(data) - 1)
    live.read(data, records)
    assert not live.rewrite_due()  # past the bound, all live
    live.forget("b")
    assert not live.rewrite_due()  # two thirds live
    live.forget("a")
    assert live.rewrite_due() and live.rewritten() == b""
    live.appended("c", b"x" * 10)
    assert live.bytes == 10 and live.rewritten() == b"x" * 10
    big = R.LiveFrames(rotate_bytes=1 << 20)
    big.read(data, records)
    big.forget("a")
    big.forget("b")
    assert not big.rewrite_due()  # all dead, but a small file is not worth a rewrite


def test_a_write_appends_its_frames_and_forgets_the_filed_in_order() -> None:
    data, records = _frames()
    live = R.LiveFrames(rotate_bytes=1 << 20)
    live.read(data, records)
    out = live.take([("c", b"xyz"), ("", b""), ("a", None), ("a", b"q")])  # a frame, a barrier, filed, a late frame
    assert out == b"xyzq" and live.size == len(data) + 4
    assert live.rewritten() == R.encode(records[1]) + b"xyz" + b"q"


def test_a_failure_breaks_the_journal_for_good_with_its_first_error() -> None:
    data, records = _frames()
    live = R.LiveFrames(rotate_bytes=1)
    live.read(data, records)
    live.forget("a")
    live.forget("b")
    assert live.broken is None and live.rewrite_due()
    first = OSError(28, "No space left on device")
    live.failed(first)
    live.failed(OSError(5, "Input/output error"))  # a later one does not replace it
    assert live.broken is first, "a later append would not be answered with the error that broke the journal"
    assert not live.rewrite_due(), "a broken journal would be rewritten"


def test_after_a_rewrite_the_file_holds_the_live_frames_only() -> None:
    data, records = _frames()
    live = R.LiveFrames(rotate_bytes=1)
    live.read(data, records)
    live.forget("a")
    assert live.rewrite_due()
    live.rewrote()
    assert live.size == live.bytes == len(live.rewritten()) and not live.rewrite_due()
