"""Shared by the tests that run real controller and node processes."""

from __future__ import annotations

import json
import random
import threading
from collections import defaultdict
from pathlib import Path

import grpc

from snapmesh import security
from snapmesh.launcher import port_is_free  # noqa: F401  (re-exported for the tests)
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc


def controller_stub(address: str, identity=None) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    """`identity`: a TLS cluster's client identity (LocalCluster.client_identity); None: plaintext."""
    channel = security.open_channel(address, identity)
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
        with security.open_channel(self.cluster.node_address(node), self.cluster.client_identity) as channel:
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


def read_logs(data_dir: Path, nodes) -> dict[str, list[dict]]:
    """Every node's transfer log; a last line still being written is left out."""
    logs = {}
    for node in nodes:
        lines = (data_dir / f"{node}.log.jsonl").read_text().splitlines()
        records = []
        for index, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if index != len(lines) - 1:
                    raise
        logs[node] = records
    return logs


def check_against_logs(snapshot: pb.Snapshot, logs: dict[str, list[dict]]) -> None:
    """Each node's recorded balance is its `cut` record's; each channel's in-flight
    transfers are those its source sent before its cut that its destination had
    not received before its own cut."""
    sid = snapshot.snapshot_id
    sent_before_cut: dict[tuple[str, str], list[str]] = defaultdict(list)
    recv_before_cut: dict[tuple[str, str], set[str]] = defaultdict(set)
    amounts: dict[str, int] = {}
    for node, records in logs.items():
        cut = None
        for record in records:
            kind = record.get("kind")
            if kind == "cut" and record.get("snapshot_id") == sid:
                cut = record
                break
            if kind == "send":
                sent_before_cut[(record["src"], record["dst"])].append(record["msg_id"])
                amounts[record["msg_id"]] = record["amount"]
            elif kind == "recv":
                recv_before_cut[(record["src"], record["dst"])].add(record["msg_id"])
        assert cut is not None, f"{sid}: no cut record in {node}'s log"
        recorded = next(n.balance for n in snapshot.nodes if n.node_id == node)
        assert recorded == cut["balance"], f"{sid}: {node} recorded {recorded}, its log says {cut['balance']}"
    for channel in snapshot.channels:
        key = (channel.src, channel.dst)
        expected = [m for m in sent_before_cut[key] if m not in recv_before_cut[key]]
        got = [t.msg_id for t in channel.in_flight]
        assert got == expected, f"{sid}: channel {channel.src}->{channel.dst} in flight {got}, logs say {expected}"
        for item in channel.in_flight:
            assert item.amount == amounts[item.msg_id]
