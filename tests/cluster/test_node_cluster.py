"""Node processes on loopback: transfers, markers and snapshots, every bad argument,
health/reflection, a clean stop. ReportState goes to a real in-test gRPC
Controller (`ReportSink`), so these tests exercise the node alone."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from support.node_harness import Cluster, port_is_free
from snapmesh.bank.logs import money_check
from snapmesh.load.background import BackgroundLoad
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

RING = [("p1", "p2"), ("p2", "p3"), ("p3", "p1")]


@pytest.fixture
def mesh(tmp_path: Path):
    cluster = Cluster(tmp_path, ["p1", "p2", "p3"], balance=1000)
    cluster.start()
    yield cluster
    cluster.close()


@pytest.fixture
def ring(tmp_path: Path):
    cluster = Cluster(tmp_path, ["p1", "p2", "p3"], balance=100, channels=RING)
    cluster.start()
    yield cluster
    cluster.close()


def test_transfers_move_money_and_are_logged_on_both_sides(mesh: Cluster) -> None:
    p1 = mesh.stub("p1")
    reply = p1.Transfer(pb.TransferRequest(to="p2", amount=30), timeout=5)
    assert reply.msg_id == "p1:p2:1" and reply.balance == 970
    batch = p1.TransferBatch(pb.TransferBatchRequest(transfers=[
        pb.TransferRequest(to="p3", amount=5), pb.TransferRequest(to="p2", amount=1)]), timeout=5)
    assert [(r.code, r.msg_id, r.balance) for r in batch.results] == [(0, "p1:p3:1", 965), (0, "p1:p2:2", 964)]
    logs = mesh.wait_settled(10)
    report = money_check(logs)
    assert report["balances"] == {"p1": 964, "p2": 1031, "p3": 1005}
    assert mesh.balances() == report["balances"]
    assert not report["duplicated"] and not report["phantom"] and not report["mismatched"]
    recv = [r for r in logs["p2"] if r["kind"] == "recv"]
    assert [(r["msg_id"], r["src"], r["dst"], r["seq"], r["amount"]) for r in recv] == [
        ("p1:p2:1", "p1", "p2", 1, 30), ("p1:p2:2", "p1", "p2", 2, 1)]


def test_markers_flow_and_snapshots_are_consistent_under_load(mesh: Cluster) -> None:
    with BackgroundLoad.for_cluster(mesh, batch=100, max_amount=5) as load:
        time.sleep(0.5)
        mesh.stub("p1").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s1"), timeout=5)
        time.sleep(0.3)
        # Concurrent snapshots from two initiators, and one id started twice.
        mesh.stub("p2").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s2"), timeout=5)
        mesh.stub("p3").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s3"), timeout=5)
        mesh.stub("p1").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s3"), timeout=5)
        states = {sid: mesh.sink.wait_for(sid, {"p1", "p2", "p3"}) for sid in ("s1", "s2", "s3")}
        time.sleep(0.3)
    assert load.stats.accepted > 500, load.stats.accepted
    logs = mesh.wait_settled()
    # Each report lists only the channels it recorded messages on; the check reads the rest as empty.
    parts = [part for by_node in states.values() for part in by_node.values()]
    assert all(part.only_recorded_channels and all(len(c.in_flight) for c in part.channels) for part in parts)
    mesh.check_snapshots(logs, *states.values())
    for node_id, records in logs.items():
        kinds = [r["kind"] for r in records]
        assert kinds.count("cut") == 3, node_id
        assert kinds.count("marker_sent") == 3 * 2 and kinds.count("marker_recv") == 3 * 2
    # Every transfer sent during the run was recorded at most once per snapshot.
    report = money_check(logs)
    assert sum(report["balances"].values()) == mesh.total
    assert not report["duplicated"] and not report["phantom"]


def test_abort_snapshot_is_logged_and_later_markers_are_dropped(ring: Cluster) -> None:
    ring.stub("p2").AbortSnapshot(pb.AbortSnapshotRequest(snapshot_id="s9", reason="deadline"), timeout=5)
    ring.stub("p1").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s9"), timeout=5)
    time.sleep(1.0)
    logs = ring.logs()
    aborts = [r for r in logs["p2"] if r["kind"] == "abort"]
    assert [(a["snapshot_id"], a["reason"]) for a in aborts] == [("s9", "deadline")]
    assert [r["kind"] for r in logs["p2"] if r.get("snapshot_id") == "s9"] == ["abort", "marker_recv"]
    assert not [r for r in logs["p3"] if r["kind"] == "cut"]  # p2 never passed the marker on
    assert "s9" not in ring.sink.states or "p2" not in ring.sink.states["s9"]


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_every_bad_argument_returns_its_code_and_changes_nothing(ring: Cluster) -> None:
    p1 = ring.stub("p1")
    ring.wait_settled()
    before_balance = ring.balances()
    before_log = {n: len(r) for n, r in ring.logs().items()}
    cases = [
        (lambda: p1.Transfer(pb.TransferRequest(to="p2", amount=0), timeout=5), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: p1.Transfer(pb.TransferRequest(to="p2", amount=-5), timeout=5), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: p1.Transfer(pb.TransferRequest(to="", amount=5), timeout=5), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: p1.Transfer(pb.TransferRequest(to="nobody", amount=5), timeout=5), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: p1.Transfer(pb.TransferRequest(to="p1", amount=5), timeout=5), grpc.StatusCode.INVALID_ARGUMENT),
        # p1->p3 is not a channel of the ring
        (lambda: p1.Transfer(pb.TransferRequest(to="p3", amount=5), timeout=5), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: p1.Transfer(pb.TransferRequest(to="p2", amount=101), timeout=5),
         grpc.StatusCode.FAILED_PRECONDITION),
        (lambda: p1.StartSnapshot(pb.StartSnapshotRequest(snapshot_id=""), timeout=5),
         grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: p1.AbortSnapshot(pb.AbortSnapshotRequest(snapshot_id="", reason="x"), timeout=5),
         grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for call, expected in cases:
        assert _code(call) == expected
    batch = p1.TransferBatch(pb.TransferBatchRequest(transfers=[
        pb.TransferRequest(to="p2", amount=0),
        pb.TransferRequest(to="p3", amount=1),
        pb.TransferRequest(to="p2", amount=1000),
        pb.TransferRequest(to="p1", amount=1),
    ]), timeout=5)
    assert [r.code for r in batch.results] == [3, 3, 9, 3]
    assert all(r.message and not r.msg_id and r.balance == 100 for r in batch.results)
    assert "cannot transfer to itself" in batch.results[3].message
    time.sleep(0.3)
    assert ring.balances() == before_balance
    assert {n: len(r) for n, r in ring.logs().items()} == before_log

    # A good transfer in the middle of bad ones is applied on its own.
    batch = p1.TransferBatch(pb.TransferBatchRequest(transfers=[
        pb.TransferRequest(to="p2", amount=-1), pb.TransferRequest(to="p2", amount=7)]), timeout=5)
    assert [(r.code, r.msg_id, r.balance) for r in batch.results] == [(3, "", 100), (0, "p1:p2:1", 93)]


def _channel_call(cluster: Cluster, node_id: str, frames: list[pb.ChannelFrame], reads: int = 1):
    """Open a raw Channel stream on `node_id`, send `frames`, read `reads` acks
    (then expect the stream to end); returns (acks, status code)."""
    with grpc.insecure_channel(cluster.direct_address(node_id)) as channel:
        call = channel.stream_stream(
            "/snapmesh.v1.Node/Channel",
            request_serializer=pb.ChannelFrame.SerializeToString,
            response_deserializer=pb.ChannelAck.FromString,
        )(iter(frames), timeout=5)
        acks = []
        try:
            for ack in call:
                acks.append(ack.acked_seq)
                if len(acks) >= reads + 1:
                    break
        except grpc.RpcError as error:
            return acks, error.code(), error.details()
        return acks, grpc.StatusCode.OK, ""


def test_bad_channel_streams_are_refused_and_change_nothing(ring: Cluster) -> None:
    ring.wait_settled()
    before_balance = ring.balances()
    before_log = {n: len(r) for n, r in ring.logs().items()}

    def frame_open(src: str, dst: str) -> pb.ChannelFrame:
        return pb.ChannelFrame(open=pb.ChannelOpen(src=src, dst=dst))

    def transfer(seq: int, amount: int) -> pb.ChannelMessage:  # the bank app's message: the amount as decimal ASCII
        return pb.ChannelMessage(seq=seq, transfer=pb.TransferMessage(msg_id=f"p3:p1:{seq}", payload=b"%d" % amount))

    def native(seq: int, amount: int) -> pb.ChannelMessage:  # what the bank's former native nodes sent
        return pb.ChannelMessage(seq=seq, transfer=pb.TransferMessage(msg_id=f"p3:p1:{seq}", amount=amount))

    def batch(*messages: pb.ChannelMessage) -> pb.ChannelFrame:
        return pb.ChannelFrame(batch=pb.ChannelBatch(messages=list(messages)))

    # p2->p1 is not a channel of the ring; p1 is not p2; the first frame must be open.
    _, code, details = _channel_call(ring, "p1", [frame_open("p2", "p1")])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no channel 'p2'->'p1'" in details
    _, code, _ = _channel_call(ring, "p1", [frame_open("p3", "p2")])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    _, code, _ = _channel_call(ring, "p1", [batch(transfer(1, 5))])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # Impersonating p3 on the real channel p3->p1 (p1 has received nothing: resume point 0):
    # a gap is DATA_LOSS; a native number (no payload) is a protocol violation.
    acks, code, details = _channel_call(ring, "p1", [frame_open("p3", "p1"), batch(transfer(2, 5))])
    assert acks == [0] and code == grpc.StatusCode.DATA_LOSS and "seq 2 after 0" in details
    acks, code, details = _channel_call(ring, "p1", [frame_open("p3", "p1"), batch(native(1, 5))])
    assert acks == [0] and code == grpc.StatusCode.FAILED_PRECONDITION and "protocol violation" in details
    # A duplicate (seq <= resume point) is dropped and acknowledged at the resume point.
    acks, code, _ = _channel_call(ring, "p1", [frame_open("p3", "p1"), batch(transfer(0, 5))])
    assert acks[:1] == [0]
    time.sleep(0.3)
    assert ring.balances() == before_balance
    after_log = {n: len(r) for n, r in ring.logs().items()}
    assert after_log == before_log
    # The node survived all of it, and the real p3->p1 channel still works.
    ring.stub("p3").Transfer(pb.TransferRequest(to="p1", amount=9), timeout=5)
    ring.wait_settled()
    assert ring.balances()["p1"] == before_balance["p1"] + 9


def test_reflection_health_metrics_and_clean_stop(mesh: Cluster) -> None:
    with grpc.insecure_channel(mesh.direct_address("p1")) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"snapmesh.v1.Node", "grpc.health.v1.Health"} <= names

    mesh.stub("p1").Transfer(pb.TransferRequest(to="p2", amount=3), timeout=5)
    mesh.wait_settled()
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{mesh.ports['p2']['metrics']}/metrics", timeout=5).read().decode()
    for line in (
        'snapmesh_transfers_received_total{node="p2"} 1.0',
        'snapmesh_balance{node="p2"} 1003.0',
        'snapmesh_channel_unacked_messages{node="p2",peer="p1"} 0.0',
        'snapmesh_transfers_sent_total{node="p2"} 0.0',
        'snapmesh_markers_sent_total{node="p2"} 0.0',
        'snapmesh_channel_recorded_messages_total{node="p2"} 0.0',
        'snapmesh_messages_received_total{node="p2"} 1.0',  # the bank's transfers are its messages
        'snapmesh_messages_sent_total{node="p2"} 0.0',
    ):
        assert line in text, line
    assert 'snapmesh_channel_frames_sent_total{node="p2",peer="p1"}' in text  # known peers start at 0
    sender = urllib.request.urlopen(f"http://127.0.0.1:{mesh.ports['p1']['metrics']}/metrics", timeout=5).read().decode()
    frames = [float(line.rsplit(" ", 1)[1]) for line in sender.splitlines()
              if line.startswith('snapmesh_channel_frames_sent_total{node="p1",peer="p2"}')]
    assert frames and frames[0] >= 1  # the transfer left p1 in a frame
    assert 'snapmesh_messages_sent_total{node="p1"} 1.0' in sender and 'snapmesh_transfers_sent_total{node="p1"} 1.0' in sender

    started = time.monotonic()
    codes = [node.stop() for node in mesh.nodes.values()]
    assert codes == [0, 0, 0]
    assert time.monotonic() - started < 10
    for node_id in mesh.node_ids:
        assert port_is_free(mesh.ports[node_id]["port"])
        assert port_is_free(mesh.ports[node_id]["metrics"])
