"""A report's carried blocks taken out of its chunk stream as they arrive, pure.

A report as blocks (blocks.py B4) carries the contents of the blocks the node
does not take the controller to hold (`FullState.blocks`): every block of a
first report, a gigabyte for a state of a gigabyte. Reassembled whole
(chunking.StateAssembler), one such report is held in memory until its last
chunk, and one over MAX_STATE_BYTES is refused however often it is sent.
`CarriedBlocks` reads the FullState's encoding as its chunks come, field by
field, and hands each carried block out as soon as it is whole; the
controller writes them to its block store (durably, pinned to the call) and
lets them go. The rest of the report (its manifest, channels, statistics)
is kept and parsed at the end, without the blocks.

CB1. The bytes held are the rest of the report, the block being read and the
    blocks handed out and not yet `released` (`held`). Only the rest and one
    block count towards `max_bytes`: a report's size is bounded by what its
    rest may hold, not by its blocks.
CB2. A carried block is at most BLOCK_BYTES (blocks.py cuts none larger); a
    larger one, a group, an unknown wire type or an encoding cut mid-field is
    refused (BadChunks): nothing is parsed from bytes that are not a report.
CB3. The snapshot and the node are read before the first block is handed out:
    a block is written only for a report that names them (protobuf encodes
    fields in number order, so a node's report names both first), and the
    report must name the same ones at its end, with a manifest.
CB4. A restore's request streamed as blocks (restorestream.py RS4) is read the
    same way (`message=pb.RestoreStateRequest`): its header is its snapshot,
    and the node writes each carried block to its shelf as it comes.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from snapmesh.protocol import blocks
from snapmesh.protocol.chunking import MAX_STATE_BYTES, BadChunks, StateTooLarge
from snapmesh.v1 import snapmesh_pb2 as pb

# The fields a block may be carried only after (CB3, CB4), per message read.
_HEADERS = {pb.FullState: ("snapshot_id", "node_id"), pb.RestoreStateRequest: ("snapshot_id",)}


class CarriedBlocks:
    """Feed one stream's chunks in order with `feed` (the blocks whole so far come
    out), then `finish` (the report without its blocks)."""

    def __init__(self, max_bytes: int | None = None, message: type = pb.FullState) -> None:
        fields = message.DESCRIPTOR.fields_by_name
        self._message = message
        self._names = _HEADERS[message]
        self._blocks = fields["blocks"].number
        self._header_numbers = tuple(fields[name].number for name in self._names)
        self._max = MAX_STATE_BYTES if max_bytes is None else max_bytes
        self._buffer = bytearray()  # bytes not read yet: at most one field's start, or one block
        self._rest = bytearray()  # every field but the blocks, as encoded
        self._out = 0  # bytes of the blocks handed out and not released
        self.carried = 0  # blocks handed out in all
        self._header: Any = None  # a `message` with the header fields only

    @property
    def held(self) -> int:
        """What this stream holds (CB1)."""
        return len(self._buffer) + len(self._rest) + self._out

    @property
    def header(self) -> Any:
        """The report's snapshot and node, once the first block came (CB3)."""
        assert self._header is not None
        return self._header

    def feed(self, data: bytes) -> list[bytes]:
        """Take the next piece of the encoding: the carried blocks it completes, in order."""
        self._buffer += data
        out: list[bytes] = []
        at = 0
        while (field := self._field(at)) is not None:
            number, start, end = field
            if number == self._blocks:
                self._check_header()
                out.append(bytes(self._buffer[start:end]))
            else:
                self._rest += self._buffer[at:end]
            at = end
        del self._buffer[:at]
        if len(self._rest) + len(self._buffer) > self._max:
            raise StateTooLarge(f"the FullState's chunks, without the blocks they carry, exceed {self._max} bytes")
        self._out += sum(len(block) for block in out)
        self.carried += len(out)
        return out

    def released(self, size: int) -> None:
        """`size` bytes of the blocks handed out are written and let go."""
        self._out -= size

    def finish(self) -> Any:
        kind = self._message.DESCRIPTOR.name
        if self._buffer:
            raise BadChunks(f"the chunks end {len(self._buffer)} bytes into a field: not a {kind}")
        state = self._message()
        try:
            state.ParseFromString(bytes(self._rest))
        except DecodeError as exc:
            raise BadChunks(f"the chunks ({len(self._rest)} bytes besides the blocks) are not a {kind}: {exc}") from None
        if not all(getattr(state, name) for name in self._names):
            raise BadChunks(f"the chunks make a {kind} without {' or '.join(self._names)}")
        if self._header is not None and any(getattr(state, name) != getattr(self._header, name) for name in self._names):
            raise BadChunks(f"the {kind}'s {' or '.join(self._names)} changed after its first block (CB3)")
        if self.carried and not (state.HasField("state_blocks") or state.HasField("state_change")):
            raise BadChunks(f"the chunks carry blocks and no manifest ({kind}.state_blocks)")
        self._rest = bytearray()
        return state

    def _check_header(self) -> None:
        if self._header is not None:
            return
        header = self._message()
        kind = self._message.DESCRIPTOR.name
        try:
            header.ParseFromString(bytes(self._rest))
        except DecodeError as exc:
            raise BadChunks(f"the fields before the first block are not a {kind}'s: {exc}") from None
        if not all(getattr(header, name) for name in self._names):
            raise BadChunks(f"a block came before the {kind}'s {' and '.join(self._names)} (CB3)")
        self._header = self._message(**{name: getattr(header, name) for name in self._names})

    def _field(self, at: int) -> tuple[int, int, int] | None:
        """The field that starts at `at` in the buffer, when it is all there:
        (its number, where its value starts, where it ends); None: not all there yet."""
        buffer = self._buffer
        tag = _varint(buffer, at)
        if tag is None:
            return None
        key, at = tag
        number, wire = key >> 3, key & 7
        if number in self._header_numbers or number == self._blocks:
            if wire != 2:
                raise BadChunks(f"field {number} of a FullState with wire type {wire}")
        if wire == 0:
            value = _varint(buffer, at)
            return None if value is None else (number, at, value[1])
        if wire in (1, 5):
            end = at + (8 if wire == 1 else 4)
            return (number, at, end) if end <= len(buffer) else None
        if wire != 2:
            raise BadChunks(f"wire type {wire} (field {number}) in a FullState's encoding (CB2)")
        length = _varint(buffer, at)
        if length is None:
            return None
        size, at = length
        if number == self._blocks and size > blocks.BLOCK_BYTES:
            raise BadChunks(f"a carried block of {size} bytes: blocks are at most {blocks.BLOCK_BYTES} (CB2)")
        return (number, at, at + size) if at + size <= len(buffer) else None


def _varint(buffer: bytearray, at: int) -> tuple[int, int] | None:
    """The varint at `at` and where it ends; None: it goes past the buffer's end."""
    value, shift = 0, 0
    while at < len(buffer):
        byte = buffer[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise BadChunks("a varint of more than 10 bytes in a FullState's encoding (CB2)")
    return None
