"""kvshard under client load, for the rescale tests: puts of new keys at every node, every third one moved on."""

from __future__ import annotations

import json
import threading

import grpc

from snapmesh.settings.config import ClusterConfig
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.polling import wait_for


class Load:
    """One thread per node: puts of new keys (p1/run-k0, ...), every third one moved on."""

    def __init__(self, cfg: ClusterConfig, run: str) -> None:
        self.cfg = cfg
        self.run = run
        self.created: set[str] = set()  # keys whose put a client saw answered
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._drive, args=(n.id,), daemon=True) for n in cfg.nodes]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _drive(self, node: str) -> None:
        peers = self.cfg.topology.outgoing(node)
        with grpc.insecure_channel(self.cfg.node(node).address) as channel:
            stub = pb_grpc.NodeStub(channel)
            i = 0
            while not self.stop.is_set():
                key = f"{node}/{self.run}-k{i}"
                command = json.dumps({"op": "put", "key": key, "value": i}).encode()
                try:
                    stub.Submit(pb.SubmitRequest(command=command, request_id=key), timeout=5)
                except grpc.RpcError as exc:
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):  # stopping, or gone
                        self.stop.wait(0.05)
                        continue
                    raise
                self.created.add(key)
                if i % 3 == 0:
                    move = json.dumps({"op": "move", "key": key, "to": peers[i % len(peers)]}).encode()
                    try:
                        stub.Submit(pb.SubmitRequest(command=move, request_id=f"move {key}"), timeout=5)
                    except grpc.RpcError:
                        pass
                i += 1


def in_flight_keys(snapshot: pb.Snapshot) -> list[str]:
    """The keys of the handoffs a snapshot recorded in flight."""
    return [json.loads(i.payload)["key"] for c in snapshot.channels for i in c.in_flight
            if json.loads(i.payload)["type"] == "handoff"]


def cut_keys(snapshot: pb.Snapshot) -> list[str]:
    """Every key of a cut: at the nodes, then in flight (a key twice is listed twice)."""
    return [k for n in snapshot.nodes for k in json.loads(n.state)["keys"]] + in_flight_keys(snapshot)


def live_cut_in_flight(stub: pb_grpc.ControllerStub, load: Load, keys: int = 30) -> tuple[pb.Snapshot, set[str]]:
    """Once `keys` keys were created: live snapshots until one is COMPLETE with handoffs in
    flight; it and the keys created before it started (the cut holds each of them)."""
    wait_for(lambda: len(load.created) >= keys, timeout=60, what=f"{keys} keys created under load")

    def cut() -> tuple[pb.Snapshot, set[str]]:
        made = set(load.created)
        return stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True, broadcast=True), timeout=60), made

    return wait_for(cut, until=lambda got: got[0].status == pb.Snapshot.COMPLETE and in_flight_keys(got[0]),
                    timeout=120, what="a live snapshot with keys in flight")
