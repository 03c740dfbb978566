"""The controller's journal: what it must not forget in a crash, made durable cheaply.

`<data_dir>/controller/journal`, append-only, one framed record per fact:

    started   a snapshot began        durable before TriggerSnapshot answers and
                                      before StartSnapshot leaves
    reported  a FullState was taken   durable before ReportState answers OK, so a
                                      node re-sends exactly what was never acknowledged
    finished  COMPLETE or FAILED      durable before anyone is shown the outcome
    restore   a restore's progress    RESTORING durable before any node is told,
                                      RESTORED/FAILED before the caller is answered;
                                      never forgotten (the epoch and the restore to
                                      resume after a crash come from these)

A COMPLETE snapshot is a pure function of its start and its reports, so these
three records are enough to rebuild every snapshot the controller ever answered
for (`replay` feeds them back to the tracker). The full snapshot file is written
later, in the background (`store.StoreWriter`); once it is, `forget` marks the
snapshot's records dead, and the file is rewritten with only the live ones when
it has grown past `ROTATE_BYTES` and is mostly dead.

Frame: u32 length, u32 CRC-32 of the payload, payload = kind byte + body. A
`started` or `finished` body is small JSON; a `reported` body is the wall time
(f64) then the FullState's protobuf bytes (the compact format: no per-entry
text). One thread writes: every append queued while an fdatasync runs goes into
the next one (group commit). A torn or corrupt frame (a crash mid-write) ends the
journal: reading stops there and the file is cut back to the last good frame.
After a failed write or fdatasync nothing more is written (retrying fsync is not
safe): every later append fails with the same error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from services.controller.tracker import COMPLETE, FAILED, Now, Tracker, TrackerError, TrackerMisuse
from snapmesh.serving.durable import fsync_dir
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

ROTATE_BYTES = 32 * 1024 * 1024
_HEADER = struct.Struct("<II")  # payload length, crc32
_WALL = struct.Struct("<d")
_STARTED, _REPORTED, _FINISHED, _RESTORE = b"S", b"R", b"F", b"X"


# ------------------------------------------------------------ records (pure)


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    snapshot_id: str
    initiator: str
    wall: float
    epoch: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Reported:
    state: pb.FullState
    wall: float

    @property
    def snapshot_id(self) -> str:
        return self.state.snapshot_id


@dataclass(frozen=True, slots=True, kw_only=True)
class Finished:
    snapshot_id: str
    status: int
    reason: str
    wall: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Restored:
    """A restore's state (issue 10): the whole pb.Restore, journaled at each step."""

    restore: pb.Restore

    @property
    def snapshot_id(self) -> str:  # the journal's key: one per epoch, never forgotten
        return f"restore@{self.restore.epoch}"


Record = Started | Reported | Finished | Restored


class CorruptJournal(Exception):
    pass


def encode(record: Record) -> bytes:
    if isinstance(record, Reported):
        payload = _REPORTED + _WALL.pack(record.wall) + record.state.SerializeToString()
    elif isinstance(record, Restored):
        payload = _RESTORE + record.restore.SerializeToString()
    elif isinstance(record, Started):
        body = {"id": record.snapshot_id, "initiator": record.initiator, "wall": record.wall, "epoch": record.epoch}
        payload = _STARTED + json.dumps(body).encode()
    else:
        body = {"id": record.snapshot_id, "status": record.status, "reason": record.reason, "wall": record.wall}
        payload = _FINISHED + json.dumps(body).encode()
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode_all(data: bytes) -> tuple[list[Record], int, str | None]:
    """The records of a journal, the length of its good prefix, and what ended it early."""
    records: list[Record] = []
    offset = 0
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            return records, offset, f"torn frame header at byte {offset}"
        length, crc = _HEADER.unpack_from(data, offset)
        start, end = offset + _HEADER.size, offset + _HEADER.size + length
        if end > len(data):
            return records, offset, f"torn frame at byte {offset} ({length} bytes announced, {len(data) - start} there)"
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            return records, offset, f"checksum mismatch in the frame at byte {offset}"
        try:
            records.append(_decode(payload))
        except (CorruptJournal, ValueError, KeyError, TypeError) as exc:
            return records, offset, f"unreadable frame at byte {offset}: {exc}"
        offset = end
    return records, offset, None


def _decode(payload: bytes) -> Record:
    kind, body = payload[:1], payload[1:]
    if kind == _REPORTED:
        (wall,) = _WALL.unpack_from(body)
        state = pb.FullState()
        state.ParseFromString(body[_WALL.size:])
        return Reported(state=state, wall=wall)
    if kind == _STARTED:
        fields = json.loads(body)
        return Started(
            snapshot_id=fields["id"], initiator=fields["initiator"], wall=float(fields["wall"]),
            epoch=int(fields.get("epoch", 1)),
        )
    if kind == _RESTORE:
        restore = pb.Restore()
        restore.ParseFromString(body)
        return Restored(restore=restore)
    if kind == _FINISHED:
        fields = json.loads(body)
        return Finished(
            snapshot_id=fields["id"], status=int(fields["status"]), reason=fields["reason"], wall=float(fields["wall"])
        )
    raise CorruptJournal(f"unknown record kind {kind!r}")


