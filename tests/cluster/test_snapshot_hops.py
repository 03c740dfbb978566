"""The path after the cut on a real cluster: every node and the controller export
`snapmesh_snapshot_hop_seconds` for their hops (snapmesh/protocol/hops.py), at 0 from
the start, and each snapshot moves them by what it went through: per node one
`recorded`, `persisted`, `sent` and `answered`; at the controller one `received` per
report, one `journaled` per snapshot (the report that completes it journals the held
ones with it), and one `visible` per COMPLETE snapshot a trigger waited for."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.cluster_helpers import controller_stub
from support.polling import wait_for
from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol.hops import CONTROLLER_HOPS, NODE_HOPS
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.cluster

NODES = ("p1", "p2", "p3")
HOP = "snapmesh_snapshot_hop_seconds"


def hops(address: str) -> dict[tuple[str, str], tuple[float, float]]:
    """{(node or "", hop): (count, sum)} of the hop histogram at one endpoint."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    out: dict[tuple[str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (f"{HOP}_count", f"{HOP}_sum"):
                entry = out.setdefault((sample.labels.get("node", ""), sample.labels["hop"]), [0.0, 0.0])
                entry[sample.name.endswith("_sum")] = sample.value
    return {key: (count, total) for key, (count, total) in out.items()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hops")
    cluster = Cluster(write_cluster(tmp / "cluster.toml", nodes=len(NODES), data_dir=tmp / "data"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def read(cluster) -> tuple[dict, dict]:
    nodes = {}
    for node in NODES:
        nodes.update(hops(cluster.config.node(node).metrics_address))
    return nodes, hops(cluster.controller_metrics_address)


def counts(cluster) -> dict[str, float]:
    """Each hop's count: the nodes' summed, and the controller's."""
    nodes, controller = read(cluster)
    out = {hop: sum(nodes[(n, hop)][0] for n in NODES) for hop in NODE_HOPS}
    out.update({hop: controller[("", hop)][0] for hop in CONTROLLER_HOPS})
    return out


def test_each_hop_moves_once_per_snapshot_per_node_and_visible_only_for_a_waiting_trigger(cluster) -> None:
    nodes, controller = read(cluster)
    assert set(nodes) == {(n, hop) for n in NODES for hop in NODE_HOPS}  # every series from the start, at 0
    assert set(controller) == {("", hop) for hop in CONTROLLER_HOPS}
    assert all(count == 0 for count, _ in [*nodes.values(), *controller.values()])

    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
        assert snapshot.status == pb.Snapshot.COMPLETE
        once = {**{hop: 3.0 for hop in NODE_HOPS}, "received": 3.0, "journaled": 1.0, "visible": 1.0}
        # A node hears the controller's answer (`answered`) after the trigger may have returned: polled.
        wait_for(lambda: counts(cluster), timeout=15, what="one snapshot's hops", until=lambda c: c == once)

        nodes, controller = read(cluster)
        for stats in snapshot.stats.nodes:  # the same two stamps as the controller's recording_duration
            assert nodes[(stats.node_id, "recorded")][1] == pytest.approx(stats.recording_duration_ms / 1e3, abs=1e-6)
        answered = sum(nodes[(n, "answered")][1] for n in NODES)
        # A node's round trip holds the way there and the controller's journal (one record round per
        # snapshot, for the report that completes it: the others are held until then).
        assert 0 < controller[("", "journaled")][1] < answered
        assert controller[("", "received")][1] < answered
        assert controller[("", "visible")][1] > 0

        # A trigger that does not wait: the path up to journaled, and no `visible`.
        started = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=30)
        wait_for(lambda: stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=started.snapshot_id), timeout=10).status,
                 timeout=30, what="the second snapshot COMPLETE", until=lambda s: s == pb.Snapshot.COMPLETE)
        twice = {**{hop: 6.0 for hop in NODE_HOPS}, "received": 6.0, "journaled": 2.0, "visible": 1.0}
        wait_for(lambda: counts(cluster), timeout=15, what="two snapshots' hops", until=lambda c: c == twice)
