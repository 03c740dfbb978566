"""kvshard's `every key exactly once` over states of any size: it reads one node's
state at a time, by name (services/app/kvscan.py), keeps sums, not the names, and
still names every wrong key in the words a check over every name would use."""

from __future__ import annotations

import dataclasses
import json
import random
import tracemalloc
from collections import Counter
from collections.abc import Iterator, Mapping

import pytest

from snapmesh.app import View, check_invariants
from snapmesh.app.testing import Cluster, run
from snapmesh.services.app import kvscan, kvshard
from snapmesh.services.app.kvshard import encode

APP = kvshard.app
INVARIANT = "every key exactly once"
MESH = [(a, b) for a in ("p1", "p2", "p3") for b in ("p1", "p2", "p3") if a != b]


def exhaustive(view: View) -> list[str]:
    """The check over every name at once, every state decoded whole: what the bounded one must say."""
    states = {node: json.loads(state) for node, state in view.states.items()}
    created = Counter(name for state in states.values() for name in state["created"])
    deleted = Counter(name for state in states.values() for name in state["deleted"])
    found: dict[str, list[str]] = {}
    for node, state in sorted(states.items()):
        for key in state["keys"]:
            found.setdefault(key, []).append(f"at {node}")
    for src, dst, seq, payload in view.in_flight:
        message = json.loads(payload)
        if message["type"] == "handoff":
            found.setdefault(message["key"], []).append(f"in flight {src}->{dst} seq {seq}")
    problems = [f"key {k} created {n} times" for k, n in sorted(created.items()) if n > 1]
    problems += [f"key {k} deleted {n} times" for k, n in sorted(deleted.items()) if n > 1]
    problems += [f"key {k} deleted but never created" for k in sorted(set(deleted) - set(created))]
    expected = set(created) - set(deleted)
    for key in sorted(expected | set(found)):
        seen = found.get(key, [])
        if key not in expected:
            problems.append(f"key {key} seen {len(seen)} times ({', '.join(seen)}) but is not a live key")
        elif len(seen) != 1:
            problems.append(f"key {key} seen {len(seen)} times" + (f" ({', '.join(seen)})" if seen else " (lost)"))
    return problems


def state(keys=(), created=(), deleted=(), moved=None) -> dict:
    return {"keys": {k: {"value": 0, "created_at": k.split("/")[0]} for k in keys}, "moved": moved or {},
            "created": list(created), "deleted": list(deleted)}


def view_of(states: Mapping[str, dict], in_flight=()) -> View:
    return View(snapshot_id="s1", states={n: encode(s) for n, s in states.items()}, in_flight=list(in_flight))


def handoff(key):
    return encode({"type": "handoff", "key": key, "value": 0, "created_at": key.split("/")[0]})


def problems(view: View) -> list[str]:
    found = check_invariants(APP, view)[INVARIANT]
    assert found == exhaustive(view)
    return found


def test_a_sound_cut_holds():
    view = view_of({"p1": state(["p1/a"], ["p1/a", "p1/b", "p1/c"], ["p1/c"]), "p2": state(["p3/x"], ["p2/y"], ["p2/y"]),
                    "p3": state([], ["p3/x", "p3/z"])}, [("p1", "p2", 1, handoff("p1/b")), ("p3", "p1", 4, handoff("p3/z"))])
    assert problems(view) == []


