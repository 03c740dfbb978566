"""A restore of states too large to join: planned from manifests, streamed block by block, pure.

A snapshot's large states are kept as block lists (blockforms.py BF1, the
"listed" form): at 1 GiB a node, joining each to send it (restoreblocks.py RB2
cuts and hashes a joined state) would hold the states of every node at once
on the controller, and a node joining its restore's pieces holds its state
twice. So a listed state is restored as it is kept:

RS0. A restore goes so (`keeps_listed`) when the controller holds the snapshot
     with listed states and neither a rescale (R7) nor an upgrade (R6) is to
     rewrite them: those read the states whole, as before.
RS1. `plan`'s part for a node whose entry is listed is its manifest and
     digest (`state_blocks`, `state_digest`), no `state` and no blocks: the
     names are the ones the node's report gave, so a block it still holds has
     the name it knows it by, and nothing is cut or hashed again.
RS2. `to_send`: the blocks of a manifest the node is not taken to hold, each
     once, in manifest order. What it holds is a belief (restoreblocks.py RB5):
     a node that lacks one refuses (blocks.MISSING) and is sent every block.
RS3. `check`, before the restore starts (so before any node hears of it):
     every block of every listed part is read and checked against its name;
     the first missing or corrupt one refuses the restore (DATA_LOSS, as a damaged
     stored snapshot is: `BlocksRefused`), naming the snapshot, the node and the block. One block is
     held at a time.
RS4. `Stream` cuts the request for RestoreStateChunks: the request without
     blocks, then each block sent as its own `blocks` field, into pieces of at
     most CHUNK_BYTES. Encodings of one message joined parse as one message
     with the repeated fields of both (protobuf merge), so the pieces are the
     encoding of the request with its blocks, and a node that joins them (one
     from before) reads what it always read. The header comes first: a node
     reading the pieces as they come (carriedblocks.py CB4) knows the snapshot
     before the first block.
RS5. `rebuild`: the node's state from its manifest, block by block in order
     (each carried or held, checked against its name as it was taken), handed
     to `write` one at a time and hashed into the whole's digest; a block found
     nowhere or a digest that differs is named and the rebuilt bytes are
     thrown away, so a refusal changes nothing (restoreblocks.py RB3).
RS6. A streamed part's call may take as long as its state takes at
     STREAM_FLOOR_BYTES_PER_S besides the restore's own timeout (`retry_for`): a
     gigabyte is written to the node's shelf and read back before it answers, and a
     call cut short by a per-call timeout fit for one message is sent again whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from snapmesh.protocol import blocks, statedigest, upgrade
from snapmesh.protocol.chunking import CHUNK_BYTES
from snapmesh.protocol.retry import Retry
from snapmesh.v1 import snapmesh_pb2 as pb


STREAM_FLOOR_BYTES_PER_S = 4 * 1024 * 1024  # RS6: the slowest a streamed part is taken to go


class BlocksRefused(Exception):
    """A restore refused before it started: a block of a part is missing or corrupt (RS3)."""

    code = "DATA_LOSS"  # as a damaged stored snapshot is (listing L5)


def keeps_listed(snapshot: pb.Snapshot, side: object, nodes: Sequence[str]) -> bool:
    """Whether a restore of the listed `snapshot` goes as RS1 parts (RS0)."""
    if nodes or not any(node.HasField("state_blocks") and not node.HasField("state") for node in snapshot.nodes):
        return False
    try:
        return upgrade.for_side(side, snapshot) is snapshot
    except upgrade.UpgradeRefused:  # refused by the machine as it is: nothing to read whole for that
        return True


def listed_part(request: pb.RestoreStateRequest, entry: pb.NodeBalance) -> None:
    """`request` for a listed `entry`: its manifest and digest (RS1)."""
    request.ClearField("state")
    request.state_blocks.hashes.extend(entry.state_blocks.hashes)
    request.state_digest = entry.state_digest


def is_listed(request: pb.RestoreStateRequest) -> bool:
    """Whether `request` is a part of RS1 (a manifest, neither its state nor its blocks)."""
    return request.HasField("state_blocks") and not request.HasField("state") and not request.blocks


def retry_for(retry: Retry, request: pb.RestoreStateRequest) -> Retry:
    """`retry` for a streamed part (RS6): its timeouts longer by the time its state may take."""
    extra = len(request.state_blocks.hashes) * blocks.BLOCK_BYTES / STREAM_FLOOR_BYTES_PER_S
    return dataclasses.replace(retry, timeout_s=retry.timeout_s + extra, for_s=retry.for_s + extra)


def to_send(hashes: Sequence[bytes], held: frozenset[bytes] | set[bytes]) -> list[bytes]:
    """The blocks of `hashes` not in `held`, each once, in order (RS2)."""
    out: list[bytes] = []
    seen: set[bytes] = set()
    for name in hashes:
        if name not in held and name not in seen:
            seen.add(name)
            out.append(name)
    return out


def check(snapshot_id: str, parts: dict[str, pb.RestoreStateRequest], read: Callable[[bytes], bytes | None]) -> None:
    """Raise BlocksRefused naming the first block of a listed part that `read` cannot
    give (None) or that does not hash to its name (RS3); each block read once."""
    seen: set[bytes] = set()
    for node in sorted(parts):
        if not is_listed(parts[node]):
            continue
        for name in parts[node].state_blocks.hashes:
            if name in seen:
                continue
            block = read(name)
            if block is None:
                raise BlocksRefused(f"snapshot {snapshot_id}, node {node}, block sha256:{name.hex()}: missing from "
                                    "the controller's block store; not restored (nothing changed)")
            if (got := blocks.block_hash(block)) != name:
                raise BlocksRefused(f"snapshot {snapshot_id}, node {node}, block sha256:{name.hex()}: corrupt (its "
                                    f"content hashes to sha256:{got.hex()}); not restored (nothing changed)")
            seen.add(name)


class Stream:
    """The pieces of a listed part with its blocks (RS4): `header` first, then `block`
    for each block in order, then `end`; each returns the pieces completed."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._chunk = chunk_bytes
        self._buffer = bytearray()
        self.sent_blocks = 0
        self.sent_bytes = 0

    def header(self, request: pb.RestoreStateRequest) -> list[bytes]:
        assert not request.blocks, "the blocks follow the header (RS4)"
        return self._add(request.SerializeToString())

    def block(self, block: bytes) -> list[bytes]:
        self.sent_blocks += 1
        return self._add(pb.RestoreStateRequest(blocks=[block]).SerializeToString())

    def end(self) -> list[bytes]:
        out = [bytes(self._buffer)] if self._buffer else []
        self.sent_bytes += len(self._buffer)
        self._buffer = bytearray()
        return out

    def _add(self, data: bytes) -> list[bytes]:
        self._buffer += data
        out = []
        while len(self._buffer) >= self._chunk:
            out.append(bytes(self._buffer[: self._chunk]))
            del self._buffer[: self._chunk]
            self.sent_bytes += self._chunk
        return out


