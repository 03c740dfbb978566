"""What each node holds of its states' blocks as the controller knows it, and a restore sent so.

A node whose report says it holds blocks (FullState.holds_blocks) keeps that
state's blocks (services/node/heldblocks.py); the controller notes their names
here when it accepts the report (`reported`), and a restore then sends that
node its state as blocks: the manifest and only the blocks it lacks
(snapmesh/protocol/restoreblocks.py RB1-RB3). The node refuses a restore it
cannot rebuild (blocks.MISSING: it restarted, or formed a newer report since);
the controller then forgets what it took the node to hold and sends the state
whole at once. A restore taken as blocks adds its state's blocks to what the
node holds (it keeps them too), until its next report.

What it knows is noted on disk too (`remember_in`, heldseed.py HT1-HT3): per node,
one small file naming the snapshot of its last accepted report, that report's
parts, and the snapshot of the last restore it took as blocks; a controller
that restarted takes it back from those and the stored manifests, so the first
restore after it sends only what each node lacks. A note is a belief, never
trusted for correctness (restoreblocks.py RB5): a node that lacks a block
refuses, and gets its state whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from snapmesh.protocol import blocks, chunking, restoreblocks
from snapmesh.protocol.controller.effects import RestoreAt
from snapmesh.protocol.retry import Failed
from snapmesh.serving import calls
from snapmesh.serving.durable import write_unsynced
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)


class NodeBlocks:
    def __init__(self) -> None:
        # node -> the names of its last accepted report's state and that report's parts (one assignment each)
        self._by_node: dict[str, tuple[frozenset[bytes], tuple[int, ...]]] = {}
        self.sent_bytes = 0  # restore requests' bytes sent, in all (a state as blocks: manifest and new blocks)
        self.directory: Path | None = None  # where the notes go (`remember_in`); None: memory only

    def remember_in(self, directory: Path) -> None:
        """Note what each node holds under `directory` from now on (heldseed.py HT1)."""
        self.directory = Path(directory)

    def believe(self, node_id: str, names: frozenset[bytes], parts: tuple[int, ...]) -> None:
        """After a restart: `node_id` is taken to hold `names` (heldseed.py HT2), until it says otherwise."""
        if names:
            self._by_node[node_id] = (names, parts)

    def reported(self, report: pb.FullState, names: Sequence[bytes]) -> None:
        """The controller accepted `report`, whose state's blocks are `names` (RB1)."""
        if report.holds_blocks and names:
            self._by_node[report.node_id] = (frozenset(names), tuple(report.state_parts))
            self._note(report.node_id, {"report": report.snapshot_id, "parts": list(report.state_parts)})
        else:  # a node from before (or one that went back to it): whole
            self._by_node.pop(report.node_id, None)
            self._note(report.node_id, None)

    def held(self, node_id: str) -> tuple[frozenset[bytes], tuple[int, ...]]:
        return self._by_node.get(node_id, (frozenset(), ()))

    def note_path(self, node_id: str) -> Path | None:
        """The note of `node_id` (its name hex-encoded: any node id is a file name)."""
        return None if self.directory is None else self.directory / f"{node_id.encode().hex()}.json"

    def _note(self, node_id: str, note: dict[str, Any] | None, *, restored: str = "") -> None:
        """Write `node_id`'s note (None: remove it). A note is a belief (RB5): written
        whole or not at all, unsynced, and a failure to write it only costs a restore sent whole."""
        path = self.note_path(node_id)
        if path is None:
            return
        try:
            if note is None:
                path.unlink(missing_ok=True)
                return
            if restored:
                try:
                    note = {**json.loads(path.read_text()), "restored": restored}
                except (OSError, ValueError):
                    return  # no note of its report: nothing to add the restore to
            write_unsynced(path, json.dumps(note).encode())
        except OSError as exc:
            log.warning("cannot note what node %s holds in %s: %s", node_id, path, exc)

    async def restore(self, stub: Any, effect: RestoreAt) -> Any:
        """Carry out `effect`: its state as blocks to a node that holds some of them,
        whole to any other and after a refusal naming a missing block (RB3)."""
        held, parts = self.held(effect.node)
        log.debug("restore at %s: it holds %d blocks", effect.node, len(held))
        if held and effect.request.HasField("state") and effect.request.state:
            sent, names = await asyncio.to_thread(restoreblocks.referenced_restore, effect.request, held, parts)
            if sent is not None:
                log.info("restore at %s: its state as blocks, %d of %d sent", effect.node, len(sent.blocks),
                         len(sent.state_blocks.hashes))
                answer = await calls.call(_rpc(stub, sent), sent, effect.retry)
                if not (isinstance(answer, Failed) and answer.code == "FAILED_PRECONDITION"
                        and answer.details.startswith(blocks.MISSING)):
                    self._sent(answer, sent)
                    if not isinstance(answer, Failed) and self._by_node.get(effect.node) == (held, parts):
                        # the node holds the restored state's blocks too (heldblocks.py), until it restarts
                        self._by_node[effect.node] = (held | frozenset(names), parts)
                        self._note(effect.node, {}, restored=effect.request.snapshot_id)
                    return answer
                log.info("restore at %s: %s; sending the state whole", effect.node, answer.details)
                self._by_node.pop(effect.node, None)
                self._note(effect.node, None)
        answer = await calls.call(_rpc(stub, effect.request), effect.request, effect.retry)
        self._sent(answer, effect.request)
        return answer

    def _sent(self, answer: Any, request: pb.RestoreStateRequest) -> None:
        if not isinstance(answer, Failed):
            self.sent_bytes += request.ByteSize()


def _rpc(stub: Any, request: pb.RestoreStateRequest) -> Callable[..., Any]:
    """RestoreState, or RestoreStateChunks for a request over a node's receive limit (docs/api.md)."""
    if request.ByteSize() <= chunking.CHUNK_BYTES:
        return stub.RestoreState
    rpc = stub.RestoreStateChunks

    def call(request: pb.RestoreStateRequest, **kwargs: Any) -> Any:
        return rpc(iter(chunking.restore_chunks(request)), **kwargs)

    return call
