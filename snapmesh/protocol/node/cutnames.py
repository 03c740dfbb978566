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

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.protocol.blockstate import BlockState


class CutNames:
    def __init__(self) -> None:
        self._parts: dict[int, tuple[bytes, tuple[bytes, ...]]] = {}  # id -> (the part, its blocks' names) (CN1)
        self._last: blocks.Named | None = None  # the last state named on the grid by compare (CN3)
        self.hashed = 0  # blocks hashed in all (the others' names were known)

    def digest(self, state: bytes | BlockState, parts: tuple[bytes, ...] = ()) -> tuple[str, blocks.Named | None]:
        """The digest of `state` in the form a node records (SD3), and, when `parts`
        (the app's, whose join `state` is) are on the grid, the state named on their
        cut for its report (CN3; else None)."""
        if parts and len(state) > statedigest.BLOCKS_FORM_BYTES \
                and all(len(part) % BLOCK_BYTES == 0 for part in parts[:-1]):
            named = self._by_parts(state, parts)
            return statedigest.of_names(named.names), named
        if type(state) is BlockState:  # CN4: not what apphost.H8 hands over; joined once
            state = bytes(state)
        if len(state) <= statedigest.BLOCKS_FORM_BYTES:
            self._parts, self._last = {}, None
            return statedigest.whole(state), None
        self._parts = {}
        self._last, hashed = blocks.names(state, (), self._last)
        self.hashed += hashed
        return statedigest.of_names(self._last.names), None

    def _by_parts(self, state: bytes | BlockState, parts: tuple[bytes, ...]) -> blocks.Named:
        known, self._parts, self._last = self._parts, {}, None
        remember, names = self._parts, []
        for part in parts:
            entry = known.get(id(part))
            if entry is not None and entry[0] is part:
                named = entry[1]
            else:
                named = tuple(statedigest.grid_names(part))
                self.hashed += len(named)
            if type(part) is bytes:
                remember[id(part)] = (part, named)
            names.extend(named)
        size = len(state)
        # On the grid (CN3): each block's bounds are the grid's, found without cutting each part.
        bounds = [(start, min(start + BLOCK_BYTES, size)) for start in range(0, size, BLOCK_BYTES)]
        return blocks.Named(state, bounds, names, None, (size, tuple(len(part) for part in parts)))
