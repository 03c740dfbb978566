"""An app's state held as its blocks, never joined: what a restore as blocks hands an app
that takes them (snapmesh.app A9, `restore_blocks`).

A restore rebuilt from blocks (restoreblocks.py RB3, restorestream.py RS5) held the
state as one bytes: the rebuild's join (or its read back from a file), and the app's
own copy made from it (the blob app cut it into blocks again). An app with
`restore_blocks` is handed the rebuilt blocks themselves; the undo base (apphost.H6),
the restore's log record (wal.Packed) and the blocks the node keeps of its last
restore (heldblocks.py) are over the same block objects, so the state is held once.
A node's cut of a blocks app is one too (node/apphost.py H8): the app's parts as they
are, held by the undo base, the cut's names, the report and its save, never joined.

BST1. The blocks, joined, are the state; none is empty, and each may be of any size
      (an app's parts off the grid: kvshard's key ranges). `len` is the state's size.
BST2. A slice that is exactly one block is that block (no copy): the reader of held
      blocks (restoreblocks.reader) and the block shelf take a restored state's
      blocks by their bounds. Any other slice is joined from the blocks it covers
      (a slice within one block is that block's slice; one across blocks, its pieces).
BST3. `bytes(state)` (`joined`) is the one join, for an app without restore_blocks
      and for readers that want bytes (tests, the simulator); the node's restore of
      such an app makes it once.
BST4. `of_parts` holds a node's cut's parts (non-empty, in a tuple nobody changes) as they
      are, without the copy and the filter a BlockState of any iterable makes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate, islice


class BlockState:
    """The state as its blocks (BST1-BST3)."""

    __slots__ = ("blocks", "_starts", "_size")

    def __init__(self, blocks: Iterable[bytes]) -> None:
        self.blocks = list(filter(None, blocks))
        starts = list(accumulate(map(len, self.blocks), initial=0))  # a node's cut holds thousands: no step each
        self._size = starts.pop()
        self._starts = starts

    @classmethod
    def of_parts(cls, parts: tuple[bytes, ...]) -> BlockState:
        """BST4: a node's cut (node/apphost.py H8) of parts already non-empty, held as the very
        tuple: neither filtered nor copied (each pass over 8192 parts touches 8192 objects
        scattered over the state, ~0.2-0.4 ms at 64 MiB; the tuple is never changed)."""
        state = object.__new__(cls)
        state.blocks = parts  # type: ignore[assignment]  (read only, as the list is)
        starts = list(accumulate(map(len, parts), initial=0))
        state._size = starts.pop()
        state._starts = starts
        return state

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __bytes__(self) -> bytes:
        return b"".join(self.blocks)

    joined = __bytes__

    def __getitem__(self, at: slice) -> bytes:
        if type(at) is not slice or at.step not in (None, 1):
            raise TypeError("a BlockState is read by slices of one step")
        start, end, _ = at.indices(self._size)
        index = bisect_right(self._starts, start) - 1
        if index < 0 or start >= end:
            return b""
        first = self.blocks[index]
        if start == self._starts[index] and end == start + len(first):
            return first  # BST2: the block itself
        out, pos = [], self._starts[index]
        for block in islice(self.blocks, index, None):  # not a copy of the list: a cut holds thousands
            if pos >= end:
                break
            out.append(block[max(start - pos, 0) : end - pos])
            pos += len(block)
        return b"".join(out)

    def runs(self, size: int) -> Iterator[bytes | memoryview]:
        """The state in consecutive runs of `size` bytes (the last shorter), each joined
        from the blocks it spans: a log record's base64 is made a run at a time."""
        pending: list[bytes | memoryview] = []
        held = 0
        for block in self.blocks:
            view = memoryview(block)
            while view:
                take = view[: size - held]
                pending.append(take)
                held += len(take)
                view = view[len(take) :]
                if held == size:
                    yield pending[0] if len(pending) == 1 else b"".join(pending)
                    pending, held = [], 0
        if pending:
            yield pending[0] if len(pending) == 1 else b"".join(pending)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockState):
            return len(other) == self._size and bytes(other) == bytes(self)
        return isinstance(other, bytes | bytearray) and len(other) == self._size and other == bytes(self)

    def __hash__(self) -> int:
        return hash(bytes(self))

    def __repr__(self) -> str:
        return f"BlockState({len(self.blocks)} blocks, {self._size} bytes)"
