"""Each node's last state whose grid names filing found: an off-grid state read for what changed.

A listed state whose manifest is off the grid (an app's parts: kvshard's key
ranges, cut into blocks that end where a part ends) cannot have its blocks-form
digest (statedigest.py SD1) checked from its block names (filingsum.py FS5): the
grid blocks straddle its blocks. Filing read every block of it at every snapshot
(at 64 MiB a node, 8,192 reads and hashes for 0.1% of the keys changed). This memo
keeps, per node, what the last such check found, so the next one reads what changed.

GM1. Per node, one state (the last one found, a new one replaces it): its blocks as
    (offset, size, name) and its grid blocks' names, found from bytes each checked
    against its name, or read unchecked and hashing to the digest its report said
    (filingsum.py FS3's argument: then each block is as named). A name fixes the
    bytes (SHA-256), so what is kept is a fact of the names, whatever the disk now
    holds; any state found so serves as the base, the last one or an older one.
GM2. A grid block of a new state is the remembered grid block's name when every block
    of the new state overlapping its byte range is a block of the remembered state
    with the same name, size and offset, and the range ends at the same byte in both
    (the state's end cuts neither, or both alike): its bytes are then the same.
    Every other grid block is hashed from the blocks overlapping it, read (each
    block read once, checked or not as the caller's `read` is).
GM3. A block's size, to place the ones after it: the remembered size of a name the
    remembered state holds (a name fixes its size), else it is read (GM2 needs it
    then anyway: a name not remembered overlaps grid blocks that are hashed). A state
    of as many blocks whose changed ones (by index) are each the size of the one they
    replace has every block at its remembered offset: only the changed ones are looked
    at (kvshard's puts keep a value's length), with no map of the whole state built.
GM4. Empty (a controller restarted, a node not seen): every block is read in order,
    streamed (one grid block's bytes held at a time), as filing did before the memo.
    Bounded: one state per node, its manifest's size (the names filing holds anyway)
    and a grid name per BLOCK_BYTES of state.
GM5. `found` computes, `keep` remembers: the caller keeps a state only once its grid
    names are known good (GM1), so a failed read (BlockMissing) or an unchecked read
    that missed leaves the memo as it was. Counted (`blocks_read`) for tests.
GM6. Only the cluster's nodes are remembered: `members` (the controller's start, and
    each rescale's Adopt: engine.py) forgets every other node, and `keep` remembers no
    other from then on (a filing under way of a snapshot taken before the rescale
    names the nodes that left). A node that comes back starts empty (GM4). Before
    `members` is first told, every node is one.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from snapmesh.app import BLOCK_BYTES

Read = Callable[[bytes], bytes]  # a block by its name, or raises (the caller's BlockMissing)


@dataclass(frozen=True, slots=True)
class Found:
    """A state's blocks and grid names (GM1)."""

    offsets: list[int]  # each block's first byte, in order
    names: list[bytes]
    sizes: list[int]
    grid: list[bytes]  # each grid block's SHA-256 (SD1)
    total: int


