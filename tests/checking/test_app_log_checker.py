"""The checkers on an app's logs with the part that knows no app (snapmesh/checking/payloads.py):
a hand-written two-node run of an app passes, its bytes held against the logs, and
each lie about the bytes is caught, by the log checker and step by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapmesh.checking.logcheck import InvariantViolation, check_logs, check_restore
from snapmesh.checking.node_logs import LogReadError, log_events, read_logs
from snapmesh.app import App
from snapmesh.checking.payloads import PAYLOADS, Payloads, digest
from snapmesh.checking.steps import StepChecker
from snapmesh.protocol.wal import pack
from snapmesh.v1 import snapmesh_pb2 as pb

# b starts s1 while a's message "x" is on the wire: it is in flight on a->b. The lines are an
# app's as its node writes them: payloads and state digests, no figure of any app's.
A = [
    {"kind": "init", "app": "demo", "version": 1, "state": pack(b"a0")},
    {"kind": "send", "msg_id": "a:b:1", "src": "a", "dst": "b", "seq": 1, "payload": pack(b"x")},
    {"kind": "marker_recv", "snapshot_id": "s1", "src": "b", "dst": "a", "seq": 1},
    {"kind": "cut", "snapshot_id": "s1", "digest": digest(b"a1")},
    {"kind": "marker_sent", "snapshot_id": "s1", "src": "a", "dst": "b", "seq": 2},
]
B = [
    {"kind": "init", "app": "demo", "version": 1, "state": pack(b"b0")},
    {"kind": "cut", "snapshot_id": "s1", "digest": digest(b"b0")},
    {"kind": "marker_sent", "snapshot_id": "s1", "src": "b", "dst": "a", "seq": 1},
    {"kind": "recv", "msg_id": "a:b:1", "src": "a", "dst": "b", "seq": 1, "payload": pack(b"x")},
    {"kind": "marker_recv", "snapshot_id": "s1", "src": "a", "dst": "b", "seq": 2},
]
CHANNELS = [("a", "b"), ("b", "a")]


def write_logs(data: Path, a: list[dict] = A, b: list[dict] = B) -> dict:
    for node, records in (("a", a), ("b", b)):
        lines = [json.dumps({"node": node, "lsn": lsn, **r}) for lsn, r in enumerate(records, start=1)]
        (data / f"{node}.log.jsonl").write_text("\n".join(lines) + "\n")
    return read_logs(data)


def snapshot(a_state: bytes = b"a1", in_flight: bytes = b"x") -> pb.Snapshot:
    snap = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE)
    snap.nodes.add(node_id="a", state=a_state)
    snap.nodes.add(node_id="b", state=b"b0")
    snap.channels.add(src="a", dst="b").in_flight.add(msg_id="a:b:1", payload=in_flight, seq=1)
    snap.channels.add(src="b", dst="a")
    return snap


def test_an_apps_honest_run_passes(tmp_path) -> None:
    report = check_logs(write_logs(tmp_path), [snapshot()], channels=CHANNELS, app=PAYLOADS)
    assert report.transfers == 1 and report.snapshots == {"s1": True}


@pytest.mark.parametrize(("lie", "words"), [
    (snapshot(a_state=b"a2"), f"a recorded {digest(b'a2')}, its cut says {digest(b'a1')}"),
    (snapshot(in_flight=b"y"), f"in flight [('a:b:1', '{pack(b'y')}', 1)]"),
])
def test_each_lie_about_the_bytes_is_caught(tmp_path, lie, words) -> None:
    with pytest.raises(InvariantViolation) as info:
        check_logs(write_logs(tmp_path), [lie], channels=CHANNELS, app=PAYLOADS)
    assert words in str(info.value)


# a's send as a command step's first send carries its command (one line), and as nodes wrote it
# before: a `command` record, then the send.
STEP_A = [A[0], {**A[1], "command": pack(b"go"), "reply": pack(b"ok")}, *A[2:]]
OLDER_A = [A[0], {"kind": "command", "command": pack(b"go"), "reply": pack(b"ok")}, *A[1:]]


@pytest.mark.parametrize("lie", [None, snapshot(a_state=b"a2"), snapshot(in_flight=b"y")])
def test_a_cut_is_checked_the_same_with_a_send_carrying_its_command_or_not(tmp_path, lie) -> None:
    verdicts = []
    for shape, a in (("step", STEP_A), ("older", OLDER_A)):
        (tmp_path / shape).mkdir()
        try:
            report = check_logs(write_logs(tmp_path / shape, a=a), [lie or snapshot()], channels=CHANNELS, app=PAYLOADS)
            verdicts.append((report.transfers, report.snapshots))
        except InvariantViolation as exc:
            verdicts.append(str(exc))
    assert verdicts[0] == verdicts[1]
    assert (verdicts[0] == (1, {"s1": True})) == (lie is None)


def test_bytes_changed_in_transit_are_caught_after_the_run_and_step_by_step(tmp_path) -> None:
    changed = [*B[:3], {**B[3], "payload": pack(b"y")}, B[4]]
    logs = write_logs(tmp_path, b=changed)
    with pytest.raises(InvariantViolation, match=f"a:b:1 sent as {pack(b'x')} on a->b, received as {pack(b'y')}"):
        check_logs(logs, [], channels=CHANNELS, app=PAYLOADS)
    at = {(e["node"], e.get("pos")): e for e in log_events(logs, PAYLOADS)}
    happened = [("a", None), ("b", None), ("a", 2), ("b", 2), ("b", 3), ("a", 3), ("a", 4), ("a", 5), ("b", 4)]
    events = [{"event": "channel", "src": s, "dst": d} for s, d in CHANNELS] + [at[key] for key in happened]
    checker = StepChecker(PAYLOADS)
    with pytest.raises(InvariantViolation, match="payload changed in transit"):
        checker.feed_all(events)


def test_an_apps_record_without_its_bytes_is_named(tmp_path) -> None:
    logs = write_logs(tmp_path)
    del logs["a"][1]["payload"]
    with pytest.raises(LogReadError, match=r"^a's log, lsn 2: an app's send record needs a string 'payload'$"):
        log_events(logs, PAYLOADS)


def test_a_restore_sets_the_state_the_snapshot_recorded(tmp_path) -> None:
    restored = [*A, {"kind": "restore", "snapshot_id": "s1", "epoch": 2, "state": pack(b"a1"), "deliveries": 0}]
    replay = {"kind": "replay", "snapshot_id": "s1", "msg_id": "a:b:1", "src": "a", "dst": "b", "seq": 1, "payload": pack(b"x")}
    logs = write_logs(tmp_path, a=restored, b=[*B, {**restored[-1], "state": pack(b"b0"), "deliveries": 1}, replay])
    check_restore(logs, snapshot(), 2, PAYLOADS)
    with pytest.raises(InvariantViolation, match="a restored s1 to state"):
        check_restore(logs, snapshot(a_state=b"a2"), 2, PAYLOADS)


def test_the_apps_invariants_are_held_when_the_app_is_given_or_named(tmp_path) -> None:
    # The honest run breaks this app's rule (a's state never reads a1): bytes alone pass it, the app does not.
    app = App(name="demo", new=lambda info: None,
              invariants={"a moved on": lambda view: ["a holds a1"] if view.states["a"] == b"a1" else []})
    logs = write_logs(tmp_path)
    check_logs(logs, [snapshot()], channels=CHANNELS, app=PAYLOADS)
    with pytest.raises(InvariantViolation, match="^snapshot s1: demo's invariant 'a moved on': a holds a1$"):
        check_logs(logs, [snapshot()], channels=CHANNELS, app=Payloads(app))
    assert Payloads.named("kvshard").app.name == "kvshard"
