"""A cluster of two nodes whose state is a blob of 16 MiB each, for the cluster tests of a
restore as blocks (snapmesh/protocol/restoreblocks.py), and what they look at."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc

from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol import blocks
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support import metrics_table
from support.polling import wait_for

SIZE = 16 * 1024 * 1024
PER_NODE = SIZE // blocks.BLOCK_BYTES
MANIFEST = PER_NODE * 34  # 32 bytes a hash and its tag: the manifest's bytes on the wire

BLOB_APP = '''\
"""A node whose state is a blob of 16 MiB: "poke OFFSET N" changes 1 KiB."""
import random

from snapmesh.app import App

SIZE = 16 * 1024 * 1024


class Blob:
    def __init__(self, info):
        self.blob = random.Random(info.node_id).randbytes(SIZE)

    def on_command(self, command, ctx):
        word, at, seed = command.decode().split()
        at = int(at)
        self.blob = self.blob[:at] + random.Random(seed).randbytes(1024) + self.blob[at + 1024:]
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return self.blob

    def restore(self, state):
        self.blob = state


app = App(name="blob", new=Blob)
'''


def blob_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Two nodes of the blob app, started; stopped at the end (a fixture's body)."""
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "blob_app.py").write_text(BLOB_APP)
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path / "data")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "apps"), os.environ.get("PYTHONPATH")]))}
    running = Cluster(path, env=env, app="blob_app:app").start()
    try:
        yield running
    finally:
        running.stop()


def controller(cluster: Cluster) -> pb_grpc.ControllerStub:
    return pb_grpc.ControllerStub(grpc.insecure_channel(cluster.controller_address))


def snapshot(cluster: Cluster) -> pb.Snapshot:
    answer = controller(cluster).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=120)
    assert answer.status == pb.Snapshot.COMPLETE, answer
    return answer


def digests(found: pb.Snapshot) -> dict[str, str]:
    return {node.node_id: node.state_digest for node in found.nodes}


def restore(cluster: Cluster, snapshot_id: str, key: str) -> None:
    done = wait_for(lambda: controller(cluster).RestoreSnapshot(
        pb.RestoreSnapshotRequest(snapshot_id=snapshot_id, request_id=key), timeout=120),
        timeout=120, retry_on=grpc.RpcError, what=f"the restore of {snapshot_id}")
    assert done.status == pb.Restore.RESTORED, done


def received(cluster: Cluster, node_id: str) -> float:
    """The bytes of the restores `node_id` took since it started (its counter)."""
    node = next(n for n in cluster.config.nodes if n.id == node_id)
    return metrics_table.value(metrics_table.scrape(node.metrics_address), "snapmesh_restore_received_bytes_total",
                               node=node_id)
