"""A report as blocks of a state too large to join is listed without its bytes ever
held together (snapmesh/protocol/controller/blockforms.py BF6), and a restart lists it
again the same way (journalblocks.py JB5): an in-process engine on a real journal and
block store, the joining bound lowered to a few blocks, two nodes each reporting a
state of 40 blocks as blocks (one by stream, its carried blocks written as they come;
one in one message). Joining a state over the bound raises here, so the snapshot reaching
COMPLETE, and the restart taking it back COMPLETE, show that nothing joined one; the
entries' sizes and digests are the states', and the answer is whole byte for byte."""

from __future__ import annotations

import asyncio
import random

import pytest

from snapmesh.protocol import blocks, chunking
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.controller import blockforms, journalblocks
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller.tracker import Now, Tracker
from snapmesh.services.controller import servicer
from snapmesh.v1 import snapmesh_pb2 as pb
from support.controller_fakes import CallContext, blob_controller

pytestmark = [pytest.mark.timeout(60)]

SIZE = 40 * blocks.BLOCK_BYTES + 100  # over LISTED_BYTES, its last block shorter
BOUND = 16 * blocks.BLOCK_BYTES  # JOINED_MAX_BYTES, lowered
STATES = {node: random.Random(node).randbytes(SIZE) for node in ("a", "b")}


def report(sid: str, node: str) -> pb.FullState:
    whole = pb.FullState(snapshot_id=sid, node_id=node, state=STATES[node], app_name="blob", app_version=1,
                         channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)])
    sent, _ = blocks.referenced_report(whole, set(), carry_all=True)  # a node's first large report
    assert sent is not None
    return sent


async def chunks(state: pb.FullState):
    for chunk in chunking.split_state(state, 64 * 1024):
        yield chunk


def no_large_join(monkeypatch) -> None:
    """`blocks.joined` (whole_report's and whole_state's too) raises for a state over BOUND."""
    joined = blocks.joined

    def guarded(sent, read, known=None):
        if len(sent.state_blocks.hashes) * blocks.BLOCK_BYTES > BOUND:
            raise AssertionError(f"the state of {sent.node_id} ({len(sent.state_blocks.hashes)} blocks) was joined")
        return joined(sent, read, known)

    monkeypatch.setattr(blocks, "joined", guarded)
    monkeypatch.setattr(servicer, "JOINED_MAX_BYTES", BOUND, raising=False)


def test_a_large_block_report_completes_and_replays_never_joined(tmp_path, monkeypatch) -> None:
    no_large_join(monkeypatch)
    asyncio.run(_never_joined(tmp_path))


async def _never_joined(tmp_path) -> None:
    c = blob_controller(tmp_path)  # never filed: the journal keeps its frames
    engine, service, store, writer, journal, tracker = c.engine, c.service, c.store, c.writer, c.journal, c.tracker
    sid = (await engine.trigger("a")).snapshot_id

    first = asyncio.create_task(service.ReportStateChunks(chunks(report(sid, "a")), CallContext()))
    second = asyncio.create_task(service.ReportState(report(sid, "b"), CallContext()))
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    finished = tracker._finished[sid]
    assert finished.status == pb.Snapshot.COMPLETE, finished.reason
    for node in finished.nodes:
        assert blockforms.is_listed(node) and node.state_bytes == SIZE
        assert node.state_digest == digest(STATES[node.node_id])
    answer = engine.machine.get(sid)  # BF1: whole, byte for byte, read by block for the answer
    assert {node.node_id: node.state for node in answer.nodes} == STATES
    await engine.close()
    await journal.close()
    writer.close()

    # A restart: the journal read back, each report listed again (JB5), then replayed (T9)
    records, _, problem = R.decode_all((tmp_path / "controller" / "journal").read_bytes())
    assert problem is None
    again = Tracker(topology=tracker.topology, deadline_s=30.0, checker=tracker.side)
    again.forms.reader = lambda: store.blocks.read
    rebuilt, pins, warnings = journalblocks.rebuilt(records, store.blocks.read, note=again.forms.note)
    assert warnings == []
    reported = [r.state for r in rebuilt if isinstance(r, R.Reported)]
    assert len(reported) == 2 and all(not r.HasField("state") and r.HasField("state_blocks") for r in reported)
    assert pins[sid] == {name for state in STATES.values() for name in blocks.names(state)[0].names}
    finished_ids, replay_warnings = R.replay(rebuilt, again, Now(mono=0.0, wall=0.0), skip=set())
    assert replay_warnings == [] and sid in finished_ids
    taken_back = again._finished[sid]
    assert taken_back.status == pb.Snapshot.COMPLETE
    assert all(blockforms.is_listed(node) and node.state_bytes == SIZE for node in taken_back.nodes)
    assert {node.node_id: node.state for node in again.get(sid).nodes} == STATES
