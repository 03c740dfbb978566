"""Which blocks a node's save carries in its pending-report file (snapmesh/protocol/savedblocks.py SV1)."""

from __future__ import annotations

from snapmesh.protocol import savedblocks


def test_a_save_carries_each_block_not_durable_once_and_what_earlier_saves_carried_that_it_names():
    names = [b"a", b"b", b"c", b"b", b"d"]
    new, again = savedblocks.carried(
        names, changed=[0, 1, 3, 4], durable={b"d"}, unsettled=[b"c", b"x"], kept=frozenset(names))
    assert new == [0, 1], "b once though twice; d durable: never carried"
    assert again == [b"c"], "carried before and not durable yet: again; x no longer named: not"


def test_a_block_both_changed_and_unsettled_is_carried_once():
    names = [b"a", b"b"]
    new, again = savedblocks.carried(names, changed=range(2), durable=set(), unsettled=[b"a"], kept=frozenset(names))
    assert (new, again) == ([0, 1], [])
