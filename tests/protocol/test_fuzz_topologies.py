"""The fault fuzzer on named topologies (`snapmesh sim fuzz --topology`) and its own draws of them.

Fresh seeds each run, printed first: a failure says the one command that replays it.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from snapmesh.commands import sim as cli
from snapmesh.fuzzer import fuzz
from snapmesh.sim.world import World

BASE = random.randrange(10**6)


@pytest.mark.parametrize("topology", ["ring", "mesh", "random-regular:1", "random-regular:2", "random-regular:4"])
def test_every_invariant_holds_on_a_named_topology(topology: str) -> None:
    print(f"fuzz --topology {topology}: seeds {BASE}..{BASE + 39}")
    ran, failure = fuzz.fuzz(BASE, 40, topology=topology)
    if failure is not None:
        seed, why = failure
        pytest.fail(f"seed {seed}: {why}\nreplay: {fuzz.replay_command(seed, topology=topology)}", pytrace=False)
    assert ran == 40


def test_a_random_regular_case_has_its_degrees_and_enough_nodes() -> None:
    for seed in range(BASE, BASE + 20):
        world = World(seed, topology="random-regular:4")
        assert len(world.ids) >= 5, world.describe()
        outs = Counter(src for src, _ in world.channels)
        ins = Counter(dst for _, dst in world.channels)
        assert outs == ins == dict.fromkeys(world.ids, 4), world.describe()
        assert "topology random-regular:4" in world.describe()


def test_the_fuzzers_own_draws_include_random_regular_and_rings() -> None:
    shapes = Counter(World(seed).shape.partition(":")[0] for seed in range(200))
    assert shapes["random-regular"] > 20 and shapes["ring"] > 5 and shapes["drawn"] > 80, shapes
    for seed in range(200):
        world = World(seed)
        if world.shape.startswith("random-regular:"):
            k = int(world.shape.partition(":")[2])
            assert Counter(src for src, _ in world.channels) == dict.fromkeys(world.ids, k), world.describe()


def test_the_replay_command_names_the_topology(capsys) -> None:
    assert fuzz.replay_command(7, topology="random-regular:2") == \
        "snapmesh sim fuzz --seed 7 --cases 1 --topology random-regular:2"
    assert cli.main(["fuzz", "--seed", "7", "--cases", "1", "--topology", "random-regular:2"]) == 0
    out = capsys.readouterr().out
    assert "topology random-regular:2" in out.splitlines()[0] and "ok: 1 cases" in out


@pytest.mark.parametrize("spec, says", [
    ("star", "unknown topology 'star'"), ("random-regular:0", "K must be at least 1"),
    ("random-regular:x", "K must be a whole number"),
])
def test_a_bad_topology_is_one_line_and_exit_2(spec: str, says: str, capsys) -> None:
    assert cli.main(["fuzz", "--cases", "1", "--topology", spec]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and says in captured.err, captured.err
