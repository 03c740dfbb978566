"""RestoreState at one node, retried: the I/O of a restore.

What a restore decides (the gate, the epoch, which snapshots fail, each node's
part, the outcome) is the controller machine's (snapmesh/protocol/controller/machine.py,
rules R1-R4); the engine's loop sends each RestoreAt part through `restore_node`
and hands the answer to the machine's `node_restored`. A node that cannot be
reached is retried until `timeout_s`: the node's side is idempotent, so a
repeat is harmless.
"""

from __future__ import annotations

import asyncio

import grpc

from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RESTORE_TIMEOUT_S = 30.0  # how long a node that cannot be reached is retried
CALL_TIMEOUT_S = 5.0
RETRY_S = 0.25


async def restore_node(
    stub: pb_grpc.NodeStub, request: pb.RestoreStateRequest, timeout_s: float = RESTORE_TIMEOUT_S
) -> pb.RestoreStateResponse | str:
    """The node's answer, or why it could not be restored (what the machine takes)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    while True:
        try:
            return await stub.RestoreState(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            detail = f"{error.code().name}: {error.details()}"
            # The node refused the part itself: asking again gets the same answer.
            if error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                return detail
            if loop.time() >= give_up:
                return f"unreachable for {timeout_s:g}s ({detail})"
        await asyncio.sleep(RETRY_S)
