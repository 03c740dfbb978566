"""A node's finished parts not yet acknowledged, one file each under `<data_dir>/<node_id>.reports/`:
what `StateReporter` saves before a report is sent and reads back after a restart. When
each file is written and what makes it durable is reporter.py's story; a large state's
file carries the blocks not yet durable beside it (snapmesh/protocol/savedblocks.py SV1-SV3,
reportblocks.py RK1)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from google.protobuf.message import DecodeError

from snapmesh.protocol import blocks
from snapmesh.protocol.blockstate import BlockState
from snapmesh.services.node.reportblocks import INLINE_BYTES, ReportBlocks
from snapmesh.serving.durable import write_atomically, write_pieces_durably, write_unsynced
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)


class CorruptReportError(ValueError):
    """A pending-report file cannot be read; the message names it."""


class PendingReports:
    """FullStates finished here and not yet acknowledged, one file per snapshot:
    `<directory>/<sha256 of the snapshot id>.fullstate` (any id makes a valid
    name), a header line `snapmesh-fullstate 1 lsn=<L> bytes=<N>` (the log
    position the state rests on, the encoding's length; a file of an older
    version has no `bytes=`) then the FullState's protobuf encoding. A state saved
    as blocks adds ` carried=<C>` to the header and C bytes after the encoding: the
    blocks it carries (savedblocks.py SV1), each a 4-byte big-endian length then the block."""

    SUFFIX = ".fullstate"
    _MAGIC = b"snapmesh-fullstate 1 lsn="

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.blocks = ReportBlocks(directory / "blocks")  # a large state's, each once (reportblocks.py)
        self.named: dict[str, blocks.Named] = {}  # by snapshot: a state saved as blocks, cut and named, until sent

    def _path(self, snapshot_id: str) -> Path:
        return self.directory / (hashlib.sha256(snapshot_id.encode()).hexdigest()[:32] + self.SUFFIX)

    def encode(self, message: pb.FullState, lsn: int) -> bytes:
        """The file's contents for `message` resting on the log up to `lsn`."""
        body = message.SerializeToString()
        return self._MAGIC + str(lsn).encode() + b" bytes=" + str(len(body)).encode() + b"\n" + body

    def pieces(self, body: bytes, lsn: int, carried: list[bytes | memoryview]) -> list[bytes | memoryview]:
        """The file's contents for the manifest encoded as `body` (reportblocks.RK7),
        carrying `carried` (SV1), in pieces: the blocks are written as they are, never copied into one."""
        frames: list[bytes | memoryview] = []
        for block in carried:
            frames += (len(block).to_bytes(4, "big"), block)
        size = sum(len(frame) for frame in frames)
        header = self._MAGIC + b"%d bytes=%d carried=%d\n" % (lsn, len(body), size)
        return [header, body, *frames]

    def write(self, snapshot_id: str, data: bytes) -> None:
        """Write `encode`'s bytes atomically (temp file, fsync, rename, fsync the directory)."""
        write_atomically(self._path(snapshot_id), data)

    def write_unsynced(self, snapshot_id: str, data: bytes) -> Path:
        """Write `encode`'s bytes (temp file, rename) for a sync that follows (the log round's)."""
        return write_unsynced(self._path(snapshot_id), data)

    def save(self, message: pb.FullState, lsn: int) -> None:
        self.write(message.snapshot_id, self.encode(message, lsn))

    def save_unsynced(
        self, message: pb.FullState, lsn: int, state: bytes | BlockState, named: blocks.Named | None = None,
    ) -> list[Path]:
        """`message` (whose state is `state`) saved: a small state's file for a sync that
        follows (the log round's), the paths written; a large state's file with its
        manifest and the blocks it carries (RK1, SV1), durable already: nothing to sync."""
        if len(state) <= INLINE_BYTES:
            return [self.write_unsynced(message.snapshot_id, self.encode(message, lsn))]
        named, carried = self.blocks.save(message.snapshot_id, state, tuple(message.state_parts), named)
        self.named[message.snapshot_id] = named  # the report's form takes its names (RK4)
        pieces = self.pieces(self.blocks.manifest_body(message, named.names), lsn, [block for _, block in carried])
        write_pieces_durably(self._path(message.snapshot_id), pieces)
        return []

    def remove(self, snapshot_id: str) -> None:
        # No directory fsync: a file that comes back after a crash is reported
        # again, and the controller answers a repeated report for good (or, its
        # blocks gone since, `load` drops it).
        self.blocks.forget(snapshot_id)
        self.named.pop(snapshot_id, None)
        self._path(snapshot_id).unlink(missing_ok=True)

    def load(self) -> list[tuple[pb.FullState, int]]:
        """Every pending (state, lsn), oldest file first; creates the directory,
        drops temp files a crash left. Raises CorruptReportError."""
        self.directory.mkdir(exist_ok=True)
        found = []
        listed: dict[str, list[bytes]] = {}  # the reports saved as blocks: their blocks stay (RK2)
        carried: dict[bytes, bytes] = {}  # the blocks their files carry, checked: written to the directory (SV3)
        for path in sorted(self.directory.iterdir(), key=lambda p: (p.stat().st_mtime_ns, p.name)):
            if path.suffix == ".tmp":
                path.unlink()  # never renamed into place: its snapshot's records are not durable either
                continue
            if path.suffix != self.SUFFIX:
                continue
            data = path.read_bytes()
            if not data.strip(b"\0"):  # its name durable, not its bytes: power lost during the round's sync
                log.warning("%s: an empty pending report (power lost while it was synced); dropping it", path)
                path.unlink()
                continue
            header, _, body = data.partition(b"\n")
            lsn_text, _, size_text = header.removeprefix(self._MAGIC).partition(b" bytes=")
            size_text, _, carried_text = size_text.partition(b" carried=")
            if not header.startswith(self._MAGIC) or not lsn_text.isdigit() or (size_text and not size_text.isdigit()) \
                    or (carried_text and not carried_text.isdigit()):
                raise CorruptReportError(f"{path}: not a pending report (bad header {header[:60]!r})")
            expected = (int(size_text) if size_text else 0) + (int(carried_text) if carried_text else 0)
            if len(body) < expected:  # part of its bytes durable: as above
                log.warning("%s: a pending report cut short (%d of %d bytes; power lost while it was synced); "
                            "dropping it", path, len(body), expected)
                path.unlink()
                continue
            own: dict[bytes, bytes] = {}
            if carried_text:
                body, own = body[:int(size_text)], _carried_blocks(path, body[int(size_text):])
            message = pb.FullState()
            try:
                message.ParseFromString(body)
            except DecodeError as exc:
                raise CorruptReportError(f"{path}: the FullState does not parse ({exc})") from None
            if path != self._path(message.snapshot_id):
                raise CorruptReportError(f"{path}: holds snapshot {message.snapshot_id!r}, not the one it is named for")
            if message.HasField("state_blocks") and not message.HasField("state"):  # saved as blocks (RK1, RK3)
                names = list(message.state_blocks.hashes)
                state, why = self.blocks.state(names, own)
                if state is None:
                    log.warning("%s: a pending report saved as blocks whose %s (power lost while it was "
                                "synced, or it was sent since); dropping it", path, why)
                    path.unlink()
                    continue
                listed[message.snapshot_id] = names
                carried.update(own)
                message.ClearField("state_blocks")
                message.state = state
            found.append((message, int(lsn_text)))
        self.blocks.sweep(listed, carried)
        return found


def _carried_blocks(path: Path, data: bytes) -> dict[bytes, bytes]:
    """The blocks a pending report's file carries (SV1), by their hash. Raises CorruptReportError."""
    out: dict[bytes, bytes] = {}
    view, at = memoryview(data), 0
    while at < len(data):
        size = int.from_bytes(view[at:at + 4], "big")
        if at + 4 + size > len(data) or size > blocks.BLOCK_BYTES:
            raise CorruptReportError(f"{path}: a carried block at byte {at} of its blocks runs past them")
        block = bytes(view[at + 4:at + 4 + size])
        out[blocks.block_hash(block)] = block
        at += 4 + size
    return out
