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

from collections.abc import Iterable

from snapmesh.protocol.controller.countedset import CountedSet


class BlockPins:
    def __init__(self) -> None:
        self._by_snapshot: dict[str, dict[int, frozenset[bytes]]] = {}  # snapshot -> call -> its blocks
        self._count = CountedSet()  # block -> how many calls pin it

    def pin(self, snapshot_id: str, names: Iterable[bytes], call: int = 0) -> None:
        """`call` of `snapshot_id` pins `names` (in place of what it pinned before)."""
        calls = self._by_snapshot.setdefault(snapshot_id, {})
        self._count.release(calls.pop(call, frozenset()))
        calls[call] = frozenset(names)
        self._count.add(calls[call])

    def add(self, snapshot_id: str, names: Iterable[bytes], call: int) -> None:
        """`call` of `snapshot_id` pins `names` too (a report's blocks, as its stream brings them)."""
        calls = self._by_snapshot.setdefault(snapshot_id, {})
        before = calls.get(call, frozenset())
        new = frozenset(names) - before
        calls[call] = before | new
        self._count.add(new)

    def unpin(self, snapshot_id: str, call: int | None = None) -> set[bytes]:
        """The pins of `call` of the snapshot go (None: all its calls'): the blocks nothing pins now."""
        calls = self._by_snapshot.get(snapshot_id, {})
        names = [calls.pop(c) for c in (list(calls) if call is None else [call]) if c in calls]
        if not calls:
            self._by_snapshot.pop(snapshot_id, None)
        return set().union(*(self._count.release(n) for n in names))

    def pinned(self, name: bytes) -> bool:
        return name in self._count

    def __len__(self) -> int:
        return len(self._count)
