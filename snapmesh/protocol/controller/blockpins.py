"""Blocks that journaled reports name, kept on disk until their snapshot's records are dead, pure.

A report journaled as blocks (journalblocks.py JB1) names blocks it does not
carry: they must stay on disk until its snapshot is filed or retired (JB2),
whether or not a stored snapshot still references them (blockrefs.py G2).
`pin` records them per snapshot and call (a report that is then refused is
never journaled: its call's pins go at once), `unpin` lets a call's or a whole
snapshot's go, and `pinned` says whether any pins a block. Not thread-safe: the store
(services/controller/store.py) calls it under the lock it holds for its
references.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from snapmesh.protocol.controller.heldsets import HeldSets


class BlockPins:
    def __init__(self) -> None:
        self._calls: dict[str, set[int]] = {}  # snapshot -> its calls that pin blocks
        self._held = HeldSets()  # (snapshot, call) -> its blocks (heldsets.py HS3: nothing counted per block)

    def pin(self, snapshot_id: str, names: Iterable[bytes], call: int = 0) -> None:
        """`call` of `snapshot_id` pins `names` (in place of what it pinned before)."""
        self._calls.setdefault(snapshot_id, set()).add(call)
        self._held.hold((snapshot_id, call), names)

    def add(self, snapshot_id: str, names: Iterable[bytes], call: int) -> None:
        """`call` of `snapshot_id` pins `names` too (a report's blocks, as its stream brings them)."""
        self._calls.setdefault(snapshot_id, set()).add(call)
        self._held.hold((snapshot_id, call), self._held.names((snapshot_id, call)).union(names))

    def unpin(self, snapshot_id: str, call: int | None = None,
              narrow: Callable[[frozenset[bytes]], set[bytes]] | None = None) -> set[bytes]:
        """The pins of `call` of the snapshot go (None: all its calls'): the blocks nothing pins now
        (of those `narrow` leaves of each call's: heldsets.py HS4)."""
        calls = self._calls.get(snapshot_id, set())
        going = set(calls) if call is None else {call} & calls
        calls -= going
        if not calls:
            self._calls.pop(snapshot_id, None)
        return self._held.release(((snapshot_id, c) for c in going), narrow)

    def unpinned(self, names: Iterable[bytes]) -> set[bytes]:
        """Those of `names` nothing pins (heldsets.py HS3)."""
        return self._held.unheld(names)

    def pinned(self, name: bytes) -> bool:
        return name in self._held

    def __len__(self) -> int:
        return len(self._held)
