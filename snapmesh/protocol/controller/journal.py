"""The controller journal's records and their rules, pure (the file is services/controller/journal.py).

One framed record per fact the controller must not forget in a crash:

    started   a snapshot began        durable before TriggerSnapshot answers and
                                      before StartSnapshot leaves
    reported  a FullState was taken   durable before ReportState answers OK, so a
                                      node re-sends exactly what was never acknowledged;
                                      a report that came as blocks is journaled as it
                                      came (journalblocks.py: the manifest and the new
                                      blocks, not the state rebuilt from them)
    finished  COMPLETE or FAILED      durable before anyone is shown the outcome
    restore   a restore's progress    RESTORING durable before any node is told,
                                      RESTORED/FAILED before the caller is answered;
                                      never forgotten (the epoch and the restore to
                                      resume after a crash come from these)
    joined    a new request_id joined the running restore
                                      durable before that call is answered;
                                      never forgotten (a retry of the key is
                                      answered by that restore, after a restart too)

A COMPLETE snapshot is a pure function of its start and its reports, so these
records are enough to rebuild every snapshot the controller ever answered for
(`replay` feeds them back to the tracker).

Frame: u32 length, u32 CRC-32 of the payload, payload = kind byte + body. A
`started` or `finished` body is small JSON; a `reported` body is the wall time
(f64) then the FullState's protobuf bytes (the compact format: no per-entry
text). A torn or corrupt frame (a crash mid-write) ends the journal: `decode_all`
stops there and says where.

A journal an older controller wrote before the app's nodes had state bytes
holds reports with the app's v1 figures only: `replay` hands each report to the
app's side once (`old_report`, its adapter's: v1fields.py F5), so the tracker,
which runs every cluster's app through its checker, reads every report one way.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, Now, Tracker, TrackerError, TrackerMisuse
from snapmesh.v1 import snapmesh_pb2 as pb

HEADER = struct.Struct("<II")  # payload length, crc32
_WALL = struct.Struct("<d")
_STARTED, _REPORTED, _FINISHED, _RESTORE, _JOINED = b"S", b"R", b"F", b"X", b"J"
_REPORTED_BLOCKS = b"B"  # a `reported` body whose FullState is the report as blocks



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
    # The report as the node sent it, its state as blocks (blocks.py B4), when it
    # came so (or its manifest, for a large state that came whole: JB4): what the
    # journal writes in place of `state` (journalblocks.py JB1).
    # Read back, `state` is that form until `journalblocks.rebuilt` makes it whole.
    sent: pb.FullState | None = None

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
    """A restore's state: the whole pb.Restore, journaled at each step."""

    restore: pb.Restore

    @property
    def snapshot_id(self) -> str:  # the journal's key: one per epoch, never forgotten
        return f"restore@{self.restore.epoch}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Joined:
    """A key that joined the restore of `epoch` while it ran: that restore answers it."""

    request_id: str
    epoch: int

    @property
    def snapshot_id(self) -> str:  # kept with its restore's records, never forgotten
        return f"restore@{self.epoch}"


Record = Started | Reported | Finished | Restored | Joined


class CorruptJournal(Exception):
    pass


class ChangeFrame(bytes):
    """The frame of a report journaled as its manifest's change (journalchanges.py JC3): its
    bytes as written, the snapshot of its base (`base`), and `whole()`, the frame written in
    its place by a rewrite, or when the file no longer holds its base's records."""

    whole: Callable[[], bytes]
    base: str

    @classmethod
    def of(cls, frame: bytes, record: Reported, base: str) -> ChangeFrame:
        made = cls(frame)
        made.whole, made.base = (lambda: whole_frame(record)), base
        return made


def whole_frame(record: Reported) -> bytes:
    """A change record's frame in full form (journalchanges.py JC3): the report as the controller
    holds it, its manifest listed with the blocks the change carried, or its small state whole."""
    state = record.state
    if not state.HasField("state_blocks"):
        return encode(Reported(state=state, wall=record.wall))
    sent = pb.FullState()
    sent.CopyFrom(state)
    sent.blocks.extend(record.sent.blocks if record.sent is not None else ())
    return encode(Reported(state=state, wall=record.wall, sent=sent))


