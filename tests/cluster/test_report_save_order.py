"""A finished part is durable before it is sent, at the cost of one sync. A small
one (the node's way: its machine's `log_reports`) is a `report` record in the
transfer log, right before the marker_recv it rests on, in the same write: the
round's one fdatasync makes both durable, with no file and no syncfs, and a log
cut short after that marker_recv holds the report. A large one
(and a machine that does not log reports) rides the log's round as a pending-report
file renamed into place before that marker_recv is written, on whichever path the
round takes, and one sync makes both durable (a syncfs of the data directory's file
system; without one, the file's fsync, its directory's and the log's fdatasync, in
that order). A failed save never fails the log. Driven through the real engine,
node machine, log and reporter, with every file operation of the data directory
recorded in order."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.node_harness import append_send
from snapmesh.services.node import translog
from snapmesh.services.node.channels import IncomingChannel
from snapmesh.services.node.engine import AppMessage, Engine
from snapmesh.services.node.loggedreports import logged_reports
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.recovery import recover
from snapmesh.services.node.pendingreports import CorruptReportError, PendingReports
from snapmesh.services.node.reporter import StateReporter
from snapmesh.services.node.translog import TransferLog
from snapmesh.serving import durable
from snapmesh.protocol.node import core
from snapmesh.protocol.node.machine import Node
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.app import load_app

BANK, PARAMS = load_app("bank"), {"initial_balance": 100}  # every node hosts an app (node rule N10)

pytestmark = pytest.mark.timeout(60)


@dataclass
class FileOps:
    """os.open/write/fsync/fdatasync/replace on paths under `root`, in order:
    (op, path, thread is the main one, bytes written or b"")."""

    root: Path
    ops: list[tuple[str, str, bool, bytes]] = field(default_factory=list)
    paths: dict[int, str] = field(default_factory=dict)
    fail_replace: bool = False
    syncfs: bool = True  # False: a system without syncfs(2), the fallback's syncs

    SYNCS = ("fsync", "fdatasync", "syncfs")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_open, real_write, real_writev, real_fsync = os.open, os.write, os.writev, os.fsync
        real_syncfs = durable._SYNCFS
        real_fdatasync, real_replace = os.fdatasync, os.replace

        def note(op: str, path: str, data: bytes = b"") -> None:
            if path.startswith(str(self.root)):
                self.ops.append((op, path, threading.current_thread() is threading.main_thread(), data))

        def fake_open(path, flags, mode=0o777, *args, **kw):
            fd = real_open(path, flags, mode, *args, **kw)
            self.paths[fd] = str(path)
            return fd

        def fake_write(fd, data):
            note("write", self.paths.get(fd, ""), bytes(data))
            return real_write(fd, data)

        def fake_writev(fd, buffers):  # a write of many pieces (durable.py): one write here
            written = real_writev(fd, buffers)
            note("write", self.paths.get(fd, ""), b"".join(bytes(b) for b in buffers)[:written])
            return written

        def fake_fsync(fd):
            note("fsync", self.paths.get(fd, ""))
            return real_fsync(fd)

        def fake_fdatasync(fd):
            note("fdatasync", self.paths.get(fd, ""))
            return real_fdatasync(fd)

        def fake_replace(src, dst, *args, **kw):
            note("replace", str(dst))
            if self.fail_replace and str(dst).endswith(PendingReports.SUFFIX):
                raise OSError(errno.EIO, "injected EIO on the report's rename")
            return real_replace(src, dst, *args, **kw)

        def fake_syncfs(fd):
            note("syncfs", self.paths.get(fd, ""))
            return real_syncfs(fd) if real_syncfs is not None else 0

        monkeypatch.setattr(durable, "_SYNCFS", fake_syncfs if self.syncfs else None)
        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "write", fake_write)
        monkeypatch.setattr(os, "writev", fake_writev)
        monkeypatch.setattr(os, "fsync", fake_fsync)
        monkeypatch.setattr(os, "fdatasync", fake_fdatasync)
        monkeypatch.setattr(os, "replace", fake_replace)

    def index(self, op: str, predicate) -> int:
        found = [i for i, (o, path, _, data) in enumerate(self.ops) if o == op and predicate(path, data)]
        assert len(found) == 1, (op, found, self.ops)
        return found[0]


class Sink:
    """Stands in for the controller: the reporter's sends land here (and in `ops`, as a "send")."""

    def __init__(self, ops: FileOps | None = None) -> None:
        self.sent: list[tuple[str, int]] = []
        self.ops = ops

    def send(self, message: pb.FullState, lsn: int) -> None:
        self.sent.append((message.snapshot_id, lsn))
        if self.ops is not None:
            self.ops.ops.append(("send", message.snapshot_id, True, b""))


