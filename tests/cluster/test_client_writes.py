"""Control-plane writes are a client's, never a node's: on real TLS clusters.

A node's key plus the token once triggered snapshots and rolled the whole
cluster back (the controller checked only the token). Now node p2's
certificate calling TriggerSnapshot and RestoreSnapshot is PERMISSION_DENIED,
naming p2 and the call, and nothing changes: no snapshot, no epoch, no log
line. The client's certificate does both (the control). The same holds on a
cluster with [tls] and no [auth], from the certificates alone. The controller's
own calls to the nodes (StartSnapshot, RestoreState) still pass, with no token
sent to them.
"""

from __future__ import annotations

import json

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.serving.credentials import open_channel
from snapmesh.settings import config, security
from snapmesh.settings.config import write_cluster
from snapmesh.settings.security import write_certs
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TLS = ('\n[tls]\nca = "tls/ca.pem"\ncert = "tls/{name}.pem"\nkey = "tls/{name}-key.pem"\n'
       'client_cert = "tls/client.pem"\nclient_key = "tls/client-key.pem"\n')
AUTH = '\n[auth]\ntoken_file = "tls/token"\n'


@pytest.fixture(scope="module", params=["tls-and-auth", "tls-only"])
def running(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    path = write_cluster(root / "cluster.toml", nodes=2, initial_balance=1000, data_dir=root / "data")
    write_certs(config.load(path), root / "tls")
    path.write_text(path.read_text() + TLS + (AUTH if request.param == "tls-and-auth" else ""))
    with Cluster(path) as cluster:
        yield request.param, root / "tls", cluster


def node_key(tls, cluster, node_id: str, *, token: bool) -> security.Identity:
    """Node `node_id`'s certificate and key, plus the cluster's token file when asked (and there is one)."""
    settings = cluster.config.tls
    token_file = tls / config.TOKEN_FILE if token and cluster.config.auth is not None else None
    return security.load_files(node_id, ca=settings.ca, cert=settings.cert_path(node_id),
                               key=settings.key_path(node_id), token_file=token_file)


def controller_stub(cluster, identity):
    channel = open_channel(cluster.controller_address, identity)
    return channel, pb_grpc.ControllerStub(channel)


def seen(cluster) -> tuple:
    """What a write would change: the snapshots listed, each node's epoch and balance, its log's lines."""
    with open_channel(cluster.controller_address, cluster.client_identity) as channel:
        listed = pb_grpc.ControllerStub(channel).ListSnapshots(pb.ListSnapshotsRequest(), timeout=10)
    states = {}
    for node_id in cluster.node_ids:
        with open_channel(cluster.node_address(node_id), cluster.client_identity) as channel:
            state = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=10)
        states[node_id] = (state.epoch, state.balance)
    logs = {n: [json.loads(line)["kind"] for line in cluster.config.log_path(n).read_text().splitlines() if line.strip()]
            for n in cluster.node_ids}
    return sorted(s.snapshot_id for s in listed.snapshots), states, logs


def refusal(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call(request, timeout=30)
    return refused.value


def test_a_node_certificate_cannot_trigger_nor_restore_and_the_client_can(running):
    kind, tls, cluster = running
    channel, client = controller_stub(cluster, cluster.client_identity)
    with channel:
        taken = client.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
        assert taken.status == pb.Snapshot.COMPLETE, taken  # the controller's StartSnapshot passed the nodes
        before = seen(cluster)

        for with_token in (True, False):
            channel_p2, as_p2 = controller_stub(cluster, node_key(tls, cluster, "p2", token=with_token))
            with channel_p2:
                for method, call, request in (
                    ("TriggerSnapshot", as_p2.TriggerSnapshot, pb.TriggerSnapshotRequest(initiator="p2", wait=True)),
                    ("RestoreSnapshot", as_p2.RestoreSnapshot, pb.RestoreSnapshotRequest(snapshot_id=taken.snapshot_id)),
                ):
                    error = refusal(call, request)
                    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (kind, method, with_token, error.details())
                    assert "'p2'" in error.details() and method in error.details(), error.details()
        assert seen(cluster) == before, "a refused write changed the cluster"

        # The control: the client's certificate restores (the controller's RestoreState passes the nodes).
        restored = client.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=taken.snapshot_id), timeout=60)
    assert restored.status == pb.Restore.RESTORED, restored.reason
    _, states, _ = seen(cluster)
    assert all(epoch > before[1][n][0] for n, (epoch, _) in states.items()), states