@pytest.mark.parametrize("states, in_flight, expected", [
    # A key on two nodes: the sums see it.
    ({"p1": state(["p1/a"], ["p1/a"]), "p2": state(["p1/a"])}, [], ["key p1/a seen 2 times (at p1, at p2)"]),
    # A key at a node and in a handoff.
    ({"p1": state(["p1/a"], ["p1/a"]), "p2": state()}, [("p1", "p2", 3, handoff("p1/a"))],
     ["key p1/a seen 2 times (at p1, in flight p1->p2 seq 3)"]),
    # A key lost, another doubled: the count is right, the sums are not.
    ({"p1": state(["p1/b"], ["p1/a", "p1/b"]), "p2": state(["p1/b"])}, [],
     ["key p1/a seen 0 times (lost)", "key p1/b seen 2 times (at p1, at p2)"]),
    # Created at two nodes and found at both: the sums match; the namespace at two nodes does not.
    ({"p1": state(["p1/a"], ["p1/a"]), "p2": state(["p1/a"], ["p1/a"])}, [],
     ["key p1/a created 2 times", "key p1/a seen 2 times (at p1, at p2)"]),
    # Created twice at one node and found twice: the list out of order says it.
    ({"p1": state(["p1/a"], ["p1/a", "p1/b", "p1/a"]), "p2": state(["p1/a"])}, [],
     ["key p1/a created 2 times", "key p1/a seen 2 times (at p1, at p2)", "key p1/b seen 0 times (lost)"]),
    ({"p1": state([], ["p1/a"], ["p1/a"]), "p2": state([], [], ["p1/a", "p2/q"])}, [],
     ["key p1/a deleted 2 times", "key p2/q deleted but never created"]),
    ({"p1": state(["p1/a"], ["p1/a"], ["p1/a"]), "p3": state(["p3/ghost"])}, [],
     ["key p1/a seen 1 times (at p1) but is not a live key", "key p3/ghost seen 1 times (at p3) but is not a live key"]),
])
def test_each_wrong_key_is_named(states, in_flight, expected):
    assert problems(view_of(states, in_flight)) == expected


def test_among_many_keys_only_the_wrong_ones_are_named():
    names = [f"p1/k{i:05d}" for i in range(3 * kvshard.BUCKETS)]
    p1 = state(names[1:], names)
    p2 = state([names[7]])
    assert problems(view_of({"p1": p1, "p2": p2})) == [
        f"key {names[0]} seen 0 times (lost)", f"key {names[7]} seen 2 times (at p1, at p2)"]


@pytest.mark.parametrize("seed", range(6))
def test_doctored_cuts_of_a_run_are_judged_as_by_every_name(seed):
    rng = random.Random(seed)
    cluster = Cluster(APP, MESH, {"keys": 40})
    run(cluster, seed=seed, steps=300)
    view = cluster.view("s1")
    assert problems(view) == []
    states = {node: json.loads(data) for node, data in view.states.items()}
    live = sorted(k for s in states.values() for k in s["keys"])
    for _ in range(rng.randint(1, 3)):
        node, other = rng.sample(sorted(states), 2)
        doctor = rng.randrange(5)
        if doctor == 0 and live:  # a key also elsewhere
            states[other]["keys"][rng.choice(live)] = {"value": 1, "created_at": "p1"}
        elif doctor == 1 and states[node]["keys"]:  # a key lost
            del states[node]["keys"][rng.choice(sorted(states[node]["keys"]))]
        elif doctor == 2 and states[node]["created"]:  # a name created again elsewhere
            states[other]["created"] = sorted({*states[other]["created"], rng.choice(states[node]["created"])})
        elif doctor == 3 and live:  # a live key deleted
            states[other]["deleted"] = sorted({*states[other]["deleted"], rng.choice(live)})
        else:  # a key never created
            states[node]["keys"][f"{node}/never"] = {"value": 0, "created_at": node}
    doctored = dataclasses.replace(view, states={node: encode(s) for node, s in states.items()})
    assert problems(doctored), f"seed {seed}: a doctored cut passed"


class Loads(Mapping[str, bytes]):
    """A View's states as the controller's are (lazystates L1): each read anew at every
    access, a copy; it counts the reads and the copies alive at once."""

    def __init__(self, states: Mapping[str, bytes]) -> None:
        self.states = dict(states)
        self.reads = 0
        self.alive = 0
        self.most_alive = 0

    def __getitem__(self, node: str) -> bytes:
        self.reads += 1
        self.alive += 1
        self.most_alive = max(self.most_alive, self.alive)
        return _Counted(self.states[node], self)

    def __iter__(self) -> Iterator[str]:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)


