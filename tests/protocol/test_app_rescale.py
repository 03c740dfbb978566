"""kvshard's and the bank's rescale, as properties over seeded runs (KR1-KR4, BR1-BR4).

Each seed runs the app's workload on an old node set (snapmesh.app.testing: FIFO
channels, a cut with messages in flight), rescales the cut onto a new node set
drawn from the same seed, and holds the result to the rules: kvshard's every live
key exactly once at its stable home, the names' history once each; the bank's
total kept and every removed account's money at its heir. The new states then
run on the new node set, the invariants checked at every step. Each seed is
printed first; a failure names it.
"""

from __future__ import annotations

import json
import random

import pytest

from snapmesh.app import NodeInfo, View, check_invariants
from snapmesh.app.testing import Cluster, run
from snapmesh.services.app import bank, kvshard

SEEDS = list(range(12))


def mesh(nodes: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for a in nodes for b in nodes if a != b]


def infos(nodes: list[str], params=None) -> list[NodeInfo]:
    return [NodeInfo(node_id=n, peers_out=tuple(m for m in nodes if m != n), peers_in=tuple(m for m in nodes if m != n),
                     params=params or {}) for n in nodes]


def node_sets(rng: random.Random) -> tuple[list[str], list[str]]:
    """An old node set and a new one: some kept, some removed, some new."""
    old = [f"p{i}" for i in range(1, rng.randint(2, 6) + 1)]
    new = [f"p{i}" for i in range(1, rng.randint(2, 7) + 1)]
    if rng.random() < 0.3:  # a set that is not a prefix: the first nodes removed
        new = [n for n in new if n != "p1"] + ["p8"]
    return old, new


def cut(app, old: list[str], rng: random.Random, params=None) -> tuple[Cluster, View]:
    cluster = Cluster(app, mesh(old), params)
    run(cluster, seed=rng.randrange(2**32), steps=rng.randint(50, 400), command_share=0.5, shadow_share=0.0)
    return cluster, cluster.view("cut")


@pytest.mark.parametrize("seed", SEEDS)
def test_kvshard_rescale_lands_every_live_key_exactly_once_at_its_home(seed):
    rng = random.Random(seed)
    old, new = node_sets(rng)
    print(f"seed {seed}: kvshard {old} -> {new}")
    cluster, view = cut(kvshard.app, old, rng)
    live = set(kvshard.places(view))
    names = {kind: sorted(n for s in view.states.values() for n in json.loads(s)[kind]) for kind in ("created", "deleted")}
    cluster.drain(random.Random(seed))
    settled = {k: e["value"] for m in cluster.machines.values() for k, e in m.keys.items()}
    states = kvshard.rescale(view, infos(new))
    assert sorted(states) == sorted(new), f"seed {seed}"
    decoded = {n: json.loads(s) for n, s in states.items()}
    after = View(snapshot_id="after", states=states, in_flight=())
    assert check_invariants(kvshard.app, after) == {"every key exactly once": []}, f"seed {seed}"
    held = {k: n for n, s in decoded.items() for k in s["keys"]}
    assert set(held) == live == set(settled), f"seed {seed}: every live key, in flight at the cut or not, lands once"
    assert all(held[k] == kvshard.home(k, new) for k in held), f"seed {seed}: each at its stable home"
    assert all(not s["moved"] for s in decoded.values()), f"seed {seed}: no pointer outlives the channels"
    for kind in ("created", "deleted"):
        assert sorted(n for s in decoded.values() for n in s[kind]) == names[kind], f"seed {seed}: {kind} once each"
        for node, state in decoded.items():
            assert all(n.split("/")[0] == node or n.split("/")[0] not in new for n in state[kind]), f"seed {seed}"
    updates = {json.loads(p)["key"] for *_, p in view.in_flight if json.loads(p)["type"] == "update"}
    for key in live - updates:  # a key with no update in flight has the value it settles to
        assert decoded[held[key]]["keys"][key]["value"] == settled[key], f"seed {seed}: {key}"
    assert kvshard.rescale(view, infos(new)) == states, f"seed {seed}: a pure function (a resumed restore)"
    grown = Cluster(kvshard.app, mesh(new))
    grown.restore(after)
    run(grown, seed=seed, steps=300, command_share=0.5)  # the invariants at every step on the new node set


def test_kvshard_rescale_absorbs_a_handoff_and_its_update_in_flight():
    cluster = Cluster(kvshard.app, mesh(["p1", "p2", "p3"]))
    cluster.command("p1", b'{"op": "put", "key": "p1/a", "value": 1}')
    cluster.command("p1", b'{"op": "move", "key": "p1/a", "to": "p2"}')
    cluster.command("p1", b'{"op": "put", "key": "p1/a", "value": 2}')  # follows the handoff (K4)
    view = cluster.view("cut")
    assert [json.loads(p)["type"] for *_, p in view.in_flight] == ["handoff", "update"]
    states = kvshard.rescale(view, infos(["p1", "p2"]))
    held = {k: (n, e["value"]) for n, s in states.items() for k, e in json.loads(s)["keys"].items()}
    assert held == {"p1/a": (kvshard.home("p1/a", ["p1", "p2"]), 2)}


@pytest.mark.parametrize("seed", SEEDS)
def test_bank_rescale_keeps_the_total_and_gives_removed_money_to_its_heir(seed):
    rng = random.Random(seed)
    old, new = node_sets(rng)
    survivors = [n for n in new if n in old]
    heirs = {n: rng.choice(survivors) for n in old if n not in new and survivors and rng.random() < 0.5}
    print(f"seed {seed}: bank {old} -> {new}, heirs {heirs}")
    params = {"total": 1000 * len(old), "heirs": heirs}
    _, view = cut(bank.app, old, rng, params)
    balances = {n: int(s) for n, s in view.states.items()}
    to = {n: sum(int(p) for _, d, _, p in view.in_flight if d == n) for n in old}
    states = bank.rescale(view, infos(new, params))
    after = {n: int(s) for n, s in states.items()}
    assert sorted(after) == sorted(new), f"seed {seed}"
    assert sum(after.values()) == params["total"], f"seed {seed}: the total kept"
    assert check_invariants(bank.app, View(snapshot_id="after", states=states, in_flight=(), params=params)) == {
        "conserved": []}
    expected = dict.fromkeys(new, 0)
    for node in old:
        expected[node if node in new else heirs.get(node, survivors[0] if survivors else new[0])] += balances[node] + to[node]
    assert after == expected, f"seed {seed}: each account's money, and what was in flight to it, at its owner or heir"
    shrunk = Cluster(bank.app, mesh(new), params)
    shrunk.restore(View(snapshot_id="after", states=states, in_flight=(), params=params))
    run(shrunk, seed=seed, steps=200)


def test_bank_rescale_refuses_an_heir_outside_the_new_set():
    view = View(snapshot_id="s", states={"p1": b"10", "p2": b"20", "p3": b"5"}, in_flight=[("p3", "p1", 1, b"3")],
                params={"heirs": {"p3": "p9"}})
    with pytest.raises(ValueError, match=r"params heirs\['p3'\] = 'p9' is not a node of the new set \(p1, p2\)"):
        bank.rescale(view, infos(["p1", "p2"]))
    good = View(snapshot_id="s", states=view.states, in_flight=view.in_flight, params={"heirs": {"p3": "p2"}})
    assert bank.rescale(good, infos(["p1", "p2"])) == {"p1": b"13", "p2": b"25"}