def rebuild(
    request: pb.RestoreStateRequest, held: Callable[[bytes], bytes | None], write: Callable[[bytes], object],
) -> tuple[list[tuple[int, int]] | None, str]:
    """The state `request`'s manifest names, each block from those it carries or else
    `held(hash)`, handed to `write` in order (RS5): the blocks' bounds, or None and why not."""
    carried = {blocks.block_hash(block): block for block in request.blocks}
    hasher = statedigest.Hasher.like(request.state_digest)  # either form (statedigest.py SD2)
    bounds: list[tuple[int, int]] = []
    missing: list[bytes] = []
    start = 0
    for name in request.state_blocks.hashes:
        block = carried.get(name)
        if block is None:
            block = held(name)
        if block is None:
            missing.append(name)
            continue
        if not missing:  # past a missing block nothing is written: it is thrown away
            write(block)
            hasher.update(block)
        bounds.append((start, start + len(block)))
        start += len(block)
    if missing:
        shown = ", ".join(f"sha256:{name.hex()}" for name in missing[:3]) + (" ..." if len(missing) > 3 else "")
        return None, (f"{blocks.MISSING}: {len(missing)} of the state of snapshot {request.snapshot_id} are neither "
                      f"sent nor held here ({shown}); send the state whole")
    got = hasher.text()
    if request.HasField("state_digest") and got != request.state_digest:
        return None, (f"{blocks.MISSING}: none, but the state of snapshot {request.snapshot_id} rebuilt from them is "
                      f"{got}, not {request.state_digest}; send the state whole")
    return bounds, ""

