"""Request ids, restores, message limits and retention on one real plaintext cluster (controller and node processes, real gRPC).

- One TransferBatch of 10,000 request ids does not push an older id out.
- Two concurrent RestoreSnapshot calls start one restore (one new epoch, not
   two); a retry with the same request_id after it finished answers it and
   rolls nothing back again; the same key for another snapshot is refused.
- A request_id over 128 bytes and a TransferBatch over 10,000 transfers are
   INVALID_ARGUMENT naming the limit, and nothing is logged; the controller
   receives at most 4 MiB per message.
- Snapshot files `--keep` deleted stay deleted across a controller restart.
"""

from __future__ import annotations

import time

import grpc
import pytest

from support.cluster_helpers import controller_stub, node_stub
from support.polling import wait_for
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_cluster(tmp_path_factory.mktemp("review") / "cluster.toml", nodes=3, initial_balance=100_000)
    with Cluster(path) as running:
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
        # A restore takes ~50 ms: on a loaded machine the second call once arrived after the first
        # had finished, and rightly started a second restore. p3 paused holds the first one open
        # (its RestoreState is retried for 30 s) until the second has surely arrived.
        cluster.pause_node("p3")
        try:
            calls = [stub.RestoreSnapshot.future(request, timeout=60) for _ in range(2)]
            time.sleep(2.0)
            assert not any(call.done() for call in calls), [call.result() for call in calls if call.done()]
        finally:
            cluster.resume_node("p3")
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
        before = wait_for(lambda: states(cluster), until=lambda s: sum(n.balance for n in s.values()) == 300_000)  # delivered
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


def log_lines(cluster, node_id: str) -> int:
    return len(cluster.config.log_path(node_id).read_text().splitlines())


def test_an_oversized_request_id_or_batch_is_refused_naming_the_limit(cluster):
    """6. A 4 MB request_id (the review sent 40 MB) is refused and not logged; a batch over the limit too."""
    channel, node = node_stub(cluster.node_address("p2"))
    with channel:
        before, lines = node.GetState(pb.GetStateRequest(), timeout=10), log_lines(cluster, "p2")
        with pytest.raises(grpc.RpcError) as long_id:
            node.Transfer(pb.TransferRequest(to="p3", amount=1, request_id="x" * 4_000_000), timeout=10)
        assert long_id.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "the limit is 128" in long_id.value.details()
        batch = pb.TransferBatchRequest(transfers=[pb.TransferRequest(to="p3", amount=1)] * 10_001)
        with pytest.raises(grpc.RpcError) as too_many:
            node.TransferBatch(batch, timeout=30)
        assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at most 10000 transfers, got 10001" in too_many.value.details()
        mixed = node.TransferBatch(pb.TransferBatchRequest(transfers=[
            pb.TransferRequest(to="p3", amount=1, request_id="y" * 129),
            pb.TransferRequest(to="p3", amount=1, request_id="ok-1"),
        ]), timeout=10)
        assert [r.code for r in mixed.results] == [grpc.StatusCode.INVALID_ARGUMENT.value[0], 0]
        after = node.GetState(pb.GetStateRequest(), timeout=10)
    assert after.balance == before.balance - 1
    text = cluster.config.log_path("p2").read_text()
    assert "x" * 200 not in text and "y" * 129 not in text and log_lines(cluster, "p2") >= lines


def test_a_batch_of_ten_thousand_ids_keeps_the_first_over_real_grpc(cluster):
    """2. One TransferBatch of 10,000 ids used to push every older id out of the window."""
    channel, node = node_stub(cluster.node_address("p3"))
    with channel:
        first = node.Transfer(pb.TransferRequest(to="p1", amount=1, request_id="oldest"), timeout=10)
        burst = [pb.TransferRequest(to="p1", amount=1, request_id=f"burst-{i}") for i in range(10_000)]
        results = node.TransferBatch(pb.TransferBatchRequest(transfers=burst), timeout=60).results
        assert [r.message for r in results if r.code] == []
        balance = node.GetState(pb.GetStateRequest(), timeout=10).balance
        retry = node.Transfer(pb.TransferRequest(to="p1", amount=1, request_id="oldest"), timeout=10)
        assert retry.msg_id == first.msg_id
        assert node.GetState(pb.GetStateRequest(), timeout=10).balance == balance, "the retry was paid twice"


def test_the_controller_receives_no_more_than_its_api_needs(cluster):
    """6. The controller's receive limit is 4 MiB (reports over 1 MiB come in chunks), not 64 MiB."""
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        huge = pb.FullState(snapshot_id="s", node_id="p1", snapshot_mode="x" * (5 * 1024 * 1024))
        with pytest.raises(grpc.RpcError) as refused:
            stub.ReportState(huge, timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_keep_deletions_do_not_come_back_after_a_controller_restart(tmp_path):
    """10. `--keep 1` deleted the older snapshots' files; a restart replayed them from the journal."""
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, initial_balance=100)
    with Cluster(path, controller_args=["--keep", "1"]) as running:
        directory = running.config.snapshots_dir
        channel, stub = controller_stub(running.controller_address)
        with channel:
            ids = [take_snapshot(stub).snapshot_id for _ in range(3)]

        compact = running.config.data_dir / "controller" / "snapshots"

        def files() -> set[str]:
            return {p.stem for d in (directory, compact) if d.is_dir() for p in d.iterdir() if p.suffix in (".json", ".pb")}

        wait_for(files, until=lambda names: ids[-1] in names and not names & set(ids[:2]))
        running.restart_controller(kill=True)  # the journal is not rewritten on the way out
        channel, stub = controller_stub(running.controller_address)
        with channel:
            listed = stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10).snapshots  # serving again
        assert [s.snapshot_id for s in listed][-3:] == ids
        time.sleep(1.0)  # its file writer has had time to write what it was given at start-up
        assert files() == {ids[-1]}, "deleted snapshot files came back"


def test_a_node_receives_no_more_than_its_api_needs(cluster):
    """6. A node's receive limit is the largest of what its RPCs may carry (rpc_budgets), not gRPC's 64 MiB."""
    from snapmesh.services.node.process import receive_limit

    limit = receive_limit(2)
    assert limit < 64 * 1024 * 1024
    channel, node = node_stub(cluster.node_address("p1"))
    with channel:
        with pytest.raises(grpc.RpcError) as refused:
            node.Transfer(pb.TransferRequest(to="p2", amount=1, request_id="z" * (limit + 1)), timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
