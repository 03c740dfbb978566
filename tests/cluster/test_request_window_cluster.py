"""The request-id window on a real plaintext cluster (two node processes and a
controller, real gRPC; snapmesh/protocol/node/requests.py W2 and W5).

The cluster file's `reply_window_bytes` reaches the node: a window full of bytes
refuses a new id (RESOURCE_EXHAUSTED) and still answers its ids' retries, and
the gauge snapmesh_request_window_bytes on the node's /metrics shows the bytes.
The same id with another transfer is INVALID_ARGUMENT naming the id, and still
is after a SIGKILL and restart (the digest rebuilt from the log).
"""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.cluster_helpers import node_stub
from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol import wal
from snapmesh.protocol.node import requests
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

# Room for three ids "id-N" paying 1 p1 -> p2 through the bank app (id, its reply: the balance
# after it, base64, and the command's digest): the fourth is refused.
ENTRY = len("id-1") + len(wal.pack(b"999")) + 32
BUDGET = 3 * ENTRY


def window_bytes(cluster: Cluster) -> float:
    text = urllib.request.urlopen(f"http://{cluster.config.node('p1').metrics_address}/metrics", timeout=5).read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "snapmesh_request_window_bytes")


def transfer(cluster: Cluster, amount: int, request_id: str) -> pb.TransferResponse | grpc.RpcError:
    channel, stub = node_stub(cluster.node_address("p1"))
    with channel:
        try:
            return stub.Transfer(pb.TransferRequest(to="p2", amount=amount, request_id=request_id), timeout=10)
        except grpc.RpcError as exc:
            return exc


def test_the_window_budget_and_one_request_per_id_on_real_nodes(tmp_path):
    assert ENTRY == requests.entry_bytes("id-1", requests.Paid(wal.pack(b"999"), 1, 0.0, 0, requests.command_digest(b"1 p2")))
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, initial_balance=1000, settings={"reply_window_bytes": BUDGET})
    with Cluster(path) as cluster:
        first = [transfer(cluster, 1, f"id-{i}") for i in (1, 2, 3)]
        assert [a.msg_id for a in first] == ["p1:p2:1", "p1:p2:2", "p1:p2:3"]
        assert window_bytes(cluster) == BUDGET
        full = transfer(cluster, 1, "id-4")
        assert isinstance(full, grpc.RpcError) and full.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, full
        assert "reply_window_bytes" in full.details()
        assert transfer(cluster, 1, "id-1").msg_id == "p1:p2:1"  # a retry is still answered
        for when in ("before", "after"):  # a restart from the log
            other = transfer(cluster, 7, "id-2")
            assert isinstance(other, grpc.RpcError) and other.code() is grpc.StatusCode.INVALID_ARGUMENT, (when, other)
            assert "'id-2'" in other.details()
            again = transfer(cluster, 1, "id-2")
            assert (again.msg_id, again.balance) == ("p1:p2:2", first[1].balance), when
            if when == "before":
                cluster.restart_node("p1", kill=True)
        assert window_bytes(cluster) == BUDGET
