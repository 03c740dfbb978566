"""A restore onto another node set: rescaled on the controller first (rescale.py RS1-RS7, restoring.py R7).

A kvshard cut with handoffs in flight, recorded on p1..p4, restored by a
controller machine whose topology is another node set: the parts it sends are
the app's rescale of the whole cut, every channel empty, the invariants hold.
Every refusal is one line, FAILED_PRECONDITION, and changes nothing: no epoch
moves, no effect, no node hears of it.
"""

from __future__ import annotations

import json

import pytest

from snapmesh.app import App, View
from snapmesh.app.testing import Cluster, run
from snapmesh.protocol import rescale
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller import restoregate
from snapmesh.protocol.controller.effects import Adopt, RestoreAt
from snapmesh.protocol.controller.tracker import COMPLETE, Now, Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.services.app import kvshard
from snapmesh.v1 import snapmesh_pb2 as pb

NOW = Now(mono=0.0, wall=1_795_000_000.0)
OLD = ["p1", "p2", "p3", "p4"]


def mesh(nodes):
    return [(a, b) for a in nodes for b in nodes if a != b]


def recorded(seed: int = 3) -> tuple[pb.Snapshot, View]:
    """A COMPLETE kvshard snapshot of p1..p4 with handoffs in flight (a seeded run's cut)."""
    cluster = Cluster(kvshard.app, mesh(OLD))
    run(cluster, seed=seed, steps=300, command_share=0.6, shadow_share=0.0)
    for node, dst in (("p1", "p2"), ("p3", "p4")):  # a handoff and its update in flight at the cut
        cluster.command(node, kvshard.encode({"op": "put", "key": f"{node}/at-cut", "value": 1}))
        cluster.command(node, kvshard.encode({"op": "move", "key": f"{node}/at-cut", "to": dst}))
        cluster.command(node, kvshard.encode({"op": "put", "key": f"{node}/at-cut", "value": 2}))
    view = cluster.view("s1")
    assert any(json.loads(p)["type"] == "handoff" for *_, p in view.in_flight), "keys in flight at the cut"
    snapshot = pb.Snapshot(snapshot_id="s1", status=COMPLETE, conserved=True)
    snapshot.app.name, snapshot.app.version = "kvshard", 1
    for node, state in view.states.items():
        snapshot.nodes.add(node_id=node, state=state, app_name="kvshard", app_version=1)
    for src, dst in mesh(OLD):
        channel = snapshot.channels.add(src=src, dst=dst)
        for s, d, seq, payload in view.in_flight:
            if (s, d) == (src, dst):
                channel.in_flight.add(msg_id=f"{s}:{d}:{seq}", seq=seq, payload=payload)
    return snapshot, view


def controller(nodes, app: App = kvshard.app, **checker) -> M.Controller:
    tracker = Tracker(topology=Topology.build(nodes, None), deadline_s=5,
                      checker=AppChecker("kvshard", app, **checker))
    return M.Controller(tracker)


@pytest.mark.parametrize("new", [["p1", "p2", "p3", "p4", "p5", "p6"], ["p1", "p2", "p3"], ["p2", "p5"]])
def test_a_snapshot_is_rescaled_onto_the_controllers_node_set_with_nothing_in_flight(new):
    snapshot, view = recorded()
    ctl = controller(new)
    decision = ctl.restore(snapshot, "k1", NOW, nodes=new)
    assert isinstance(decision, restoregate.Start), decision
    parts = {e.node: e.request for e in ctl.drain() if isinstance(e, RestoreAt)}
    assert sorted(parts) == sorted(new) and all(not p.channels for p in parts.values()), "every channel empty"
    states = {n: p.state for n, p in parts.items()}
    assert states == kvshard.rescale(view, _infos(new))
    held = [k for s in states.values() for k in json.loads(s)["keys"]]
    assert sorted(held) == sorted(set(held)) == sorted(kvshard.places(view)), "every key once, those in flight too"
    assert ctl.tracker.epoch == 2


