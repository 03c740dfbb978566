"""A node's memory of what its controller holds of its state (services/node/sentblocks.py):
whole reports until the controller says it takes blocks, then only the blocks it lacks,
whole again after a refusal naming a missing block."""

from __future__ import annotations

import random

from snapmesh.protocol import blocks
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


def report(state: bytes) -> pb.FullState:
    return pb.FullState(snapshot_id="s2", node_id="p1", epoch=1, app_name="blob", app_version=1, state=state)


def test_the_node_sends_blocks_once_the_controller_takes_them_and_whole_after_a_refusal():
    memory = SentBlocks()
    state = random.Random(5).randbytes(4 * B)
    sent, names = memory.form(report(state))
    assert sent.HasField("state")  # nothing said yet: whole
    memory.accepted(pb.ReportStateResponse(), names)  # a controller from before blocks
    assert memory.form(report(state))[0].HasField("state")
    memory.accepted(pb.ReportStateResponse(takes_blocks=True), names)
    sent, _ = memory.form(report(state))
    assert sent.HasField("state_blocks") and len(sent.blocks) == 0
    assert not memory.refused("snapshot s2 is unknown")
    assert memory.refused(f"{blocks.MISSING}: 1 of the state of p1 ...")
    assert memory.form(report(state))[0].HasField("state")


def test_a_state_that_changed_a_little_has_only_its_changed_blocks_hashed():
    memory = SentBlocks()
    state = random.Random(7).randbytes(64 * B)
    _, names = memory.form(report(state))
    assert memory.hashed == 64
    memory.accepted(pb.ReportStateResponse(takes_blocks=True), names)
    changed = state[:10 * B] + b"!" * 100 + state[10 * B + 100:40 * B] + b"?" + state[40 * B + 1:]
    sent, names = memory.form(report(changed))
    assert memory.hashed == 66 and len(sent.blocks) == 2
    assert list(sent.state_blocks.hashes) == [blocks.block_hash(b) for b in blocks.split(changed)]


def test_a_state_formed_either_way_reaches_the_disk_copy_once():
    """Whether `form` cuts the state itself or is handed the names a pending report's save
    found, the held blocks' disk copy (heldblocks.py) is told of it: a node restarted after
    either keeps its blocks."""
    memory = SentBlocks()
    told: list[blocks.Named] = []
    memory.on_formed = told.append
    first, second = random.Random(9).randbytes(4 * B), random.Random(10).randbytes(4 * B)
    memory.form(report(first))
    named, _ = blocks.names(second)
    memory.form(report(second), named)
    assert [t.names for t in told] == [blocks.names(first)[0].names, named.names]
