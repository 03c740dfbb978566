"""The one snapshot-versus-log checker (snapmesh/checking/logcheck.py `check_logs`) on a
hand-written two-node run: it passes the honest logs, read from sealed
segments and an active file with a torn last line and a record kind it does
not know, and it catches each kind of lie."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import snapmesh.bank.logs as bank_logs
from snapmesh.checking.logcheck import InvariantViolation, RecordedSnapshot, check_logs
from snapmesh.checking.node_logs import read_logs

# p2 starts s1 while p1's transfer of 10 is on the wire: it is in flight on p1->p2.
P1 = [
    {"kind": "init", "balance": 100},
    {"kind": "send", "msg_id": "p1:p2:1", "src": "p1", "dst": "p2", "seq": 1, "amount": 10},
    {"kind": "marker_recv", "snapshot_id": "s1", "src": "p2", "dst": "p1", "seq": 1},
    {"kind": "cut", "snapshot_id": "s1", "balance": 90},
    {"kind": "marker_sent", "snapshot_id": "s1", "src": "p1", "dst": "p2", "seq": 2},
    {"kind": "flush_hint", "note": "a kind this checker has never heard of"},
]
P2 = [
    {"kind": "init", "balance": 100},
    {"kind": "cut", "snapshot_id": "s1", "balance": 100},
    {"kind": "marker_sent", "snapshot_id": "s1", "src": "p2", "dst": "p1", "seq": 1},
    {"kind": "recv", "msg_id": "p1:p2:1", "src": "p1", "dst": "p2", "seq": 1, "amount": 10},
    {"kind": "marker_recv", "snapshot_id": "s1", "src": "p1", "dst": "p2", "seq": 2},
]
CHANNELS = [("p1", "p2"), ("p2", "p1")]


def honest() -> RecordedSnapshot:
    return RecordedSnapshot(
        snapshot_id="s1",
        states={"p1": 90, "p2": 100},
        in_flight={("p1", "p2"): [("p1:p2:1", 10, 1)], ("p2", "p1"): []},
    )


def write_log(data: Path, node: str, records: list[dict], *, sealed_upto: int = 0, torn: bool = False) -> None:
    lines = [json.dumps({"node": node, "lsn": lsn, **r}) for lsn, r in enumerate(records, start=1)]
    if sealed_upto:
        (data / f"{node}.log.{1:012d}.jsonl").write_text("\n".join(lines[:sealed_upto]) + "\n")
        lines = lines[sealed_upto:]
    (data / f"{node}.log.jsonl").write_text("\n".join(lines) + "\n" + ('{"node": "p1", "ls' if torn else ""))


@pytest.fixture
def logs(tmp_path: Path) -> dict:
    write_log(tmp_path, "p1", P1, sealed_upto=2, torn=True)
    write_log(tmp_path, "p2", P2)
    return read_logs(tmp_path)


def test_segments_are_read_in_lsn_order_and_the_honest_run_passes(logs) -> None:
    assert [r["lsn"] for r in logs["p1"]] == [1, 2, 3, 4, 5, 6]
    report = check_logs(logs, [honest()], channels=CHANNELS, app=bank_logs)
    assert report.transfers == 1 and report.snapshots == {"s1": True}


def lie(**changes) -> RecordedSnapshot:
    fields = {"snapshot_id": "s1", "states": {"p1": 90, "p2": 100},
              "in_flight": {("p1", "p2"): [("p1:p2:1", 10, 1)], ("p2", "p1"): []}}
    return RecordedSnapshot(**{**fields, **changes})


@pytest.mark.parametrize(
    ("snapshot", "words"),
    [
        (lie(in_flight={("p1", "p2"): [], ("p2", "p1"): []}), "in flight []"),
        (lie(states={"p1": 80, "p2": 100}), "p1 recorded 80"),
        (lie(in_flight={("p1", "p2"): [("p1:p2:1", 11, 1)], ("p2", "p1"): []}), "in flight"),
        (lie(in_flight={("p1", "p2"): [("p1:p2:1", 10, 1)]}), "records channels"),
    ],
)
def test_each_lie_in_a_snapshot_is_caught(logs, snapshot, words) -> None:
    with pytest.raises(InvariantViolation) as info:
        check_logs(logs, [snapshot], channels=CHANNELS, app=bank_logs)
    assert words in str(info.value)


def test_a_second_marker_and_a_bad_cut_in_the_logs_are_caught(logs) -> None:
    logs["p2"].append({"node": "p2", "lsn": 6, "kind": "marker_recv", "snapshot_id": "s1", "src": "p1", "dst": "p2",
                       "seq": 3})
    with pytest.raises(InvariantViolation, match="1 markers out and 2 in"):
        check_logs(logs, [honest()], channels=CHANNELS, app=bank_logs)
    logs["p2"].pop()
    logs["p1"][3] = {**logs["p1"][3], "balance": 95}
    with pytest.raises(InvariantViolation, match="its cut says 95"):
        check_logs(logs, [honest()], channels=CHANNELS, app=bank_logs)


def test_a_snapshot_aborted_at_the_receiver_before_its_marker_came_is_no_violation(tmp_path: Path) -> None:
    """Found by `snapmesh chaos`: p1, restarted, was told to abort s2 before p2's
    marker arrived; the marker was dropped and p2's later transfer received,
    with no cut at p1. The checker took p1's missing cut as "after everything"
    and called that transfer received before p1's cut. A transfer received
    before a real cut and sent after the sender's is still caught."""
    p1 = [{"kind": "init", "balance": 100},
          {"kind": "abort", "snapshot_id": "s2", "reason": "deadline passed; no report from p1"},
          {"kind": "marker_recv", "snapshot_id": "s2", "src": "p2", "dst": "p1", "seq": 1},
          {"kind": "recv", "msg_id": "p2:p1:2", "src": "p2", "dst": "p1", "seq": 2, "amount": 5}]
    p2 = [{"kind": "init", "balance": 100},
          {"kind": "cut", "snapshot_id": "s2", "balance": 100},
          {"kind": "marker_sent", "snapshot_id": "s2", "src": "p2", "dst": "p1", "seq": 1},
          {"kind": "send", "msg_id": "p2:p1:2", "src": "p2", "dst": "p1", "seq": 2, "amount": 5}]
    write_log(tmp_path, "p1", p1)
    write_log(tmp_path, "p2", p2)
    check_logs(read_logs(tmp_path), [], channels=[("p2", "p1")], app=bank_logs)

    p1[1:2] = [{"kind": "cut", "snapshot_id": "s2", "balance": 100}]  # p1 did cut, yet got the transfer first
    p1.append(p1.pop(1))
    write_log(tmp_path, "p1", p1)
    with pytest.raises(InvariantViolation, match="p2:p1:2 was sent after p2's cut but received before p1's cut"):
        check_logs(read_logs(tmp_path), [], channels=[("p2", "p1")], app=bank_logs)