def _infos(nodes):
    from snapmesh.app import NodeInfo

    return [NodeInfo(node_id=n, peers_out=tuple(m for m in nodes if m != n), peers_in=tuple(m for m in nodes if m != n))
            for n in nodes]


def test_the_same_node_set_goes_as_it_is_with_or_without_the_target():
    snapshot, _ = recorded()
    for nodes in ([], OLD, list(reversed(OLD))):
        ctl = controller(OLD)
        assert isinstance(ctl.restore(snapshot, "k1", NOW, nodes=nodes), restoregate.Start)
        parts = {e.node: e.request for e in ctl.drain() if isinstance(e, RestoreAt)}
        assert {n: p.state for n, p in parts.items()} == {n.node_id: n.state for n in snapshot.nodes}


def refused(ctl: M.Controller, snapshot: pb.Snapshot, nodes) -> str:
    decision = ctl.restore(snapshot, "k1", NOW, nodes=nodes)
    assert isinstance(decision, restoregate.Refuse) and decision.code == "FAILED_PRECONDITION", decision
    assert ctl.drain() == [] and ctl.tracker.epoch == 1 and ctl.last_restore is None, "nothing changed"
    assert "\n" not in decision.message
    return decision.message


def test_another_node_set_without_a_target_is_refused():
    message = refused(controller(["p1", "p2", "p3"]), recorded()[0], [])
    assert message == ("cannot rescale: snapshot s1 was taken on nodes p1, p2, p3, p4, and this controller runs"
                       " p1, p2, p3: give the target node set (RestoreSnapshotRequest.nodes) to rescale")


def test_a_target_the_controller_does_not_run_is_refused_unless_its_cluster_file_names_it():
    five = ["p1", "p2", "p3", "p4", "p5"]
    for candidate, read in ((None, "no cluster file was read"),
                            (Topology.build(["p1", "p2", "p3", "p4"], None), "its cluster file names p1, p2, p3, p4"),
                            ("c.toml: not valid TOML: x", "its cluster file cannot be read (c.toml: not valid TOML: x)")):
        ctl = controller(["p1", "p2", "p3"])
        decision = ctl.restore(recorded()[0], "k1", NOW, nodes=five, candidate=candidate)
        assert isinstance(decision, restoregate.Refuse) and decision.code == "FAILED_PRECONDITION", decision
        assert decision.message == (f"cannot rescale: the target node set (p1, p2, p3, p4, p5) is not the nodes this "
                                    f"controller runs (p1, p2, p3), and {read}: write the new cluster file first "
                                    "(snapmesh cluster rescale does)")
        assert ctl.drain() == [] and ctl.tracker.epoch == 1 and ctl.tracker.topology.nodes == ("p1", "p2", "p3")


@pytest.mark.parametrize("new", [["p1", "p2", "p3", "p4", "p5", "p6"], ["p1", "p2", "p3"]])
def test_a_running_controller_adopts_the_cluster_files_node_set_when_the_rescale_starts(new):
    snapshot, view = recorded()
    ctl = controller(OLD)  # runs p1..p4, the snapshot's own node set
    ctl.start("p1", NOW, b"\0" * 8)  # in progress: it fails "restored to", on the old topology
    candidate = Topology.build(new, None)
    decision = ctl.restore(snapshot, "k1", NOW, nodes=list(reversed(new)), candidate=candidate)
    assert isinstance(decision, restoregate.Start), decision
    effects = ctl.drain()
    kinds = [type(e).__name__ for e in effects]
    adopt = kinds.index("Adopt")
    assert kinds.index("Journal") < adopt < kinds.index("RestoreAt"), f"recorded, adopted, then the parts: {kinds}"
    assert effects[adopt] == Adopt(candidate) and ctl.topology is candidate and ctl.stopping.nodes == tuple(new)
    parts = {e.node: e.request.state for e in effects if isinstance(e, RestoreAt)}
    assert parts == kvshard.rescale(view, _infos(new)), "the app's rescale, on the file's node set"
    assert ctl.restore(snapshot, "k1", NOW, nodes=new, candidate=candidate).__class__ is restoregate.Join
    assert ctl.topology is candidate and ctl.tracker.epoch == 2, "the retry joins it: nothing runs twice"


