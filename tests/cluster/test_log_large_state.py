"""A state of a GiB in the transfer log: the record's line holds the state's text once.

A node's init (and a checkpoint, a restore) carries its app's whole state, base64. At
1 GiB a node, escaping it (a copy), joining the line (a copy) and encoding the round
(a copy) put four copies of the state's text at once on top of the app's state and
its undo base: four nodes of 1 GiB did not fit in 24 GiB. And a fresh log's init did
not count as the segment's opening, so the first step sealed the segment, writing the
state a second time. Here at a few MiB, the piece size lowered.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from pathlib import Path

import pytest

from support.node_harness import append, append_send
from snapmesh.protocol import wal
from snapmesh.services.node import logpieces, translog
from snapmesh.services.node.translog import TransferLog

pytestmark = pytest.mark.timeout(60)

STATE = 3 * 1024 * 1024  # bytes of the app's state


def _traced_peak(work) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = work()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_state_is_written_into_its_line_without_an_escaped_copy() -> None:
    state = wal.pack(bytes(range(256)) * (STATE // 256))
    record = wal.Init(lsn=1, state=state, app="blob", version=1)
    line, peak = _traced_peak(lambda: wal.encode(record, "p1"))
    assert json.loads(line)["state"] == state
    assert peak < 1.3 * len(state), f"encoding made {peak / len(state):.2f} copies of the state's text, not 1"


def test_a_state_that_needs_escaping_is_still_escaped() -> None:
    text = 'a"b\\c\n' * 20000  # over the size a plain state is taken as it is
    record = wal.Init(lsn=1, state=text)
    assert json.loads(wal.encode(record, "p1"))["state"] == text


def test_a_large_line_is_written_a_piece_at_a_time_never_joined_or_encoded_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logpieces, "PIECE_CHARS", 256 * 1024)
    big = "A" * STATE + "\n"
    small = ['{"x":1}\n', '{"x":2}\n']
    chunks = logpieces.chunks([small[0], big, small[1]])
    assert [len(pieces) for pieces, _ in chunks] == [3]
    assert chunks[0][0][1] is big  # the very line: no copy
    path = tmp_path / "out"
    fd = translog.os.open(path, translog.os.O_WRONLY | translog.os.O_CREAT, 0o644)
    try:
        _, peak = _traced_peak(lambda: logpieces.write_all(fd, chunks[0][0]))
    finally:
        translog.os.close(fd)
    assert path.read_text() == small[0] + big + small[1]
    assert peak < 4 * logpieces.PIECE_CHARS, f"writing held {peak:,} bytes at once for a {len(big):,}-byte line"


def test_a_fresh_logs_init_opens_its_segment_so_a_large_state_seals_nothing(tmp_path: Path) -> None:
    async def go() -> tuple[int, int]:
        log = TransferLog(tmp_path / "p1.log.jsonl", "p1", last_lsn=0)
        log.start()
        append(log, wal.Init, state=wal.pack(b"\x01" * STATE))
        append_send(log, "p1", "p2", 1, 5)
        await log.wait_durable(log.last_lsn)
        appended = log.appended_bytes
        await log.close()
        reopened = TransferLog(tmp_path / "p1.log.jsonl", "p1", last_lsn=2)
        try:
            return appended, reopened.appended_bytes
        finally:
            translog.os.close(reopened._fd)

    appended, after_restart = asyncio.run(go())
    # only the send counts towards segment_bytes, as after a restart, which reads the init as the head
    assert appended == after_restart < 1000
