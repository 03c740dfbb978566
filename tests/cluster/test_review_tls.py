"""Who may call what, on one real --tls cluster, with the real grpcurl where a client would use it.

- The node's control RPCs (StartSnapshot, AbortSnapshot, RestoreState) answer
   only the controller's certificate: the client's certificate plus the token,
   and a node's own certificate plus the token, are PERMISSION_DENIED and change
   nothing. The controller itself still restores (the control).
- ReportStateChunks checks the caller's certificate before it reads a chunk:
   a client streaming 600 MiB is refused at once, not after buffering 512 MiB.
- With protect_reads, /metrics is served over mutual TLS only.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from snapmesh.settings import config, security
from snapmesh.serving import credentials
from snapmesh.settings.config import write_cluster
from snapmesh.settings.security import write_certs
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.binaries import grpcurl_binary

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("review-tls")
    path = write_cluster(root / "cluster.toml", nodes=3, initial_balance=1000, data_dir=root / "data")
    write_certs(config.load(path), root / "tls")
    with Cluster(path, tls_dir=root / "tls") as running:
        yield root / "tls", running


def grpcurl(tls: Path, who: str, address: str, method: str, body: dict) -> subprocess.CompletedProcess:
    """The real grpcurl, presenting `who`'s certificate and the cluster's token."""
    token = security.read_token(tls / config.TOKEN_FILE)
    argv = [str(grpcurl_binary()), "-cacert", str(tls / config.CA_FILE), "-cert", str(tls / f"{who}.pem"),
            "-key", str(tls / f"{who}-key.pem"), "-H", f"authorization: Bearer {token}",
            "-d", json.dumps(body), address, f"snapmesh.v1.Node/{method}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def node_state(cluster, node_id: str) -> pb.NodeStateResponse:
    with credentials.open_channel(cluster.node_address(node_id), cluster.client_identity) as channel:
        return pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=10)


def test_node_control_rpcs_refuse_a_client_and_a_node_certificate(tls_cluster):
    tls, cluster = tls_cluster
    before = {n: node_state(cluster, n) for n in cluster.node_ids}
    forged = {"snapshot_id": "forged", "epoch": str(before["p1"].epoch + 1), "balance": "1000000"}
    calls = [
        ("RestoreState", forged),
        ("StartSnapshot", {"snapshot_id": "intruder"}),
        ("AbortSnapshot", {"snapshot_id": "intruder", "reason": "x"}),
    ]
    for who in ("client", "p2"):  # the client's credentials, and node p2's own (a node's own once set another's balance)
        for method, body in calls:
            result = grpcurl(tls, who, cluster.node_address("p3"), method, body)
            assert result.returncode != 0, f"{who} called {method}: {result.stdout}"
            assert "PermissionDenied" in result.stderr and "'controller'" in result.stderr, result.stderr
    after = {n: node_state(cluster, n) for n in cluster.node_ids}
    assert after == before, "a refused control call changed a node"


def test_the_controller_still_restores_over_tls(tls_cluster):
    _, cluster = tls_cluster
    with credentials.open_channel(cluster.controller_address, cluster.client_identity) as channel:
        stub = pb_grpc.ControllerStub(channel)
        snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
        assert snapshot.status == pb.Snapshot.COMPLETE
        restore = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=snapshot.snapshot_id), timeout=60)
    assert restore.status == pb.Restore.RESTORED, restore.reason
    assert sum(n.balance for n in restore.nodes) == 3000


def test_grpcurl_is_what_a_client_runs(tls_cluster):
    """The control: the same grpcurl and client credentials read a node's state."""
    tls, cluster = tls_cluster
    result = grpcurl(tls, "client", cluster.node_address("p1"), "GetState", {})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["node_id"] == "p1"


def test_report_state_chunks_checks_the_caller_before_buffering(tls_cluster):
    _, cluster = tls_cluster
    pulled = 0

    def chunks():
        nonlocal pulled
        piece = pb.FullStateChunk(data=b"\0" * (1024 * 1024))
        for _ in range(600):
            pulled += 1
            yield piece

    started = time.monotonic()
    with credentials.open_channel(cluster.controller_address, cluster.client_identity) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ControllerStub(channel).ReportStateChunks(chunks(), timeout=60)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
    assert "not a node" in refused.value.details()
    assert pulled < 100 and time.monotonic() - started < 20, f"{pulled} MiB sent before the refusal"


def test_metrics_are_behind_mutual_tls_when_reads_are_protected(tmp_path):
    """10. With protect_reads = true, /metrics (balances among them) no longer answers plain HTTP."""
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    write_certs(config.load(path), tmp_path / "certs")
    path.write_text(path.read_text() + (
        '\n[tls]\nca = "certs/ca.pem"\ncert = "certs/{name}.pem"\nkey = "certs/{name}-key.pem"\n'
        'client_cert = "certs/client.pem"\nclient_key = "certs/client-key.pem"\n'
        '\n[auth]\ntoken_file = "certs/token"\nprotect_reads = true\n'
    ))
    certs = tmp_path / "certs"
    with Cluster(path) as cluster:
        for process in (*cluster.config.nodes, cluster.config.controller):
            address = process.metrics_address
            with pytest.raises(OSError):  # plain HTTP: the TLS server drops it
                urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read()
            anonymous = ssl.create_default_context(cafile=certs / "ca.pem")
            with pytest.raises(OSError):  # HTTPS without a client certificate
                urllib.request.urlopen(f"https://{address}/metrics", timeout=10, context=anonymous).read()
            client = ssl.create_default_context(cafile=certs / "ca.pem")
            client.load_cert_chain(certs / "client.pem", certs / "client-key.pem")
            body = urllib.request.urlopen(f"https://{address}/metrics", timeout=10, context=client).read().decode()
            assert "snapmesh_" in body