def test_a_target_below_two_nodes_is_refused():
    message = refused(controller(["p1", "p2"]), recorded()[0], ["p1"])
    assert message == "cannot rescale: the target node set (p1) needs at least 2 nodes"


def test_an_app_without_rescale_is_refused():
    plain = App(name="kvshard", new=kvshard.KVShard, invariants=kvshard.app.invariants)
    message = refused(controller(["p1", "p2", "p3"], plain), recorded()[0], ["p1", "p2", "p3"])
    assert message == ("cannot rescale: snapshot s1 cannot be restored onto another node set: app 'kvshard' has no"
                       " rescale(view, nodes)")


def _with(rescale_fn) -> App:
    return App(name="kvshard", new=kvshard.KVShard, invariants=kvshard.app.invariants, rescale=rescale_fn)


def test_a_rescale_that_returns_the_wrong_node_set_is_refused():
    def drops_one(view, nodes):
        return {info.node_id: b"{}" for info in nodes[1:]} | {"p9": b"{}"}

    message = refused(controller(["p1", "p2", "p3"], _with(drops_one)), recorded()[0], ["p1", "p2", "p3"])
    assert message == ("cannot rescale: app 'kvshard': rescale(snapshot s1, nodes p1, p2, p3) returned the wrong node"
                       " set: no state for p1; a state for p9, not in the node set")


def test_a_rescale_that_returns_a_state_not_bytes_is_refused():
    def text(view, nodes):
        return {info.node_id: "{}" for info in nodes}

    message = refused(controller(["p1", "p2", "p3"], _with(text)), recorded()[0], ["p1", "p2", "p3"])
    assert message == "cannot rescale: app 'kvshard': rescale(snapshot s1, nodes p1, p2, p3) returned a str for p1, not bytes"


def test_a_rescale_that_raises_is_refused_naming_it():
    def broken(view, nodes):
        raise KeyError("keys")

    message = refused(controller(["p1", "p2", "p3"], _with(broken)), recorded()[0], ["p1", "p2", "p3"])
    assert message.endswith("rescale(snapshot s1, nodes p1, p2, p3) raised KeyError: 'keys'")


def test_a_rescale_that_drops_a_key_in_flight_breaks_the_invariant_and_is_refused():
    def forgets_in_flight(view, nodes):  # wrong: ignores the handoffs on the channels
        return kvshard.rescale(View(snapshot_id=view.snapshot_id, states=view.states, in_flight=()), nodes)

    message = refused(controller(["p1", "p2", "p3"], _with(forgets_in_flight)), recorded()[0], ["p1", "p2", "p3"])
    assert "breaks the app's invariant(s): every key exactly once: key " in message and "(lost)" in message


@pytest.mark.parametrize("checker, words", [
    (AppChecker("kvshard", None, why="no module named 'kvshard'"),
     r"the controller has no app with rescale\(view, nodes\) \(no module named 'kvshard'\)"),
    (AppChecker("ring:app", App(name="ring", new=lambda info: None)), "app 'ring' has no rescale"),
])
def test_a_controller_without_an_app_that_rescales_cannot_rescale(checker, words):
    tracker = Tracker(topology=Topology.build(["p1", "p2", "p3"], None), deadline_s=5, checker=checker)
    with pytest.raises(rescale.RescaleRefused, match="another node set: " + words):
        rescale.for_side(tracker.side, recorded()[0], tracker.topology, ["p1", "p2", "p3"])


def test_a_resumed_rescale_rescales_again_to_the_same_parts():
    snapshot, _ = recorded()
    ctl = controller(["p1", "p2", "p5"])
    ctl.restore(snapshot, "k1", NOW, nodes=["p1", "p2", "p5"])
    first = {e.node: e.request.state for e in ctl.drain() if isinstance(e, RestoreAt)}
    ctl.to_resume = snapshot.snapshot_id
    ctl.resume(snapshot)
    assert {e.node: e.request.state for e in ctl.drain() if isinstance(e, RestoreAt)} == first
