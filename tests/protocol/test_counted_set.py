"""The counted set BlockRefs and BlockPins share (snapmesh/protocol/controller/countedset.py), pure."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller.countedset import CountedSet

X, Y, Z = b"x" * 32, b"y" * 32, b"z" * 32


def test_a_name_is_freed_only_by_the_release_of_its_last_holder():
    held = CountedSet()
    held.add({X, Y})
    held.add({Y, Z})
    assert held.release({Y, Z}) == {Z}  # Y is still the first holder's
    assert Y in held and Z not in held and len(held) == 2
    assert held.release({X, Y}) == {X, Y}
    assert len(held) == 0 and X not in held


def test_releasing_nothing_frees_nothing():
    held = CountedSet()
    held.add({X})
    assert held.release(()) == set() and X in held


def test_a_name_released_more_often_than_held_is_named_not_freed_quietly():
    held = CountedSet()
    held.add({X})
    held.release({X})
    with pytest.raises(KeyError, match="sha256:" + X.hex() + " released more often than it was held"):
        held.release({X})
    with pytest.raises(KeyError, match=Y.hex()):
        held.release({Y})
