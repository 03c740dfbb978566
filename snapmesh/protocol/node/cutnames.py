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
     let go at the next cut (memory bound by the app's current blocks).
CN3. Parts are on the grid when each but the last is a whole number of blocks:
     their blocks are then the grid's (statedigest SD1) and the report's (blocks.py
     B6) alike, and the cut's report carries them (core.FullState.named) so that
     the report is formed from these names (blocks.names `made`) rather than a
     compare of the state.
     Other states (snapshot() only, or parts off the grid) are named on the grid
     against the last such state, compared at memory speed (blocks.py B5).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain, compress
from operator import is_not

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.protocol.blockstate import BlockState


class CutNames:
    def __init__(self) -> None:
        # The last cut's parts (a non-`bytes` one as None: never taken, CN1) and each one's blocks' names.
        self._kept: tuple[bytes | None, ...] = ()
        self._kept_names: list[tuple[bytes, ...]] = []
        self._last: blocks.Named | None = None  # the last state named on the grid by compare (CN3)
        self._bounds: tuple[int, list[tuple[int, int]]] = (-1, [])  # the grid of the last size named by parts
        self.hashed = 0  # blocks hashed in all (the others' names were known)

    def digest(self, state: bytes | BlockState, parts: tuple[bytes, ...] = ()) -> tuple[str, blocks.Named | None]:
        """The digest of `state` in the form a node records (SD3), and, when `parts`
        (the app's, whose join `state` is) are on the grid, the state named on their
        cut for its report (CN3; else None)."""
        if parts and len(state) > statedigest.BLOCKS_FORM_BYTES \
                and not any(map(BLOCK_BYTES.__rmod__, map(len, parts[:-1]))):  # each a whole number of blocks
            named = self._by_parts(state, parts)
            return statedigest.of_names(named.names), named
        if type(state) is BlockState:  # CN4: not what apphost.H8 hands over; joined once
            state = bytes(state)
        self._kept, self._kept_names = (), []
        if len(state) <= statedigest.BLOCKS_FORM_BYTES:
            self._last = None
            return statedigest.whole(state), None
        self._last, hashed = blocks.names(state, (), self._last)
        self.hashed += hashed
        return statedigest.of_names(self._last.names), None

    def _by_parts(self, state: bytes | BlockState, parts: tuple[bytes, ...]) -> blocks.Named:
        last, last_names, self._last = self._kept, self._kept_names, None
        count = len(parts)
        # CN1 a part at a time costs milliseconds at thousands of parts: the parts still where they
        # were (the very object, `is`) are found by one map, and only the others looked at.
        if len(last) == count:
            names = list(last_names)
            others: Iterable[int] = compress(range(count), map(is_not, parts, last))
        else:
            names, others = [()] * count, range(count)
        where: dict[int, int] | None = None
        for i in others:
            part = parts[i]
            if where is None:
                where = dict(zip(map(id, last), range(len(last)), strict=True))
            j = where.get(id(part))
            if j is not None and last[j] is part:  # moved, not changed: held by the entry, so its id is its own
                names[i] = last_names[j]
            else:
                names[i] = tuple(statedigest.grid_names(part))
                self.hashed += len(names[i])
        # CN2: the entries are this cut's parts; CN1: a part that can change is never taken
        plain = set(map(type, parts)) == {bytes}
        self._kept = parts if plain else tuple(part if type(part) is bytes else None for part in parts)
        self._kept_names = names
        size = len(state)
        # On the grid (CN3): each block's bounds are the grid's, found without cutting each part
        # (and the same list as the last cut's when the size is: nothing changes a Named's bounds).
        if self._bounds[0] != size:
            self._bounds = (size, [(start, min(start + BLOCK_BYTES, size)) for start in range(0, size, BLOCK_BYTES)])
        return blocks.Named(state, self._bounds[1], list(chain.from_iterable(names)), None,
                            (size, tuple(map(len, parts))))
