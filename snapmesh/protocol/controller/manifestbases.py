"""The manifests the controller holds as bases of the nodes' next changes, pure (manifestdelta.py MD3, MD4).

MB1. `kept` after a report is taken (journaled): the node's manifest of that
    snapshot is a base from then on, and the answer says takes_changes; the
    oldest of the node's past BASES_KEPT goes. Memory: a list of the names, each
    the object the report's manifest already holds.
MB2. `whole` rebuilds a report sent as a change into the report with its full
    manifest (state_blocks) in place of the change, before anything else reads it;
    its base must be held for the same node and snapshot (else MissingBase, MD3) and
    fit (else BadChange, MD2); the report is then not changed. A report with no change
    is returned as it is.
MB3. Thread-safe for its use (a report rebuilt in a thread while the loop keeps
    another's): each node's bases are replaced with one assignment.
"""

from __future__ import annotations

from collections.abc import Sequence

from snapmesh.protocol import manifestdelta
from snapmesh.v1 import snapmesh_pb2 as pb

BASES_KEPT = 2  # MD4: a report formed while the one before was in flight still finds its base


class ManifestBases:
    def __init__(self, kept: int = BASES_KEPT) -> None:
        self._kept = kept
        self._by_node: dict[str, dict[str, list[bytes]]] = {}  # node -> snapshot -> manifest, oldest first

    def kept(self, node_id: str, snapshot_id: str, names: Sequence[bytes]) -> None:
        """`node_id`'s report of `snapshot_id`, with manifest `names`, was taken (MB1)."""
        bases = {sid: held for sid, held in self._by_node.get(node_id, {}).items() if sid != snapshot_id}
        bases[snapshot_id] = names if isinstance(names, list) else list(names)
        while len(bases) > self._kept:
            del bases[next(iter(bases))]
        self._by_node = {**self._by_node, node_id: bases}

    def forget(self, node_id: str) -> None:
        self._by_node = {node: bases for node, bases in self._by_node.items() if node != node_id}

    def base(self, node_id: str, snapshot_id: str) -> list[bytes] | None:
        return self._by_node.get(node_id, {}).get(snapshot_id)

    def whole(self, report: pb.FullState) -> tuple[pb.FullState, list[bytes] | None]:
        """`report` with its full manifest in place of its change, and that manifest (None: the
        report came with none, MB2)."""
        if not report.HasField("state_change"):
            return report, None
        base = self.base(report.node_id, report.state_change.base_snapshot_id)
        if base is None:
            raise manifestdelta.missing_base(report)
        names = manifestdelta.applied(report.state_change, base)
        out = pb.FullState()
        out.CopyFrom(report)  # a report as blocks: no state in it, its new blocks only
        out.ClearField("state_change")
        out.state_blocks.hashes.extend(names)
        return out, names
