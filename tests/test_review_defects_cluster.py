"""Issue 26 on one real plaintext cluster (controller and node processes, real gRPC).

4. Two concurrent RestoreSnapshot calls start one restore (one new epoch, not
   two); a retry with the same request_id after it finished answers it and
   rolls nothing back again; the same key for another snapshot is refused.
"""

from __future__ import annotations

import grpc
import pytest

from cluster_helpers import controller_stub, node_stub
from snapmesh.launcher import LocalCluster, write_config
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("review") / "cluster.toml", nodes=3, initial_balance=1000)
    with LocalCluster(path) as running:
        yield running


def states(cluster) -> dict[str, pb.NodeStateResponse]:
    out = {}
    for n in cluster.node_ids:
        channel, stub = node_stub(cluster.node_address(n))
        with channel:
            out[n] = stub.GetState(pb.GetStateRequest(), timeout=10)
    return out


def take_snapshot(stub) -> pb.Snapshot:
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
    assert snapshot.status == pb.Snapshot.COMPLETE and snapshot.conserved, snapshot.reason
    return snapshot


def test_two_concurrent_restores_start_one(cluster):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        snapshot = take_snapshot(stub)
        epoch = states(cluster)["p1"].epoch
        request = pb.RestoreSnapshotRequest(snapshot_id=snapshot.snapshot_id)
        calls = [stub.RestoreSnapshot.future(request, timeout=60) for _ in range(2)]
        answers = [call.result() for call in calls]
    assert [a.status for a in answers] == [pb.Restore.RESTORED] * 2, [a.reason for a in answers]
    assert {a.epoch for a in answers} == {epoch + 1}, "two restores were started"
    assert {s.epoch for s in states(cluster).values()} == {epoch + 1}


def test_a_retried_restore_with_its_key_does_not_roll_back_again(cluster):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        snapshot = take_snapshot(stub)
        request = pb.RestoreSnapshotRequest(snapshot_id=snapshot.snapshot_id, request_id="restore-42")
        first = stub.RestoreSnapshot(request, timeout=60)
        assert first.status == pb.Restore.RESTORED and first.request_id == "restore-42"
        node_channel, node = node_stub(cluster.node_address("p1"))
        with node_channel:
            node.Transfer(pb.TransferRequest(to="p2", amount=7), timeout=10)  # after the restore: must stay
        before = states(cluster)
        again = stub.RestoreSnapshot(request, timeout=60)
        assert again == first
        assert states(cluster) == before, "the retry rolled the cluster back again"
        other = take_snapshot(stub)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=other.snapshot_id, request_id="restore-42"),
                                 timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert snapshot.snapshot_id in refused.value.details()
    assert states(cluster) == before
