"""What an app's client knows of a cluster: its nodes as the workload sees them, and a snapshot's verdict.

`node_infos` / `mesh_infos` give each node's NodeInfo as the nodes themselves
get it (the load generator, snapmesh/load/generator.py, hands them to the
app's workload); `snapshot_view` / `snapshot_problems` read a controller
Snapshot as the app's checks do and check it again here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from snapmesh.app import App, NodeInfo, View, check_invariants
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb


def node_infos(nodes: Sequence[str], channels: Sequence[tuple[str, str]],
               params: Mapping[str, object]) -> list[NodeInfo]:
    """Each node's NodeInfo as the nodes themselves get it (their channels and the [app] table)."""
    return [NodeInfo(node_id=n, peers_out=tuple(d for s, d in channels if s == n),
                     peers_in=tuple(s for s, d in channels if d == n), params=params) for n in nodes]


def mesh_infos(count: int) -> list[NodeInfo]:
    """Nodes p1..pN of a full mesh with no [app] params: the cluster `cluster up --nodes N`,
    `demo` and `chaos` write, known before its file is written."""
    ids = [f"p{i}" for i in range(1, count + 1)]
    return node_infos(ids, Topology.build(ids).channels, {})


# -- a snapshot's verdict, as the controller gave it and as this client checks it again

def snapshot_view(snapshot: pb.Snapshot, params: Mapping[str, object] | None = None) -> View:
    """A controller Snapshot as the app's checks see it: each node's state, each in-flight payload."""
    return View(snapshot_id=snapshot.snapshot_id, states={n.node_id: n.state for n in snapshot.nodes},
                in_flight=[(c.src, c.dst, t.seq, t.payload) for c in snapshot.channels for t in c.in_flight],
                params=params or {})


def snapshot_problems(app: App, snapshot: pb.Snapshot, params: Mapping[str, object] | None = None) -> list[str]:
    """What is wrong with a COMPLETE app snapshot: the controller's verdict (a failed
    invariant, or none checked) and this client's own `check_invariants` over it."""
    sid = snapshot.snapshot_id
    problems = []
    verdict = snapshot.app
    if verdict.status == pb.AppCheck.CHECKED:
        problems += [f"{sid}: the controller found {i.name!r} broken: {'; '.join(i.problems[:3])}"
                     for i in verdict.invariants if not i.ok]
    else:
        problems.append(f"{sid}: the controller did not check the app's invariants "
                        f"({pb.AppCheck.Status.Name(verdict.status)})")
    for name, found in check_invariants(app, snapshot_view(snapshot, params)).items():
        if found:
            problems.append(f"{sid}: {name!r} broken (checked again here): {'; '.join(found[:3])}")
    return problems
