"""A restore after a restart sends each node only the blocks it lacks, on real processes
(the blob app of tests/support/blob_cluster.py: 16 MiB per node, 2 nodes).

- p1 restarted (stopped, or killed) keeps the blocks it held on disk (services/node/blockshelf.py): restoring
  the first snapshot after it sends p1 its manifest and the one block that changed
  since, not its state whole (its `snapmesh_restore_received_bytes_total`, which counts
  from its start).
- The controller restarted rebuilds what each node holds from its stored manifests
  (services/controller/heldseed.py): the first restore after it sends each node its
  manifest and what changed, and the states restored are the snapshot's byte for byte.
"""

from __future__ import annotations

import grpc
import pytest

from snapmesh.protocol import blocks
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.blob_cluster import MANIFEST, blob_cluster, digests, received, restore, snapshot

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ONE_BLOCK = MANIFEST + blocks.BLOCK_BYTES + 4096  # a manifest, one block and the request's other fields


@pytest.fixture
def cluster(tmp_path):
    yield from blob_cluster(tmp_path)


def poke(cluster, node_id: str) -> None:
    with grpc.insecure_channel(cluster.node_address(node_id)) as channel:
        reply = pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b"poke 5000000 7"), timeout=30)
    assert reply.reply == b"ok"


@pytest.mark.parametrize("kill", [False, True], ids=["stopped", "killed"])
def test_a_node_restarted_keeps_its_blocks_and_a_restore_sends_only_what_changed(cluster, kill):
    first = snapshot(cluster)
    poke(cluster, "p1")
    second = snapshot(cluster)  # p1's last report: one block changed since the first
    cluster.restart_node("p1", kill=kill)  # its memory is gone; its data dir (and its blocks there) are kept
    restore(cluster, first.snapshot_id, "restore-after-node-restart")
    p1 = received(cluster, "p1")
    print(f"restore of a 16 MiB state after a node restart: p1 received {p1:.0f} bytes")
    assert MANIFEST < p1 < ONE_BLOCK  # not whole (> SIZE)
    assert digests(snapshot(cluster)) == digests(first) != digests(second)


def test_a_controller_restarted_sends_a_restore_only_what_the_nodes_lack(cluster):
    first = snapshot(cluster)
    poke(cluster, "p1")
    second = snapshot(cluster)
    cluster.restart_controller()  # what it knew of the nodes' blocks was in its memory only
    before = {node: received(cluster, node) for node in ("p1", "p2")}
    restore(cluster, first.snapshot_id, "restore-after-controller-restart")
    got = {node: received(cluster, node) - before[node] for node in ("p1", "p2")}
    print(f"restore of a 16 MiB state after a controller restart: received {got}")
    assert MANIFEST < got["p1"] < ONE_BLOCK and got["p2"] < MANIFEST + 4096
    assert digests(snapshot(cluster)) == digests(first) != digests(second)
