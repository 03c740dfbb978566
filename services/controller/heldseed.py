"""What each node holds, taken back after a controller restart (nodeblocks.py's notes).

The controller knows what each node holds of its states' blocks from the reports
it accepted and the restores it sent as blocks (nodeblocks.py); in memory only, a
controller that restarted would send the first restore after it whole to every
node. So:

HT1. NodeBlocks notes, per node, under `<data_dir>/controller/nodeblocks/`, the
    snapshot of its last accepted report that said it holds blocks
    (FullState.holds_blocks: only such a node ever gets a state as blocks, RB1),
    that report's parts, and the snapshot of the last restore it took as blocks.
    A report that does not say it holds blocks, and a refusal naming a missing
    block, remove the note.
HT2. At start (`take_back`), each note is read back: the node is taken to hold the
    blocks its node entry names in those snapshots' stored manifests
    (controller/snapshots/<id>.pb, no block read). A snapshot not filed (failed
    before it was, deleted since) adds nothing; a note or manifest that cannot be
    read is skipped with a warning, and the node gets its state whole. The note of a
    node no longer in the cluster is removed.
HT3. What is taken back is a belief (restoreblocks.py RB5): the node may have formed
    a newer report, restarted without its blocks, or been replaced. A block it
    lacks is refused (RB3) and its state sent whole: one round more, never a
    wrong state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from snapmesh.checking import snapshot_file
from snapmesh.services.controller.nodeblocks import NodeBlocks

log = logging.getLogger(__name__)

# snapshot id, node id -> the names of that node's state in that snapshot's manifest (None: none there)
Manifests = Callable[[str, str], "list[bytes] | None"]


def stored_manifests(compact_path: Callable[[str], Path]) -> Manifests:
    """`Manifests` read from the store's compact files (`compact_path(snapshot_id)`), each read once."""
    cache: dict[str, dict[str, list[bytes]] | None] = {}

    def names(snapshot_id: str, node_id: str) -> list[bytes] | None:
        if snapshot_id not in cache:
            try:
                stored, _ = snapshot_file.read_stored(compact_path(snapshot_id))
                cache[snapshot_id] = {n.node_id: list(n.state_blocks.hashes) for n in stored.nodes
                                      if n.HasField("state_blocks")}
            except (OSError, snapshot_file.Unreadable) as exc:
                log.info("what the nodes held in snapshot %s is not known: %s", snapshot_id, exc)
                cache[snapshot_id] = None
        found = cache[snapshot_id]
        return None if found is None else found.get(node_id)

    return names


def take_back(node_blocks: NodeBlocks, directory: Path, nodes: list[str], manifests: Manifests) -> dict[str, int]:
    """HT2: what each of `nodes` holds, from its note under `directory` and `manifests`;
    then `node_blocks` notes there from now on (HT1). Blocks taken back, by node."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    node_blocks.remember_in(directory)
    taken: dict[str, int] = {}
    noted = {node_blocks.note_path(node) for node in nodes}
    for stale in directory.glob("*.json"):  # a node no longer in the cluster: its note goes
        if stale not in noted:
            stale.unlink(missing_ok=True)
    for node in nodes:
        path = node_blocks.note_path(node)
        assert path is not None
        try:
            note = json.loads(path.read_text())
            report, restored = str(note["report"]), str(note.get("restored", ""))
            parts = tuple(int(part) for part in note.get("parts", ()))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot read the note of what node %s holds (%s): %s; its next restore goes whole",
                        node, path, exc)
            continue
        held: set[bytes] = set()
        for snapshot_id in filter(None, (report, restored)):
            held.update(manifests(snapshot_id, node) or ())
        node_blocks.believe(node, frozenset(held), parts)
        if held:
            taken[node] = len(held)
    return taken
