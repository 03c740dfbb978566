"""An app whose state is a blob of `mib` MiB per node ([app] mib), changed in place: `bench state`'s subject.

The blob is kept as immutable blocks of the framework's BLOCK_BYTES (see `Blob`).
The blob starts as pseudo-random bytes drawn from the node's id, a block at a time
(so no two nodes' blocks are alike and nothing compresses), made when first used: a restore, which
makes a new machine and then restores it, does not pay for a blob it replaces. A command is an 8-byte big-endian
offset and the bytes to write there; it sends nothing. The one invariant: every
node's state is still `mib` MiB.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from snapmesh.app import BLOCK_BYTES, App, Context, NodeInfo, View

MIB = 1024 * 1024


def size_of(params) -> int:
    return int(float(params.get("mib", 1)) * MIB)


class Blob:
    """The blob as immutable blocks of BLOCK_BYTES (the last one shorter): a write
    replaces the blocks it touches and no other, and snapshot_blocks() hands the
    blocks over as they are, so a node's cut hashes only the blocks written since
    the last (snapmesh.app A8) and nothing copies the blob but the join. A restore
as blocks hands them back (restore_blocks, A9) and they are kept as they are."""

    def __init__(self, info: NodeInfo) -> None:
        self._info = info
        self._blocks: list[bytes] | None = None
        self._size = 0

    @property
    def blocks(self) -> list[bytes]:
        if self._blocks is None:
            # Each block drawn on its own (the node's id and its index): the blob drawn whole and
            # then cut held it three times at once (the digest's buffer, its bytes, the blocks).
            size, seed = size_of(self._info.params), self._info.node_id.encode() + b"\0"
            self._blocks = [hashlib.shake_256(seed + i.to_bytes(8, "big")).digest(min(BLOCK_BYTES, size - i))
                            for i in range(0, size, BLOCK_BYTES)]
            self._size = size
        return self._blocks  # type: ignore[return-value]

    def _set(self, blob: bytes) -> None:
        view = memoryview(blob)
        self._blocks = [bytes(view[i : i + BLOCK_BYTES]) for i in range(0, len(blob), BLOCK_BYTES)]
        self._size = len(blob)

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        offset = int.from_bytes(command[:8], "big")
        data = memoryview(command)[8:]
        blocks = self.blocks
        if offset + len(data) > self._size:
            ctx.refuse("OUT_OF_RANGE", f"a write of {len(data)} bytes at {offset} passes the blob's end ({self._size})")
        while data:
            index, at = divmod(offset, BLOCK_BYTES)
            block = blocks[index]
            n = min(len(data), len(block) - at)
            blocks[index] = block[:at] + data[:n] + block[at + n :]  # a new block: the old one may be in a cut
            offset, data = offset + n, data[n:]
        return b""

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        pass

    def snapshot_blocks(self) -> list[bytes]:
        return list(self.blocks)  # the list copied, not the blocks: they never change

    def snapshot(self) -> bytes:
        return b"".join(self.blocks)

    def restore(self, state: bytes) -> None:
        self._set(state)

    def restore_blocks(self, blocks: Iterable[bytes]) -> None:
        """The state as the node rebuilt it (snapmesh.app A9): kept as they are when each
        but the last is BLOCK_BYTES (the node's usual cut of this app's parts), so the
        node and the app hold one state between them; else joined and cut again."""
        kept = list(blocks)
        if any(len(block) != BLOCK_BYTES for block in kept[:-1]) or any(type(b) is not bytes for b in kept):
            self._set(b"".join(kept))
            return
        self._blocks, self._size = kept, sum(map(len, kept))


def write(offset: int, data: bytes) -> bytes:
    """The command that writes `data` at `offset`."""
    return offset.to_bytes(8, "big") + data


def same_size(view: View) -> list[str]:
    sizes = dict(view.sizes)  # the lengths only (View.sizes): no state read
    return [f"the blobs differ in size: {sizes}"] if len(set(sizes.values())) > 1 else []


app = App(name="blob", new=Blob, invariants={"every blob the same size": same_size})
