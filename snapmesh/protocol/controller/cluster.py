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

Pure: the servicer hands in the file's nodes and mode and the machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

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
    answer_state_bytes: int = DEFAULT_STATE_BYTES,
) -> pb.Cluster:
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
    )
