"""A multiset of block names: how many holders hold each name, and which a release frees, pure.

BlockRefs (a stored snapshot references its blocks, blockrefs.py G2) and BlockPins
(a journaled report's call pins the blocks it names, blockpins.py) each count
holders per block and must say exactly which blocks their last holder let go:
the caller deletes those, so a name freed while held loses a block, and one never
freed leaks it. One class carries that count for both, so the rule is written once.
"""

from __future__ import annotations

from collections.abc import Iterable


class CountedSet:
    def __init__(self) -> None:
        self._count: dict[bytes, int] = {}  # name -> how many holders hold it (never 0: absent instead)

    def add(self, names: Iterable[bytes]) -> None:
        """One more holder holds each of `names` (a holder counts a name once: pass a set)."""
        for name in names:
            self._count[name] = self._count.get(name, 0) + 1

    def release(self, names: Iterable[bytes]) -> set[bytes]:
        """One holder of each of `names` lets go: the names no holder holds now.
        A name not held is a caller's bug (it would free a block another holder
        needs): it raises, naming the block."""
        freed = set()
        for name in names:
            left = self._count.get(name, 0) - 1
            if left < 0:
                raise KeyError(f"block sha256:{name.hex()} released more often than it was held")
            if left:
                self._count[name] = left
            else:
                del self._count[name]
                freed.add(name)
        return freed

    def __contains__(self, name: object) -> bool:
        return name in self._count

    def __len__(self) -> int:
        """How many distinct names are held."""
        return len(self._count)
