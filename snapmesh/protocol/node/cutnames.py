"""The digest a node's cut record holds of its app's state, hashing what changed, pure.

The node machine owns one `CutNames` and asks it for each cut's digest
(snapmesh/protocol/statedigest.py SD3): the whole form for a small state, else
the blocks form over the state's grid blocks, named here.

Rules
-----
CN1. A part an app's snapshot_blocks() handed over (apphost.Host.cut) that is
     a `bytes` object named at the last cut is known by its identity and not
     hashed again: `bytes` cannot change, and the entry holds the object, so
     its id cannot pass to another object while the entry lives. An entry is
     taken only if it holds that very object (`is`), never by its id alone. A
     `bytearray` part can change under the same identity: it is always hashed.
CN2. The entries are the parts of the last cut only: a part the app dropped is
     let go at the next cut (memory bound by the app's current blocks; CN5 keeps
     their offsets and a name per grid block of the last state besides).
CN3. Parts are on the grid when each but the last is a whole number of blocks:
     their blocks are then the grid's (statedigest SD1) and the report's (blocks.py
     B6) alike. Either way, on the grid or off it, the parts' report blocks are
     named by identity (CN1) and the cut's report carries them (core.FullState.named)
     so that the report is formed from these names (blocks.names `made`) rather
     than a compare of the state.
CN4. A state held as its blocks (apphost.H8: the parts of a state larger than
     BLOCKS_FORM_BYTES, on the grid or off it) is never joined here: its report
     blocks are its parts' (CN3), its grid blocks are named by CN5.
     Other states (snapshot() only, or a state given without its parts) are named
     on the grid against the last such state, compared at memory speed (blocks.py B5).
CN5. Off the grid (kvshard's key ranges, of any length), the grid digest is found by
     what changed, as the controller's gridmemo.GM2 does with names: a grid block
     whose byte range is covered only by parts that are the very objects (`is`,
     `bytes` only: CN1) at the same offsets as at the last cut by parts, and that
     ends at the same byte as it did then (the state's end cuts neither, or both
     alike), has the same bytes, and keeps its hash. Only the other grid blocks are
     sliced from the state (blockstate.BST2: the pieces of the parts it covers) and
     hashed: a range that changed length moves every part after it, and so the grid
     blocks after it are hashed again. Counted in `grid_hashed` (and `hashed`).
CN6. A cut follows what changed, not the state's size: with as many parts as the last
     cut, only the parts that are not the very object at their index are looked at
     (hashed; a part that moved to another index with none inserted or removed is
     hashed again, not looked for), and the parts' sizes, whether they are all
     `bytes`, whether they are on the grid and, a block a part, the flat list of
     names are the last cut's with those parts changed. A cut of another count (a
     part inserted or removed) looks every part up by identity (CN1), as before.
     One pass over the parts (which are the very objects) is the whole of the cut's
     work a part: at 64 MiB (8192 parts, ~70 changed) it fell from ~4 ms to ~2 ms,
     half of it hashing the changed blocks.
CN7. A part changed in place keeps the names of its blocks that did not change: a part
     that is not the very object at its index (CN6) but is as long as the `bytes` object
     there at the last cut is compared with it a block at a time (its own blocks, B6),
     and only the blocks whose bytes differ are hashed; an equal compare names the same
     bytes, so the name is the one hashing would give (blocks.py B5). Off the grid (CN5),
     only the grid blocks that overlap those differing blocks are sliced and hashed: the
     others' bytes are the last cut's, at the same offsets. kvshard's ranges (~64 KiB,
     ~64 keys) changed by one key each hashed a range's 8-9 blocks and as many grid
     blocks; now one or two of each (at 64 MiB: the cut's digest from ~12 ms to ~3 ms).
"""

from __future__ import annotations

import hashlib
from itertools import accumulate, chain, compress
from operator import is_not

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.protocol.blockstate import BlockState


