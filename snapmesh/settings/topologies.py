"""Named topologies: the channels of `mesh`, `ring` and `random-regular:K`, drawn from a seed.

    mesh              every ordered pair of nodes (N * (N - 1) channels; a cluster
                      file says it by leaving `channels` out)
    ring              one way round in the order given: p1 -> p2 -> ... -> pN -> p1
    random-regular:K  every node sends on K channels and receives on K (1 <= K < N),
                      N * K channels, drawn from a seed

A random K-regular graph is built in K layers, each a permutation of the nodes
(a node's one successor in that layer): the first is a ring in a shuffled order,
so the graph is strongly connected whatever the other layers are; each further
layer is a perfect matching of senders to receivers in what is still allowed (no
self-loop, no channel of an earlier layer). After r layers every sender still has
N - 1 - r receivers it may take, and every receiver as many senders: a regular
bipartite graph, which always has a perfect matching (Hall), so a layer is found
every time (augmenting paths, tried in a seeded order) and nothing is redrawn.

Pure: the same names, K and seed give the same channels on every machine (one
`random.Random(seed)`, nothing else), so `cluster up --topology`, the fuzzer, the
chaos campaign and the bench can all say a graph by its name and its seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

MESH, RING, RANDOM_REGULAR = "mesh", "ring", "random-regular"
NAMES = f"{MESH}, {RING} or {RANDOM_REGULAR}:K"


class ShapeError(ValueError):
    """A topology name that names no graph, or none on this many nodes; one line."""


def parse(spec: str) -> tuple[str, int | None]:
    """(name, K) of a topology spec: ("mesh", None), ("ring", None), ("random-regular", K)."""
    name, colon, degree = spec.partition(":")
    if name in (MESH, RING) and not colon:
        return name, None
    if name != RANDOM_REGULAR:
        raise ShapeError(f"unknown topology {spec!r}: {NAMES}")
    try:
        k = int(degree)
    except ValueError:
        raise ShapeError(f"topology {spec!r}: K must be a whole number, as in {RANDOM_REGULAR}:3") from None
    if k < 1:
        raise ShapeError(f"topology {spec!r}: K must be at least 1 (each node needs a channel out), got {k}")
    return name, k


def check(spec: str, nodes: int) -> None:
    """ShapeError unless `spec` names a graph on `nodes` nodes."""
    name, k = parse(spec)
    if k is not None and k >= nodes:
        raise ShapeError(f"topology {spec!r} on {nodes} nodes: K must be below N, at most {nodes - 1}")


def channels(spec: str, ids: Sequence[str], seed: int = 0) -> list[tuple[str, str]] | None:
    """The channels `spec` names on the nodes `ids` (None for the mesh: a cluster file leaves
    `channels` out for it), in the order of `ids` by sender, then by receiver."""
    check(spec, len(ids))
    name, k = parse(spec)
    if name == MESH:
        return None
    if name == RING:
        return [(ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids))] if len(ids) > 1 else []
    return random_regular(ids, k, seed)  # type: ignore[arg-type]


def random_regular(ids: Sequence[str], k: int, seed: int) -> list[tuple[str, str]]:
    """A strongly connected digraph on `ids` where every node has out-degree and in-degree `k`
    (1 <= k < len(ids)), no self-loop and no channel twice, drawn from `seed`."""
    ids = list(ids)
    if len(set(ids)) != len(ids):
        raise ShapeError("a node is listed twice")
    if not 1 <= k < len(ids):
        raise ShapeError(f"{RANDOM_REGULAR}:{k} on {len(ids)} nodes: K must be 1 to {len(ids) - 1}")
    rng = random.Random(seed)
    order = ids[:]
    rng.shuffle(order)
    used = {(order[i], order[(i + 1) % len(order)]) for i in range(len(order))}
    for _ in range(k - 1):
        used.update(_layer(rng, ids, used))
    place = {node: index for index, node in enumerate(ids)}
    return sorted(used, key=lambda c: (place[c[0]], place[c[1]]))


def _layer(rng: random.Random, ids: list[str], used: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """One more permutation layer: each node sends to one new receiver, each receives from one."""
    receivers = ids[:]
    rng.shuffle(receivers)
    start = {node: rng.randrange(len(ids)) for node in ids}

    def candidates(src: str) -> Iterator[str]:
        for step in range(len(receivers)):
            dst = receivers[(start[src] + step) % len(receivers)]
            if dst != src and (src, dst) not in used:
                yield dst

    sender_of: dict[str, str] = {}  # receiver -> its sender in this layer
    senders = ids[:]
    rng.shuffle(senders)
    for src in senders:
        free = next((dst for dst in candidates(src) if dst not in sender_of), None)
        if free is not None:  # most senders find a receiver no one has taken: no path to search
            sender_of[free] = src
        elif not _augment(src, candidates, sender_of):
            raise AssertionError(f"no perfect matching for {src}: the allowed graph was not regular")
    return [(src, dst) for dst, src in sender_of.items()]


def _augment(root: str, candidates, sender_of: dict[str, str]) -> bool:
    """Kuhn's augmenting path from sender `root`, iterative (no recursion limit at 1,000 nodes)."""
    seen: set[str] = set()
    stack = [(root, candidates(root))]
    chosen: list[str] = []  # chosen[i]: the receiver stack[i]'s sender reached for
    while stack:
        src, options = stack[-1]
        dst = next((d for d in options if d not in seen), None)
        if dst is None:
            stack.pop()
            if chosen:
                chosen.pop()
            continue
        seen.add(dst)
        chosen.append(dst)
        if dst not in sender_of:
            for (level_src, _), level_dst in zip(stack, chosen, strict=True):
                sender_of[level_dst] = level_src
            return True
        stack.append((sender_of[dst], candidates(sender_of[dst])))
    return False
