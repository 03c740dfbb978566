"""A cut of a blocks app follows the parts that changed, not the state's size (cutnames.CN6):
one pass over its parts, and the state named exactly as a cut from nothing names it."""

from __future__ import annotations

import os
import random

from snapmesh.protocol import statedigest
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node.cutnames import CutNames


class Parts(tuple):
    """An app's parts that count the passes made over them."""

    passes = 0

    def __iter__(self):
        Parts.passes += 1
        return super().__iter__()


def _cut(names: CutNames, parts: list[bytes]) -> tuple[tuple[str, list, list, object], int]:
    """The cut's digest, names, bounds and key, and how many passes it made over its parts."""
    cut = Parts(parts)
    state = BlockState(tuple(parts))
    Parts.passes = 0
    digest, named = names.digest(state, cut)
    assert named is not None
    return (digest, named.names, named.bounds, named.cut), Parts.passes


def _cut_once(parts: list[bytes]) -> CutNames:
    """Names that have cut `parts` once: what the next cut follows."""
    names = CutNames()
    _cut(names, parts)
    return names


def _cut_as_from_nothing(names: CutNames, parts: list[bytes]) -> int:
    """Cut `parts` with `names` (what it kept of its last cut), checked against a cut from nothing and
    against the grid's digest of their bytes; how many passes it made over them."""
    got, passes = _cut(names, parts)
    assert got == _cut(CutNames(), parts)[0]
    assert got[0] == statedigest.of_names(statedigest.grid_names(b"".join(parts)))
    return passes


def test_a_cut_of_as_many_parts_passes_over_them_once_and_names_them_as_from_nothing() -> None:
    rng = random.Random(7)
    parts = [os.urandom(BLOCK_BYTES) for _ in range(512)] + [os.urandom(100)]
    names = _cut_once(parts)
    for _ in range(3):
        for i in rng.sample(range(len(parts) - 1), 9):
            parts[i] = os.urandom(BLOCK_BYTES)
        # CN6: this cut's parts beside the last's, once (the old cut read sizes, types, ids too)
        assert _cut_as_from_nothing(names, parts) == 2


def test_a_part_that_changed_its_size_or_left_the_grid_is_followed_too() -> None:
    parts = [os.urandom(BLOCK_BYTES) for _ in range(200)]
    names = _cut_once(parts)
    parts[5] = os.urandom(BLOCK_BYTES + 10)  # off the grid: two report blocks for this part
    parts[-1] = os.urandom(30)
    grown = list(parts)
    parts[-1] = os.urandom(BLOCK_BYTES)
    back = list(parts)
    back[5] = os.urandom(BLOCK_BYTES)  # on the grid again
    for cut in (grown, parts, back):
        _cut_as_from_nothing(names, cut)


def test_a_part_inserted_is_looked_up_and_the_others_keep_their_names() -> None:
    parts = [os.urandom(BLOCK_BYTES) for _ in range(64)]
    names = _cut_once(parts)
    before = names.hashed
    parts.insert(10, os.urandom(BLOCK_BYTES))  # every part after it moved: found by identity (CN1)
    _cut_as_from_nothing(names, parts)
    assert names.hashed - before == 1
