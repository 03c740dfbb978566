"""The gRPC server metrics interceptor (snapmesh/serving/metrics.py) on a real grpc.aio
server over loopback: each RPC shape, each way an RPC ends (OK, an abort with a
code, an exception, a client's cancel), and a call the token check refuses."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from snapmesh.serving import credentials
from snapmesh.serving.metrics import GrpcServerMetrics
from snapmesh.settings.access import Gate, Roles, Rule

SERVICE = "test.Echo"


async def ok(request: bytes, context) -> bytes:
    return request


async def not_found(request: bytes, context) -> bytes:
    await context.abort(grpc.StatusCode.NOT_FOUND, "nothing here")


async def crash(request: bytes, context) -> bytes:
    raise ValueError("a bug")


async def three(request: bytes, context):
    for i in range(3):
        yield bytes([i])


async def echo(requests, context):
    async for request in requests:
        yield request


async def forever(request: bytes, context) -> bytes:
    await asyncio.sleep(60)
    return request


HANDLERS = {
    "Ok": grpc.unary_unary_rpc_method_handler(ok),
    "NotFound": grpc.unary_unary_rpc_method_handler(not_found),
    "Crash": grpc.unary_unary_rpc_method_handler(crash),
    "Three": grpc.unary_stream_rpc_method_handler(three),
    "Echo": grpc.stream_stream_rpc_method_handler(echo),
    "Forever": grpc.unary_unary_rpc_method_handler(forever),
    "Guarded": grpc.unary_unary_rpc_method_handler(ok),
}


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"grpc_service": SERVICE, **labels})
    return 0.0 if value is None else value


async def exercise(registry: CollectorRegistry) -> None:
    rules = {f"/{SERVICE}/{method}": Rule.ANY for method in HANDLERS} | {f"/{SERVICE}/Guarded": Rule.CLIENT_WRITE}
    gate = Gate(roles=Roles(nodes=frozenset()), token="secret", rules=rules)
    server = grpc.aio.server(interceptors=[GrpcServerMetrics(registry)])

    def register(_servicer, target) -> None:
        target.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, HANDLERS),))

    credentials.add_guarded(register, None, server, credentials.Guard(gate))  # the token check lives in the handlers
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            def call(method):
                return channel.unary_unary(f"/{SERVICE}/{method}")

            assert await call("Ok")(b"x", timeout=5) == b"x"
            assert await call("Ok")(b"y", timeout=5) == b"y"
            for method, code in (("NotFound", grpc.StatusCode.NOT_FOUND), ("Crash", grpc.StatusCode.UNKNOWN),
                                 ("Guarded", grpc.StatusCode.UNAUTHENTICATED)):
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await call(method)(b"", timeout=5)
                assert error.value.code() == code, method
            assert await call("Guarded")(b"z", timeout=5, metadata=(("authorization", "Bearer secret"),)) == b"z"
            assert [r async for r in channel.unary_stream(f"/{SERVICE}/Three")(b"", timeout=5)] == [b"\0", b"\1", b"\2"]

            async def two():
                yield b"a"
                yield b"b"

            assert [r async for r in channel.stream_stream(f"/{SERVICE}/Echo")(two(), timeout=5)] == [b"a", b"b"]
            pending = call("Forever")(b"", timeout=30)
            await asyncio.sleep(0.3)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        # The server sees the cancel a moment later.
        for _ in range(50):
            if sample(registry, "grpc_server_handled_total", grpc_method="Forever", grpc_type="unary",
                      grpc_code="CANCELLED"):
                break
            await asyncio.sleep(0.1)
    finally:
        await server.stop(0)


def test_every_rpc_counted_by_method_type_and_code_and_timed():
    registry = CollectorRegistry()
    asyncio.run(exercise(registry))

    def handled(method: str, kind: str, code: str) -> float:
        return sample(registry, "grpc_server_handled_total", grpc_method=method, grpc_type=kind, grpc_code=code)

    assert handled("Ok", "unary", "OK") == 2
    assert handled("NotFound", "unary", "NOT_FOUND") == 1
    assert handled("Crash", "unary", "UNKNOWN") == 1
    assert handled("Guarded", "unary", "UNAUTHENTICATED") == 1  # refused by the token check, still counted
    assert handled("Guarded", "unary", "OK") == 1
    assert handled("Three", "server_stream", "OK") == 1
    assert handled("Echo", "bidi_stream", "OK") == 1
    assert handled("Forever", "unary", "CANCELLED") == 1
    assert sample(registry, "grpc_server_started_total", grpc_method="Ok", grpc_type="unary") == 2
    assert sample(registry, "grpc_server_handling_seconds_count", grpc_method="Ok", grpc_type="unary") == 2
    forever = sample(registry, "grpc_server_handling_seconds_sum", grpc_method="Forever", grpc_type="unary")
    assert 0.25 < forever < 10, forever  # seconds: it ran until the client cancelled it
