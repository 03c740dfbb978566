"""A user's own gRPC microservice that embeds a snapmesh node (tests/cluster/test_embed.py).

    python tests/support/embed_host.py CLUSTER_FILE NODE_ID SHOP_PORT

Its own API is `shop.Shop` without a proto: generic handlers, bytes in and out.
`Pass` and `Has` run token_ring's commands through `node.submit` (the request id
from the `request-id` header); the user's own interceptor refuses a Shop call
without the `shop-key: open-sesame` header (PERMISSION_DENIED) and lets every
other call (snapmesh's) through untouched. The shop listens on a port of its own
beside the node's. Prints `ready` once serving; on SIGTERM closes the node,
stops the server and prints `tasks left: N` (N: the loop's tasks other than main).
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc

import snapmesh
from snapmesh.app import Refused

SHOP = "shop.Shop"
KEY = ("shop-key", "open-sesame")


class ShopKey(grpc.aio.ServerInterceptor):
    """The user's own interceptor: its API asks for a key; other calls pass."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if not details.method.startswith(f"/{SHOP}/") or KEY in tuple(details.invocation_metadata or ()):
            return handler

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the shop wants its key")

        return grpc.unary_unary_rpc_method_handler(refuse)


def shop_handlers(node) -> grpc.GenericRpcHandler:
    async def run(command: bytes, context) -> bytes:
        request_id = dict(context.invocation_metadata()).get("request-id", "")
        try:
            reply = await node.submit(command, request_id=request_id)
        except Refused as refused:
            await context.abort(grpc.StatusCode[refused.code], refused.text)
        return reply.reply

    async def pass_(request: bytes, context) -> bytes:
        return await run(b"pass", context)

    async def has(request: bytes, context) -> bytes:
        return await run(b"has", context)

    return grpc.method_handlers_generic_handler(SHOP, {
        "Pass": grpc.unary_unary_rpc_method_handler(pass_),
        "Has": grpc.unary_unary_rpc_method_handler(has),
    })


async def main(cluster: str, node_id: str, shop_port: int) -> int:
    import token_ring  # examples/, on PYTHONPATH

    server = grpc.aio.server(interceptors=[ShopKey()])
    node = await snapmesh.embed(token_ring.app, cluster=cluster, node_id=node_id, server=server)
    server.add_generic_rpc_handlers((shop_handlers(node),))
    assert server.add_insecure_port(f"127.0.0.1:{shop_port}") == shop_port
    await server.start()
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    status = await node.close()
    await server.stop(1)
    await asyncio.sleep(0)  # let finished tasks leave the loop
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    print(f"tasks left: {len(left)} {[t.get_name() for t in left]}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
