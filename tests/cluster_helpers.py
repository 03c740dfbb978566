"""Shared by the tests that run real controller and node processes."""

from __future__ import annotations

import random
import threading

import grpc

from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc


def controller_stub(address: str) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.ControllerStub(channel)


class Load:
    """Background transfers: one thread per node sends batches of random transfers
    to random neighbours with TransferBatch until stopped."""

    def __init__(self, cluster, *, batch: int = 20, max_amount: int = 20, seed: int = 1, pause_s: float = 0.005):
        self.cluster = cluster
        self.batch = batch
        self.max_amount = max_amount
        self.pause_s = pause_s
        self.seed = seed
        self.made = 0
        self.refused = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Load:
        topology = self.cluster.config.topology
        for index, node in enumerate(topology.nodes):
            rng = random.Random(self.seed * 1000 + index)
            thread = threading.Thread(
                target=self._run, args=(node, list(topology.outgoing(node)), rng), daemon=True, name=f"load-{node}"
            )
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _run(self, node: str, neighbours: list[str], rng: random.Random) -> None:
        with grpc.insecure_channel(self.cluster.node_address(node)) as channel:
            stub = pb_grpc.NodeStub(channel)
            while not self._stop.is_set():
                request = pb.TransferBatchRequest(
                    transfers=[
                        pb.TransferRequest(to=rng.choice(neighbours), amount=rng.randint(1, self.max_amount))
                        for _ in range(self.batch)
                    ]
                )
                try:
                    response = stub.TransferBatch(request, timeout=5)
                except grpc.RpcError as error:
                    with self._lock:
                        self.errors.append(f"{node}: {error.code().name}: {error.details()}")
                    self._stop.wait(0.1)
                    continue
                made = sum(1 for r in response.results if r.code == 0)
                with self._lock:
                    self.made += made
                    self.refused += len(response.results) - made
                self._stop.wait(self.pause_s)