def extend(logs: dict, node: str, records: list[dict]) -> None:
    for record in records:
        logs[node].append({"node": node, "lsn": logs[node][-1]["lsn"] + 1, **record})


def test_a_snapshot_aborted_at_a_node_before_it_recorded_is_no_inconsistent_cut(logs) -> None:
    """p1 records s2 and pays p2 after its marker; p2 had dropped s2 before any
    marker came, so it never records it: p2 has no cut that the transfer crossed.
    Had p2 recorded s2 after that receive, the cut would be inconsistent."""
    extend(logs, "p1", [
        {"kind": "cut", "snapshot_id": "s2", "balance": 90},
        {"kind": "marker_sent", "snapshot_id": "s2", "src": "p1", "dst": "p2", "seq": 3},
        {"kind": "send", "msg_id": "p1:p2:4", "src": "p1", "dst": "p2", "seq": 4, "amount": 5},
    ])
    honest_p2 = [dict(r) for r in logs["p2"]]
    extend(logs, "p2", [
        {"kind": "abort", "snapshot_id": "s2", "reason": "deadline"},
        {"kind": "marker_recv", "snapshot_id": "s2", "src": "p1", "dst": "p2", "seq": 3},
        {"kind": "recv", "msg_id": "p1:p2:4", "src": "p1", "dst": "p2", "seq": 4, "amount": 5},
    ])
    check_logs(logs, [honest()], channels=CHANNELS, app=bank_logs)
    logs["p2"] = honest_p2
    extend(logs, "p2", [
        {"kind": "recv", "msg_id": "p1:p2:4", "src": "p1", "dst": "p2", "seq": 4, "amount": 5},
        {"kind": "cut", "snapshot_id": "s2", "balance": 105},
    ])
    with pytest.raises(InvariantViolation, match="p1:p2:4 was sent after p1's cut but received before p2's cut"):
        check_logs(logs, [honest()], channels=CHANNELS, app=bank_logs)
