"""Where a transfer-log round syncs (services/node/translog.py, `sync_inline`), by its kind:
a round that makes files durable with its records (a report's save: sync_with_log, one
syncfs of the whole file system) is placed by the last such round's time, a plain round
(write + fdatasync) by the last plain one's. A slow syncfs sends the next report's round
to a worker thread, and does not send the plain rounds between them off the loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from support.node_harness import append, append_send

from snapmesh.protocol import wal
from snapmesh.services.node import translog
from snapmesh.services.node.translog import TransferLog

pytestmark = pytest.mark.timeout(60)


def test_a_slow_files_sync_moves_the_next_files_round_off_the_loop_and_no_plain_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p1.log.jsonl"
    rounds: list[tuple[str, bool]] = []  # (kind, on the loop's thread)
    real_plain, real_files = translog._write_all_and_sync, translog.sync_with_log

    def plain(fd: int, data: bytes) -> float:
        rounds.append(("plain", threading.current_thread() is threading.main_thread()))
        real_plain(fd, data)
        return 0.0  # as if fast: the rule is under test, not this machine's disk

    def files(log_fd: int, directory: Path, paths: list[Path]) -> int:
        rounds.append(("files", threading.current_thread() is threading.main_thread()))
        time.sleep(translog.INLINE_SYNC_MAX_S * 3)  # as a syncfs behind a busy file system
        return real_files(log_fd, directory, paths)

    monkeypatch.setattr(translog, "_write_all_and_sync", plain)
    monkeypatch.setattr(translog, "sync_with_log", files)
    saved = tmp_path / "report"

    def save() -> list[Path]:
        saved.write_bytes(b"state")
        return [saved]

    async def go() -> None:
        log = TransferLog(path, "p1", last_lsn=0)
        log.start()
        append(log, wal.Init)
        await log.wait_durable(log.last_lsn)
        for seq in (1, 3):
            log.before_records(save, 5)
            append_send(log, "p1", "p2", seq, 1)
            await log.wait_durable(log.last_lsn)  # a report's round: slow
            append_send(log, "p1", "p2", seq + 1, 1)
            await log.wait_durable(log.last_lsn)  # a plain round: its kind's last was fast
        await log.close()

    asyncio.run(go())
    assert rounds == [("plain", True), ("files", True), ("plain", True), ("files", False), ("plain", True)], rounds
    assert [json.loads(line)["lsn"] for line in path.read_text().splitlines()] == list(range(1, 6))