def encode(record: Record) -> bytes:
    if isinstance(record, Reported) and record.sent is not None:
        payload = _REPORTED_BLOCKS + _WALL.pack(record.wall) + record.sent.SerializeToString()
        if record.sent.HasField("state_change"):
            frame = HEADER.pack(len(payload), zlib.crc32(payload)) + payload
            return ChangeFrame.of(frame, record, record.sent.state_change.base_snapshot_id)
    elif isinstance(record, Reported):
        payload = _REPORTED + _WALL.pack(record.wall) + record.state.SerializeToString()
    elif isinstance(record, Restored):
        payload = _RESTORE + record.restore.SerializeToString()
    elif isinstance(record, Joined):
        payload = _JOINED + json.dumps({"key": record.request_id, "epoch": record.epoch}).encode()
    elif isinstance(record, Started):
        body = {"id": record.snapshot_id, "initiator": record.initiator, "wall": record.wall, "epoch": record.epoch}
        payload = _STARTED + json.dumps(body).encode()
    else:
        body = {"id": record.snapshot_id, "status": record.status, "reason": record.reason, "wall": record.wall}
        payload = _FINISHED + json.dumps(body).encode()
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode_all(data: bytes) -> tuple[list[Record], int, str | None]:
    """The records of a journal, the length of its good prefix, and what ended it early."""
    records: list[Record] = []
    offset = 0
    while offset < len(data):
        if offset + HEADER.size > len(data):
            return records, offset, f"torn frame header at byte {offset}"
        length, crc = HEADER.unpack_from(data, offset)
        start, end = offset + HEADER.size, offset + HEADER.size + length
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


class LiveFrames:
    """Which frames of the journal file still matter, and when the file is worth
    rewriting with only them. A snapshot's frames are live until its file is
    written (`forget`); a restore's and a joined key's never go (their snapshot id
    is never forgotten). The file is rewritten once it is past `rotate_bytes` and
    mostly dead. The live size is kept as frames come and go: deciding costs the
    frames of one write, not a sum over every snapshot not yet filed.

    A failed write, sync or rewrite breaks the journal (`failed`): retrying fsync
    is not safe, so nothing more is written or rewritten, and every later append
    is answered with the error that broke it (`broken`)."""

    def __init__(self, rotate_bytes: int) -> None:
        self.rotate_bytes = rotate_bytes
        self.size = 0  # the file's
        self.bytes = 0  # the live frames'
        self._frames: dict[str, list[bytes]] = {}  # snapshot id -> its frames, until filed
        self._in_file: set[str] = set()  # the snapshots with frames in the file, live or not (JC3)
        self.broken: OSError | None = None  # what every append is answered with, once set

    def read(self, data: bytes, records: list[Record], whole: list[Record] | None = None) -> None:
        """The file as read (`data`: its good prefix, which holds `records`): every frame starts
        live. `whole`: the records in full form (journalchanges.py `expanded`), one for one: a change
        record's frame is written so at a rewrite (JC3)."""
        offset = 0
        for at, record in enumerate(records):
            length, _ = HEADER.unpack_from(data, offset)
            end = offset + HEADER.size + length
            frame = data[offset:end]
            if whole is not None and whole[at] is not record and isinstance(full := whole[at], Reported):
                frame = ChangeFrame(frame)
                frame.whole, frame.base = functools.partial(encode, full), record.sent.state_change.base_snapshot_id
            self.appended(record.snapshot_id, frame)
            offset = end
        self.size = len(data)

    def appended(self, snapshot_id: str, frame: bytes) -> None:
        self._frames.setdefault(snapshot_id, []).append(frame)
        self._in_file.add(snapshot_id)
        self.bytes += len(frame)

    def forget(self, snapshot_id: str) -> None:
        self.bytes -= sum(len(f) for f in self._frames.pop(snapshot_id, ()))

    def take(self, batch: Iterable[tuple[str, bytes | None]]) -> bytes:
        """One write's queue in order, each a snapshot id and a frame (b"": none, a
        barrier; None: the snapshot is filed, `forget`): the bytes to append, counted
        in the file's size."""
        data = bytearray()
        for snapshot_id, frame in batch:
            if frame is None:
                self.forget(snapshot_id)
            elif frame:
                if type(frame) is ChangeFrame and frame.base not in self._in_file:  # its base rewritten away (JC3)
                    frame = frame.whole()
                data += frame
                self.appended(snapshot_id, frame)
        self.size += len(data)
        return bytes(data)

    def failed(self, error: OSError) -> None:
        """A write, sync or rewrite failed: the first error is the journal's answer from now on."""
        if self.broken is None:
            self.broken = error

    def rewrite_due(self) -> bool:
        return self.broken is None and self.size > self.rotate_bytes and self.bytes < self.size // 2

    def rewrote(self) -> None:
        """The file was replaced by `rewritten()`: it holds the live frames only."""
        self.size = self.bytes
        self._in_file = set(self._frames)

    def rewritten(self) -> bytes:
        """What the file holds once rewritten: every live frame, a change in full form (JC3)."""
        if any(type(f) is ChangeFrame for frames in list(self._frames.values()) for f in frames):
            for sid, frames in list(self._frames.items()):
                whole = [f.whole() if type(f) is ChangeFrame else f for f in frames]
                self.bytes += sum(map(len, whole)) - sum(map(len, frames))
                self._frames[sid] = whole
        return b"".join(f for frames in self._frames.values() for f in frames)