class GridMemo:
    def __init__(self) -> None:
        self._nodes: dict[str, Found] = {}
        # node -> the name at each offset and each name's size of its state (GM2, GM3): built when needed
        self._maps: dict[str, tuple[dict[int, bytes], dict[bytes, int]]] = {}
        self.blocks_read = 0
        self._members: frozenset[str] | None = None  # GM6: the cluster's nodes (None: not told)
        self._lock = threading.Lock()  # `members` on the controller's loop, `keep` in the writer's thread

    def holds(self, node_id: str) -> bool:
        return node_id in self._nodes

    def keep(self, node_id: str, found: Found) -> None:
        """Remember `found` as the node's state (GM1, GM5), if the node is a member (GM6)."""
        with self._lock:
            if self._members is not None and node_id not in self._members:
                return
            self._nodes[node_id] = found
            self._maps.pop(node_id, None)

    def members(self, node_ids: Iterable[str]) -> None:
        """The cluster's nodes now: every other one is forgotten, and not kept from now on (GM6)."""
        with self._lock:
            self._members = members = frozenset(node_ids)
            for node_id in [n for n in list(self._nodes) if n not in members]:
                del self._nodes[node_id]
            for node_id in [n for n in list(self._maps) if n not in members]:
                self._maps.pop(node_id, None)

    def found(self, node_id: str, names: Sequence[bytes], read: Read) -> Found:
        """The grid names of the state `names` names, reading only what GM2 needs."""
        names = list(names)  # not the report's message: the memo outlives it
        before = self._nodes.get(node_id)
        if before is None:
            return self._streamed(names, read)
        held: dict[bytes, bytes] = {}  # blocks read for their size (GM3): hashed from these, not read again
        changed = self._in_place(before, names, read, held)
        if changed is not None:  # every block where it was: only the changed ones' grid blocks
            offsets, lengths, total = before.offsets, before.sizes, before.total
            dirty = {g for i in changed if lengths[i]
                     for g in range(offsets[i] // BLOCK_BYTES, (offsets[i] + lengths[i] - 1) // BLOCK_BYTES + 1)}
        else:
            offsets, lengths, total, dirty = self._moved(node_id, before, names, read, held)
        count = -(-total // BLOCK_BYTES)
        grid = before.grid[:count]
        grid.extend(b"" for _ in range(count - len(grid)))
        for g in sorted(dirty):
            low, high = g * BLOCK_BYTES, min((g + 1) * BLOCK_BYTES, total)
            hasher = hashlib.sha256()
            i = bisect.bisect_right(offsets, low) - 1
            while i < len(names) and offsets[i] < high:
                if lengths[i]:
                    name = names[i]
                    if (block := held.get(name)) is None:
                        block = held[name] = self._read(read, name)
                    hasher.update(memoryview(block)[max(low - offsets[i], 0) : high - offsets[i]])
                i += 1
            grid[g] = hasher.digest()
        return Found(offsets, names, lengths, grid, total)

    def _in_place(self, before: Found, names: list[bytes], read: Read, held: dict[bytes, bytes]) -> list[int] | None:
        """The blocks that differ from `before`'s at the same index, when each is the size of
        the one it replaces (so every block is at its offset in `before`); else None."""
        if len(names) != len(before.names):
            return None
        changed = list(itertools.compress(itertools.count(), map(operator.ne, names, before.names)))
        for i in changed:
            held[names[i]] = block = self._read(read, names[i])
            if len(block) != before.sizes[i]:
                return None
        return changed

    def _moved(self, node_id: str, before: Found, names: list[bytes], read: Read,
               held: dict[bytes, bytes]) -> tuple[list[int], list[int], int, set[int]]:
        """Offsets, sizes, size and the grid blocks to hash of a state whose blocks moved (GM2, GM3)."""
        if (maps := self._maps.get(node_id)) is None:
            maps = (dict(zip(before.offsets, before.names, strict=True)),
                    dict(zip(before.names, before.sizes, strict=True)))
            if self._nodes.get(node_id) is before:  # not of a node forgotten meanwhile (GM6)
                self._maps[node_id] = maps
        at, sizes = maps
        lengths = list(map(sizes.get, names))
        for i, size in enumerate(lengths):
            if size is None:
                if (block := held.get(names[i])) is None:
                    block = held[names[i]] = self._read(read, names[i])
                lengths[i] = len(block)
        offsets = [0, *itertools.accumulate(lengths)]
        total = offsets.pop()
        count = -(-total // BLOCK_BYTES)
        dirty = set(range(min(count, len(before.grid)), count))
        # the last grid blocks of either state, when the ends differ: a range cut short in one (GM2)
        for g in range(min(total, before.total) // BLOCK_BYTES, min(count, len(before.grid))):
            if min((g + 1) * BLOCK_BYTES, total) != min((g + 1) * BLOCK_BYTES, before.total):
                dirty.add(g)
        # a name at the same offset has the same size (its bytes are the name's): one look per block
        other = at.get
        for i in [i for i, (start, name) in enumerate(zip(offsets, names, strict=True)) if other(start) != name]:
            if lengths[i]:
                dirty.update(range(offsets[i] // BLOCK_BYTES, (offsets[i] + lengths[i] - 1) // BLOCK_BYTES + 1))
        return offsets, lengths, total, dirty

    def _streamed(self, names: Sequence[bytes], read: Read) -> Found:
        """Every block read in order, the grid named as it goes (GM4)."""
        grid: list[bytes] = []
        offsets, lengths, carry, offset = [], [], bytearray(), 0
        for name in names:
            block = memoryview(self._read(read, name))
            offsets.append(offset)
            lengths.append(len(block))
            offset += len(block)
            if carry:
                take = BLOCK_BYTES - len(carry)
                carry.extend(block[:take])
                block = block[take:]
                if len(carry) < BLOCK_BYTES:
                    continue
                grid.append(hashlib.sha256(carry).digest())
                carry.clear()
            whole = len(block) - len(block) % BLOCK_BYTES
            grid.extend(hashlib.sha256(block[i : i + BLOCK_BYTES]).digest() for i in range(0, whole, BLOCK_BYTES))
            carry.extend(block[whole:])
        if carry:
            grid.append(hashlib.sha256(carry).digest())
        return Found(offsets, names, lengths, grid, offset)

    def _read(self, read: Read, name: bytes) -> bytes:
        self.blocks_read += 1
        return read(name)
