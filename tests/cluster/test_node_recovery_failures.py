"""What a node keeps across restarts and under load, against real node processes:
aborts are remembered, a marker_recv is never logged without its cut, segments
seal with a checkpoint, a full channel refuses at once, a retried request pays once."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import grpc
import pytest

from support.node_harness import Cluster
from support.polling import WaitTimedOut, wait_for
from snapmesh.bank.logs import money_check
from snapmesh.services.node.recovery import recover
from snapmesh.protocol import wal
from snapmesh.load.background import BackgroundLoad
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def pair(tmp_path: Path):
    cluster = Cluster(tmp_path, ["p1", "p2"])
    yield cluster
    cluster.close()


@pytest.fixture
def bounded_pair(tmp_path: Path):
    cluster = Cluster(tmp_path, ["p1", "p2"], settings={"channel_bound": 20})
    yield cluster
    cluster.close()


def test_a_full_channel_refuses_at_once_with_resource_exhausted_and_moves_no_money(bounded_pair: Cluster) -> None:
    pair = bounded_pair
    pair.start("p1")  # p2 is down: nothing sent to it is acknowledged
    p1 = pair.stub("p1")
    for _ in range(20):
        p1.Transfer(pb.TransferRequest(to="p2", amount=1), timeout=5)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        p1.Transfer(pb.TransferRequest(to="p2", amount=1), timeout=5)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "20 unacknowledged" in info.value.details()
    assert time.monotonic() - started < 1.0, "refused, but not at once"
    batch = p1.TransferBatch(pb.TransferBatchRequest(transfers=[pb.TransferRequest(to="p2", amount=1)]), timeout=5)
    assert batch.results[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert p1.GetState(pb.GetStateRequest(), timeout=5).balance == 980
    assert sum(r["kind"] == "send" for r in pair.logs()["p1"]) == 20
    pair.start("p2")  # the channel drains; transfers are accepted again

    def accepted() -> bool:
        try:
            p1.Transfer(pb.TransferRequest(to="p2", amount=1), timeout=5)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return False
        return True

    wait_for(accepted, timeout=30, interval=0.1, what="a transfer accepted once p2 drains the channel")
    pair.wait_settled(20)


def test_a_retried_request_is_answered_once_and_paid_once_across_a_restart(pair: Cluster) -> None:  # 9
    pair.start()
    p1 = pair.stub("p1")
    first = p1.Transfer(pb.TransferRequest(to="p2", amount=30, request_id="order-17"), timeout=5)
    again = p1.Transfer(pb.TransferRequest(to="p2", amount=30, request_id="order-17"), timeout=5)
    assert (again.msg_id, again.balance) == (first.msg_id, first.balance) == ("p1:p2:1", 970)
    batch = p1.TransferBatch(pb.TransferBatchRequest(transfers=[
        pb.TransferRequest(to="p2", amount=30, request_id="order-17"),
        pb.TransferRequest(to="p2", amount=5, request_id="order-18"),
    ]), timeout=5)
    assert [(r.code, r.msg_id) for r in batch.results] == [(0, "p1:p2:1"), (0, "p1:p2:2")]
    pair.kill_node("p1")  # SIGKILL: the map must come back from the log
    pair.start("p1")
    after = p1.Transfer(pb.TransferRequest(to="p2", amount=30, request_id="order-17"), timeout=5)
    assert (after.msg_id, after.balance) == ("p1:p2:1", 970)
    assert p1.GetState(pb.GetStateRequest(), timeout=5).balance == 965
    # Operators grep these lines (the helm test too): their v1 wording stays.
    said = (pair.log_dir / "p1.log").read_text()
    assert "recovered from " in said and ".log.jsonl: balance 965, " in said and "(balance 965)" in said, said[-2000:]
    logs = pair.wait_settled(20)
    # The bank app's log: a transfer is its send, carrying its command (which holds the request id).
    commands = [r.get("request_id") for r in logs["p1"] if r["kind"] == "command" or "command" in r]
    sends = [r["msg_id"] for r in logs["p1"] if r["kind"] == "send"]
    assert (commands, sends) == (["order-17", "order-18"], ["p1:p2:1", "p1:p2:2"])


def test_an_abort_is_remembered_so_a_late_marker_starts_no_zombie_recording(pair: Cluster) -> None:  # 3
    pair.start()
    p1, p2 = pair.stub("p1"), pair.stub("p2")
    p1.AbortSnapshot(pb.AbortSnapshotRequest(snapshot_id="s-late", reason="deadline"), timeout=5)
    pair.kill_node("p1")
    pair.start("p1")
    p2.StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s-late"), timeout=5)  # its marker reaches p1 late
    wait_for(lambda: any(r["kind"] == "marker_recv" for r in pair.logs()["p1"]), timeout=20, interval=0.1,
             what="the late marker at p1")
    assert not [r for r in pair.logs()["p1"] if r["kind"] == "cut"], "p1 started a zombie recording"


def test_recovery_treats_a_marker_recv_without_its_cut_as_a_recording(tmp_path: Path) -> None:  # 4
    path = tmp_path / "p1.log.jsonl"
    records = [
        {"node": "p1", "lsn": 1, "kind": "init", "app": ""},
        {"node": "p1", "lsn": 2, "kind": "marker_recv", "snapshot_id": "s1", "src": "p2", "dst": "p1", "seq": 1},
    ]  # the cut that belonged to it never reached the disk (an old node wrote marker_recv first)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    state = recover(path, "p1", incoming=("p2",), outgoing=("p2",))
    assert "s1" in state.abandoned and state.last_received == {"p2": 1}


def test_a_node_logs_the_cut_before_the_marker_recv_that_caused_it(pair: Cluster) -> None:  # 4
    pair.start()
    pair.stub("p2").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s1"), timeout=5)
    kinds = wait_for(lambda: [r["kind"] for r in pair.logs()["p1"] if r.get("snapshot_id") == "s1"],
                     until=lambda found: "marker_recv" in found, timeout=20, interval=0.1, what="p1's marker_recv of s1")
    assert kinds.index("cut") < kinds.index("marker_recv")


def test_segments_seal_with_a_checkpoint_and_a_restart_reads_only_the_active_one(tmp_path: Path) -> None:  # 5
    cluster = Cluster(tmp_path, ["p1", "p2"], settings={"segment_records": 300})
    try:
        cluster.start()
        with BackgroundLoad.for_cluster(cluster, batch=50, max_amount=3) as load:
            with contextlib.suppress(WaitTimedOut):  # up to 30 s of load, then the segments are counted
                wait_for(lambda: load.stats.accepted, until=lambda n: n >= 3000, timeout=30, interval=0.1,
                         what="3000 transfers")
        logs = cluster.wait_settled(30)
        data = cluster.data_dir
        sealed = sorted(n for n in os.listdir(data) if wal.sealed_first_lsn(n, "p1") is not None)
        assert len(sealed) >= 3, sealed
        firsts = [wal.sealed_first_lsn(n, "p1") for n in sealed]
        assert firsts[0] == 1 and sealed[0] == "p1.log.000000000001.jsonl"
        for name, first in zip(sealed, firsts, strict=True):
            head = json.loads((data / name).read_text().splitlines()[0])
            assert head["lsn"] == first and head["kind"] == ("init" if first == 1 else "checkpoint")
        assert json.loads((data / "p1.log.jsonl").read_text().splitlines()[0])["kind"] == "checkpoint"
        before = money_check(logs)["balances"]
        assert cluster.stop_node("p1") == 0
        cluster.start("p1")
        out = cluster.nodes["p1"].output().split("---- start #2")[1]
        read = int(out.split(" records read")[0].rsplit(" ", 1)[1])
        assert read <= 300, f"restart read {read} records: more than the active segment"
        assert cluster.balances() == before
        cluster.stub("p1").Transfer(pb.TransferRequest(to="p2", amount=1), timeout=5)
        report = money_check(cluster.wait_settled(20))
        assert not report["duplicated"] and not report["phantom"] and sum(report["balances"].values()) == 2000
    finally:
        cluster.close()
