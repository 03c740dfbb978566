"""What each node holds of its states' blocks as the controller knows it, and a restore sent so.

A node whose report says it holds blocks (FullState.holds_blocks) keeps that
state's blocks (services/node/heldblocks.py); the controller notes their names
here when it accepts the report (`reported`), and a restore then sends that
node its state as blocks: the manifest and only the blocks it lacks
(snapmesh/protocol/restoreblocks.py RB1-RB3). The node refuses a restore it
cannot rebuild (blocks.MISSING: it restarted, or formed a newer report since);
the controller then forgets what it took the node to hold and sends the state
whole at once. A restore taken as blocks adds its state's blocks to what the
node holds (it keeps them too), until its next report. Only in memory: a controller that restarted knows nothing, and
sends whole until each node reported again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from snapmesh.protocol import blocks, chunking, restoreblocks
from snapmesh.protocol.controller.effects import RestoreAt
from snapmesh.protocol.retry import Failed
from snapmesh.serving import calls
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)


class NodeBlocks:
    def __init__(self) -> None:
        # node -> the names of its last accepted report's state and that report's parts (one assignment each)
        self._by_node: dict[str, tuple[frozenset[bytes], tuple[int, ...]]] = {}
        self.sent_bytes = 0  # restore requests' bytes sent, in all (a state as blocks: manifest and new blocks)

    def reported(self, report: pb.FullState, names: Sequence[bytes]) -> None:
        """The controller accepted `report`, whose state's blocks are `names` (RB1)."""
        if report.holds_blocks and names:
            self._by_node[report.node_id] = (frozenset(names), tuple(report.state_parts))
        else:  # a node from before (or one that went back to it): whole
            self._by_node.pop(report.node_id, None)

    def held(self, node_id: str) -> tuple[frozenset[bytes], tuple[int, ...]]:
        return self._by_node.get(node_id, (frozenset(), ()))

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
                    return answer
                log.info("restore at %s: %s; sending the state whole", effect.node, answer.details)
                self._by_node.pop(effect.node, None)
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
