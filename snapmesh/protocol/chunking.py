"""A FullState too large for one gRPC message, sent as a stream of chunks.

A node's FullState holds every message it recorded in flight, so a partition
during a snapshot can make it arbitrarily large. A gRPC server refuses a message
over its receive limit (4 MiB by default; ours take 64 MiB), and a node that
retried such a report would retry until the deadline. Raising the limits
only moves that cliff, and needs every server configured alike. So a state
over `CHUNK_BYTES` is sent with `Controller.ReportStateChunks`: its protobuf
encoding cut into pieces of `CHUNK_BYTES`, which any gRPC server's default limit
takes. Pieces of the encoding rather than pieces of the message: any state splits
at any size, whatever its shape (one channel alone may be too large), and
reassembly is concatenation, so the controller gets exactly the message
`ReportState` would have. States that fit still go by `ReportState`: one call,
and a controller without the streaming RPC still takes them.

The same holds the other way for a restore: a RestoreStateRequest over
`CHUNK_BYTES` (an app's state, many messages in flight) goes to the
node with `Node.RestoreStateChunks` (`restore_chunks`), so a node's receive
limit, which gRPC sets per server and not per RPC, can be what its clients'
calls may carry.

Pure: no I/O. The node splits; the controller (and the tests' report sink)
reassemble with `StateAssembler`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

from google.protobuf.message import DecodeError

from snapmesh.v1 import snapmesh_pb2 as pb

CHUNK_BYTES = 1024 * 1024  # well under gRPC's default 4 MiB per message
# What one reassembled state may reach: the controller holds every state of a
# snapshot in memory, so one stream must not be able to take all of it.
MAX_STATE_BYTES = 512 * 1024 * 1024
# The bytes all ReportStateChunks streams may hold at once, per peer and in all,
# so many peers cannot exhaust memory together: a stream that would go past either is refused at once
# (RESOURCE_EXHAUSTED; a node's reporter retries it later).
MAX_INFLIGHT_PER_PEER = MAX_STATE_BYTES
MAX_INFLIGHT_TOTAL = 768 * 1024 * 1024
# The blocks a report carries are written to the controller's block store this many
# bytes at a time as its stream brings them (carriedblocks.py): what one stream holds
# of them, so a report's blocks may add up to more than any of the bounds above. Each
# write costs a sync (blockdir.py D2): a state up to this size pays one, as when it came whole.
WRITE_WINDOW_BYTES = 32 * CHUNK_BYTES


class ChunkError(ValueError):
    """The chunks of one stream do not make an acceptable FullState; `code` names
    the gRPC status the stream is refused with."""

    code = "INVALID_ARGUMENT"


class StateTooLarge(ChunkError):
    """The chunks add up to more than MAX_STATE_BYTES."""

    code = "RESOURCE_EXHAUSTED"


class BadChunks(ChunkError):
    """The concatenated chunks are not a FullState's encoding."""


class Busy(ChunkError):
    """Taking a chunk would put more bytes in flight than a peer or all may hold."""

    code = "RESOURCE_EXHAUSTED"


class NotANode(ChunkError):
    """With TLS, only a node's certificate may send a report (checked before any chunk is read)."""

    code = "PERMISSION_DENIED"


def charged_peer(names: set[str] | None, nodes: Iterable[str], peer: str) -> str:
    """Whose budget a stream's bytes count against: with TLS (`names`: what the peer's
    certificate names) the first node it names, raising NotANode when it names none;
    in plaintext the gRPC `peer` ("ipv4:127.0.0.1:5000") without its port."""
    if names is None:
        return peer.rsplit(":", 1)[0]
    named = sorted(names & set(nodes))
    if not named:
        raise NotANode(f"the peer's certificate names {', '.join(sorted(names)) or 'nothing'}, not a node")
    return named[0]


class ChunkBudget:
    """The bytes held by the chunk streams being assembled, per peer and in all.
    `take` before keeping a chunk (raises Busy and takes nothing past a bound),
    `give_back` what a stream held once it ends, whatever the outcome."""

    def __init__(self, per_peer: int = MAX_INFLIGHT_PER_PEER, total: int = MAX_INFLIGHT_TOTAL) -> None:
        self.per_peer = per_peer
        self.total = total
        self.held = 0
        self._by_peer: dict[str, int] = {}

    def take(self, peer: str, size: int) -> None:
        mine = self._by_peer.get(peer, 0)
        if mine + size > self.per_peer:
            raise Busy(f"{peer} already has {mine} bytes of reports in flight (limit {self.per_peer} per peer)")
        if self.held + size > self.total:
            raise Busy(f"{self.held} bytes of reports are in flight (limit {self.total}); retry later")
        self._by_peer[peer] = mine + size
        self.held += size

    def give_back(self, peer: str, size: int) -> None:
        left = self._by_peer.get(peer, 0) - size
        if left > 0:
            self._by_peer[peer] = left
        else:
            self._by_peer.pop(peer, None)
        self.held -= size

    def peer_bytes(self, peer: str) -> int:
        return self._by_peer.get(peer, 0)


def needs_chunks(state: pb.FullState, chunk_bytes: int = CHUNK_BYTES, extra: int = 0) -> bool:
    """Whether `state` (and `extra` bytes of blocks carried apart, `carried_bytes`) is over one chunk."""
    return state.ByteSize() + extra > chunk_bytes