async def one_snapshot(tmp_path: Path, transfers_before: int, ops: FileOps | None = None,
                       log_reports: bool = False, **node_kw) -> tuple[list[str], Sink, PendingReports]:
    """p1 (one incoming channel, from p2) takes `transfers_before` transfers and
    then s1's marker in one frame: cut, recvs, marker_recv, and its part is done.
    `log_reports`: the node's way (embedded.py), its report in the log."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = data_dir / "p1.log.jsonl"
    recovered = recover(path, "p1", incoming=("p2",), outgoing=(), app=BANK, app_params=PARAMS)
    engine: Engine | None = None
    log = TransferLog(path, "p1", last_lsn=recovered.last_lsn,
                      on_durable=lambda lsn: engine.durable(lsn) if engine is not None else None)
    pending = PendingReports(data_dir / "p1.reports")
    pending.load()
    sink = Sink(ops)
    reporter = StateReporter(address="127.0.0.1:1", log_=log, metrics=NodeMetrics("p1"), options=[], pending=pending)
    reporter._start = sink.send  # type: ignore[method-assign]
    node = Node(node_id="p1", incoming=("p2",), outgoing=(), recovered=recovered, now=0.0, wall=0.0, app=BANK,
                app_params=PARAMS, **node_kw)
    node.log_reports = log_reports
    engine = Engine(node=node, log_=log, outgoing={}, incoming={"p2": IncomingChannel(src="p2", dst="p1")},
                    metrics=NodeMetrics("p1"), reporter=reporter, app_spec="bank")
    log.flush_sync()
    engine.durable(log.durable_lsn)
    log.start()
    engine.opened("p2", 1)
    frame = [(seq, AppMessage(b"1", f"p2:p1:{seq}")) for seq in range(1, transfers_before + 1)]  # the bank app's: 1
    frame.append((transfers_before + 1, core.Marker(snapshot_id="s1")))
    engine.receive_batch("p2", 1, frame)
    await asyncio.wait_for(log.wait_durable(log.last_lsn), 10)
    await log.close()
    return path.read_text().splitlines(), sink, pending


@pytest.mark.parametrize(("transfers_before", "on_loop"), [(0, True), (200, False)],
                         ids=["small-round-on-the-loop", "large-round-on-a-thread"])
def test_a_small_report_is_a_log_record_made_durable_by_the_rounds_one_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transfers_before: int, on_loop: bool
) -> None:
    ops = FileOps(tmp_path)
    ops.install(monkeypatch)
    lines, sink, pending = asyncio.run(one_snapshot(tmp_path, transfers_before, ops, log_reports=True))

    kinds = [line.split('"kind":"')[1].split('"')[0] for line in lines]
    marker_lsn = kinds.index("marker_recv") + 1
    assert kinds[marker_lsn - 2] == "report" and kinds[-1] == "marker_recv"  # right before the record it rests on
    assert json.loads(lines[marker_lsn - 2])["upto"] == marker_lsn
    assert sink.sent == [("s1", marker_lsn)]  # sent once both are durable
    [(state, lsn, _)] = logged_reports(tmp_path / "data" / "p1.log.jsonl", "p1")  # what a restart sends again
    assert state.snapshot_id == "s1" and lsn == marker_lsn and state.state == b"%d" % (100 + transfers_before)
    assert pending.load() == []  # no file

    log_path = str(tmp_path / "data" / "p1.log.jsonl")
    written = ops.index("write", lambda p, d: p == log_path and b'"kind":"report"' in d)
    assert b'"kind":"marker_recv"' in ops.ops[written][3] and b'"kind":"cut"' in ops.ops[written][3]  # one write
    sent = ops.index("send", lambda p, _: p == "s1")
    syncs = [(o, p) for o, p, _, _ in ops.ops[written:sent] if o in FileOps.SYNCS]
    assert syncs == [("fdatasync", log_path)], ops.ops  # the report's path: one fdatasync of the log
    assert not [op for op in ops.ops if op[0] == "syncfs"], ops.ops
    assert not [op for op in ops.ops if op[1].startswith(str(pending.directory))], ops.ops
    assert ops.ops[written][2] is on_loop  # on the round's own path


def test_a_seal_carries_a_logged_report_not_yet_taken_into_its_checkpoint(tmp_path: Path) -> None:
    """The step that finishes the part seals the segment (segment_records): the report's
    record is in the sealed segment, and the active one's checkpoint carries it."""
    lines, sink, _ = asyncio.run(one_snapshot(tmp_path, 3, log_reports=True, segment_records=4))
    data = tmp_path / "data"
    [sealed] = data.glob("p1.log.0*.jsonl")
    records = [json.loads(line) for line in sealed.read_text().splitlines()]
    [report] = [r for r in records if r["kind"] == "report"]
    assert sink.sent == [("s1", report["upto"])]
    checkpoint = json.loads(lines[0])
    assert checkpoint["kind"] == "checkpoint" and checkpoint["reports"] == {"s1": report["fullstate"]}
    [(state, lsn, _)] = logged_reports(data / "p1.log.jsonl", "p1")  # what a restart sends again
    assert state.snapshot_id == "s1" and state.state == b"103" and lsn == checkpoint["lsn"]