def last_restore(records: Iterable[Record]) -> pb.Restore | None:
    """The newest restore the journal holds (the highest epoch, its latest state)."""
    latest: pb.Restore | None = None
    for record in records:
        if isinstance(record, Restored) and (latest is None or record.restore.epoch >= latest.epoch):
            latest = record.restore
    return latest


def replay(records: Iterable[Record], tracker: Tracker, now: Now, *, skip: set[str]) -> tuple[list[str], list[str]]:
    """Feed the journal back to a tracker: every snapshot not in `skip` (already
    loaded from its file) is rebuilt as it was answered. Returns the ids of the
    snapshots finished here and the warnings for records that did not fit."""
    finished: list[str] = []
    warnings: list[str] = []
    for record in records:
        if isinstance(record, Restored):  # the epoch only; the restore itself is the restorer's
            tracker.epoch = max(tracker.epoch, record.restore.epoch)
            continue
        sid = record.snapshot_id
        if sid in skip:
            continue
        at = Now(mono=now.mono, wall=record.wall)
        try:
            if isinstance(record, Started):
                tracker.start(sid, record.initiator, at, epoch=record.epoch)
            elif isinstance(record, Reported):
                tracker.report(record.state, at)
            elif record.status == FAILED:
                tracker.fail(sid, record.reason, at)
                finished.append(sid)
            elif record.status == COMPLETE:
                if tracker.get(sid).status != COMPLETE:
                    warnings.append(f"journal: snapshot {sid} was answered COMPLETE but its reports do not complete it")
                    continue
                finished.append(sid)
        except (TrackerError, TrackerMisuse) as exc:
            warnings.append(f"journal: skipping a {type(record).__name__.lower()} record of snapshot {sid}: {exc}")
    return finished, warnings


# ------------------------------------------------------------------ the file


class Journal:
    """The journal file and its one writer thread. `append` and `forget` are
    called from the event loop; futures resolve there once the bytes are on disk."""

    def __init__(self, path: Path, *, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.path = Path(path)
        self.rotate_bytes = rotate_bytes
        self._fd = -1
        self._size = 0
        self._live: dict[str, list[bytes]] = {}  # snapshot id -> its frames, until filed
        self._live_bytes = 0  # their total size, kept as they come and go (not summed per write)
        self._queue: list[tuple[str, str, bytes, asyncio.Future[None] | None]] = []
        self._cond = threading.Condition()
        self._closing = False
        self._broken: OSError | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self) -> tuple[list[Record], list[str]]:
        """Read what is there (cutting off a torn tail), then start appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        records, good, problem = decode_all(data)
        warnings = []
        if problem is not None:
            warnings.append(f"journal {self.path}: {problem}; keeping the {len(records)} records before it")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        if good < len(data):
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
        os.lseek(self._fd, good, os.SEEK_SET)
        self._size = good
        offset = 0
        for record in records:  # every frame starts live; `forget` kills the filed ones
            length, _ = _HEADER.unpack_from(data, offset)
            end = offset + _HEADER.size + length
            self._live.setdefault(record.snapshot_id, []).append(data[offset:end])
            self._live_bytes += end - offset
            offset = end
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="controller-journal", daemon=True)
        self._thread.start()
        return records, warnings

    def append(self, record: Record) -> asyncio.Future[None]:
        """Queue a record; the future resolves once it is durable (or fails with the OSError)."""
        return self._put("append", record.snapshot_id, encode(record))

    def barrier(self) -> asyncio.Future[None]:
        """Resolves once everything appended so far is durable."""
        return self._put("append", "", b"")

    def forget(self, snapshot_id: str) -> None:
        """The snapshot is in its file: its records need not survive the next rewrite."""
        self._put("forget", snapshot_id, b"", want_future=False)

    def _put(self, op: str, sid: str, frame: bytes, want_future: bool = True) -> asyncio.Future[None]:
        assert self._loop is not None, "journal not open"
        future = self._loop.create_future() if want_future else None
        with self._cond:
            if self._broken is not None and future is not None:
                future.set_exception(self._broken)
                return future
            self._queue.append((op, sid, frame, future))
            self._cond.notify()
        return future  # type: ignore[return-value]

    async def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- the writer thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                batch, self._queue = self._queue, []
                if not batch and self._closing:
                    return
            error = self._broken
            if error is None:
                try:
                    self._write(batch)
                except OSError as exc:
                    log.error("journal %s: write failed, appending nothing more: %s", self.path, exc)
                    with self._cond:
                        self._broken = error = exc
            for _, _, _, future in batch:
                if future is not None:
                    self._loop.call_soon_threadsafe(_settle, future, error)

    def _write(self, batch) -> None:
        data = bytearray()
        for op, sid, frame, _ in batch:
            if op == "forget":
                self._live_bytes -= sum(len(f) for f in self._live.pop(sid, ()))
            elif frame:
                data += frame
                self._live.setdefault(sid, []).append(frame)
                self._live_bytes += len(frame)
        if data:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fdatasync(self._fd)
            self._size += len(data)
        live = self._live_bytes  # per write: O(this batch), not O(every snapshot not yet filed)
        if self._size > self.rotate_bytes and live < self._size // 2:
            self._rewrite(live)

    def _rewrite(self, live: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"".join(f for frames in self._live.values() for f in frames))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = fd
        self._size = live
        log.info("journal %s rewritten: %d live bytes", self.path, live)


def _settle(future: asyncio.Future[None], error: OSError | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
