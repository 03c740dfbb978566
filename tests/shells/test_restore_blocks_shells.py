"""A restore as blocks through the shells: the node rebuilds it from the blocks of its last
report and a restore's (services/node/heldblocks.py) and refuses, before anything changes,
what it cannot; the controller (services/controller/nodeblocks.py) sends blocks only to a
node whose last report said it holds them, and the state whole after a refusal."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from snapmesh.protocol import blocks
from snapmesh.protocol.controller.effects import RestoreAt
from snapmesh.services.controller.nodeblocks import NodeBlocks
from snapmesh.services.node.heldblocks import HeldBlocks
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb
from support.restore_blocks import FakeNode, report, restore

pytestmark = pytest.mark.timeout(60)

B = blocks.BLOCK_BYTES


def test_the_node_rebuilds_a_restore_from_its_last_report_and_then_from_that_restore():
    sent = SentBlocks()
    state = random.Random(1).randbytes(8 * B)
    sent.form(report(state))
    held = HeldBlocks(sent)
    older = state[: 2 * B] + b"o" * B + state[3 * B :]
    nodes = NodeBlocks()
    nodes.reported(report(state), blocks.names(state)[0].names)
    node = FakeNode(held)
    answer = asyncio.run(nodes.restore(node, RestoreAt("p1", restore(older))))
    assert answer.epoch == 3 and node.states == [older]
    assert list(node.got[0].blocks) == [b"o" * B]
    assert nodes.held("p1")[0] == frozenset(blocks.names(state)[0].names) | frozenset(node.got[0].state_blocks.hashes)
    # the node's next report changed every block; the restored state's are still held
    sent.form(report(random.Random(2).randbytes(8 * B)))
    again = pb.RestoreStateRequest(snapshot_id="s1", epoch=4, state_digest=node.got[0].state_digest)
    again.state_blocks.CopyFrom(node.got[0].state_blocks)
    assert asyncio.run(held.state_of(again))[0] == older


def test_a_node_that_restarted_refuses_the_blocks_and_the_controller_sends_the_state_whole():
    state = random.Random(3).randbytes(8 * B)
    nodes = NodeBlocks()
    nodes.reported(report(state), blocks.names(state)[0].names)
    node = FakeNode(HeldBlocks(SentBlocks()))  # restarted: holds nothing
    older = state[:B] + b"o" * B + state[2 * B :]
    answer = asyncio.run(nodes.restore(node, RestoreAt("p1", restore(older))))
    assert answer.epoch == 3 and node.states == [older]
    assert [r.HasField("state_blocks") for r in node.got] == [True, False]
    assert nodes.sent_bytes == node.got[1].ByteSize()  # the whole one was taken
    assert nodes.held("p1") == (frozenset(), ())  # forgotten: the next restore goes whole at once
    asyncio.run(nodes.restore(node, RestoreAt("p1", restore(older))))
    assert len(node.got) == 3 and node.got[2].HasField("state")


def test_a_node_whose_report_does_not_say_it_holds_blocks_gets_its_state_whole():
    state = random.Random(4).randbytes(4 * B)
    old = report(state)
    old.holds_blocks = False  # a node from before the field
    nodes = NodeBlocks()
    nodes.reported(old, blocks.names(state)[0].names)
    node = FakeNode(HeldBlocks(SentBlocks()))
    asyncio.run(nodes.restore(node, RestoreAt("p1", restore(state))))
    assert [r.HasField("state") for r in node.got] == [True]


def test_a_refusal_for_another_reason_is_the_answer_and_nothing_is_sent_again():
    state = random.Random(5).randbytes(4 * B)
    nodes = NodeBlocks()
    nodes.reported(report(state), blocks.names(state)[0].names)

    class Stale(FakeNode):
        async def RestoreState(self, request, timeout=None, wait_for_ready=None):
            self.got.append(request)
            raise grpc.aio.AioRpcError(grpc.StatusCode.FAILED_PRECONDITION, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), details="epoch 3 is older than this node's 4")

    node = Stale(HeldBlocks(SentBlocks()))
    answer = asyncio.run(nodes.restore(node, RestoreAt("p1", restore(state))))
    assert answer.code == "FAILED_PRECONDITION" and len(node.got) == 1 and nodes.sent_bytes == 0
