"""A restore's log record holds the state's bytes, not their base64: made as the line is written.

At a GiB a node the restore record's base64 (a str of 4/3 of the state) and the line
joined around it held 2.7 states on top of the state the node restores. These count
what a restore and its record's write hold at once (tracemalloc's peak), against the
state's size: no timing.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from snapmesh.app import App
from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.effects import Append
from snapmesh.protocol.node.machine import Node
from snapmesh.services.node import logpieces
from snapmesh.services.node.translog import TransferLog

STATE = 4 * 1024 * 1024
PEERS = ("p2", "p3")


class Held:
    """An app that keeps the bytes it is given (no copy of its own), so what is counted is the node's."""

    def __init__(self, info) -> None:
        self.state = b""

    def on_command(self, command, ctx) -> bytes:
        return b""

    def on_message(self, src, payload, ctx) -> None:
        pass

    def snapshot(self) -> bytes:
        return self.state

    def restore(self, state: bytes) -> None:
        self.state = state


APP = App(name="held", new=Held)


def _node(records=()) -> Node:
    numbered = [(f"p1.log:{n}", r) for n, r in enumerate(records, 1)]
    state = recovery.recover(numbered, node_id="p1", incoming=PEERS, outgoing=PEERS, app=APP)
    return Node(node_id="p1", incoming=PEERS, outgoing=PEERS, recovered=state, app=APP)


def _peak(action):
    tracemalloc.start()
    try:
        out = action()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _restore_record(node: Node, state: bytes) -> wal.Restore:
    node.drain()
    _, peak = _peak(lambda: node.restore(snapshot_id="s", epoch=2, in_flight=[], state=state))
    assert peak < 0.1 * len(state), f"the restore held {peak / len(state):.2f} states besides the state"
    records = [e.record for e in node.drain() if type(e) is Append and type(e.record) is wal.Restore]
    assert len(records) == 1
    return records[0]


def test_a_restore_holds_no_base64_of_its_state() -> None:
    state = bytes(range(256)) * (STATE // 256)
    record = _restore_record(_node(), state)
    assert wal.unpack(record.state, "the record") == state
    assert record.state == wal.pack(state)  # it reads as the base64 it stands for


def test_the_restore_record_is_written_a_slice_at_a_time_and_recovers_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logpieces, "PIECE_CHARS", 256 * 1024)
    state = bytes(range(251)) * (STATE // 251)
    node = _node()
    opening = [e.record for e in node.drain() if type(e) is Append]
    record = _restore_record(node, state)
    path = tmp_path / "p1.log.jsonl"
    log = TransferLog(path, "p1", last_lsn=record.lsn - 1)

    def write() -> None:
        log.append_record(record)
        log.flush_sync()

    try:
        _, peak = _peak(write)
    finally:
        logpieces.os.close(log._fd)
    assert peak < 4 * logpieces.PIECE_CHARS, f"writing the restore held {peak:,} bytes for a {len(state):,}-byte state"
    line = path.read_text()
    assert line.count("\n") == 1 and len(line) == len(wal.encode(record, "p1"))
    parsed = wal.parse(line, "p1.log:1", node_id="p1")
    assert wal.unpack(parsed.state, "p1.log:1") == state
    after = _node([*opening, parsed])  # a crash after the record: recovery restores the state from it
    assert after.app_state() == state