class _Counted(bytes):
    def __new__(cls, data: bytes, loads: Loads) -> _Counted:
        made = super().__new__(cls, data)
        made.loads = loads
        return made

    def __del__(self) -> None:
        self.loads.alive -= 1


def big_view(nodes=4, keys=2000) -> View:
    states = {}
    for i in range(1, nodes + 1):
        names = [f"p{i}/k{n:08d}" for n in range(keys)]
        states[f"p{i}"] = encode({"keys": {name: {"value": "ab" * 512, "created_at": f"p{i}"} for name in names},
                                  "moved": {}, "created": names, "deleted": []})
    return View(snapshot_id="s1", states=states, in_flight=[])


@pytest.mark.parametrize("doctored", [False, True])
def test_it_holds_one_state_at_a_time_and_little_beside_it(doctored):
    view = big_view()
    if doctored:  # a wrong key: its names are read again, one state at a time too
        p1 = json.loads(view.states["p1"])
        del p1["keys"]["p1/k00000005"]
        view = dataclasses.replace(view, states={**view.states, "p1": encode(p1)})
    loads = Loads(view.states)
    one_state = max(len(data) for data in view.states.values())
    tracemalloc.start()
    try:
        found = check_invariants(APP, dataclasses.replace(view, states=loads))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == {INVARIANT: ["key p1/k00000005 seen 0 times (lost)"] if doctored else []}
    assert loads.most_alive == 1 and loads.alive == 0
    # each state once, by pieces (View.fold: one piece, the state, here); a wrong key's
    # snapshot then twice more: the bucket sums, then the names of the wrong bucket
    assert loads.reads == (12 if doctored else 4)
    # One state's copy, a window of it decoded (kvscan.WINDOW), and small change: every
    # state decoded at once would be about five states' bytes.
    assert peak < one_state + 2 * kvscan.WINDOW, (peak, one_state)


def test_names_are_read_as_json_reads_them(monkeypatch):
    rng = random.Random(5)
    values = [7, -12, "plain", 'quote " and \\ slash', 2.5e-3, None, True, [1, {"a": "b"}], {"x": [None]}, "é", ""]
    for window in (1, 2, 3, 5, 16, 1 << 20):
        monkeypatch.setattr(kvscan, "WINDOW", window)
        for _ in range(20):
            keys = {f"p{rng.randint(1, 3)}/k{i}": {"value": rng.choice(values), "created_at": "p1"}
                    for i in range(rng.randint(0, 8))}
            decoded = {"created": sorted(keys), "deleted": ['p2/"q"'] * rng.randint(0, 2), "keys": keys,
                       "moved": {"p1/z": "p2"}}
            for data in (encode(decoded), json.dumps(decoded, indent=rng.choice([None, 1])).encode()):
                read = json.loads(data)
                assert list(kvscan.names(data)) == [(part, name) for part in kvscan.PARTS for name in read[part]]


@pytest.mark.parametrize("data", [b"", b"{", b'{"created":["a",]}', b'{"keys":{"a":}}', b'{"keys":{"a":1}'])
def test_a_state_that_is_not_json_is_a_value_error(data):
    with pytest.raises(ValueError):
        list(kvscan.names(data))


def test_describe_counts_one_state_at_a_time_too():
    view = big_view(keys=500)
    loads = Loads(view.states)
    tracemalloc.start()
    try:
        described = APP.describe(dataclasses.replace(view, states=loads))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert described == {"keys_per_node": {f"p{i}": 500 for i in range(1, 5)}, "keys_in_flight": 0,
                         "handoffs_in_flight": [], "updates_in_flight": 0, "created": 2000, "deleted": 0}
    assert loads.most_alive == 1 and loads.reads == 4
    assert peak < max(len(data) for data in view.states.values()) + 2 * kvscan.WINDOW
