"""Batches of commands and concurrent commands on a real cluster: real node processes, real gRPC.

examples/token_ring.py on two nodes (`Cluster(..., app=...)`). SubmitBatch over
gRPC answers each item in order with its own code, a retry of the batch is
answered replayed, and a malformed batch is INVALID_ARGUMENT; the pinned
grpcurl calls SubmitBatch through reflection alone. Then 64 concurrent unary
Submit callers share the log's fsyncs: p1's /metrics, read before and after,
show more than 4 records per group commit (`snapmesh_log_committed_records_total`
over `snapmesh_log_fsync_seconds_count`), where a node whose log starts a round
on each caller's record shows 1-2. Counts, not timings.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.binaries import grpcurl_binary
from support.ring import APP, EXAMPLES, env_with

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

OK = grpc.StatusCode.OK.value[0]
CALLERS = 64
CALLS_EACH = 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batches")
    running = Cluster(write_cluster(tmp / "cluster.toml", nodes=2, data_dir=tmp / "data"), app=APP, env=env_with(EXAMPLES))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _batch(*items: tuple[str, bytes]) -> pb.SubmitBatchRequest:
    return pb.SubmitBatchRequest(items=[pb.SubmitRequest(request_id=rid, command=command) for rid, command in items])


def test_a_batch_is_answered_item_by_item_in_order_over_grpc(cluster):
    with grpc.insecure_channel(cluster.node_address("p1")) as channel:
        node = pb_grpc.NodeStub(channel)
        request = _batch(("b-has", b"has"), ("b-dance", b"dance"), ("b-pass", b"pass"), ("", b"pass"), ("", b"has"))
        first = node.SubmitBatch(request, timeout=30)
        again = node.SubmitBatch(request, timeout=30)  # a client's retry of the whole batch
        with pytest.raises(grpc.RpcError) as twice:
            node.SubmitBatch(_batch(("x", b"has"), ("x", b"has")), timeout=30)
        with pytest.raises(grpc.RpcError) as empty:
            node.SubmitBatch(pb.SubmitBatchRequest(), timeout=30)
    invalid, refused = grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.FAILED_PRECONDITION.value[0]
    # p1 holds the token first: it passes it once; the second pass is refused, the app's code and text.
    assert [(r.code, r.reply) for r in first.results] == [
        (OK, b"1"), (invalid, b""), (OK, b"passed to p2"), (refused, b""), (OK, b"0")]
    assert "unknown command" in first.results[1].message and "does not hold" in first.results[3].message
    assert [r.replayed for r in first.results] == [False] * 5 and all(r.epoch == 1 for r in first.results if not r.code)
    # The retry: the ids answered are replayed with their first reply; the items without one run again.
    assert [(r.code, r.reply, r.replayed) for r in again.results] == [
        (OK, b"1", True), (invalid, b"", False), (OK, b"passed to p2", True), (refused, b"", False), (OK, b"0", False)]
    assert twice.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'x'" in twice.value.details()
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_grpcurl_calls_submit_batch_through_reflection(cluster):
    body = json.dumps({"items": [{"command": base64.b64encode(b"has").decode()},
                                 {"command": base64.b64encode(b"dance").decode()}]})
    result = subprocess.run([str(grpcurl_binary()), "-plaintext", "-d", body, cluster.node_address("p2"),
                             "snapmesh.v1.Node/SubmitBatch"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert len(results) == 2 and "code" not in results[0] and results[1]["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert base64.b64decode(results[0]["reply"]) in (b"0", b"1") and "unknown command" in results[1]["message"]


def _commits(address: str) -> tuple[float, float]:
    """p1's (records made durable, group commits) so far, from its /metrics."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("snapmesh_log_committed_records_total", "snapmesh_log_fsync_seconds_count"):
                found[sample.name] = sample.value
    return found["snapmesh_log_committed_records_total"], found["snapmesh_log_fsync_seconds_count"]


async def _callers(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        node = pb_grpc.NodeStub(channel)

        async def caller() -> int:
            for _ in range(CALLS_EACH):
                assert (await node.Submit(pb.SubmitRequest(command=b"has"), timeout=60)).reply in (b"0", b"1")
            return CALLS_EACH

        return sum(await asyncio.gather(*(caller() for _ in range(CALLERS))))


def test_concurrent_unary_submits_share_their_fsyncs(cluster):
    metrics = cluster.config.node("p1").metrics_address
    records_before, commits_before = _commits(metrics)
    answered = asyncio.run(_callers(cluster.node_address("p1")))
    records_after, commits_after = _commits(metrics)
    records, commits = records_after - records_before, commits_after - commits_before
    assert answered == CALLERS * CALLS_EACH and records >= answered  # a command record each
    print(f"{CALLERS} callers: {records:.0f} records in {commits:.0f} commits, {records / commits:.1f} a commit")
    assert records / commits > 4, (records, commits)