_BLOCKS_TAG = len(pb.FullState(blocks=[b""]).SerializeToString()) - 1  # the field's tag (its length's varint: 1)


def carried_bytes(carried: Iterable[bytes]) -> int:
    """What blocks carried apart (`stream_state` `carried`) add to the report's encoding: each
    a `blocks` field, as the message holding them would encode it."""
    return sum(_BLOCKS_TAG + (max(len(block).bit_length(), 1) + 6) // 7 + len(block) for block in carried)


def split_state(state: pb.FullState, chunk_bytes: int = CHUNK_BYTES) -> list[pb.FullStateChunk]:
    """The state's encoding in pieces of at most `chunk_bytes`, in order."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    data = state.SerializeToString()
    return [pb.FullStateChunk(data=data[i : i + chunk_bytes]) for i in range(0, len(data), chunk_bytes)] or [
        pb.FullStateChunk()
    ]


def stream_state(
    state: pb.FullState, chunk_bytes: int = CHUNK_BYTES, carried: Iterable[bytes] = (),
) -> Iterator[pb.FullStateChunk]:
    """`split_state`'s chunks, made as they are sent and never the whole encoding: the state
    without its carried blocks first (its snapshot and node before any block, carriedblocks.py
    CB3), then each block as its own `blocks` field. The encodings of one message joined parse
    as one message (protobuf merges them), so the controller reads what `split_state` gives.
    A first report of a GiB, every block carried, was encoded whole and then cut: two copies
    of the state more, and four nodes of 1 GiB did not fit in 24 GiB. `carried`: blocks carried
    apart from the message, after its own (a node's first report, whose blocks in the message
    were a copy of its state: they are the node's own blocks, blocks.referenced_report)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    head = pb.FullState()
    for field, value in state.ListFields():
        if field.name == "blocks":
            continue
        if field.is_repeated:
            getattr(head, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(head, field.name).CopyFrom(value)
        else:
            setattr(head, field.name, value)
    buffer = bytearray(head.SerializeToString())
    sent = False
    for block in chain(state.blocks, carried):
        buffer += pb.FullState(blocks=[block]).SerializeToString()
        while len(buffer) >= chunk_bytes:
            yield pb.FullStateChunk(data=bytes(buffer[:chunk_bytes]))
            del buffer[:chunk_bytes]
            sent = True
    for at in range(0, len(buffer), chunk_bytes):  # the rest (a whole state's header may be many chunks)
        yield pb.FullStateChunk(data=bytes(buffer[at : at + chunk_bytes]))
        sent = True
    if not sent:
        yield pb.FullStateChunk()


def chunk_count(state: pb.FullState, chunk_bytes: int = CHUNK_BYTES, extra: int = 0) -> int:
    """How many chunks `split_state` and `stream_state` cut `state` into (`extra`: `carried_bytes`)."""
    return chunks_of(state.ByteSize() + extra, chunk_bytes)


def chunks_of(encoded: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """`chunk_count` of a report whose encoding, with its carried blocks, is `encoded` bytes
    (for a caller that has its size already: protobuf's ByteSize encodes the message)."""
    return max(1, -(-encoded // chunk_bytes))


def restore_chunks(request: pb.RestoreStateRequest, chunk_bytes: int = CHUNK_BYTES) -> list[pb.RestoreStateChunk]:
    """A RestoreStateRequest's encoding in pieces of at most `chunk_bytes`, in order
    (`Node.RestoreStateChunks`: a node takes no message much over CHUNK_BYTES)."""
    data = request.SerializeToString()
    return [pb.RestoreStateChunk(data=data[i : i + chunk_bytes]) for i in range(0, len(data), chunk_bytes)] or [
        pb.RestoreStateChunk()
    ]


class StateAssembler:
    """Feed the chunks of one stream in order with `add`, then `finish`. With a
    `budget`, each chunk is taken from it for `peer` first (Busy past a bound), and
    `release` gives back what the stream held, whatever its outcome."""

    def __init__(self, max_bytes: int = MAX_STATE_BYTES, *, budget: ChunkBudget | None = None, peer: str = "") -> None:
        self._max = max_bytes
        self._pieces: list[bytes] = []
        self._size = 0
        self._budget, self._peer, self._held = budget, peer, 0

    def add(self, chunk: pb.FullStateChunk) -> None:
        if self._budget is not None:
            self._budget.take(self._peer, len(chunk.data))
            self._held += len(chunk.data)
        self._size += len(chunk.data)
        if self._size > self._max:
            raise StateTooLarge(f"the FullState's chunks exceed {self._max} bytes")
        self._pieces.append(chunk.data)

    def finish(self) -> pb.FullState:
        state = pb.FullState()
        try:
            state.ParseFromString(b"".join(self._pieces))
        except DecodeError as exc:
            raise BadChunks(f"the {len(self._pieces)} chunk(s) ({self._size} bytes) are not a FullState: {exc}") from None
        if not state.snapshot_id or not state.node_id:
            raise BadChunks(f"the {len(self._pieces)} chunk(s) make a FullState without snapshot_id or node_id")
        return state

    def release(self) -> None:
        if self._budget is not None:
            self._budget.give_back(self._peer, self._held)
        self._held = 0
