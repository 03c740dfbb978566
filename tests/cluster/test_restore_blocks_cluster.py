"""A restore sends each node only the blocks of its state it lacks, on real processes: an
app whose state is a blob of 16 MiB per node (2 nodes).

- A snapshot, one block of p1's state changed, a second snapshot (p1's last report):
  restoring the first sends p1 its manifest and the one block that changed since, and
  p2 its manifest alone (the nodes' `snapmesh_restore_received_bytes_total`); the
  states restored are byte for byte the first snapshot's (a snapshot after it has its
  digests).
- p1 restarted with an empty data directory holds no block: it refuses the restore as
  blocks, gets its state whole, and the restore works all the same.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol import blocks
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support import metrics_table
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

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


@pytest.fixture
def cluster(tmp_path):
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


def test_a_restore_sends_each_node_only_the_blocks_it_lacks(cluster):
    first = snapshot(cluster)
    with grpc.insecure_channel(cluster.node_address("p1")) as channel:
        reply = pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b"poke 5000000 7"), timeout=30)
    assert reply.reply == b"ok"
    second = snapshot(cluster)  # p1's last report: one block changed since the first
    assert digests(second)["p1"] != digests(first)["p1"] and digests(second)["p2"] == digests(first)["p2"]

    restore(cluster, first.snapshot_id, "restore-blocks-1")
    p1, p2 = received(cluster, "p1"), received(cluster, "p2")
    print(f"restore of a 16 MiB state: p1 received {p1:.0f} bytes, p2 {p2:.0f}")
    assert MANIFEST < p1 < MANIFEST + blocks.BLOCK_BYTES + 4096  # the manifest and one block
    assert PER_NODE * 32 < p2 < MANIFEST + 4096  # the manifest alone
    assert digests(snapshot(cluster)) == digests(first)  # byte for byte

    cluster.stop_node("p1")  # a node that lost its blocks: an empty data directory
    data = Path(cluster.data_dir)
    for entry in data.iterdir():
        if entry.name.startswith("p1"):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    cluster.start_node("p1")
    restore(cluster, second.snapshot_id, "restore-blocks-2")
    assert received(cluster, "p1") > SIZE  # refused as blocks, then whole
    assert received(cluster, "p2") < p2 + MANIFEST + blocks.BLOCK_BYTES + 4096  # p2 still held them: one block
    assert digests(snapshot(cluster)) == digests(second)
