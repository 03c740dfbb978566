"""kvshard (services/app/kvshard.py): keys that migrate by handoff, each exactly once at every cut.

Pure: the machines run over snapmesh.app.testing's FIFO channels; every cut is
the states plus the queued messages between two steps. Seeded runs name their
seed (and Hypothesis prints the falsifying one).
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapmesh.app import Context, NodeInfo, Refused, check_invariants, load_app
from snapmesh.app.testing import Cluster, run, sql_violations
from snapmesh.services.app import kvshard

APP = kvshard.app
MESH = [(a, b) for a in ("p1", "p2", "p3") for b in ("p1", "p2", "p3") if a != b]
INVARIANT = "every key exactly once"


def cmd(op, key, **fields):
    return json.dumps({"op": op, "key": key, **fields}).encode()


def state(cluster, node):
    return json.loads(cluster.snapshot(node))


def refused(cluster, node, command):
    with pytest.raises(Refused) as caught:
        cluster.command(node, command)
    return caught.value.code, caught.value.text


def test_load_app_finds_the_built_in():
    assert load_app("kvshard") is APP


def test_a_node_creates_keys_in_its_own_namespace_only():
    cluster = Cluster(APP, MESH)
    assert json.loads(cluster.command("p1", cmd("put", "p1/a", value=1))) == {"key": "p1/a", "created_at": "p1"}
    assert json.loads(cluster.command("p1", cmd("put", "p1/a", value=2))) == {"key": "p1/a", "updated_at": "p1"}
    assert refused(cluster, "p1", cmd("put", "p2/a", value=1)) == (
        "FAILED_PRECONDITION", "key p2/a is not at p1, which creates only keys named p1/...")
    assert json.loads(cluster.command("p1", cmd("get", "p1/a"))) == {"key": "p1/a", "value": 2, "at": "p1"}
    assert refused(cluster, "p2", cmd("get", "p1/a")) == ("NOT_FOUND", "key p1/a is not at p2")
    assert state(cluster, "p1") == {"keys": {"p1/a": {"value": 2, "created_at": "p1"}}, "moved": {},
                                    "created": ["p1/a"], "deleted": []}


@pytest.mark.parametrize(
    "command, text",
    [
        (b"\xff", "a command is a JSON object"),
        (b"[1]", "op must be one of put, get, move, delete"),
        (b'{"op": "drop", "key": "p1/a"}', "op must be one of"),
        (cmd("get", ""), "key must be a string of 1..200 characters"),
        (cmd("get", "p1/" + "x" * 200), "key must be a string"),
        (cmd("put", "p1/a"), "put needs a value"),
        (cmd("move", "p1/a", to="p1"), "to must be a node p1 sends to: p2, p3"),
        (cmd("move", "p1/a", to="p9"), "to must be a node p1 sends to"),
    ],
)
def test_a_malformed_command_is_invalid_argument_and_changes_nothing(command, text):
    cluster = Cluster(APP, MESH)
    cluster.command("p1", cmd("put", "p1/a", value=1))
    before = cluster.snapshot("p1")
    code, message = refused(cluster, "p1", command)
    assert code == "INVALID_ARGUMENT" and text in message
    assert cluster.snapshot("p1") == before


def test_a_moved_key_leaves_in_the_same_step_and_updates_follow_it():
    cluster = Cluster(APP, MESH)
    cluster.command("p1", cmd("put", "p1/a", value=1))
    assert json.loads(cluster.command("p1", cmd("move", "p1/a", to="p2"))) == {"key": "p1/a", "moved_to": "p2"}
    # Mid-move the key is in no node: only in the handoff on the channel.
    view = cluster.view()
    assert "p1/a" not in state(cluster, "p1")["keys"] and "p1/a" not in state(cluster, "p2")["keys"]
    assert [(s, d, json.loads(p)["type"]) for s, d, _, p in view.in_flight] == [("p1", "p2", "handoff")]
    assert check_invariants(APP, view) == {INVARIANT: []}
    assert APP.describe(view)["handoffs_in_flight"] == ["p1/a: p1->p2"]
    # A put at the old node follows the pointer, behind the handoff on the same channel.
    assert json.loads(cluster.command("p1", cmd("put", "p1/a", value=7))) == {"key": "p1/a", "forwarded_to": "p2"}
    assert refused(cluster, "p1", cmd("get", "p1/a")) == ("FAILED_PRECONDITION", "key p1/a is not at p1: it was moved to p2")
    cluster.drain()
    assert state(cluster, "p2")["keys"] == {"p1/a": {"value": 7, "created_at": "p1"}}
    # Two hops: p2 -> p3, and an update from p1 follows p1 -> p2 -> p3.
    cluster.command("p2", cmd("move", "p1/a", to="p3"))
    cluster.command("p1", cmd("put", "p1/a", value=9))
    cluster.drain()
    assert state(cluster, "p3")["keys"] == {"p1/a": {"value": 9, "created_at": "p1"}}
    assert state(cluster, "p2")["moved"] == {"p1/a": "p3"}


def test_a_deleted_key_is_gone_for_good():
    cluster = Cluster(APP, MESH)
    cluster.command("p1", cmd("put", "p1/a", value=1))
    cluster.command("p1", cmd("move", "p1/a", to="p2"))
    cluster.command("p1", cmd("put", "p1/a", value=2))  # an update behind the handoff
    cluster.deliver("p1", "p2")
    assert json.loads(cluster.command("p2", cmd("delete", "p1/a"))) == {"key": "p1/a", "deleted_at": "p2"}
    cluster.drain()  # the update arrives after the delete and is dropped
    assert state(cluster, "p2")["keys"] == {} and state(cluster, "p2")["deleted"] == ["p1/a"]
    assert refused(cluster, "p2", cmd("get", "p1/a")) == ("NOT_FOUND", "key p1/a was deleted at p2")
    # A put at the old node still follows the pointer, and is dropped where the key died.
    assert json.loads(cluster.command("p1", cmd("put", "p1/a", value=3))) == {"key": "p1/a", "forwarded_to": "p2"}
    cluster.drain()
    assert state(cluster, "p2")["keys"] == {}
    # Its name is not created again by its creator.
    cluster.command("p1", cmd("put", "p1/b", value=1))
    cluster.command("p1", cmd("delete", "p1/b"))
    assert refused(cluster, "p1", cmd("put", "p1/b", value=3)) == (
        "FAILED_PRECONDITION", "key p1/b was deleted; a name is not created twice")
    assert check_invariants(APP, cluster.view()) == {INVARIANT: []}
    assert APP.describe(cluster.view()) == {"keys_per_node": {"p1": 0, "p2": 0, "p3": 0}, "keys_in_flight": 0,
                                            "handoffs_in_flight": [], "updates_in_flight": 0, "created": 2, "deleted": 2}


def test_an_update_ahead_of_its_handoff_stops_the_node():
    # Order matters: FIFO puts the update behind the handoff; a channel that reordered them is caught.
    machine = kvshard.KVShard(NodeInfo(node_id="p2", peers_out=("p1",), peers_in=("p1",)))
    update = json.dumps({"type": "update", "key": "p1/a", "value": 1}).encode()
    with pytest.raises(ValueError, match="an update of p1/a from p1 before its handoff: the channel reordered"):
        machine.on_message("p1", update, Context("p2", ["p1"]))
    handoff = json.dumps({"type": "handoff", "key": "p1/a", "value": 0, "created_at": "p1"}).encode()
    machine.on_message("p1", handoff, Context("p2", ["p1"]))
    with pytest.raises(ValueError, match="a handoff of p1/a from p1, which is already here"):
        machine.on_message("p1", handoff, Context("p2", ["p1"]))


def two_keys_one_in_flight():
    cluster = Cluster(APP, MESH)
    cluster.command("p1", cmd("put", "p1/a", value="A"))
    cluster.command("p1", cmd("put", "p1/b", value="B"))
    cluster.command("p1", cmd("move", "p1/b", to="p2"))
    return cluster.view("s1")


def test_a_lost_key_paired_with_a_doubled_one_fails_the_invariant():
    view = two_keys_one_in_flight()
    assert check_invariants(APP, view) == {INVARIANT: []}
    # Doctor the cut: p1 loses p1/a, and p2 already holds p1/b while its handoff is still in flight.
    p1, p2 = json.loads(view.states["p1"]), json.loads(view.states["p2"])
    del p1["keys"]["p1/a"]
    p2["keys"]["p1/b"] = {"value": "B", "created_at": "p1"}
    doctored = dataclasses.replace(view, states={**view.states, "p1": kvshard.encode(p1), "p2": kvshard.encode(p2)})
    # A count cannot see it: two keys created, two found.
    found = sum(len(json.loads(s)["keys"]) for s in doctored.states.values()) + len(doctored.in_flight)
    assert found == 2
    assert check_invariants(APP, doctored) == {INVARIANT: [
        "key p1/a seen 0 times (lost)",
        "key p1/b seen 2 times (at p2, in flight p1->p2 seq 1)",
    ]}
    # The Spark query says the same, row for row (run here in DuckDB).
    assert sorted(sql_violations(APP, [view, dataclasses.replace(doctored, snapshot_id="s2")])[INVARIANT]) == [
        ("s2", "p1/a", 0, True), ("s2", "p1/b", 2, True)]


def test_a_key_that_was_never_created_or_is_deleted_must_not_appear():
    view = two_keys_one_in_flight()
    p3 = {"keys": {"p3/ghost": {"value": 0, "created_at": "p3"}}, "moved": {}, "created": [], "deleted": []}
    ghost = dataclasses.replace(view, states={**view.states, "p3": kvshard.encode(p3)})
    assert check_invariants(APP, ghost)[INVARIANT] == ["key p3/ghost seen 1 times (at p3) but is not a live key"]
    assert sql_violations(APP, [ghost])[INVARIANT] == [("s1", "p3/ghost", 1, False)]


def test_a_restore_delivers_the_key_in_flight_and_its_update():
    cluster = Cluster(APP, MESH)
    cluster.command("p1", cmd("put", "p1/a", value=1))
    cluster.command("p1", cmd("move", "p1/a", to="p3"))
    cluster.command("p1", cmd("put", "p1/a", value=2))
    cut = cluster.view("s1")
    cluster.drain()
    cluster.command("p3", cmd("delete", "p1/a"))
    cluster.restore(cut)
    assert state(cluster, "p3")["keys"] == {"p1/a": {"value": 2, "created_at": "p1"}}
    assert check_invariants(APP, cluster.view()) == {INVARIANT: []}


def scenario(seed):
    """A random topology (a ring through 2-5 nodes plus random chords) and run settings, from one seed."""
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(rng.randint(2, 5))]
    rng.shuffle(nodes)
    channels = {(a, b) for a, b in zip(nodes, nodes[1:] + nodes[:1], strict=True) if a != b}
    channels |= {(a, b) for a in nodes for b in nodes if a != b and rng.random() < 0.4}
    return sorted(channels), {"keys": rng.randint(3, 30)}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_cut_of_a_random_run_holds_every_key_once(seed):
    channels, params = scenario(seed)
    cluster = Cluster(APP, channels, params=params)
    stats = run(cluster, seed=seed, steps=300, command_share=0.4, replay_share=0.02, restore_share=0.02)
    assert stats.commands, stats
    cluster.drain(random.Random(seed))
    assert check_invariants(APP, cluster.view()) == {INVARIANT: []}, f"seed {seed}"


def test_a_run_moves_keys_through_the_channels():
    cluster = Cluster(APP, MESH)
    for seed in range(5):
        run(cluster, seed=seed, steps=200)
        cluster.drain()
    moved = sum(len(state(cluster, n)["moved"]) for n in ("p1", "p2", "p3"))
    assert moved > 0, "no key was ever moved"


def test_the_same_seed_gives_the_same_states():
    def once(seed):
        cluster = Cluster(APP, scenario(seed)[0])
        stats = run(cluster, seed=seed, steps=400, replay_share=0.02, restore_share=0.02)
        return cluster.view(), stats

    first, again, other = once(11), once(11), once(12)
    assert first == again
    assert first[0].states != other[0].states


def test_the_workload_keeps_to_its_bound_of_live_keys():
    infos = [NodeInfo(node_id=n, peers_out=[m for m in ("p1", "p2") if m != n], peers_in=[], params={"keys": 5})
             for n in ("p1", "p2")]
    commands = kvshard.workload(infos, random.Random(3))
    live: set[str] = set()
    made = 0
    for _ in range(2000):
        node, command = next(commands)
        request = json.loads(command)
        if request["op"] == "put" and request["key"] not in live and request["key"].startswith(node + "/"):
            live.add(request["key"])
            made += 1
        elif request["op"] == "delete":
            live.discard(request["key"])
        assert len(live) <= 5
    assert made > 5  # keys are deleted and new ones made
