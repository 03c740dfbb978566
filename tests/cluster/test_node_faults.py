"""Faults below the algorithm, repaired by the transport: connections cut by a
TCP proxy mid-load, a node SIGKILLed mid-load and restarted on its data dir.
The logs decide: every send has exactly one recv, nothing else is received,
balances sum to the total, and snapshots taken around the faults are consistent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from snapmesh.chaos.proxy import ChaosProxy
from support.node_harness import Cluster
from snapmesh.checking import scrape
from snapmesh.load.background import BackgroundLoad
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def metric_sum(cluster: Cluster, name: str) -> float:
    return sum(scrape.sums(node.metrics_address).get(name, 0.0) for node in cluster.config.nodes)


@pytest.fixture
def proxied_pair(tmp_path: Path):
    cluster = Cluster(tmp_path, ["p1", "p2"], balance=100_000, proxied=("p1", "p2"))
    proxies = {n: ChaosProxy(cluster.ports[n]["port"], cluster.ports[n]["listen"]) for n in cluster.node_ids}
    try:
        cluster.start()
        yield cluster, proxies
    finally:
        cluster.close()
        for proxy in proxies.values():
            proxy.close()


def test_stream_cut_mid_load_resends_without_loss_or_duplicates(proxied_pair) -> None:
    cluster, proxies = proxied_pair
    killed = 0
    with BackgroundLoad.for_cluster(cluster, batch=200, max_amount=10) as load:
        for round_ in range(16):
            time.sleep(0.25)
            for proxy in proxies.values():
                killed += proxy.kill_connections()
            if round_ == 6:
                cluster.stub("p1").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="during-cuts"), timeout=5)
        time.sleep(0.5)
    assert killed >= 10, f"only {killed} connections were cut"
    assert load.stats.accepted > 2000, load.stats.accepted
    logs = cluster.assert_money_intact()
    states = cluster.sink.wait_for("during-cuts", {"p1", "p2"})
    cluster.check_snapshots(logs, states)
    assert metric_sum(cluster, "snapmesh_channel_reconnects_total") >= 10
    resent = metric_sum(cluster, "snapmesh_channel_resent_messages_total")
    print(f"cut {killed} connections; {resent:.0f} messages resent; {load.stats.accepted} transfers")
    assert resent > 0, "no cut ever caught a message in flight"
    sends = sum(1 for records in logs.values() for r in records if r["kind"] == "send")
    assert sends == load.stats.accepted


def test_sigkilled_node_restarts_on_its_log_without_loss_or_duplicates(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, ["p1", "p2", "p3"], balance=100_000)
    try:
        cluster.start()
        with BackgroundLoad.for_cluster(cluster, batch=200, max_amount=10) as load:
            time.sleep(1.0)
            cluster.stub("p1").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="before"), timeout=5)
            cluster.sink.wait_for("before", {"p1", "p2", "p3"})
            time.sleep(0.5)
            accepted_before_kill = load.stats.accepted
            cluster.kill_node("p2")
            time.sleep(0.7)  # the others keep sending to p2 into their outboxes
            cluster.start("p2")
            time.sleep(1.0)
            cluster.stub("p3").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="after"), timeout=5)
            after = cluster.sink.wait_for("after", {"p1", "p2", "p3"})
            time.sleep(0.5)
        assert load.stats.accepted > accepted_before_kill > 0
        logs = cluster.assert_money_intact()
        kinds = [r["kind"] for r in logs["p2"]]
        assert kinds.count("init") == 1 and kinds.count("restart") == 1
        cluster.check_snapshots(logs, cluster.sink.states["before"], after)
        # Every message p2 sent before the kill carries on from where its log left off.
        seqs = [r["seq"] for r in logs["p2"] if r["kind"] in ("send", "marker_sent") and r["dst"] == "p1"]
        assert seqs == list(range(1, len(seqs) + 1))
        for node in cluster.nodes.values():
            assert node.stop() == 0
    finally:
        cluster.close()


def test_a_recording_no_abort_reached_is_dropped_after_twice_the_deadline(tmp_path: Path) -> None:
    """p3 is stopped, so s1 can never finish at p1 and p2; no controller tells them
    (the report sink never aborts). Each drops its recording by itself at twice
    the configured deadline, and later markers for s1 are stale there."""
    cluster = Cluster(tmp_path, ["p1", "p2", "p3"], deadline=1)
    try:
        cluster.start()
        cluster.pause_node("p3")
        cluster.stub("p1").StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s1"), timeout=5)
        time.sleep(1.0)
        for node in ("p1", "p2"):  # recording, not yet expired
            kinds = [r["kind"] for r in cluster.logs()[node] if r.get("snapshot_id") == "s1"]
            assert "cut" in kinds and "abort" not in kinds, (node, kinds)
        time.sleep(2.0)
        cluster.resume_node("p3")
        # p3 still gets both markers (sent before the expiry) and finishes its own part.
        assert set(cluster.sink.wait_for("s1", {"p3"})) >= {"p3"}
        cluster.stub("p1").Transfer(pb.TransferRequest(to="p2", amount=7), timeout=5)
        logs = cluster.assert_money_intact()
    finally:
        if cluster.nodes["p3"].alive:
            cluster.resume_node("p3")
        cluster.close()
    for node in ("p1", "p2"):
        aborts = [r for r in logs[node] if r["kind"] == "abort" and r["snapshot_id"] == "s1"]
        assert [a["reason"] for a in aborts] == ["not finished here within 2s of recording"], node
        assert "p1" not in cluster.sink.states.get("s1", {}) and "p2" not in cluster.sink.states.get("s1", {})
