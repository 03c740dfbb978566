"""What GetCluster answers (snapmesh/protocol/controller/cluster.py, C1-C3)."""

from __future__ import annotations

from dataclasses import dataclass

from snapmesh.protocol.controller import cluster
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.tracker import Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb


@dataclass(frozen=True)
class Node:
    id: str
    address: str
    metrics_address: str


def test_the_cluster_is_the_files_nodes_and_the_machines_topology_settings_epoch_and_restore() -> None:
    tracker = Tracker(topology=Topology.build(["b", "a"], None), expected_total=100, deadline_s=7.5)
    m = M.Controller(tracker, max_concurrent=3, keep=2)
    nodes = [Node("b", "h:2", "h:3"), Node("a", "h:0", "h:1")]
    answer = cluster.answer(nodes, m, snapshot_mode="overtake", interval_s=4.0, answer_state_bytes=1 << 20)
    assert [(n.node_id, n.address, n.metrics_address) for n in answer.nodes] == [("b", "h:2", "h:3"), ("a", "h:0", "h:1")]
    assert {(c.src, c.dst) for c in answer.channels} == set(m.topology.channels)
    assert answer.settings == pb.SnapshotSettings(
        snapshot_mode="overtake", deadline_s=7.5, interval_s=4.0, keep=2, max_concurrent_snapshots=3,
        answer_state_bytes=1 << 20,
    )
    assert answer.epoch == m.epoch and not answer.HasField("last_restore")

    restored = pb.Restore(snapshot_id="s1", epoch=2, status=pb.Restore.RESTORED, request_id="k")
    m.taken_back([(restored, [])])  # as after a restart
    answer = cluster.answer(nodes, m, snapshot_mode="classic", interval_s=0.0)
    assert answer.epoch == 2 and answer.last_restore == restored