@pytest.mark.parametrize("syncfs", [True, False], ids=["syncfs", "no-syncfs"])
@pytest.mark.parametrize(("transfers_before", "on_loop"), [(0, True), (200, False)],
                         ids=["small-round-on-the-loop", "large-round-on-a-thread"])
def test_the_report_file_is_written_before_the_marker_recv_and_one_sync_makes_both_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transfers_before: int, on_loop: bool, syncfs: bool
) -> None:
    ops = FileOps(tmp_path, syncfs=syncfs)
    ops.install(monkeypatch)
    lines, sink, pending = asyncio.run(one_snapshot(tmp_path, transfers_before, ops))

    marker_lsn = next(i for i, line in enumerate(lines, start=1) if '"marker_recv"' in line)
    assert sink.sent == [("s1", marker_lsn)]  # reported once durable, resting on the marker_recv
    [(state, lsn)] = pending.load()
    assert state.snapshot_id == "s1" and lsn == marker_lsn and state.state == b"%d" % (100 + transfers_before)

    reports = str(pending.directory)
    renamed = ops.index("replace", lambda p, _: p.startswith(reports) and p.endswith(PendingReports.SUFFIX))
    marker_written = ops.index("write", lambda p, d: p.endswith("p1.log.jsonl") and b'"marker_recv"' in d)
    sent = ops.index("send", lambda p, _: p == "s1")
    assert renamed < marker_written < sent, ops.ops
    # The report's path: from its file's first write to its send, the syncs made.
    first = min(i for i, (o, p, _, _) in enumerate(ops.ops) if o == "write" and p.startswith(reports))
    syncs = [(o, p) for o, p, _, _ in ops.ops[first:sent] if o in FileOps.SYNCS]
    data = str(tmp_path / "data")
    if syncfs:
        assert syncs == [("syncfs", data)], ops.ops  # one, after the marker_recv's write
    else:  # the file, its directory, then the log: the old order, all after the writes
        assert [o for o, _ in syncs] == ["fsync", "fsync", "fdatasync"], ops.ops
        assert syncs[1:] == [("fsync", reports), ("fdatasync", data + "/p1.log.jsonl")]
    assert all(i > marker_written for i, (o, _, _, _) in enumerate(ops.ops[:sent]) if o in FileOps.SYNCS and i > first)
    # No round before it wrote the records the state rests on: the cut and the
    # recvs go in the same write, after the file too.
    assert b'"kind":"cut"' in ops.ops[marker_written][3]
    # The save ran on the round's own path: the loop for a small round, the
    # worker thread, with the log's write, for a large one.
    save_threads = {on_main for _, p, on_main, _ in ops.ops[:marker_written] if p.startswith(reports)}
    assert save_threads == {on_loop}, ops.ops
    assert ops.ops[marker_written][2] is on_loop


