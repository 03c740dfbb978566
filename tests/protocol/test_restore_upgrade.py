"""A restore of an older version's snapshot into newer code: upgraded on the controller first (upgrade.py U1-U6).

A two-node token ring described inline. Version 1 holds a node's tokens as
b"0"/b"1" and sends b"token"; version 2 holds JSON {"tokens": n} and sends
b'{"t":1}' (a changed state and message encoding). The controller machine
restores a COMPLETE snapshot its reports made: the parts it sends the nodes are
upgraded, the invariants hold on them; a refusal changes nothing: no epoch
moves, no effect, no node hears of it.
"""

from __future__ import annotations

import json

import pytest

from snapmesh.app import App, View
from snapmesh.protocol.appstate import AppChecker, digest
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller import restoregate
from snapmesh.protocol.controller.effects import RestoreAt
from snapmesh.protocol.controller.tracker import COMPLETE, Now, Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

NOW = Now(mono=0.0, wall=1_795_000_000.0)


def one_token_v1(view: View) -> list[str]:
    count = sum(int(s) for s in view.states.values()) + sum(p == b"token" for *_, p in view.in_flight)
    return [] if count == 1 else [f"{count} tokens"]


def one_token_v2(view: View) -> list[str]:
    count = sum(json.loads(s)["tokens"] for s in view.states.values())
    count += sum(json.loads(p)["t"] for *_, p in view.in_flight)
    return [] if count == 1 else [f"{count} tokens"]


def upgrade(state: bytes, from_version: int) -> bytes:
    assert from_version == 1
    return json.dumps({"tokens": int(state)}).encode()


def upgrade_message(payload: bytes, from_version: int) -> bytes:
    return json.dumps({"t": int(payload == b"token")}).encode()


V1 = App(name="ring", new=lambda info: None, invariants={"one token": one_token_v1})
V2 = App(name="ring", new=lambda info: None, invariants={"one token": one_token_v2}, version=2, upgrade=upgrade,
         upgrade_message=upgrade_message)


def report(node: str, state: bytes, in_flight=(), *, version: int = 1, name: str = "ring") -> pb.FullState:
    src = "b" if node == "a" else "a"
    items = [pb.InFlightTransfer(msg_id=f"{src}:{node}:{seq}", seq=seq, payload=p) for seq, p in enumerate(in_flight, 1)]
    return pb.FullState(snapshot_id="s1", node_id=node, state=state, app_name=name, app_version=version,
                        channels=[pb.ChannelState(src=src, dst=node, in_flight=items)])


def tracker(app: App) -> Tracker:
    return Tracker(topology=Topology.build(["a", "b"], None), deadline_s=5,
                   checker=AppChecker("ring:app", app))


def recorded(app: App, *, version: int = 1, old_node: bool = False) -> pb.Snapshot:
    """s1 as `app`'s controller completes it: the token in flight a -> b."""
    machine = tracker(app)
    machine.start("s1", "a", NOW)
    if old_node:  # a node from before versions reports none: version 0, read as 1
        machine.report(pb.FullState(snapshot_id="s1", node_id="a", state=b"0", channels=[pb.ChannelState(src="b", dst="a")]), NOW)
    else:
        machine.report(report("a", b"0", version=version), NOW)
    snapshot = machine.report(report("b", b"0", [b"token"], version=version), NOW).snapshot
    assert snapshot.status == COMPLETE and not snapshot.reason, snapshot.reason
    return snapshot


def restore(app: App, snapshot: pb.Snapshot) -> tuple[M.Controller, restoregate.Decision, list]:
    controller = M.Controller(tracker(app))
    decision = controller.restore(snapshot, "k1", NOW)
    return controller, decision, controller.drain()


def test_a_snapshot_names_the_app_and_the_version_its_nodes_ran():
    snapshot = recorded(V1)
    assert (snapshot.app.name, snapshot.app.version) == ("ring", 1)
    assert [(n.node_id, n.app_name, n.app_version) for n in snapshot.nodes] == [("a", "ring", 1), ("b", "ring", 1)]
    assert recorded(V1, old_node=True).app.version == 1, "an old node's part reads as version 1"


@pytest.mark.parametrize("old_node", [False, True])
def test_an_older_snapshot_is_upgraded_on_the_controller_and_its_invariants_hold(old_node):
    controller, decision, effects = restore(V2, recorded(V1, old_node=old_node))
    assert isinstance(decision, restoregate.Start)
    parts = {e.node: e.request for e in effects if isinstance(e, RestoreAt)}
    assert {n: p.state for n, p in parts.items()} == {"a": b'{"tokens": 0}', "b": b'{"tokens": 0}'}
    assert [item.payload for c in parts["b"].channels for item in c.in_flight] == [b'{"t": 1}']
    assert controller.tracker.epoch == 2


