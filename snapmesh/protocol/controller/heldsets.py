"""Block names held by holders, each holder's names one set: which a release frees, pure.

BlockRefs (a stored snapshot references its blocks, blockrefs.py G2) and BlockPins
(a journaled report's call pins the blocks it names, blockpins.py) each say which
blocks a holder holds and must say exactly which blocks their last holder let go:
the caller deletes those, so a name freed while held loses a block, and one never
freed leaks it. One class carries that for both, so the rule is written once.

HS1. A holder holds a name once, however often the names it is given repeat it,
    and a name is held while any holder's set has it.
HS2. `hold` and `release` return exactly the names of the holder's set before
    that no holder's set has after: no name another holder still has, and every
    name none has.
HS3. Nothing is counted per name: a holder's names are kept as the one frozenset
    it is given, and what a release frees is its set less the others' (set
    differences in C, the newest holders first). At 64 MiB a node and four nodes,
    each snapshot adds and releases 32,768 names as pins and as many as references,
    of which a few hundred changed: a count per name cost a dict update for every
    one, each time; a set difference with the holder before costs one look-up in C,
    and what is left after the first few holders is only what changed.
HS4. `release(holders, narrow)`: each let-go set is first narrowed by `narrow` (names ->
    those of them another owner does not hold, e.g. the store's references for its pins)
    and only what is left is joined and checked here: a filed snapshot's pins, each set
    a node's names and all of them referenced, made a union of every node's names and
    checked it twice (3x the CPU of narrowing each); narrowed, the union is what changed.
    The same names are freed either way: narrowing and the check here commute.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable


class HeldSets:
    def __init__(self) -> None:
        self._sets: dict[Hashable, frozenset[bytes]] = {}  # holder -> its names, the oldest first

    def hold(self, holder: Hashable, names: Iterable[bytes]) -> set[bytes]:
        """`holder` holds `names` in place of what it held: the names of before none holds now (HS2)."""
        before = self._sets.pop(holder, frozenset())
        after = names if isinstance(names, frozenset) else frozenset(names)
        self._sets[holder] = after
        return self.unheld(before - after)

    def release(self, holders: Iterable[Hashable],
                narrow: Callable[[frozenset[bytes]], set[bytes]] | None = None) -> set[bytes]:
        """`holders` hold nothing any more: the names of theirs none holds now (HS2), each
        holder's narrowed first by `narrow` (HS4)."""
        let_go: list = [names for holder in list(holders) if (names := self._sets.pop(holder, None)) is not None]
        if narrow is not None:
            let_go = [narrow(names) for names in let_go]
        if len(let_go) > 1:
            let_go = [set().union(*let_go)]
        return self.unheld(let_go[0]) if let_go else set()

    def names(self, holder: Hashable) -> frozenset[bytes]:
        return self._sets.get(holder, frozenset())

    def unheld(self, names: Iterable[bytes]) -> set[bytes]:
        """Those of `names` no holder holds (HS3)."""
        left = given = names if isinstance(names, (set, frozenset)) else set(names)
        for held in reversed(self._sets.values()):
            if not left:
                break
            left = left.difference(held)  # C: iterates the smaller side, mostly
        return left if type(left) is set and left is not given else set(left)

    def __contains__(self, name: object) -> bool:
        return any(name in held for held in reversed(self._sets.values()))

    def __len__(self) -> int:
        """How many distinct names are held (a union: for audits and tests, not a hot path)."""
        return len(frozenset().union(*self._sets.values()))
