"""The held sets BlockRefs and BlockPins share (snapmesh/protocol/controller/heldsets.py), and both on it, pure."""

from __future__ import annotations

import random
from collections import Counter

from snapmesh.protocol.controller.blockpins import BlockPins
from snapmesh.protocol.controller.blockrefs import BlockRefs
from snapmesh.protocol.controller.heldsets import HeldSets

X, Y, Z = b"x" * 32, b"y" * 32, b"z" * 32


def test_a_name_is_freed_only_by_the_release_of_its_last_holder():
    held = HeldSets()
    held.hold("a", {X, Y})
    held.hold("b", {Y, Z})
    assert held.release(["b"]) == {Z}  # Y is still the first holder's
    assert Y in held and Z not in held and len(held) == 2
    assert held.release(["a"]) == {X, Y}
    assert len(held) == 0 and X not in held


def test_releasing_nothing_or_a_holder_not_held_frees_nothing():
    held = HeldSets()
    held.hold("a", {X})
    assert held.release([]) == set() and held.release(["b"]) == set() and X in held


def test_a_name_a_manifest_names_twice_is_held_once_and_freed_by_one_release():
    refs = BlockRefs()
    assert refs.hold("s1", [X, Y, X, X]) == set()  # G1
    assert len(refs) == 2
    assert refs.drop("s1") == {X, Y}
    assert not refs.referenced(X) and len(refs) == 0


def test_a_block_dropped_from_one_snapshot_stays_while_another_keeps_it():
    refs = BlockRefs()
    refs.hold("s1", [X, Y])
    refs.hold("s2", [Y, Z])
    assert refs.hold("s1", [Z]) == {X}  # s1 again without X and Y: only X is unreferenced now
    assert refs.referenced(Y) and refs.referenced(Z)
    assert refs.drop("s2") == {Y}  # Z is still s1's
    assert refs.unreferenced([X, Y, Z]) == {X, Y}
    assert refs.drop("s1") == {Z} and refs.drop("s1") == set()


def test_a_call_pinned_again_holds_what_it_names_last_and_its_unpin_frees_only_what_none_pins():
    pins = BlockPins()
    pins.pin("s1", {X}, call=1)  # its held blocks (store.py `pin`)
    pins.pin("s1", {X, Y}, call=1)  # then all it names (store.py `keep`)
    pins.pin("s1", {Y}, call=2)
    pins.add("s2", {Z}, call=3)
    pins.add("s2", {X}, call=3)
    assert pins.unpin("s1", call=1) == set()  # X is call 3's, Y call 2's
    assert pins.unpin("s1") == {Y}
    assert pins.pinned(X) and pins.pinned(Z) and not pins.pinned(Y) and len(pins) == 2
    assert pins.unpinned([X, Y, Z]) == {Y}
    assert pins.unpin("s2", call=4) == set()  # no such call: nothing goes
    assert pins.unpin("s2") == {X, Z} and len(pins) == 0


def test_what_is_held_and_freed_is_what_a_count_per_name_says_under_random_holds_and_releases():
    rng = random.Random(7)
    universe = [bytes([i]) * 32 for i in range(40)]
    held, model, sets = HeldSets(), Counter(), {}
    for _ in range(3000):
        holder = rng.randrange(8)
        if rng.random() < 0.6:
            names = [rng.choice(universe) for _ in range(rng.randrange(12))]  # repeats too (HS1)
            before = sets.get(holder, set())
            model.subtract(before)
            sets[holder] = set(names)
            model.update(sets[holder])
            expected = {n for n in before if model[n] <= 0}
            assert held.hold(holder, names) == expected
        else:
            before = sets.pop(holder, set())
            model.subtract(before)
            assert held.release([holder]) == {n for n in before if model[n] <= 0}
        model = +model
        assert len(held) == len(model)
        probe = rng.sample(universe, 10)
        assert held.unheld(probe) == {n for n in probe if n not in model}
        assert all((n in held) == (n in model) for n in probe)


def test_pins_narrowed_by_the_references_first_free_what_the_unnarrowed_release_frees():
    """HS4: a snapshot's calls' pins, each narrowed by the references before they are joined, free
    (after the references' own check) exactly the names the release of them whole would."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    universe = [bytes([i]) * 32 for i in range(200)]
    for round_ in range(40):
        pins, plain, refs = BlockPins(), BlockPins(), BlockRefs()
        for sid in ("s1", "s2"):
            for call in range(rng.randrange(1, 4)):
                names = set(rng.sample(universe, rng.randrange(0, 60)))
                pins.pin(sid, names, call)
                plain.pin(sid, names, call)
        for sid in ("s0", "s1"):
            refs.hold(sid, rng.sample(universe, rng.randrange(0, 150)))
        call = rng.choice([None, 0, 1])
        freed = pins.unpin("s1", call, refs.unreferenced)
        whole = refs.unreferenced(plain.unpin("s1", call))
        assert freed == whole, (seed, round_)
        assert all(not refs.referenced(name) for name in freed), (seed, round_)
        assert {name for name in universe if pins.pinned(name)} == {name for name in universe if plain.pinned(name)}
