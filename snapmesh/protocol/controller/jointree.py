"""A state's pieces' results joined, kept as a tree so that a changed piece re-joins a path, pure.

An invariant that adds up its pieces' results (View.fold_joined) went over every
piece's result at every snapshot, about a thousand a node at 64 MiB, though a
few changed. The tree keeps the joins of pairs of results, of pairs of those and
so on: a changed piece re-joins the results on its way to the root, so setting k
pieces of n costs about k log2 n joins, and the root is the join of all.

Rules:
JT1. `join` is associative over a sequence (the join of consecutive joins is the
    join of all, in order), and the join of one result is that result: the root
    is then `join(results)`, however the tree groups them. A result left over at
    the end of a level goes up unjoined, so `join` of one is never asked.
JT2. `set(i, result)` replaces the i-th result; `root()` re-joins only the nodes
    above the results set since the last `root()`, each once.
JT3. No results: the root is `join([])`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class JoinTree:
    def __init__(self, results: list[Any], join: Callable[[list[Any]], Any]) -> None:
        self._join = join
        self._levels: list[list[Any]] = [list(results)]  # the results, then each level's joins of pairs
        while len(self._levels[-1]) > 1:
            below = self._levels[-1]
            self._levels.append([self._pair(below, i) for i in range(0, len(below), 2)])
        self._dirty: set[int] = set()  # results set since the last root (JT2)

    def __len__(self) -> int:
        return len(self._levels[0])

    def set(self, index: int, result: Any) -> None:
        self._levels[0][index] = result
        self._dirty.add(index)

    def root(self) -> Any:
        if not self._levels[0]:
            return self._join([])  # JT3
        dirty = self._dirty
        for level in range(1, len(self._levels)):
            below, here = self._levels[level - 1], self._levels[level]
            dirty = {i // 2 for i in dirty}
            for i in dirty:
                here[i] = self._pair(below, 2 * i)
        self._dirty = set()
        return self._levels[-1][0]

    def _pair(self, below: list[Any], left: int) -> Any:
        return self._join(below[left:left + 2]) if left + 1 < len(below) else below[left]  # JT1: one goes up