def test_the_same_version_goes_as_it_is():
    _, decision, effects = restore(V1, snapshot := recorded(V1))
    assert isinstance(decision, restoregate.Start)
    assert {e.node: e.request.state for e in effects if isinstance(e, RestoreAt)} == {n.node_id: n.state for n in snapshot.nodes}


def refused(app: App, snapshot: pb.Snapshot) -> str:
    controller, decision, effects = restore(app, snapshot)
    assert isinstance(decision, restoregate.Refuse) and decision.code == "FAILED_PRECONDITION", decision
    assert effects == [] and controller.tracker.epoch == 1 and controller.last_restore is None, "nothing changed"
    assert "\n" not in decision.message
    return decision.message


def test_without_upgrade_it_is_refused_naming_both_versions():
    message = refused(App(name="ring", new=lambda info: None, version=2), recorded(V1))
    assert message == ("cannot restore into this code: snapshot s1 holds app 'ring' version 1; this code is version 2"
                       " and has no upgrade(state, from_version): give the App one, or restore the snapshot with the"
                       " code of version 1")


def test_a_version_that_goes_backwards_is_refused():
    message = refused(V2, recorded(App(name="ring", new=lambda info: None, version=3), version=3))
    assert "recorded by app 'ring' version 3, newer than this code's version 2: a version never goes backwards" in message


def test_an_upgrade_that_raises_fails_the_restore_before_any_node_changes():
    def broken(state, from_version):
        raise ValueError("no such field 'tokens'")

    message = refused(App(name="ring", new=lambda info: None, version=2, upgrade=broken), recorded(V1))
    assert message == ("cannot restore into this code: upgrade(the state of a, from_version=1) raised ValueError:"
                       " no such field 'tokens'")


def test_an_upgrade_that_breaks_an_invariant_is_refused_naming_it():
    def drops(state, from_version):  # forgets the token a state holds: wrong, and the invariant says so
        return json.dumps({"tokens": 0}).encode()

    snapshot = recorded(V1)
    snapshot.nodes[0].state = b"1"  # the token at a, none in flight
    for channel in snapshot.channels:
        del channel.in_flight[:]
    app = App(name="ring", new=lambda info: None, invariants={"one token": one_token_v2}, version=2, upgrade=drops)
    assert "upgraded from version 1 to 2 breaks the app's invariant(s): one token: 0 tokens" in refused(app, snapshot)


def test_a_snapshot_of_another_app_is_refused():
    assert "recorded by app 'ring'; this code is app 'bell'" in refused(App(name="bell", new=lambda info: None),
                                                                          recorded(V1))


def test_a_resumed_restore_upgrades_again():
    controller = M.Controller(tracker(V2))
    snapshot = recorded(V1)
    controller.restore(snapshot, "k1", NOW)
    controller.drain()
    controller.to_resume = snapshot.snapshot_id
    controller.resume(snapshot)
    parts = {e.node: e.request.state for e in controller.drain() if isinstance(e, RestoreAt)}
    assert parts == {"a": b'{"tokens": 0}', "b": b'{"tokens": 0}'}
    assert digest(parts["a"]).startswith("sha256:")



def test_a_controller_on_version_2_leaves_a_version_1_snapshot_unchecked_and_restores_it_upgraded():
    """appstate.py V6: version 2's invariants read version 2's encoding, so they do not judge
    version 1's states; a v1 snapshot rebuilt from the journal by a controller restarted on v2
    is UNCHECKED (not broken), and its restore checks the upgraded states."""
    first = M.Controller(tracker(V1))
    first.trigger("s1", "a", NOW)
    first.reported(report("a", b"0"), NOW)
    first.reported(report("b", b"0", [b"token"]), NOW)
    records = [e.record for e in first.drain() if isinstance(e, M.Journal)]
    assert first.get("s1").app.status == pb.AppCheck.CHECKED, "its own version's snapshots are checked"

    restarted = M.Controller(tracker(V2))
    restarted.replayed(records, NOW)
    snapshot = restarted.get("s1")
    assert snapshot.status == COMPLETE and snapshot.app.status == pb.AppCheck.UNCHECKED
    assert snapshot.reason == ("unchecked: recorded by version 1 of the app, and the controller runs version 2: "
                               "a restore checks the invariants on the upgraded states")
    assert isinstance(restarted.restore(snapshot, "k1", NOW), restoregate.Start)
    assert {e.node: e.request.state for e in restarted.drain() if isinstance(e, RestoreAt)} == {
        "a": b'{"tokens": 0}', "b": b'{"tokens": 0}'}