def test_a_pending_report_power_cut_short_is_dropped_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its name durable and not (all) its bytes: a power loss during the round's one
    sync. The part is lost (the controller aborts that snapshot at its deadline);
    the node starts. Garbage is still refused."""
    pending = PendingReports(tmp_path / "p1.reports")
    pending.load()
    whole = pending.encode(pb.FullState(snapshot_id="s1", node_id="p1", balance=95, state=b"x" * 100), 7)
    pending.write("s1", whole[:-10])
    pending.write("s2", b"")
    pending.write("s3", pending.encode(pb.FullState(snapshot_id="s3", node_id="p1", balance=95), 8))
    assert [(m.snapshot_id, lsn) for m, lsn in pending.load()] == [("s3", 8)]
    assert "cut short" in caplog.text and "an empty pending report" in caplog.text
    assert sorted(p.name for p in pending.directory.iterdir()) == [pending._path("s3").name]
    pending.write("s4", b"snapmesh-fullstate 1 lsn=9 bytes=x\n")
    with pytest.raises(CorruptReportError, match="bad header"):
        pending.load()


def test_a_failed_save_is_logged_the_state_reported_and_the_log_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ops = FileOps(tmp_path, fail_replace=True)
    ops.install(monkeypatch)
    lines, sink, pending = asyncio.run(one_snapshot(tmp_path, 0))

    marker_lsn = next(i for i, line in enumerate(lines, start=1) if '"marker_recv"' in line)
    assert sink.sent == [("s1", marker_lsn)]  # reported all the same
    assert pending.load() == []  # only not crash-safe (the temp file is dropped)
    assert "snapshot s1: cannot keep the state for a report after a crash: " in caplog.text
    assert "injected EIO" in caplog.text


def test_an_action_that_raises_does_not_fail_the_log_and_actions_keep_their_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "p1.log.jsonl"
    done: list[str] = []

    def broken() -> None:
        done.append("broken")
        raise OSError(errno.ENOSPC, "injected ENOSPC in an action")

    async def go() -> None:
        log = TransferLog(path, "p1", last_lsn=0)
        log.start()
        log.before_records(lambda: done.append(f"first, file holds {len(path.read_text().splitlines())} lines"))
        append_send(log, "p1", "p2", 1, 5)
        log.before_records(broken)
        log.before_records(lambda: done.append(f"third, file holds {len(path.read_text().splitlines())} lines"))
        append_send(log, "p1", "p2", 2, 5)
        await asyncio.wait_for(log.wait_durable(log.last_lsn), 10)
        assert log.failure is None and log.durable_lsn == 2
        log.before_records(lambda: done.append("alone"))  # a round with no records
        append_send(log, "p1", "p2", 3, 5)
        await asyncio.wait_for(log.wait_durable(log.last_lsn), 10)
        await log.close()

    asyncio.run(go())
    assert done == ["first, file holds 0 lines", "broken", "third, file holds 0 lines", "alone"]
    assert len(path.read_text().splitlines()) == 3
    assert "injected ENOSPC in an action" in caplog.text and "the log goes on" in caplog.text


def test_the_round_path_counts_the_actions_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large save with a small round goes to the worker thread (sync_inline on both)."""
    threads: list[bool] = []
    real = translog._write_all_and_sync

    def spy(fd: int, data: tuple[str, ...]) -> float:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(fd, data)

    monkeypatch.setattr(translog, "_write_all_and_sync", spy)

    async def go() -> None:
        log = TransferLog(tmp_path / "p1.log.jsonl", "p1", last_lsn=0)
        log.start()
        append_send(log, "p1", "p2", 1, 5)
        await log.wait_durable(log.last_lsn)
        log.before_records(lambda: None, translog.INLINE_SYNC_MAX_BYTES)
        append_send(log, "p1", "p2", 2, 5)
        await log.wait_durable(log.last_lsn)
        await log.close()

    asyncio.run(go())
    assert threads == [True, False]


def test_a_cancel_before_the_save_ran_leaves_no_file(tmp_path: Path) -> None:
    """An abort that comes while the save is still queued in the log: the
    removal follows the save, so no file is left for a snapshot that was dropped."""
    pending = PendingReports(tmp_path / "p1.reports")
    pending.load()

    async def go() -> None:
        log = TransferLog(tmp_path / "p1.log.jsonl", "p1", last_lsn=0)
        reporter = StateReporter(address="127.0.0.1:1", log_=log, metrics=NodeMetrics("p1"), options=[],
                                 pending=pending)
        log.start()
        lsn = append_send(log, "p1", "p2", 1, 5)
        reporter.keep(pb.FullState(snapshot_id="s1", node_id="p1", balance=95), lsn)
        reporter.keep(pb.FullState(snapshot_id="s2", node_id="p1", balance=95), lsn)
        reporter.cancel("s1")
        await asyncio.wait_for(log.wait_durable(lsn), 10)
        await reporter.close()
        await log.close()

    asyncio.run(go())
    assert [(m.snapshot_id, lsn) for m, lsn in pending.load()] == [("s2", 1)]
