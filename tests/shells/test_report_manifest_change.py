"""A node's manifest sent as its change from the last report the controller answered
takes_changes (snapmesh/protocol/manifestdelta.py MD1, MD3; services/node/sentblocks.py),
rebuilt by the controller's report path before anything reads it (manifestbases.py MB2)."""

from __future__ import annotations

import random

import pytest

from snapmesh.protocol import blocks, manifestdelta
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb
from support.report_service import report_service

B = blocks.BLOCK_BYTES


def _report(sid: str, state: bytes) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id="p1", epoch=1, app_name="blob", app_version=1, state=state)


def test_the_node_sends_a_change_only_from_a_report_answered_takes_changes_and_drops_a_refused_base():
    node = SentBlocks()
    state = bytearray(random.Random(3).randbytes(8 * B))
    _, names = node.form(_report("s1", bytes(state)))
    node.accepted(pb.ReportStateResponse(takes_blocks=True), names, "s1")  # a controller before changes
    state[2 * B] ^= 1
    sent, names = node.form(_report("s2", bytes(state)))
    assert sent.HasField("state_blocks") and not sent.HasField("state_change")
    node.accepted(pb.ReportStateResponse(takes_blocks=True, takes_changes=True), names, "s2")
    state[5 * B] ^= 1
    sent, _ = node.form(_report("s3", bytes(state)))
    assert not sent.HasField("state_blocks") and len(sent.blocks) == 1
    delta = sent.state_change
    assert (delta.base_snapshot_id, delta.base_count, delta.block_count, list(delta.positions)) == ("s2", 8, 8, [5])
    assert not node.refused("snapshot s3 is unknown")
    assert node.refused(f"{manifestdelta.MISSING_BASE}: the manifest of node p1's report ...")
    sent, _ = node.form(_report("s3", bytes(state)))  # the full manifest, the blocks held still
    assert list(sent.state_blocks.hashes) == [blocks.block_hash(b) for b in blocks.split(bytes(state))]
    assert len(sent.blocks) == 1 and not sent.HasField("state_change")


def test_the_controller_rebuilds_a_change_from_the_base_it_kept_and_refuses_one_it_does_not_hold(tmp_path):
    c = report_service(tmp_path)
    service = c.service
    state = bytearray(random.Random(4).randbytes(16 * B))
    node = c.first_report(bytes(state))
    service._bases.kept("p1", "s1", blocks.names(bytes(state))[0].names)  # what ReportState keeps (MB1)
    node.accepted(pb.ReportStateResponse(takes_blocks=True, takes_changes=True), node.form(_report("s1", bytes(state)))[1],
                  "s1")
    state[9 * B] ^= 1
    sent, _ = node.form(_report("s2", bytes(state)))
    assert sent.HasField("state_change") and list(sent.state_change.positions) == [9]
    taken, names, manifest, rebuilt = service._named_report(sent, 2)
    expected = [blocks.block_hash(b) for b in blocks.split(bytes(state))]
    assert manifest == expected and names == frozenset(expected)
    assert list(rebuilt.state_blocks.hashes) == expected and not rebuilt.HasField("state_change")
    assert c.forms.state(_filled(c, taken), "s2") == bytes(state)

    elsewhere = report_service(tmp_path / "other")  # another controller (or this one restarted): no base
    with pytest.raises(manifestdelta.MissingBase, match=manifestdelta.MISSING_BASE):
        elsewhere.service._named_report(sent, 1)
    assert not list((tmp_path / "other").rglob("blocks/*"))
    for writer in (c.writer, elsewhere.writer):
        writer.close()


def _filled(c, taken: pb.FullState) -> pb.NodeBalance:
    entry = pb.NodeBalance(node_id="p1")
    if taken.HasField("state"):
        entry.state = taken.state
    else:
        c.forms.fill(entry, c.forms.of(taken))
    return entry
