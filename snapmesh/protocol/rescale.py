"""A snapshot rescaled onto another node set, pure (snapmesh.app, Rescale).

The controller restores onto the nodes it runs (its topology, from its cluster
file). A COMPLETE snapshot taken on another node set is made the new set's
before any node hears of the restore, after the upgrade (upgrade.py U1-U6):

RS1. The snapshot's node set is the topology's, and the target asked for (if
     any) is that set too: the snapshot goes as it is (an ordinary restore).
RS2. A target node set (RestoreSnapshotRequest.nodes) other than the nodes the
     controller runs is taken from the controller's cluster file as it reads at
     the call (`target_topology`): the file must name exactly that node set (with
     the new nodes' addresses); the restore then runs on the file's topology, and
     the controller adopts it when the restore starts (a running controller
     rescales without a restart; after one, it reads the same file). A file that
     names another set, or cannot be read, is refused naming both sets (write the
     new cluster file first: `snapmesh cluster rescale` does). A snapshot of
     another node set with no target asked is refused too: a rescale is never silent.
RS3. The target holds at least 2 nodes (a snapshot needs a channel).
RS4. The app must have `rescale`: an app without one, or an app the controller
     could not load, cannot be restored onto another node set.
RS5. `rescale(view, nodes)` gets the whole COMPLETE view (states and in-flight
     payloads, the [app] params) and the new set's NodeInfos in topology order.
     One that raises, returns no mapping, another node set, or a state that is
     not bytes is refused, naming the first fault.
RS6. The app's invariants must hold on the rescaled states with nothing in
     flight (the params those of the new cluster); a broken one is refused,
     naming it.
RS7. The result is a copy of the snapshot with one entry per new node (its
     state, digest, the app's name and version) and every channel of the
     topology, each empty: the messages in flight were absorbed (RS5).

A refusal is `RescaleRefused`, one line; the controller turns it into the
restore's refusal (FAILED_PRECONDITION) before the epoch moves, so nothing
changes anywhere. Pure: a restore resumed after a controller restart rescales
again and gets the same parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from snapmesh.app import App, NodeInfo, View, check_invariants
from snapmesh.protocol.appstate import AppChecker, digest, view_of
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

MIN_NODES = 2  # RS3


class RescaleRefused(Exception):
    """The snapshot cannot be restored onto the target node set (RS2-RS6): one line saying why."""


def _names(nodes: Sequence[str]) -> str:
    return ", ".join(nodes) or "none"


def for_side(side: Any, snapshot: pb.Snapshot, topology: Topology, target: Sequence[str] | None) -> pb.Snapshot:
    """`snapshot` as the nodes of `topology` take it (RS1-RS7). `target` is the node
    set a call asked for (empty: none asked; None: a resumed restore, whose call was
    checked when it started)."""
    sid = snapshot.snapshot_id
    recorded = [n.node_id for n in snapshot.nodes]
    running = list(topology.nodes)
    if target and set(target) != set(running):
        raise RescaleRefused(f"the target node set ({_names(sorted(set(target)))}) is not the topology "
                             f"({_names(running)})")  # target_topology chose it: a caller's bug
    if set(recorded) == set(running):
        return snapshot  # RS1
    if target is not None and not target:
        raise RescaleRefused(f"snapshot {sid} was taken on nodes {_names(recorded)}, and this controller runs "
                             f"{_names(running)}: give the target node set (RestoreSnapshotRequest.nodes) to rescale")
    if len(running) < MIN_NODES:
        raise RescaleRefused(f"the target node set ({_names(running)}) needs at least {MIN_NODES} nodes")
    app = side.app if isinstance(side, AppChecker) else None
    if app is None or app.rescale is None:
        what = f"app {app.name!r} has no rescale(view, nodes)" if app is not None else (
            "the controller has no app with rescale(view, nodes)"
            + (f" ({side.why})" if isinstance(side, AppChecker) and side.why else ""))
        raise RescaleRefused(f"snapshot {sid} cannot be restored onto another node set: {what}")
    params = side.params
    infos = [NodeInfo(node_id=n, peers_out=topology.outgoing(n), peers_in=topology.incoming(n), params=params)
             for n in running]
    states = rescaled_states(app, view_of(snapshot, params), infos)
    return _snapshot_of(snapshot, app, states, topology)


def target_topology(running: Topology, target: Sequence[str], candidate: Topology | str | None) -> Topology:
    """The topology a restore asking for `target` runs on (RS2, RS3): the running one
    when the target is empty or its node set, else `candidate` (the controller's cluster
    file as read at the call; a str: why it could not be read) when it names exactly the target."""
    if not target:
        return running
    if len(set(target)) < MIN_NODES:
        raise RescaleRefused(f"the target node set ({_names(list(target))}) needs at least {MIN_NODES} nodes")
    if set(target) == set(running.nodes):
        return running
    wanted = _names(sorted(set(target)))
    if isinstance(candidate, Topology) and set(candidate.nodes) == set(target):
        return candidate
    read = (f"its cluster file cannot be read ({candidate})" if isinstance(candidate, str) else
            f"its cluster file names {_names(list(candidate.nodes))}" if candidate is not None else "no cluster file was read")
    raise RescaleRefused(f"the target node set ({wanted}) is not the nodes this controller runs ({_names(list(running.nodes))}), "
                         f"and {read}: write the new cluster file first (snapmesh cluster rescale does)")


def rescaled_states(app: App, view: View, infos: Sequence[NodeInfo]) -> dict[str, bytes]:
    """`app.rescale(view, infos)`, checked (RS5, RS6): each new node's state."""
    wanted = [info.node_id for info in infos]
    where = f"app {app.name!r}: rescale(snapshot {view.snapshot_id}, nodes {_names(wanted)})"
    assert app.rescale is not None
    try:
        out = app.rescale(view, tuple(infos))
    except Exception as exc:  # the app's code: any failure refuses the restore (RS5)
        text = " ".join(str(exc).split())
        raise RescaleRefused(f"{where} raised {type(exc).__name__}: {text}") from None
    if not isinstance(out, Mapping):
        raise RescaleRefused(f"{where} returned {type(out).__name__}, not a mapping of node id -> state bytes")
    missing, extra = [n for n in wanted if n not in out], sorted(str(n) for n in out if n not in wanted)
    if missing or extra:
        parts = ([f"no state for {_names(missing)}"] if missing else []) + (
            [f"a state for {_names(extra)}, not in the node set"] if extra else [])
        raise RescaleRefused(f"{where} returned the wrong node set: {'; '.join(parts)}")
    for node in wanted:
        if not isinstance(out[node], bytes | bytearray):
            raise RescaleRefused(f"{where} returned a {type(out[node]).__name__} for {node}, not bytes")
    states = {node: bytes(out[node]) for node in wanted}
    after = View(snapshot_id=view.snapshot_id, states=states, in_flight=(), params=view.params)
    broken = {name: problems for name, problems in check_invariants(app, after).items() if problems}
    if broken:
        listed = " | ".join(f"{name}: {'; '.join(problems)}" for name, problems in broken.items())
        raise RescaleRefused(f"{where} breaks the app's invariant(s): {listed}")
    return states


def _snapshot_of(snapshot: pb.Snapshot, app: App, states: Mapping[str, bytes], topology: Topology) -> pb.Snapshot:
    """RS7: the snapshot's copy on the new node set, nothing in flight."""
    copy = pb.Snapshot()
    copy.CopyFrom(snapshot)
    del copy.nodes[:]
    del copy.channels[:]
    for node in topology.nodes:
        state = states[node]
        copy.nodes.add(node_id=node, state=state, state_digest=digest(state), app_name=app.name,
                       app_version=app.version)
    for src, dst in topology.channels:
        copy.channels.add(src=src, dst=dst)
    copy.app.name, copy.app.version = app.name, app.version
    return copy
