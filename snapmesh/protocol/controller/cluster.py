"""What GetCluster answers, decided: the cluster as the controller runs it.

C1. The nodes in the file's order, each with the address peers dial and the one
    its metrics are served at; the channels of the machine's topology.
C2. The snapshot settings the controller runs: the file's snapshot_mode (a hybrid
    cluster's tracker reads overtake reports), the machine's deadline, retention
    (`keep`) and admission limit (`max_concurrent`), the periodic interval
    (0: none), and past how many bytes of states an answer leaves them out
    (`answer_state_bytes`, answers.py A2).
C3. The cluster's epoch and its newest restore (the snapshot page's "last
    restore"), as the machine holds them.
C4. The app the nodes run: the file's (or --app's) module:attr, "" for the bank;
    and the name and version of the app the tracker judges snapshots with (an
    app the controller could not load, and the bank: "" and 0), so a client
    names the app without importing it.

Pure: the servicer hands in the file's nodes, mode and app spec, and the machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller.answers import DEFAULT_STATE_BYTES
from snapmesh.protocol.controller.machine import Controller
from snapmesh.v1 import snapmesh_pb2 as pb


class Node(Protocol):
    """A node as the cluster file names it (settings.config.NodeConfig)."""

    @property
    def id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def metrics_address(self) -> str: ...


def answer(
    nodes: Iterable[Node], machine: Controller, *, snapshot_mode: str, interval_s: float,
    answer_state_bytes: int = DEFAULT_STATE_BYTES, app: str = "",
) -> pb.Cluster:
    side = machine.tracker.side
    loaded = side.app if isinstance(side, AppChecker) else None  # C4
    return pb.Cluster(
        nodes=[pb.NodeInfo(node_id=n.id, address=n.address, metrics_address=n.metrics_address) for n in nodes],  # C1
        channels=[pb.ChannelId(src=s, dst=d) for s, d in machine.topology.channels],
        last_restore=machine.last_restore,  # C3
        settings=pb.SnapshotSettings(  # C2
            snapshot_mode=snapshot_mode,
            deadline_s=machine.deadline_s,
            interval_s=interval_s,
            keep=machine.keep,
            max_concurrent_snapshots=machine.max_concurrent,
            answer_state_bytes=answer_state_bytes,
        ),
        epoch=machine.epoch,
        app=app,  # C4
        app_name=loaded.name if loaded is not None else "",
        app_version=loaded.version if loaded is not None else 0,
    )
