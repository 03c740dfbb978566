"""A restore as blocks hands an app with restore_blocks the rebuilt blocks, never joined
(snapmesh.app A9, apphost.H3, blockstate.py, heldblocks.py).

A blob node restoring the state of its last report held, besides what it held
before (the app's blocks and the cut's join, the undo base and the report's
blocks), the rebuilt state joined (or read back from a file) and the blob app's
own cut of it: two states more. With restore_blocks the app keeps the rebuilt
blocks, which the undo base and the restore's record hold too: one state more,
the state restored. These count what the rebuild and the restore hold at once
(tracemalloc's peak) against the state's size: no timing.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import pytest

from bench import blob_app
from snapmesh.app import App
from snapmesh.protocol import blocks, restoreblocks, wal
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.core import AppRefusal
from snapmesh.protocol.node.effects import Append
from snapmesh.protocol.node.machine import Node
from snapmesh.services.node import heldblocks, logpieces
from snapmesh.services.node.heldblocks import HeldBlocks
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.services.node.translog import TransferLog
from support.restore_blocks import report, restore

pytestmark = pytest.mark.timeout(120)

MIB = 4
STATE = MIB * 1024 * 1024
PEERS = ("p2", "p3")


class PlainBlob(blob_app.Blob):
    """The blob app restored by restore(bytes) only: a restore() below restore_blocks() hides it (A9)."""

    def restore(self, state: bytes) -> None:
        super().restore(state)


PLAIN = App(name="blob", new=PlainBlob)


def _node(app: App, records=()) -> Node:
    numbered = [(f"p1.log:{n}", r) for n, r in enumerate(records, 1)]
    params = {"mib": MIB}
    state = recovery.recover(numbered, node_id="p1", incoming=PEERS, outgoing=PEERS, app=app, app_params=params)
    return Node(node_id="p1", incoming=PEERS, outgoing=PEERS, recovered=state, app=app, app_params=params)


@pytest.fixture(autouse=True)
def _through_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state this size is rebuilt as a GiB's is (RS5): through a file on the shelf, or as blocks."""
    monkeypatch.setattr(heldblocks, "FILE_REBUILD_BYTES", STATE // 4)


def _reported(node: Node, shelf: Path) -> tuple[HeldBlocks, bytes, object]:
    """The node's cut, formed as its last report (SentBlocks.last, kept on its shelf), then a few
    blocks written since: the restore of that snapshot sends nothing, every block held. The
    node's held blocks, the state and the request."""
    cut, parts = node.host.cut()
    state = bytes(cut)  # the cut holds the app's parts (apphost.H8): joined for the messages here
    sizes = tuple(map(len, parts))
    named = blocks.names(state, sizes)[0]
    held = HeldBlocks(SentBlocks(), shelf)
    held._sent.form(report(state), named)
    held.flush()
    for at in (0, 5 * blocks.BLOCK_BYTES + 7, STATE - 3):
        node.submit(blob_app.write(at, b"new"))
    request, _ = restoreblocks.referenced_restore(restore(state), frozenset(named.names), sizes)
    assert request is not None and not request.blocks
    return held, state, request


def _restored(node: Node, held: HeldBlocks, request) -> tuple[object, int]:
    """The servicer's RestoreState, in process: rebuilt by the held blocks, then the node's restore;
    its restore record, and the peak both held at once besides what was held before."""
    node.drain()

    def action() -> None:
        state, named = asyncio.run(held.state_of(request, as_blocks=node.host.takes_blocks()))
        node.restore(snapshot_id=request.snapshot_id, epoch=2, in_flight=[], state=state)
        held.restored(named)

    tracemalloc.start()
    try:
        action()
        held.flush()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        held.close()
    records = [e.record for e in node.drain() if type(e) is Append and type(e.record) is wal.Restore]
    assert len(records) == 1
    return records[0], peak


def test_an_app_with_restore_blocks_keeps_the_rebuilt_blocks_and_the_node_holds_no_other_copy(tmp_path: Path) -> None:
    node = _node(blob_app.app)
    assert node.host.takes_blocks()
    held, state, request = _reported(node, tmp_path / "p1.blocks")
    record, peak = _restored(node, held, request)
    assert peak < 1.25 * STATE, f"the restore held {peak / STATE:.2f} states besides those before (1: the state)"
    kept = node.host.machine.blocks
    base = node.host.undo.base
    assert type(base) is BlockState and type(record.state.data) is BlockState
    assert len(kept) == len(base.blocks) and all(a is b for a, b in zip(kept, base.blocks, strict=True))
    assert record.state.data is base  # the record is over the same blocks
    assert bytes(base) == state and node.app_state() == state


def test_a_command_refused_after_a_restore_as_blocks_is_taken_back_from_the_blocks(tmp_path: Path) -> None:
    node = _node(blob_app.app)
    held, state, request = _reported(node, tmp_path / "p1.blocks")
    _restored(node, held, request)
    node.submit(blob_app.write(10, b"kept"))
    with pytest.raises(AppRefusal, match="OUT_OF_RANGE|passes the blob's end"):
        node.submit(blob_app.write(STATE - 2, b"past"))
    assert node.app_state() == state[:10] + b"kept" + state[14:]


def test_an_app_without_restore_blocks_still_restores_from_the_blocks_joined(tmp_path: Path) -> None:
    node = _node(PLAIN)
    assert not node.host.takes_blocks()
    held, state, request = _reported(node, tmp_path / "p1.blocks")
    record, _ = _restored(node, held, request)
    assert type(record.state.data) is bytes and record.state.data == state
    assert node.app_state() == state


def test_the_restore_record_over_blocks_is_written_a_slice_at_a_time_and_recovers_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logpieces, "PIECE_CHARS", 256 * 1024 + 4)  # slices across blocks' bounds
    node = _node(blob_app.app)
    opening = [e.record for e in node.drain() if type(e) is Append]
    held, state, request = _reported(node, tmp_path / "p1.blocks")
    logged = [e.record for e in node.drain() if type(e) is Append]
    record, _ = _restored(node, held, request)
    path = tmp_path / "p1.log.jsonl"
    log = TransferLog(path, "p1", last_lsn=record.lsn - 1)
    try:
        log.append_record(record)
        log.flush_sync()
    finally:
        logpieces.os.close(log._fd)
    line = path.read_text()
    assert line.count("\n") == 1 and len(line) == len(wal.encode(record, "p1"))
    parsed = wal.parse(line, "p1.log:1", node_id="p1")
    assert wal.unpack(parsed.state, "p1.log:1") == state
    after = _node(blob_app.app, [*opening, *logged, parsed])  # a crash after the record: recovered from it
    assert after.app_state() == state
