"""A snapshot's node states as an app's `View.states`, read one at a time, pure.

`View.states` (snapmesh.app) is a Mapping of node -> its state bytes. Built as a
dict, it held a copy of every node's state at once beside the snapshot's own,
while the app's invariants, describe, upgrade or rescale read them; at 1 GiB a
node that doubles the controller's peak. `NodeStates` reads a node's state from
the snapshot when it is asked for and keeps no copy, so an invariant that goes
through the states one by one holds one at a time (a check that keeps them all,
`dict(view.states)`, still may).

Rules:
L1. Its keys are the snapshot's node ids, in the snapshot's order; each value is
    that node's `state`, read anew at every access (equal each time: the snapshot
    is not changed while a check runs).
L2. An id that is not a node of the snapshot is a KeyError naming it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from snapmesh.v1 import snapmesh_pb2 as pb


class NodeStates(Mapping[str, bytes]):
    def __init__(self, snapshot: pb.Snapshot) -> None:
        self._nodes = {node.node_id: node for node in snapshot.nodes}

    def __getitem__(self, node_id: str) -> bytes:
        try:
            node = self._nodes[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in this snapshot (its nodes: {', '.join(self._nodes)})") from None
        return node.state

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{node_id!r}: <{len(node.state)} bytes>" for node_id, node in self._nodes.items())
        return f"NodeStates({{{sizes}}})"