def _decode(payload: bytes) -> Record:
    kind, body = payload[:1], payload[1:]
    if kind == _REPORTED:
        (wall,) = _WALL.unpack_from(body)
        state = pb.FullState()
        state.ParseFromString(body[_WALL.size:])
        return Reported(state=state, wall=wall)
    if kind == _REPORTED_BLOCKS:
        (wall,) = _WALL.unpack_from(body)
        sent = pb.FullState()
        sent.ParseFromString(body[_WALL.size:])
        if not (sent.HasField("state_blocks") or sent.HasField("state_change")):
            raise CorruptJournal("a report journaled as blocks has no manifest nor change (journalchanges.py)")
        return Reported(state=sent, wall=wall, sent=sent)
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
    if kind == _JOINED:
        fields = json.loads(body)
        return Joined(request_id=str(fields["key"]), epoch=int(fields["epoch"]))
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


def restores(records: Iterable[Record]) -> tuple[list[tuple[pb.Restore, list[str]]], list[str]]:
    """Every restore the journal holds, oldest (lowest epoch) first: its latest state
    and the keys that joined it, in the order they joined. And the warnings for
    `joined` records that name no restore."""
    latest: dict[int, pb.Restore] = {}
    joined: dict[int, list[str]] = {}
    warnings: list[str] = []
    for record in records:
        if isinstance(record, Restored):
            latest[record.restore.epoch] = record.restore
        elif isinstance(record, Joined):
            if record.epoch not in latest:
                warnings.append(f"journal: key {record.request_id!r} joined no restore of epoch {record.epoch}; ignored")
                continue
            joined.setdefault(record.epoch, []).append(record.request_id)
    return [(latest[e], joined.get(e, [])) for e in sorted(latest)], warnings


def replay(records: Iterable[Record], tracker: Tracker, now: Now, *, skip: set[str]) -> tuple[list[str], list[str]]:
    """Feed the journal back to a tracker: every snapshot not in `skip` (already
    loaded from its file) is rebuilt as it was answered. Returns the ids of the
    snapshots finished here and the warnings for records that did not fit."""
    finished: list[str] = []
    warnings: list[str] = []
    for record in records:
        if isinstance(record, Restored):  # the epoch only; the restore itself is the machine's
            tracker.epoch = max(tracker.epoch, record.restore.epoch)
            continue
        if isinstance(record, Joined):  # the machine's (`restores`)
            continue
        sid = record.snapshot_id
        if sid in skip:
            continue
        at = Now(mono=now.mono, wall=record.wall)
        try:
            if isinstance(record, Started):
                tracker.start(sid, record.initiator, at, epoch=record.epoch)
            elif isinstance(record, Reported):
                if record.state.HasField("state_blocks") and not _noted(tracker, record.state):
                    raise TrackerMisuse("its state is still a manifest of blocks")  # neither whole nor listed (JB5)
                tracker.report(tracker.side.old_report(record.state), at)  # F5: an old report, the app's
            elif record.status == FAILED:
                tracker.fail(sid, record.reason, at)
                finished.append(sid)
            elif record.status == COMPLETE:
                if tracker.listed(sid).status != COMPLETE:  # listed: its states are not read (JB5)
                    warnings.append(f"journal: snapshot {sid} was answered COMPLETE but its reports do not complete it")
                    continue
                finished.append(sid)
        except (TrackerError, TrackerMisuse) as exc:
            warnings.append(f"journal: skipping a {type(record).__name__.lower()} record of snapshot {sid}: {exc}")
    return finished, warnings


def _noted(tracker: Tracker, state: pb.FullState) -> bool:
    """Whether a report as its manifest was listed by journalblocks.rebuilt (JB5: its size and digest noted)."""
    try:
        return tracker.forms.of(state) is not None
    except LookupError:
        return False
