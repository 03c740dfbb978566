"""What each node holds, taken back after a controller restart (services/controller/heldseed.py
HT1-HT3): NodeBlocks notes each node's last report and restore as blocks; a new NodeBlocks takes
them back from the notes and the stored manifests, and a belief that is wrong costs a refusal
and the state sent whole, never a wrong state."""

from __future__ import annotations

import asyncio
import json
import random
import threading

import pytest

from snapmesh.protocol import blocks
from snapmesh.protocol.controller.effects import RestoreAt
from snapmesh.services.controller import heldseed, nodeblocks
from snapmesh.services.controller.nodeblocks import NodeBlocks
from snapmesh.services.node.heldblocks import HeldBlocks
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb
from support.restore_blocks import FakeNode, report, restore

pytestmark = pytest.mark.timeout(60)

B = blocks.BLOCK_BYTES


def manifests(by_snapshot: dict[str, bytes]) -> heldseed.Manifests:
    """p1's state in each snapshot, as its stored manifest names it."""
    return lambda sid, node: blocks.names(by_snapshot[sid])[0].names if sid in by_snapshot and node == "p1" else None


def test_a_restarted_controller_takes_back_what_a_node_holds_and_sends_only_what_it_lacks(tmp_path):
    state = random.Random(1).randbytes(8 * B)
    before = NodeBlocks()
    assert heldseed.take_back(before, tmp_path, ["p1", "p2"], manifests({})) == {}
    before.reported(report(state), blocks.names(state)[0].names)  # the report of s2
    before.flush()
    sent = SentBlocks()
    sent.form(report(state))
    node = FakeNode(HeldBlocks(sent))

    after = NodeBlocks()  # the controller restarted
    assert heldseed.take_back(after, tmp_path, ["p1", "p2"], manifests({"s2": state})) == {"p1": 8}
    older = state[:B] + b"o" * B + state[2 * B :]
    asyncio.run(after.restore(node, RestoreAt("p1", restore(older))))
    after.flush()
    assert node.states == [older] and len(node.got) == 1 and list(node.got[0].blocks) == [b"o" * B]

    again = NodeBlocks()  # and again: the restore's blocks are held too (its snapshot, s1, noted)
    heldseed.take_back(again, tmp_path, ["p1"], manifests({"s2": state, "s1": older}))
    assert again.held("p1")[0] == frozenset(blocks.names(state)[0].names) | frozenset(blocks.names(older)[0].names)


def test_a_wrong_belief_is_refused_and_the_state_sent_whole_and_then_forgotten(tmp_path):
    state = random.Random(2).randbytes(4 * B)
    first = NodeBlocks()
    heldseed.take_back(first, tmp_path, ["p1"], manifests({}))
    first.reported(report(state), blocks.names(state)[0].names)
    first.flush()
    after = NodeBlocks()
    heldseed.take_back(after, tmp_path, ["p1"], manifests({"s2": state}))
    node = FakeNode(HeldBlocks(SentBlocks()))  # it restarted without its blocks meanwhile
    asyncio.run(after.restore(node, RestoreAt("p1", restore(state))))
    after.flush()
    assert node.states == [state] and [r.HasField("state") for r in node.got] == [False, True]
    assert not after.note_path("p1").exists()  # the next restart believes nothing of it
    assert heldseed.take_back(NodeBlocks(), tmp_path, ["p1"], manifests({"s2": state})) == {}


def test_a_report_that_does_not_hold_blocks_and_an_unreadable_note_leave_nothing_believed(tmp_path):
    state = random.Random(3).randbytes(4 * B)
    nodes = NodeBlocks()
    heldseed.take_back(nodes, tmp_path, ["p1"], manifests({}))
    nodes.reported(report(state), blocks.names(state)[0].names)
    old = report(state)
    old.holds_blocks = False  # a node from before the field must never get a state as blocks
    nodes.reported(old, blocks.names(state)[0].names)
    nodes.flush()
    assert heldseed.take_back(NodeBlocks(), tmp_path, ["p1"], manifests({"s2": state})) == {}
    nodes.reported(report(state), blocks.names(state)[0].names)
    nodes.flush()
    nodes.note_path("p1").write_text("{not json")
    assert heldseed.take_back(NodeBlocks(), tmp_path, ["p1"], manifests({"s2": state})) == {}
    # a snapshot not filed adds nothing
    nodes.reported(report(state), blocks.names(state)[0].names)
    nodes.flush()
    assert heldseed.take_back(NodeBlocks(), tmp_path, ["p1"], manifests({})) == {}
    # a node no longer in the cluster: its note goes
    assert heldseed.take_back(NodeBlocks(), tmp_path, ["p2"], manifests({"s2": state})) == {}
    assert not nodes.note_path("p1").exists()


def test_stored_manifests_reads_a_compact_file_and_skips_one_it_cannot(tmp_path):
    stored = pb.Snapshot(snapshot_id="s1")
    entry = stored.nodes.add(node_id="p1")
    entry.state_blocks.hashes.extend([b"a" * 32, b"b" * 32])
    (tmp_path / "s1.pb").write_bytes(stored.SerializeToString())
    read = heldseed.stored_manifests(lambda sid: tmp_path / f"{sid}.pb")
    assert read("s1", "p1") == [b"a" * 32, b"b" * 32] and read("s1", "p2") is None
    assert read("s9", "p1") is None


def test_a_note_is_written_by_the_notes_worker_never_on_the_reporting_thread(tmp_path, monkeypatch):
    """A report's answer (and the trigger's COMPLETE behind it on the event loop) waits for no
    note file: `reported` hands the note to one worker, which writes the notes in order."""
    state = random.Random(4).randbytes(4 * B)
    written = []
    real = nodeblocks.write_unsynced
    monkeypatch.setattr(nodeblocks, "write_unsynced",
                        lambda path, data: written.append(threading.current_thread().name) or real(path, data))
    nodes = NodeBlocks()
    heldseed.take_back(nodes, tmp_path, ["p1"], manifests({}))
    nodes.reported(report(state), blocks.names(state)[0].names)
    later = report(state)
    later.snapshot_id = "s3"
    nodes.reported(later, blocks.names(state)[0].names)
    nodes.close()  # the notes asked for are written, in order
    assert written and all(name.startswith("node-notes") for name in written), written
    assert json.loads(nodes.note_path("p1").read_text())["report"] == "s3"