class CutNames:
    def __init__(self) -> None:
        # The last cut's parts (a non-`bytes` one as None: never taken, CN1) and each one's blocks' names.
        self._kept: tuple[bytes | None, ...] = ()
        self._kept_names: list[tuple[bytes, ...]] = []
        self._last: blocks.Named | None = None  # the last state named on the grid by compare (CN4)
        self._bounds: tuple[object, list[tuple[int, int]]] = (None, [])  # the cut of the last (size, sizes) named
        # CN5: the last cut by parts: its parts' offsets, its size and its grid blocks' names (None: none)
        self._grid: tuple[list[int], int, list[bytes]] | None = None
        # CN6: the last cut by parts' sizes and whether they were on the grid, whether its parts were all
        # `bytes`, and its names flat when each part was one block (None: not)
        self._sizes: tuple[tuple[int, ...] | None, bool] = (None, False)
        self._plain = False
        self._flat: list[bytes] | None = None
        # CN7: this cut's changed parts (by index) -> their own blocks that differ (None: every one)
        self._differ: dict[int, list[int] | None] | None = None
        self.hashed = 0  # blocks hashed in all (the others' names were known)
        self.grid_hashed = 0  # of those, grid blocks of a state off the grid (CN5)

    def digest(self, state: bytes | BlockState, parts: tuple[bytes, ...] = ()) -> tuple[str, blocks.Named | None]:
        """The digest of `state` in the form a node records (SD3), and, when `parts`
        (the app's, whose join `state` is) make a state larger than BLOCKS_FORM_BYTES,
        the state named on their cut for its report (CN3; else None)."""
        if parts and len(state) > statedigest.BLOCKS_FORM_BYTES:
            last = self._kept
            named, offsets = self._by_parts(state, parts)
            if offsets is None:  # on the grid: the parts' blocks are the grid's (CN3)
                grid = named.names
            else:
                grid = self._off_grid(state, parts, offsets, last)
            self._grid = None if offsets is None else (offsets, len(state), grid)
            return statedigest.of_names(grid), named
        if type(state) is BlockState:  # CN4: not what apphost.H8 hands over; joined once
            state = bytes(state)
        self._kept, self._kept_names, self._grid, self._flat = (), [], None, None
        if len(state) <= statedigest.BLOCKS_FORM_BYTES:
            self._last = None
            return statedigest.whole(state), None
        self._last, hashed = blocks.names(state, (), self._last)
        self.hashed += hashed
        return statedigest.of_names(self._last.names), None

    def _off_grid(self, state: bytes | BlockState, parts: tuple[bytes, ...], offsets: list[int],
                  last: tuple[bytes | None, ...]) -> list[bytes]:
        """The grid blocks' names of a state off the grid, hashing those CN5 cannot keep."""
        size, memo = len(state), self._grid
        count = -(-size // BLOCK_BYTES)
        if memo is None:
            grid = statedigest.grid_names(state)  # a BlockState's read by its slices (SD5)
            self.hashed += count
            self.grid_hashed += count
            return grid
        last_offsets, last_size, last_grid = memo
        differ: dict[int, list[int] | None]
        if offsets == last_offsets and len(last) == len(parts) and self._differ is not None:
            differ = self._differ  # every part where it was: its object told, and its blocks that differ (CN7)
        elif offsets == last_offsets and len(last) == len(parts):  # every part where it was: its object told
            differ = dict.fromkeys(compress(range(len(parts)), map(is_not, parts, last)))
        else:  # the parts at the same offsets as at the last cut, by one look each
            at = dict(zip(last_offsets, last, strict=True)).get
            differ = {i: None for i, (offset, part) in enumerate(zip(offsets, parts, strict=True))
                      if at(offset) is not part}
        dirty: set[int] = set()
        for i, within in differ.items():
            start, end = offsets[i], offsets[i] + len(parts[i])
            if within is None:
                dirty.update(range(start // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1))
                continue
            for j in within:  # CN7: the grid blocks over the part's blocks that differ
                first = start + j * BLOCK_BYTES
                dirty.update(range(first // BLOCK_BYTES, (min(first + BLOCK_BYTES, end) - 1) // BLOCK_BYTES + 1))
        if size != last_size:  # the grid blocks from the shorter end on: new, or ending elsewhere
            dirty.update(range(min(size, last_size) // BLOCK_BYTES, count))
        grid = last_grid[:count]
        grid.extend(b"" for _ in range(count - len(grid)))
        sha256 = hashlib.sha256
        for g in dirty:
            start = g * BLOCK_BYTES
            grid[g] = sha256(state[start : min(start + BLOCK_BYTES, size)]).digest()
        self.hashed += len(dirty)
        self.grid_hashed += len(dirty)
        return grid

    def _by_parts(self, state: bytes | BlockState, parts: tuple[bytes, ...]) -> tuple[blocks.Named, list[int] | None]:
        """The state named on its parts' cut (CN1-CN3), and its parts' offsets when off the grid (else None)."""
        last, last_names, self._last = self._kept, self._kept_names, None
        count = len(parts)
        self._differ = None
        if len(last) == count:  # CN6: only the parts that are not the very object at their index are looked at
            changed = list(compress(range(count), map(is_not, parts, last)))
            names = list(last_names)
            differ: dict[int, list[int] | None] = {}
            for i in changed:  # the part's own blocks, from its start (B6), those that changed (CN7)
                names[i], differ[i] = self._renamed(parts[i], last[i], last_names[i])
            self._differ = differ
            sizes, plain, flat = self._incremental(parts, changed, names)
        else:
            names = self._looked_up(parts, last, last_names)
            sizes, plain, flat = tuple(map(len, parts)), set(map(type, parts)) == {bytes}, None
        # CN2: the entries are this cut's parts; CN1: a part that can change is never taken
        self._kept = parts if plain else tuple(part if type(part) is bytes else None for part in parts)
        self._kept_names, self._plain = names, plain
        size = len(state)
        if sizes != self._sizes[0]:  # CN6: the same sizes as the last cut are on the grid as it was, or off it
            self._sizes = (sizes, not any(map(BLOCK_BYTES.__rmod__, sizes[:-1])))  # each but the last whole blocks
        on_grid = self._sizes[1]
        # Each block's bounds: on the grid (CN3), the grid's, found without cutting each part; off it, each
        # part cut (B6). The same list as the last cut's when the cut is: nothing changes a Named's bounds.
        key = size if on_grid else (size, sizes)
        if self._bounds[0] != key:
            bounds = [(start, min(start + BLOCK_BYTES, size)) for start in range(0, size, BLOCK_BYTES)] \
                if on_grid else blocks.bounds(size, sizes)
            self._bounds = (key, bounds)
        if flat is None:
            flat = list(chain.from_iterable(names))
        self._flat = flat if len(flat) == count else None  # CN6: a block a part, the names kept flat for the next cut
        named = blocks.Named(state, self._bounds[1], list(flat), None, (size, sizes))
        return named, None if on_grid else list(accumulate(sizes[:-1], initial=0))

    def _renamed(self, part: bytes, before: bytes | None,
                  before_names: tuple[bytes, ...]) -> tuple[tuple[bytes, ...], list[int] | None]:
        """CN7: the names of `part`'s own blocks, hashing only those whose bytes differ from
        `before`'s (the `bytes` part at its index at the last cut), and which those are
        (None: every block hashed: no such part, or of another length)."""
        size = len(part)
        if before is None or len(before) != size or len(before_names) != -(-size // BLOCK_BYTES):
            own = tuple(statedigest.grid_names(part))
            self.hashed += len(own)
            return own, None
        out, differ, view, sha256 = list(before_names), [], memoryview(part), hashlib.sha256
        for j, start in enumerate(range(0, size, BLOCK_BYTES)):
            end = start + BLOCK_BYTES
            if part[start:end] != before[start:end]:  # bytes slices: memcmp (a memoryview's is item by item)
                out[j] = sha256(view[start:end]).digest()
                differ.append(j)
        self.hashed += len(differ)
        return tuple(out), differ

    def _incremental(self, parts: tuple[bytes, ...], changed: list[int],
                     names: list[tuple[bytes, ...]]) -> tuple[tuple[int, ...], bool, list[bytes] | None]:
        """CN6: the sizes, whether every part is `bytes`, and the flat names (None: to be joined) of a
        cut of as many parts as the last, from the last cut's and the `changed` parts alone."""
        last_sizes = self._sizes[0]
        if last_sizes is None or len(last_sizes) != len(parts):  # not the last cut's sizes: all read
            return tuple(map(len, parts)), set(map(type, parts)) == {bytes}, None
        sizes = list(last_sizes)
        for i in changed:
            sizes[i] = len(parts[i])
        plain = self._plain and all(type(parts[i]) is bytes for i in changed)
        flat = None
        if self._flat is not None and all(len(names[i]) == 1 for i in changed):
            flat = list(self._flat)
            for i in changed:
                flat[i] = names[i][0]
        return tuple(sizes), plain, flat

    def _looked_up(self, parts: tuple[bytes, ...], last: tuple[bytes | None, ...],
                   last_names: list[tuple[bytes, ...]]) -> list[tuple[bytes, ...]]:
        """CN1 for a cut of another count of parts than the last (a part inserted or removed):
        a part the last cut held anywhere (the very object, moved) keeps its names."""
        where = dict(zip(map(id, last), range(len(last)), strict=True))
        names: list[tuple[bytes, ...]] = []
        for part in parts:
            j = where.get(id(part))
            if j is not None and last[j] is part:  # moved, not changed: held by the entry, so its id is its own
                names.append(last_names[j])
            else:
                names.append(tuple(statedigest.grid_names(part)))  # the part's own blocks, from its start (B6)
                self.hashed += len(names[-1])
        return names
