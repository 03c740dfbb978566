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
L3. A node whose state the snapshot holds as its block list (the controller's
    listed form, snapmesh/protocol/controller/blockforms.py) is read by block,
    through the reader `with_reader` set while the NodeStates was made (the
    app's side makes the view and knows no blocks; the one thread that judges,
    the controller's loop, sets it); with none set, it is a LookupError naming
    the node, never b"".
L4. `sizes()` is node -> the length of its state, in the snapshot's order, and reads
    no state: a listed one's is its entry's `state_bytes` (its blocks' sizes, each
    block checked against its name when taken, and their sum against it when filed:
    wholedigest.py WD2). An invariant that needs only the lengths (`View.sizes`) so
    costs nothing per block: reading each state by block was most of a second
    snapshot's controller time at 64 MiB a node (docs/bench-cluster.md).
L5. `fold(node, key, fn)` is `fn` of each piece of the node's state, in order, a
    piece being one or more whole parts of the app's snapshot_blocks(), or the
    whole state. A listed state is folded through the folder `with_reader` set
    (foldmemo.py FM1-FM5: a piece's result is kept by its blocks' names, so an
    unchanged piece costs no read at the next snapshot); any other, or one with no
    folder set, is one piece, the state, folded afresh.
L6. `fold_joined(node, key, fn)` is `fn.join` of `fold`'s results: a listed state's
    through the folder (`joined=True`: foldmemo.py FM9, the changed pieces re-joined
    only); any other's, its one piece's result joined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from snapmesh.v1 import snapmesh_pb2 as pb

T = TypeVar("T")
# L3: (entry, snapshot id) -> the state a listed entry stands for
Reader = Callable[[pb.NodeBalance, str], bytes]
# L5: (entry, snapshot id, key, fn, joined) -> fn of each piece of the state a listed entry stands for
# (joined: those joined by fn.join, L6)
Folder = Callable[[pb.NodeBalance, str, str, Callable[[bytes], Any], bool], Any]
_readers: list[tuple[Reader, Folder | None]] = []  # set by `with_reader`, the innermost last


def with_reader(read: Reader, action: Callable[[], T], fold: Folder | None = None) -> T:
    """`action()`, the NodeStates made meanwhile reading listed states through `read` (L3)
    and folding them through `fold` (L5)."""
    _readers.append((read, fold))
    try:
        return action()
    finally:
        _readers.pop()


def _listed(node: pb.NodeBalance) -> bool:
    return node.HasField("state_blocks") and not node.HasField("state")


class NodeStates(Mapping[str, bytes]):
    def __init__(self, snapshot: pb.Snapshot) -> None:
        self._nodes = {node.node_id: node for node in snapshot.nodes}
        self._snapshot_id = snapshot.snapshot_id
        self._read, self._fold = _readers[-1] if _readers else (None, None)

    def __getitem__(self, node_id: str) -> bytes:
        try:
            node = self._nodes[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in this snapshot (its nodes: {', '.join(self._nodes)})") from None
        if _listed(node):
            if self._read is None:
                raise LookupError(f"node {node_id!r} of snapshot {self._snapshot_id}: its state is a block list "
                                  "and no reader of blocks was set (lazystates.reading)")
            return self._read(node, self._snapshot_id)
        return node.state

    def fold(self, node_id: str, key: str, fn: Callable[[bytes], Any]) -> list[Any]:
        """`fn` of each piece of the node's state, in order (L5)."""
        node = self._nodes.get(node_id)
        if node is not None and _listed(node) and self._fold is not None:
            return self._fold(node, self._snapshot_id, key, fn, False)
        return [fn(self[node_id])]

    def fold_joined(self, node_id: str, key: str, fn: Any) -> Any:
        """`fn.join` of `fold`'s results (L6)."""
        node = self._nodes.get(node_id)
        if node is not None and _listed(node) and self._fold is not None:
            return self._fold(node, self._snapshot_id, key, fn, True)
        return fn.join([fn(self[node_id])])

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def sizes(self) -> dict[str, int]:
        """Node -> the length of its state, none read (L4)."""
        return {node_id: node.state_bytes if _listed(node) else len(node.state) for node_id, node in self._nodes.items()}

    def __repr__(self) -> str:
        sizes = ", ".join(f"{node_id!r}: <{node.state_bytes if _listed(node) else len(node.state)} bytes>"
                          for node_id, node in self._nodes.items())
        return f"NodeStates({{{sizes}}})"
