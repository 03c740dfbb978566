"""examples/shop against a running cluster (tests/deploy/test_wheel_shop.py): a load of
orders, moves and restocks on a thread, and the checks of its snapshots."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable

import grpc

from snapmesh.examples.shop import shop_pb2 as shop_pb
from snapmesh.examples.shop import shop_pb2_grpc as shop_grpc
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

SPEC = "snapmesh.examples.shop:app"
INVARIANTS = {"stock conserved", "each order once"}
ITEMS = ("apple", "pear", "plum")

Send = Callable[[dict], None]  # one command to one warehouse; raises grpc.RpcError when refused


def by_submit(address: str) -> tuple[grpc.Channel, Send]:
    """Commands as Node.Submit's bytes (the shop under `cluster up --app`)."""
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.NodeStub(channel)
    return channel, lambda fields: stub.Submit(pb.SubmitRequest(command=json.dumps(fields).encode()), timeout=10)


def by_shop_api(address: str) -> tuple[grpc.Channel, Send]:
    """Commands as the shop's own API (a shop process that embeds its node)."""
    channel = grpc.insecure_channel(address)
    stub = shop_grpc.ShopStub(channel)

    def send(fields: dict) -> None:
        if fields["op"] == "order":
            stub.PlaceOrder(shop_pb.PlaceOrderRequest(item=fields["item"], qty=fields["qty"]), timeout=10)
        elif fields["op"] == "move":
            stub.MoveStock(shop_pb.MoveStockRequest(item=fields["item"], qty=fields["qty"], to=fields["to"]), timeout=10)
        else:
            stub.Restock(shop_pb.RestockRequest(item=fields["item"], qty=fields["qty"]), timeout=10)

    return channel, send


class ShopLoad:
    """Random orders (some larger than a warehouse holds, which travel on), moves and restocks
    at every warehouse in turn, as fast as they answer, until stopped. Refusals are counted."""

    def __init__(self, targets: dict[str, str], connect: Callable[[str], tuple[grpc.Channel, Send]], seed: int = 1):
        self.sent = self.refused = 0
        self._rng = random.Random(seed)
        self._ids = sorted(targets)
        self._links = {node: connect(address) for node, address in targets.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _command(self, node: str) -> dict:
        item, roll = self._rng.choice(ITEMS), self._rng.random()
        if roll < 0.6:
            return {"op": "order", "item": item, "qty": self._rng.choice([self._rng.randint(1, 10), 150])}
        if roll < 0.85:
            return {"op": "move", "item": item, "qty": self._rng.randint(1, 20),
                    "to": self._rng.choice([n for n in self._ids if n != node])}
        return {"op": "restock", "item": item, "qty": self._rng.randint(5, 40)}

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in self._ids:
                try:
                    self._links[node][1](self._command(node))
                    self.sent += 1
                except grpc.RpcError:
                    self.refused += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for channel, _ in self._links.values():
            channel.close()


def checked(snapshot: pb.Snapshot) -> pb.Snapshot:
    """COMPLETE, and the controller ran the shop's invariants on it: both hold."""
    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
    assert snapshot.app.spec == SPEC and snapshot.app.status == pb.AppCheck.CHECKED, snapshot.app
    assert {i.name: i.ok for i in snapshot.app.invariants} == dict.fromkeys(INVARIANTS, True), snapshot.app
    return snapshot


def every_complete_snapshot_checked(stub: pb_grpc.ControllerStub) -> int:
    """Every COMPLETE snapshot the controller holds, checked; how many there are."""
    count, token = 0, ""
    while True:
        page = stub.ListSnapshots(pb.ListSnapshotsRequest(status=pb.Snapshot.COMPLETE, page_token=token), timeout=30)
        for snapshot in page.snapshots:
            checked(snapshot)
            count += 1
        if not page.next_page_token:
            return count
        token = page.next_page_token


def orders_in_flight(snapshot: pb.Snapshot) -> list[str]:
    """The orders a snapshot recorded on a channel, travelling to the next warehouse."""
    found = []
    for channel in snapshot.channels:
        for message in channel.in_flight:
            said = json.loads(message.payload)
            if said["kind"] == "order":
                found.append(said["order"])
    return found


def placed(snapshot: pb.Snapshot) -> dict[str, int]:
    """How many orders each warehouse had taken at the cut."""
    return {node.node_id: json.loads(node.state)["placed"] for node in snapshot.nodes}


def catch_orders_in_flight(stub: pb_grpc.ControllerStub, load: ShopLoad, bound: int = 300) -> pb.Snapshot:
    """Snapshots under the load, each checked, until one holds an order in flight; that snapshot."""
    for _ in range(bound):
        snapshot = checked(stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
        if orders_in_flight(snapshot):
            return snapshot
    raise AssertionError(f"{bound} snapshots and no order in flight in any ({load.sent} commands sent)")
