"""The controller's start-up check of its nodes (mode_mismatch) asks each node's GetState
once while it answers: a node's GetState copies and hashes its app's state, seconds at
1 GiB a node on a busy machine. With a 2 s timeout each node was asked again and again,
copying and hashing its state without end while it took snapshots."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from snapmesh.v1 import snapmesh_pb2 as pb
from support.controller_fakes import blob_controller

pytestmark = [pytest.mark.timeout(60)]

SLOW_S = 2.5  # past the old timeout


class _Late(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "late")


class _SlowNode:
    """A node whose GetState takes SLOW_S (it hashes a large state), running another app."""

    def __init__(self) -> None:
        self.asked = 0

    async def GetState(self, request, timeout=None, wait_for_ready=False):
        self.asked += 1
        if timeout is not None and timeout < SLOW_S:
            await asyncio.sleep(timeout)
            raise _Late()
        await asyncio.sleep(SLOW_S)
        return pb.NodeStateResponse(snapshot_mode="classic", app="other.module:app")


def test_a_node_slow_to_answer_is_asked_once_and_its_answer_judged(tmp_path) -> None:
    async def go() -> tuple[str, list[int]]:
        c = blob_controller(tmp_path)
        nodes = {n: _SlowNode() for n in c.engine.nodes}
        c.engine.stubs = nodes
        try:
            problem = await asyncio.wait_for(c.service.mode_mismatch(retry_s=0.1), 4 * SLOW_S)
        finally:
            await c.engine.close()
            await c.journal.close()
            c.writer.close()
        return problem, [node.asked for node in nodes.values()]

    problem, asked = asyncio.run(go())
    assert "every process must run the same app" in problem
    assert asked[0] == 1, asked  # the first node asked once: it answered
