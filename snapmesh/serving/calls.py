"""The one loop that calls a peer until its `Retry` (snapmesh/protocol/retry.py) says to stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from snapmesh.protocol.retry import Failed, Retry


async def call(rpc: Callable[..., Awaitable[Any]], request: Any, retry: Retry) -> Any:
    """`rpc`'s answer, else the Failed that `retry` gave up on. Only for calls whose
    other side is idempotent: a repeat must be harmless."""
    loop = asyncio.get_running_loop()
    began, tried = loop.time(), 0
    while True:
        tried += 1
        try:
            return await rpc(request, timeout=retry.timeout(tried), wait_for_ready=retry.waits(tried))
        except grpc.aio.AioRpcError as error:
            failed = Failed(error.code().name, f"{error.details()}")
        pause = retry.again(failed, tried, loop.time() - began)
        if pause is None:
            return failed
        await asyncio.sleep(pause)
