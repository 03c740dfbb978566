"""A large state a node reports whole is kept as its manifest once its blocks are durable
(snapmesh/protocol/controller/blockforms.py BF5, journalblocks.py JB4): an in-process
engine on a real journal and block store, two nodes each reporting a state of 40
blocks whole (ReportStateChunks, as a large report goes). While the first report is
held (held.py H1) neither the tracker, the held record nor any frame of the waiting
call holds its bytes; the COMPLETE snapshot holds manifests, the journal's frames
no state, and the answer is the whole snapshot (BF1). Read back after a restart,
the journal gives the reports whole again and pins their blocks (JB3). A small state
stays inline (BF2)."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from snapmesh.protocol import blocks, chunking
from snapmesh.protocol.controller import blockforms, journalblocks
from snapmesh.protocol.controller import journal as R
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.v1 import snapmesh_pb2 as pb
from support.controller_fakes import CallContext, blob_controller

pytestmark = [pytest.mark.timeout(60)]

SIZE = 40 * blocks.BLOCK_BYTES + 100  # over LISTED_BYTES, its last block shorter
STATES = {node: random.Random(node).randbytes(SIZE) for node in ("a", "b")}


def report(sid: str, node: str, state: bytes | None = None) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id=node, state=STATES[node] if state is None else state,
                        app_name="blob", app_version=1,
                        channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)])




async def chunks(state: pb.FullState):
    for chunk in chunking.split_state(state, 64 * 1024):
        yield chunk


def whole_states(message) -> list[str]:
    """Where `message` (a report, a record's, an entry) holds a state of SIZE bytes."""
    return [type(message).__name__] if message.HasField("state") and len(message.state) >= SIZE else []


def frames_holding_a_state(task: asyncio.Task) -> list[str]:
    """The frames of the call `task` runs, down to what it waits on, with a local holding a whole state."""
    found, coro = [], task.get_coro()
    while coro is not None and hasattr(coro, "cr_frame"):
        for name, value in (coro.cr_frame.f_locals if coro.cr_frame is not None else {}).items():
            for each in value if isinstance(value, list) else [value]:
                if isinstance(each, pb.FullState) and whole_states(each):
                    found.append(f"{coro.__qualname__}: {name}")
        coro = coro.cr_await
    return found


def test_a_large_whole_report_is_kept_as_its_manifest_from_receipt_to_replay(tmp_path) -> None:
    asyncio.run(_manifest_from_receipt_to_replay(tmp_path))


async def _manifest_from_receipt_to_replay(tmp_path) -> None:
    c = blob_controller(tmp_path)  # never filed: the journal keeps its frames
    engine, service, store, writer, journal, tracker = c.engine, c.service, c.store, c.writer, c.journal, c.tracker
    sid = (await engine.trigger("a")).snapshot_id

    first = asyncio.create_task(service.ReportStateChunks(chunks(report(sid, "a")), CallContext()))
    for _ in range(500):
        if len(engine.machine.held):
            break
        await asyncio.sleep(0.01)
    assert len(engine.machine.held) == 1 and not first.done(), "the report that does not complete is held"
    taken = tracker._pending[sid].reports["a"]
    assert not whole_states(taken) and taken.HasField("state_blocks"), "the tracker holds the state's bytes"
    assert tracker.forms.of(taken).size == SIZE
    (record,) = engine.machine.held._held[sid].records.values()
    assert record.sent is record.state and not whole_states(record.state), "the held record holds them"
    assert frames_holding_a_state(first) == [], "the waiting call holds them"

    second = asyncio.create_task(service.ReportStateChunks(chunks(report(sid, "b")), CallContext()))
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    finished = tracker._finished[sid]
    assert finished.status == pb.Snapshot.COMPLETE, finished.reason
    assert all(blockforms.is_listed(node) and node.state_bytes == SIZE for node in finished.nodes)
    assert sum(len(frame) for frame in journal._live._frames[sid]) < SIZE, "the journal holds a state"
    answer = engine.machine.get(sid)  # BF1: whole, byte for byte
    assert {node.node_id: node.state for node in answer.nodes} == STATES
    await engine.close()
    await journal.close()
    writer.close()

    records, _, problem = R.decode_all((tmp_path / "controller" / "journal").read_bytes())
    assert problem is None
    rebuilt, pins, warnings = journalblocks.rebuilt(records, store.blocks.read)  # JB3, at a restart
    assert warnings == []
    reported = {r.state.node_id: r.state for r in rebuilt if isinstance(r, R.Reported)}
    assert reported == {node: report(sid, node) for node in STATES}
    assert pins[sid] == {name for state in STATES.values() for name in blocks.names(state)[0].names}


def test_a_small_whole_report_stays_inline(tmp_path) -> None:
    """BF2: its blocks are kept for the node's next report, its state is not listed."""
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    forms = blockforms.BlockForms()
    service = ControllerService(SimpleNamespace(writer=writer, machine=SimpleNamespace(forms=forms)))  # type: ignore[arg-type]
    small = report("s1", "a", bytes(blockforms.LISTED_BYTES))
    names, listed = service._know(small, 1)
    assert listed is None and len(names) == blockforms.LISTED_BYTES // blocks.BLOCK_BYTES
    large_names, large = service._know(report("s1", "b"), 2)
    assert large is not None and list(large.state_blocks.hashes) == large_names and not large.HasField("state")
    writer.close()
