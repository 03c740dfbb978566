"""The reports a node's log holds (wal.Report), read back at start-up to be sent again.

A small finished part (its state up to reportblocks.INLINE_BYTES) is kept in the
transfer log itself: a `report` record right before the marker_recv that finished
it (`upto`: what it rests on), made durable by that round's one fdatasync, with no
file and no syncfs on the report's path (reporter.py). A log cut short after the
marker_recv holds it; one cut short before that marker_recv's lsn is not sent (the
marker comes again and the part is taken again). A seal carries the ones not yet acknowledged into the
next segment's checkpoint (`reports`), so the active segment holds them all: its
checkpoint's, then its `report` records, less those an `abort` record after them
dropped. One the controller took already may be among them (a report is not
marked taken in the log until the next seal leaves it out); the controller answers
a repeated report for good, as it did a pending-report file that came back.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import DecodeError

from snapmesh.protocol import wal
from snapmesh.v1 import snapmesh_pb2 as pb

# The kinds read; any other line is skipped unparsed (a segment is mostly sends and receipts).
_READ = (b'"kind":"report"', b'"kind":"checkpoint"', b'"kind":"abort"')


class CorruptLoggedReportError(ValueError):
    """A `report` record's FullState does not parse; the message names it (file:line)."""


def logged_reports(path: Path, node_id: str) -> list[tuple[pb.FullState, int, str]]:
    """The log's pending reports at `path` (the active segment) as (message, the lsn it
    rests on, its record's fullstate), oldest first; the caller drops those resting on
    records the log does not hold (StateReporter.resume). Raises CorruptLoggedReportError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    found: dict[str, tuple[str, int, str]] = {}  # snapshot id -> (fullstate, lsn, where)
    lines, _torn = wal.split_lines(data, str(path))
    for where, raw in lines:
        if not any(kind in raw for kind in _READ):
            continue
        record = wal.parse(raw, where, node_id=node_id)
        kind = type(record)
        if kind is wal.Checkpoint:
            for snapshot_id, text in record.reports.items():  # type: ignore[attr-defined]
                found[snapshot_id] = (text, record.lsn, where)
        elif kind is wal.Report and record.fullstate:  # type: ignore[attr-defined]
            found[record.snapshot_id] = (record.fullstate, record.upto, where)  # type: ignore[attr-defined]
        elif kind is wal.Abort:
            found.pop(record.snapshot_id, None)  # type: ignore[attr-defined]
    out = []
    for snapshot_id, (text, lsn, where) in found.items():
        message = pb.FullState()
        try:
            message.ParseFromString(wal.unpack(text, where))
        except (DecodeError, wal.CorruptRecord) as exc:
            raise CorruptLoggedReportError(f"{where}: the report of snapshot {snapshot_id!r} does not parse ({exc})") \
                from None
        if message.snapshot_id != snapshot_id:
            raise CorruptLoggedReportError(f"{where}: a report of snapshot {message.snapshot_id!r}, not {snapshot_id!r}")
        out.append((message, lsn, text))
    return out
