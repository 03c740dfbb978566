"""A node's RestoreState and the requests of a restore as blocks, for the shells' tests of it
(services/node/heldblocks.py, services/controller/nodeblocks.py)."""

from __future__ import annotations

import grpc

from snapmesh.services.node.heldblocks import HeldBlocks, MissingRestoreBlocks
from snapmesh.v1 import snapmesh_pb2 as pb


def report(state: bytes) -> pb.FullState:
    return pb.FullState(snapshot_id="s2", node_id="p1", epoch=1, state=state, holds_blocks=True)


def restore(state: bytes, snapshot_id: str = "s1") -> pb.RestoreStateRequest:
    return pb.RestoreStateRequest(snapshot_id=snapshot_id, epoch=3, state=state)


class FakeNode:
    """A node's RestoreState as the servicer runs it: rebuilt by HeldBlocks, or refused."""

    def __init__(self, held: HeldBlocks) -> None:
        self.held, self.got, self.states = held, [], []

    async def RestoreState(self, request, timeout=None, wait_for_ready=None):
        self.got.append(request)
        try:
            state, named = await self.held.state_of(request)
        except MissingRestoreBlocks as exc:
            raise grpc.aio.AioRpcError(grpc.StatusCode.FAILED_PRECONDITION, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), details=str(exc)) from None
        self.held.restored(named)
        self.states.append(state)
        return pb.RestoreStateResponse(epoch=request.epoch)

    RestoreStateChunks = None  # every request here is under a MiB
