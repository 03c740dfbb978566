"""A report whose carried blocks add up to more than every chunk bound goes through
(snapmesh/protocol/carriedblocks.py CB1): an in-process engine on a real journal and
block store, the bounds lowered to a few MiB, two nodes each reporting a state of
6 MiB as a node forms it at first (every block carried, sentblocks.py). The blocks
are written as the stream brings them, so what the streams hold stays within a
window, the snapshot is COMPLETE and whole again byte for byte, and the journal
holds no state. A stream cut mid-way lets every pin it took go, and its blocks."""

from __future__ import annotations

import asyncio
import random

import pytest

from snapmesh.protocol import blocks, chunking
from snapmesh.protocol.controller.tracker import Tracker
from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb
from support.controller_fakes import CallContext, blob_controller

pytestmark = [pytest.mark.timeout(120)]

MIB = 1024 * 1024
SIZE = 6 * MIB + 100
STATES = {node: random.Random(node).randbytes(SIZE) for node in ("a", "b")}
PER_PEER, TOTAL, WINDOW = 3 * MIB, 4 * MIB, MIB // 2


class PeakBudget(chunking.ChunkBudget):
    """A ChunkBudget that remembers the most its streams held at once."""

    peak = 0

    def take(self, peer: str, size: int) -> None:
        super().take(peer, size)
        self.peak = max(self.peak, self.held)




def formed(sid: str, node: str) -> pb.FullState:
    """The report a node sends at first for a state over its carry_over (reporter.py: WRITE_WINDOW_BYTES)."""
    report = pb.FullState(snapshot_id=sid, node_id=node, state=STATES[node], app_name="blob", app_version=1,
                          channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)])
    sent, _ = SentBlocks(chunking.WRITE_WINDOW_BYTES).form(report)
    assert sent.HasField("state_blocks") and len(sent.blocks) == len(sent.state_blocks.hashes)
    return sent


async def chunks(sent: pb.FullState, stalled: asyncio.Event | None = None, after: int = 0):
    """The report's chunks; with `stalled`, `after` of them, then nothing (the node went away)."""
    for i, chunk in enumerate(chunking.split_state(sent)):
        if stalled is not None and i == after:
            stalled.set()
            await asyncio.Event().wait()
        yield chunk


def engine_on(tmp_path) -> tuple[ControllerEngine, ControllerService, SnapshotStore, Tracker]:
    c = blob_controller(tmp_path, deadline_s=60.0)
    c.service._chunk_budget = PeakBudget(per_peer=PER_PEER, total=TOTAL)
    return c.engine, c.service, c.store, c.tracker


@pytest.fixture
def lowered(monkeypatch) -> None:
    monkeypatch.setattr(chunking, "MAX_STATE_BYTES", 2 * MIB)
    monkeypatch.setattr(chunking, "WRITE_WINDOW_BYTES", WINDOW)


def test_a_report_carrying_more_than_every_bound_completes_with_a_window_held(tmp_path, lowered) -> None:
    asyncio.run(_completes(tmp_path))


async def _completes(tmp_path) -> None:
    engine, service, store, tracker = engine_on(tmp_path)
    sid = (await engine.trigger("a")).snapshot_id
    reports = {node: formed(sid, node) for node in STATES}
    assert all(r.ByteSize() > TOTAL + chunking.MAX_STATE_BYTES for r in reports.values())
    calls = [service.ReportStateChunks(chunks(reports[node]), CallContext()) for node in STATES]  # both at once
    await asyncio.wait_for(asyncio.gather(*calls), 60)
    finished = tracker._finished[sid]
    assert finished.status == pb.Snapshot.COMPLETE, finished.reason
    assert {node.node_id: node.state for node in engine.machine.get(sid).nodes} == STATES
    budget = service._chunk_budget
    # each stream: its window of blocks, the chunk being read, what the window's last chunk brought
    assert budget.peak <= 2 * (WINDOW + 2 * chunking.CHUNK_BYTES), budget.peak
    assert budget.held == 0
    assert sum(len(frame) for frame in engine.journal._live._frames[sid]) < SIZE, "the journal holds a state"
    named = {name for state in STATES.values() for name in blocks.names(state)[0].names}
    assert named <= store.blocks.names() and all(store.pins.pinned(name) for name in named)
    await engine.close()
    await engine.journal.close()
    engine.writer.close()


def test_a_stream_cut_mid_way_leaves_no_pin_and_no_block(tmp_path, lowered) -> None:
    asyncio.run(_cut(tmp_path))


async def _cut(tmp_path) -> None:
    engine, service, store, _ = engine_on(tmp_path)
    sid = (await engine.trigger("a")).snapshot_id
    stalled = asyncio.Event()
    call = asyncio.create_task(service.ReportStateChunks(chunks(formed(sid, "a"), stalled, 4), CallContext()))
    await asyncio.wait_for(stalled.wait(), 30)
    assert len(store.pins) > 0 and store.blocks.names(), "no block was written before the stream ended"
    call.cancel()  # as gRPC cancels a call whose peer is gone
    with pytest.raises(asyncio.CancelledError):
        await call
    assert service._chunk_budget.held == 0
    await engine.close()
    await engine.journal.close()
    engine.writer.close()  # what it was handed first is done (the unpin)
    assert len(store.pins) == 0 and store.blocks.names() == set(), "the cut stream's blocks stay"
