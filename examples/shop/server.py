"""A shop process of the user's own: the Shop API (shop.proto) on its own port, and its
warehouse's snapmesh node embedded in the same grpc.aio server (docs/apps.md, Embedding).

    python -m snapmesh.examples.shop.server --cluster cluster.toml --node p1 --listen 127.0.0.1:7001

The node's port is the cluster file's address for the node; the shop's port is
--listen. Each Shop call is one command through `node.submit` (exactly once per
request id), or a read through `node.query`. Prints one line once it serves;
SIGTERM or SIGINT closes the node, then stops the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

import grpc

import snapmesh
from snapmesh.app import Refused
from snapmesh.examples.shop import shop_pb2 as pb
from snapmesh.examples.shop import shop_pb2_grpc as pb_grpc
from snapmesh.examples.shop.warehouse import app, encode
from snapmesh.services.node.embedded import EmbedError


class Shop(pb_grpc.ShopServicer):
    """The shop's own API over one warehouse's node."""

    def __init__(self, node) -> None:
        self.node = node

    async def _run(self, command: dict, request_id: str, context) -> tuple[dict, bool]:
        try:
            reply = await self.node.submit(encode(command), request_id=request_id)
        except Refused as refused:  # the app's or the node's refusal, with its gRPC status
            await context.abort(grpc.StatusCode[refused.code], refused.text)
        return json.loads(reply.reply), reply.replayed

    async def PlaceOrder(self, request, context):
        said, replayed = await self._run({"op": "order", "item": request.item, "qty": request.qty},
                                         request.request_id, context)
        return pb.PlaceOrderReply(order_id=said["order"], status=said["status"], warehouse=said["warehouse"],
                                  replayed=replayed)

    async def MoveStock(self, request, context):
        said, replayed = await self._run({"op": "move", "item": request.item, "qty": request.qty, "to": request.to},
                                         request.request_id, context)
        return pb.StockReply(item=said["item"], left=said["left"], replayed=replayed)

    async def Restock(self, request, context):
        said, replayed = await self._run({"op": "restock", "item": request.item, "qty": request.qty},
                                         request.request_id, context)
        return pb.StockReply(item=said["item"], left=said["left"], replayed=replayed)

    async def GetStock(self, request, context):
        try:
            said = json.loads(await self.node.query(encode({"op": "stock"})))
        except Refused as refused:
            await context.abort(grpc.StatusCode[refused.code], refused.text)
        return pb.GetStockReply(warehouse=said["warehouse"], stock=said["stock"], placed=said["placed"])


async def serve(cluster: str, node_id: str, listen: str) -> int:
    # A full SubmitBatch and the node's channel frames exceed gRPC's default 4 MiB (docs/apps.md, Embedding).
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 5 * 1024 * 1024)])
    node = await snapmesh.embed(app, cluster=cluster, node_id=node_id, server=server)
    pb_grpc.add_ShopServicer_to_server(Shop(node), server)
    if server.add_insecure_port(listen) == 0:
        await node.close()
        print(f"shop {node_id}: cannot listen on {listen}", file=sys.stderr)
        return 2
    await server.start()
    print(f"shop {node_id} serving on {listen}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    failed, stopped = asyncio.ensure_future(node.failed()), asyncio.ensure_future(stop.wait())
    await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
    status = 1 if failed.done() else 0  # the node failed while serving (it logged why): stop; a restart recovers
    for waiting in (failed, stopped):
        waiting.cancel()
    status = max(status, await node.close())
    await server.stop(5)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapmesh.examples.shop.server", description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", required=True, help="the cluster file (its [app] names this app)")
    parser.add_argument("--node", required=True, help="this warehouse's node id in the cluster file")
    parser.add_argument("--listen", required=True, help="HOST:PORT for the Shop API")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(serve(args.cluster, args.node, args.listen))
    except EmbedError as exc:  # StartFailed too: the line `snapmesh node` would print
        print(f"shop {args.node}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
