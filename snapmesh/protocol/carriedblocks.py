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
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from snapmesh.protocol import blocks
from snapmesh.protocol.chunking import MAX_STATE_BYTES, BadChunks, StateTooLarge
from snapmesh.v1 import snapmesh_pb2 as pb

_BLOCKS = pb.FullState.DESCRIPTOR.fields_by_name["blocks"].number
_HEADER = (pb.FullState.DESCRIPTOR.fields_by_name["snapshot_id"].number,
           pb.FullState.DESCRIPTOR.fields_by_name["node_id"].number)


class CarriedBlocks:
    """Feed one stream's chunks in order with `feed` (the blocks whole so far come
    out), then `finish` (the report without its blocks)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self._max = MAX_STATE_BYTES if max_bytes is None else max_bytes
        self._buffer = bytearray()  # bytes not read yet: at most one field's start, or one block
        self._rest = bytearray()  # every field but the blocks, as encoded
        self._out = 0  # bytes of the blocks handed out and not released
        self.carried = 0  # blocks handed out in all
        self._header: pb.FullState | None = None

    @property
    def held(self) -> int:
        """What this stream holds (CB1)."""
        return len(self._buffer) + len(self._rest) + self._out

    @property
    def header(self) -> pb.FullState:
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
            if number == _BLOCKS:
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

    def finish(self) -> pb.FullState:
        if self._buffer:
            raise BadChunks(f"the chunks end {len(self._buffer)} bytes into a field: not a FullState")
        state = pb.FullState()
        try:
            state.ParseFromString(bytes(self._rest))
        except DecodeError as exc:
            raise BadChunks(f"the chunks ({len(self._rest)} bytes besides the blocks) are not a FullState: {exc}") from None
        if not state.snapshot_id or not state.node_id:
            raise BadChunks("the chunks make a FullState without snapshot_id or node_id")
        if self._header is not None and (state.snapshot_id, state.node_id) != (self._header.snapshot_id,
                                                                               self._header.node_id):
            raise BadChunks("the report's snapshot_id or node_id changed after its first block (CB3)")
        if self.carried and not state.HasField("state_blocks"):
            raise BadChunks("the chunks carry blocks and no manifest (FullState.state_blocks)")
        self._rest = bytearray()
        return state

    def _check_header(self) -> None:
        if self._header is not None:
            return
        header = pb.FullState()
        try:
            header.ParseFromString(bytes(self._rest))
        except DecodeError as exc:
            raise BadChunks(f"the fields before the first block are not a FullState's: {exc}") from None
        if not header.snapshot_id or not header.node_id:
            raise BadChunks("a block came before the report's snapshot_id and node_id (CB3)")
        self._header = pb.FullState(snapshot_id=header.snapshot_id, node_id=header.node_id)

    def _field(self, at: int) -> tuple[int, int, int] | None:
        """The field that starts at `at` in the buffer, when it is all there:
        (its number, where its value starts, where it ends); None: not all there yet."""
        buffer = self._buffer
        tag = _varint(buffer, at)
        if tag is None:
            return None
        key, at = tag
        number, wire = key >> 3, key & 7
        if number in _HEADER or number == _BLOCKS:
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
        if number == _BLOCKS and size > blocks.BLOCK_BYTES:
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
