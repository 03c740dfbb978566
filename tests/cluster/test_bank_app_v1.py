"""The bank's v1 RPCs on nodes that host the bank app answer as the native bank's do.

Two real 3-node rings of `snapmesh node` processes on loopback, one running the bank
natively (no [app]), one hosting the bank app (services/app/bank.py) through the
node's edge (snapmesh/bank/edge.py). The same Transfer and TransferBatch calls,
good and bad, retried and repeated in one batch, go to both: every answer (code,
text, msg id, balance) is the same, and so are the balances GetState serves once the
money arrived. The bank app's node then dies by SIGKILL and restarts: it recovers its
balance from its log, and a retry of a request id paid before the kill gets its first
answer (msg id and balance) back."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest

from support.node_harness import ReportSink, cluster_file
from support.polling import wait_for
from snapmesh.processes import supervisor
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

RING = [("p1", "p2"), ("p2", "p3"), ("p3", "p1")]
NODES = ["p1", "p2", "p3"]
BANK_APP = "snapmesh.services.app.bank:app"


def start(tmp_path: Path, app: bool) -> tuple[supervisor.Cluster, ReportSink]:
    path, ports = cluster_file(tmp_path, NODES, balance=100, channels=RING)
    if app:
        with path.open("a") as toml:
            toml.write(f'\n[app]\nmodule = "{BANK_APP}"\ninitial_balance = 100\n')
    cluster = supervisor.Cluster(path, controller=False)
    sink = ReportSink(ports["controller"])
    cluster.start()
    return cluster, sink


def answer(call) -> tuple:
    """A call's answer as comparable data: its code and text, or its response's fields."""
    try:
        response = call()
    except grpc.RpcError as exc:
        return (exc.code().name, exc.details())
    if isinstance(response, pb.TransferBatchResponse):
        return tuple((r.code, r.message, r.msg_id, r.balance) for r in response.results)
    return ("OK", response.msg_id, response.balance)


def transfer(to: str, amount: int, request_id: str = "") -> pb.TransferRequest:
    return pb.TransferRequest(to=to, amount=amount, request_id=request_id)


def calls(stub: pb_grpc.NodeStub) -> list:
    batch = pb.TransferBatchRequest
    return [
        lambda: stub.Transfer(transfer("p2", 30, "r-1"), timeout=10),
        lambda: stub.Transfer(transfer("p2", 30, "r-1"), timeout=10),  # a retry: the first answer
        lambda: stub.Transfer(transfer("p2", 31, "r-1"), timeout=10),  # another request under a used id
        lambda: stub.Transfer(transfer("p2", 0), timeout=10),
        lambda: stub.Transfer(transfer("p2", -5), timeout=10),
        lambda: stub.Transfer(transfer("", 5), timeout=10),
        lambda: stub.Transfer(transfer("nobody", 5), timeout=10),
        lambda: stub.Transfer(transfer("p1", 5), timeout=10),
        lambda: stub.Transfer(transfer("p3", 5), timeout=10),  # not a channel of the ring
        lambda: stub.Transfer(transfer("p2", 101), timeout=10),
        lambda: stub.TransferBatch(batch(transfers=[
            transfer("p2", 0), transfer("p3", 1), transfer("p2", 1000), transfer("p1", 1), transfer("p2", 7, "r-2"),
            transfer("p2", 9), transfer("p2", 7, "r-2"), transfer("p2", 500)]), timeout=10),
        lambda: stub.TransferBatch(batch(transfers=[]), timeout=10),
        lambda: stub.TransferBatch(batch(transfers=[transfer("p2", 1)] * 10_001), timeout=10),
    ]


def balances(cluster: supervisor.Cluster) -> dict[str, int]:
    found = {}
    for node in NODES:
        with grpc.insecure_channel(cluster.config.node(node).address) as channel:
            found[node] = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=5).balance
    return found


def run(tmp_path: Path, app: bool) -> tuple[list, dict[str, int]]:
    """The calls' answers on one ring and the balances served once the money arrived;
    the bank app's p1 is then killed, restarted, and asked for a retry."""
    cluster, sink = start(tmp_path / ("app" if app else "native"), app)
    try:
        with grpc.insecure_channel(cluster.config.node("p1").address) as channel:
            stub = pb_grpc.NodeStub(channel)
            wait_for(lambda: stub.GetState(pb.GetStateRequest(), timeout=5), retry_on=grpc.RpcError, what="p1 serving")
            answers = [answer(call) for call in calls(stub)]
        served = wait_for(lambda: balances(cluster), until=lambda b: sum(b.values()) == 300, timeout=30,
                          retry_on=grpc.RpcError, what="the money to arrive")
        if app:
            cluster.kill_node("p1", signal.SIGKILL)
            cluster.start_node("p1")
            back = wait_for(lambda: balances(cluster), retry_on=grpc.RpcError, what="p1 back")
            assert back == served, "p1 recovered another balance from its log"
            with grpc.insecure_channel(cluster.config.node("p1").address) as channel:
                retry = answer(lambda: pb_grpc.NodeStub(channel).Transfer(transfer("p2", 30, "r-1"), timeout=10))
            assert retry == answers[0], "a retry after the restart did not get its first answer"
        return answers, served
    finally:
        cluster.stop()
        sink.close()


def test_the_bank_app_answers_the_v1_calls_as_the_native_bank_and_recovers(tmp_path: Path) -> None:
    native, native_served = run(tmp_path, app=False)
    hosted, hosted_served = run(tmp_path, app=True)
    assert hosted == native
    assert hosted[0] == ("OK", "p1:p2:1", 70)
    assert hosted_served == native_served
