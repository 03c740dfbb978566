"""A small report held in the transfer log (wal.Report) is read back at start-up and
sent again (services/node/loggedreports.py, StateReporter.resume): the checkpoint's
carried ones, then the `report` records, less those an abort dropped, and never one
resting on a record the log does not hold; pending-report files an older version
wrote are sent beside them; a seal carries only the reports not yet taken."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapmesh.protocol import wal
from snapmesh.services.node.loggedreports import CorruptLoggedReportError, logged_reports
from snapmesh.services.node.pendingreports import PendingReports
from snapmesh.services.node.reporter import StateReporter
from snapmesh.v1 import snapmesh_pb2 as pb


def part(sid: str, balance: int = 95) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id="p1", balance=balance, state=b"x")


def packed(sid: str) -> str:
    return wal.pack(part(sid).SerializeToString())


def write_log(path: Path, records: list[wal.Record], torn: str = "") -> None:
    path.write_text("".join(wal.encode(r, "p1") for r in records) + torn)


def checkpoint(lsn: int, reports: dict) -> wal.Checkpoint:
    return wal.Checkpoint(lsn=lsn, next_seq={}, acked={}, received={}, outbox={}, abandoned=[], requests={},
                          reports=reports)


def test_the_checkpoints_and_the_records_reports_less_the_aborted_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"
    write_log(path, [
        checkpoint(10, {"s0": packed("s0")}),
        wal.Report(lsn=11, snapshot_id="s1", upto=12, fullstate=packed("s1")),
        wal.MarkerRecv(lsn=12, snapshot_id="s1", src="p2", dst="p1", seq=3),
        wal.Report(lsn=13, snapshot_id="s2", upto=14),  # a large state's: in its file
        wal.Report(lsn=14, snapshot_id="s3", upto=15, fullstate=packed("s3")),
        wal.Abort(lsn=15, snapshot_id="s3", reason="deadline"),
        wal.Report(lsn=16, snapshot_id="s4", upto=17, fullstate=packed("s4")),  # its marker_recv lost
    ], torn='{"node":"p1","lsn":17,"kind":"marker_r')
    found = logged_reports(path, "p1")
    assert [(m.snapshot_id, upto) for m, upto, _ in found] == [("s0", 10), ("s1", 12), ("s4", 17)]
    assert found[1][0] == part("s1") and found[1][2] == packed("s1")

    reporter = StateReporter(address="127.0.0.1:1", log_=None, metrics=None, options=[])
    started: list[tuple[str, int]] = []
    reporter._start = lambda message, lsn: started.append((message.snapshot_id, lsn))  # type: ignore[method-assign]
    old = PendingReports(tmp_path / "p1.reports")  # a file an older version wrote, and one for a logged id
    old.load()
    old.save(part("s9"), 5)
    old.save(part("s1"), 12)
    reporter.resume(old.load(), 16, found)  # the log ends at 16: s4 rests on 17
    assert sorted(started) == [("s0", 10), ("s1", 12), ("s9", 5)]  # s1 once, from its file
    carried = reporter.carried(checkpoint(20, {}))
    assert carried.reports == {"s0": packed("s0")}  # resumed from the log: still kept there
    reporter._forget("s0")  # the controller took it
    assert reporter.carried(checkpoint(20, {})).reports == {}


def test_a_report_that_does_not_parse_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"
    write_log(path, [checkpoint(1, {}), wal.Report(lsn=2, snapshot_id="s1", upto=2, fullstate=wal.pack(b"\xff\x00"))])
    with pytest.raises(CorruptLoggedReportError, match=r"p1\.log\.jsonl:2: the report of snapshot 's1' does not parse"):
        logged_reports(path, "p1")
    write_log(path, [checkpoint(1, {}), wal.Report(lsn=2, snapshot_id="s1", upto=2, fullstate=packed("s2"))])
    with pytest.raises(CorruptLoggedReportError, match="a report of snapshot 's2', not 's1'"):
        logged_reports(path, "p1")


def test_keep_puts_a_small_state_in_the_record_and_a_large_one_in_its_file(tmp_path: Path) -> None:
    queued: list[int] = []

    class Log:
        failure = None

        def before_records(self, action, nbytes: int = 0) -> None:
            queued.append(nbytes)

    reporter = StateReporter(address="127.0.0.1:1", log_=Log(), metrics=None, options=[],
                             pending=PendingReports(tmp_path / "p1.reports"))
    reporter._hops.finished = lambda message: None  # type: ignore[method-assign]
    small = pb.FullState(snapshot_id="s1", node_id="p1")
    reporter.keep(small, 7, b"a" * 100, in_log=True)
    record = reporter.logged(wal.Report(lsn=6, snapshot_id="s1", upto=7))
    assert pb.FullState.FromString(wal.unpack(record.fullstate, "test")).state == b"a" * 100 and queued == []
    large = pb.FullState(snapshot_id="s2", node_id="p1")
    reporter.keep(large, 9, b"b" * (64 * 1024 + 1), in_log=True)
    assert reporter.logged(wal.Report(lsn=8, snapshot_id="s2", upto=9)).fullstate == "" and len(queued) == 1
    many = pb.FullState(snapshot_id="s3", node_id="p1", channels=[pb.ChannelState(src="p2", dst="p1", in_flight=[
        pb.InFlightTransfer(msg_id="m" * 100, amount=1)] * 1000)])  # a small app state, many messages recorded
    reporter.keep(many, 11, b"c", in_log=True)
    assert reporter.logged(wal.Report(lsn=10, snapshot_id="s3", upto=11)).fullstate == "" and len(queued) == 2
    reporter.cancel("s1")  # its abort record drops it; no round for a file
    assert reporter.carried(checkpoint(20, {})).reports == {} and len(queued) == 2
