"""An app's restore_blocks (snapmesh.app A9) on real processes: two nodes of the bench's blob
app (bench/blob_app.py, 2 MiB each), which takes a restore's rebuilt blocks unjoined.

A snapshot, a write to p1, a second snapshot; restoring the first rebuilds p1's state
from the blocks it holds as blocks, never joined: the states restored are byte for byte
the first snapshot's, and so they are after p1 restarts and recovers from its log's
restore record (whose base64 was made a run at a time over the blocks).
"""

from __future__ import annotations

import grpc
import pytest

from bench import blob_app
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.blob_cluster import digests, received, restore, snapshot

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture
def cluster(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path / "data")
    path.write_text(path.read_text() + '\n[app]\nmodule = "bench.blob_app:app"\nmib = 2\n')
    running = Cluster(path, app="bench.blob_app:app").start()
    try:
        yield running
    finally:
        running.stop()


def test_a_restore_as_blocks_into_an_app_with_restore_blocks_restores_and_recovers(cluster) -> None:
    first = snapshot(cluster)
    with grpc.insecure_channel(cluster.node_address("p1")) as channel:
        pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=blob_app.write(70_000, b"changed")), timeout=30)
    second = snapshot(cluster)
    assert digests(second)["p1"] != digests(first)["p1"]

    restore(cluster, first.snapshot_id, "restore-blocks-app-1")
    assert received(cluster, "p1") < 2 * blob_app.MIB // 4  # as blocks: its manifest and the block changed
    assert digests(snapshot(cluster)) == digests(first)
    cluster.stop_node("p1")
    cluster.start_node("p1")  # recovered from the restore record and the checkpoints since
    assert digests(snapshot(cluster)) == digests(first)
