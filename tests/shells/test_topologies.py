"""Named topologies (snapmesh/settings/topologies.py): random-regular:K is K-regular, simple and
strongly connected for every N, K and seed drawn; the names and their bad input.

The property test draws its cases from one seed, printed first, so a failure says how to
replay it: SNAPMESH_TOPOLOGY_SEED=S pytest tests/shells/test_topologies.py.
"""

from __future__ import annotations

import os
import random
import tomllib
from collections import Counter

import pytest

from snapmesh.protocol.topology import Topology
from snapmesh.settings import topologies
from snapmesh.settings.config import load, write_cluster
from snapmesh.settings.topologies import ShapeError

SEED = int(os.environ.get("SNAPMESH_TOPOLOGY_SEED", random.randrange(2**32)))


def test_random_regular_is_k_regular_simple_and_strongly_connected():
    print(f"topology property seed {SEED} (replay: SNAPMESH_TOPOLOGY_SEED={SEED})")
    rng = random.Random(SEED)
    cases = [(n, k) for n in range(2, 9) for k in range(1, n)]  # every K of the small N
    cases += [(n, rng.randint(1, n - 1)) for n in (rng.randint(9, 40) for _ in range(40))]
    cases += [(200, 8), (64, 63)]
    for n, k in cases:
        seed = rng.randrange(2**32)
        ids = [f"p{i}" for i in range(1, n + 1)]
        channels = topologies.channels(f"random-regular:{k}", ids, seed)
        where = f"random-regular:{k} on {n} nodes, graph seed {seed} (property seed {SEED})"
        assert len(set(channels)) == len(channels) == n * k, where
        assert all(src != dst for src, dst in channels), where
        assert Counter(src for src, _ in channels) == dict.fromkeys(ids, k), where
        assert Counter(dst for _, dst in channels) == dict.fromkeys(ids, k), where
        assert Topology(tuple(ids), tuple(channels)).not_strongly_connected_witness() is None, where
        assert topologies.channels(f"random-regular:{k}", ids, seed) == channels, f"not deterministic: {where}"


def test_the_seed_chooses_the_graph():
    ids = [f"p{i}" for i in range(1, 13)]
    drawn = {tuple(topologies.channels("random-regular:3", ids, seed)) for seed in range(20)}
    assert len(drawn) > 15


def test_a_seed_gives_the_same_graph_on_every_machine():
    # Pinned: a cluster file written from a seed today is written the same way tomorrow.
    assert topologies.channels("random-regular:2", ["a", "b", "c", "d"], 7) == [
        ("a", "b"), ("a", "c"), ("b", "a"), ("b", "d"), ("c", "a"), ("c", "d"), ("d", "b"), ("d", "c")]


def test_mesh_and_ring():
    ids = ["p1", "p2", "p3"]
    assert topologies.channels("mesh", ids) is None  # a cluster file leaves `channels` out for the mesh
    assert topologies.channels("ring", ids) == [("p1", "p2"), ("p2", "p3"), ("p3", "p1")]
    assert topologies.channels("random-regular:2", ids, 5) == [(a, b) for a in ids for b in ids if a != b]


@pytest.mark.parametrize("spec, nodes, says", [
    ("star", 4, "unknown topology 'star': mesh, ring or random-regular:K"),
    ("ring:2", 4, "unknown topology 'ring:2'"),
    ("random-regular", 4, "K must be a whole number"),
    ("random-regular:two", 4, "K must be a whole number"),
    ("random-regular:0", 4, "K must be at least 1"),
    ("random-regular:-1", 4, "K must be at least 1"),
    ("random-regular:4", 4, "on 4 nodes: K must be below N, at most 3"),
    ("random-regular:9", 4, "K must be below N"),
])
def test_bad_input_is_one_line(spec, nodes, says):
    with pytest.raises(ShapeError) as caught:
        topologies.check(spec, nodes)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_write_cluster_writes_a_named_topology_into_channels(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=6, topology="random-regular:2", topology_seed=3)
    ids = [f"p{i}" for i in range(1, 7)]
    assert list(load(path, env={}).topology.channels) == topologies.channels("random-regular:2", ids, 3)
    assert "channels" not in tomllib.loads(write_cluster(tmp_path / "mesh.toml", nodes=3).read_text())
