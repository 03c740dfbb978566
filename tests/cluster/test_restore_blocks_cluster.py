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

import shutil
from pathlib import Path

import grpc
import pytest

from snapmesh.protocol import blocks
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.blob_cluster import MANIFEST, PER_NODE, SIZE, blob_cluster, digests, received, restore, snapshot

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]



@pytest.fixture
def cluster(tmp_path):
    yield from blob_cluster(tmp_path)


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
