"""A client of the shop's own API (shop.proto), from the shell:

    python -m snapmesh.examples.shop.client 127.0.0.1:7001 order pear 3 [--request-id ID]
    python -m snapmesh.examples.shop.client 127.0.0.1:7001 move pear 5 p2
    python -m snapmesh.examples.shop.client 127.0.0.1:7001 restock pear 20
    python -m snapmesh.examples.shop.client 127.0.0.1:7001 stock

Prints the reply as one line of JSON; a refusal prints `CODE: text` on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from snapmesh.examples.shop import shop_pb2 as pb
from snapmesh.examples.shop import shop_pb2_grpc as pb_grpc


def call(stub: pb_grpc.ShopStub, args: argparse.Namespace):
    if args.op == "order":
        return stub.PlaceOrder(pb.PlaceOrderRequest(request_id=args.request_id, item=args.item, qty=args.qty), timeout=30)
    if args.op == "move":
        return stub.MoveStock(pb.MoveStockRequest(request_id=args.request_id, item=args.item, qty=args.qty, to=args.to),
                              timeout=30)
    if args.op == "restock":
        return stub.Restock(pb.RestockRequest(request_id=args.request_id, item=args.item, qty=args.qty), timeout=30)
    return stub.GetStock(pb.GetStockRequest(), timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapmesh.examples.shop.client", description="Call a shop's API.")
    parser.add_argument("address", help="a shop process's --listen address")
    ops = parser.add_subparsers(dest="op", required=True)
    for op in ("order", "move", "restock"):
        sub = ops.add_parser(op)
        sub.add_argument("item")
        sub.add_argument("qty", type=int)
        if op == "move":
            sub.add_argument("to", help="the warehouse (node id) the stock goes to")
        sub.add_argument("--request-id", default="", help="a retry with the same id runs nothing twice")
    ops.add_parser("stock")
    args = parser.parse_args(argv)
    with grpc.insecure_channel(args.address) as channel:
        try:
            reply = call(pb_grpc.ShopStub(channel), args)
        except grpc.RpcError as error:
            print(f"{error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    said = MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    print(json.dumps(said, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
