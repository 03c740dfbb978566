"""What GetCluster answers (snapmesh/protocol/controller/cluster.py, C1-C4)."""

from __future__ import annotations

from dataclasses import dataclass

from snapmesh.app import App
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller import cluster
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.tracker import Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports


@dataclass(frozen=True)
class Node:
    id: str
    address: str
    metrics_address: str


def test_the_cluster_is_the_files_nodes_and_the_machines_topology_settings_epoch_and_restore() -> None:
    tracker = bank_reports.tracker(Topology.build(["b", "a"], None), expected_total=100, deadline_s=7.5)
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


def test_the_cluster_names_its_app_and_the_loaded_apps_name_and_version() -> None:
    nodes = [Node("a", "h:0", "h:1")]
    bank = M.Controller(bank_reports.tracker(Topology.build(["a"], None), expected_total=0, deadline_s=1.0))
    answer = cluster.answer(nodes, bank, snapshot_mode="classic", interval_s=0.0, app="snapmesh.services.app.bank:app")
    assert (answer.app, answer.app_name, answer.app_version) == ("snapmesh.services.app.bank:app", "bank", 1)

    app = App(name="shelf", new=lambda info: None, version=3)
    checked = AppChecker("shelf_app:app", app)
    m = M.Controller(Tracker(topology=Topology.build(["a"], None), deadline_s=1.0, checker=checked))
    answer = cluster.answer(nodes, m, snapshot_mode="classic", interval_s=0.0, app="shelf_app:app")
    assert (answer.app, answer.app_name, answer.app_version) == ("shelf_app:app", "shelf", 3)

    # An app the controller could not load: its spec, no name or version to tell.
    unloaded = AppChecker("shelf_app:app", None, why="no module named shelf_app")
    m = M.Controller(Tracker(topology=Topology.build(["a"], None), deadline_s=1.0, checker=unloaded))
    answer = cluster.answer(nodes, m, snapshot_mode="classic", interval_s=0.0, app="shelf_app:app")
    assert (answer.app, answer.app_name, answer.app_version) == ("shelf_app:app", "", 0)
