"""An app whose state is a blob of `mib` MiB per node ([app] mib), changed in place: `bench state`'s subject.

The blob starts as pseudo-random bytes drawn from the node's id (so no two nodes'
blocks are alike and nothing compresses), made when first used: a restore, which
makes a new machine and then restores it, does not pay for a blob it replaces. A command is an 8-byte big-endian
offset and the bytes to write there; it sends nothing. The one invariant: every
node's state is still `mib` MiB.
"""

from __future__ import annotations

import hashlib

from snapmesh.app import App, Context, NodeInfo, View

MIB = 1024 * 1024


def size_of(params) -> int:
    return int(float(params.get("mib", 1)) * MIB)


class Blob:
    def __init__(self, info: NodeInfo) -> None:
        self._info = info
        self._blob: bytearray | None = None

    @property
    def blob(self) -> bytearray:
        if self._blob is None:
            self._blob = bytearray(hashlib.shake_256(self._info.node_id.encode()).digest(size_of(self._info.params)))
        return self._blob

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        offset = int.from_bytes(command[:8], "big")
        data = command[8:]
        if offset + len(data) > len(self.blob):
            ctx.refuse("OUT_OF_RANGE", f"a write of {len(data)} bytes at {offset} passes the blob's end ({len(self.blob)})")
        self.blob[offset : offset + len(data)] = data
        return b""

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        pass

    def snapshot(self) -> bytes:
        return bytes(self.blob)

    def restore(self, state: bytes) -> None:
        self._blob = bytearray(state)


def write(offset: int, data: bytes) -> bytes:
    """The command that writes `data` at `offset`."""
    return offset.to_bytes(8, "big") + data


def same_size(view: View) -> list[str]:
    sizes = dict(view.sizes)  # the lengths only (View.sizes): no state read
    return [f"the blobs differ in size: {sizes}"] if len(set(sizes.values())) > 1 else []


app = App(name="blob", new=Blob, invariants={"every blob the same size": same_size})
