"""An app campaign's verdicts (snapmesh/chaos/appchecks.py) on a kvshard run written by hand.

Two nodes: p2 starts snapshot s1 while p1's handoff of key p1/a is on the wire, so s1
holds it in flight; after the cut p1 hands off p1/b. The logs are an app's as its
nodes write them (payloads and state digests, no figure of any app's), so the checks
judge kvshard on its own terms, through the checkers' part that knows no app. The
honest run passes; each damage to its logs or its snapshot fails the check that owns
it: a receive duplicated, a message lost, bytes changed in transit, a state that is
not its cut's, and a snapshot consistent with the logs that breaks kvshard's invariant.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from snapmesh.app import load_app
from snapmesh.chaos import checks
from snapmesh.chaos.appchecks import CONSISTENT, MESSAGES, app_checks
from snapmesh.chaos.campaign import Options, Outcome
from snapmesh.checking.payloads import digest
from snapmesh.protocol.wal import pack
from snapmesh.services.app.kvshard import encode
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.timeout(60)

INVARIANTS = "every COMPLETE snapshot's app invariants hold"
KVSHARD = load_app("kvshard")
EMPTY = encode({"keys": {}, "moved": {}, "created": [], "deleted": []})
P1_AT_CUT = encode({"keys": {}, "moved": {"p1/a": "p2"}, "created": ["p1/a"], "deleted": []})
HANDOFF_A = encode({"type": "handoff", "key": "p1/a", "value": 1, "created_at": "p1"})
HANDOFF_B = encode({"type": "handoff", "key": "p1/b", "value": 2, "created_at": "p1"})
CHANNELS = (("p1", "p2"), ("p2", "p1"))


def _log(node: str, *records: dict) -> list[dict]:
    return [{"node": node, "lsn": lsn, **r} for lsn, r in enumerate(records, start=1)]


def _message(kind: str, seq: int, payload: bytes) -> dict:
    return {"kind": kind, "msg_id": f"p1:p2:{seq}", "src": "p1", "dst": "p2", "seq": seq, "payload": pack(payload)}


def _marker(kind: str, src: str, dst: str, seq: int) -> dict:
    return {"kind": kind, "snapshot_id": "s1", "src": src, "dst": dst, "seq": seq}


def _logs(p2_at_cut: bytes = EMPTY) -> dict[str, list[dict]]:
    init = {"kind": "init", "app": "kvshard", "version": 1, "state": pack(EMPTY)}
    p1 = _log("p1", init, _message("send", 1, HANDOFF_A), _marker("marker_recv", "p2", "p1", 1),
              {"kind": "cut", "snapshot_id": "s1", "digest": digest(P1_AT_CUT)}, _marker("marker_sent", "p1", "p2", 2),
              _message("send", 3, HANDOFF_B))
    p2 = _log("p2", init, {"kind": "cut", "snapshot_id": "s1", "digest": digest(p2_at_cut)},
              _marker("marker_sent", "p2", "p1", 1), _message("recv", 1, HANDOFF_A),
              _marker("marker_recv", "p1", "p2", 2), _message("recv", 3, HANDOFF_B))
    return {"p1": p1, "p2": p2}


def _snapshot(p1: bytes = P1_AT_CUT, p2: bytes = EMPTY) -> pb.Snapshot:
    snap = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE, epoch=1)
    snap.nodes.add(node_id="p1", state=p1)
    snap.nodes.add(node_id="p2", state=p2)
    snap.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", payload=HANDOFF_A, seq=1)
    snap.channels.add(src="p2", dst="p1")
    snap.app.status = pb.AppCheck.CHECKED
    snap.app.invariants.add(name="every key exactly once", ok=True)
    return snap


def _outcome(logs: dict[str, list[dict]], snapshot: pb.Snapshot) -> Outcome:
    outcome = Outcome(Options(app="kvshard"), Path("/nonexistent"), CHANNELS, 0, app=KVSHARD)
    outcome.logs, outcome.snapshots, outcome.triggered = logs, {"s1": snapshot}, [("s1", True)]
    return outcome


def _verdicts(outcome: Outcome) -> dict[str, tuple[bool | None, str]]:
    return {name: (ok, detail) for name, ok, detail in app_checks(outcome, reconcile=False)}


def test_the_honest_run_passes_in_the_apps_own_words() -> None:
    outcome = _outcome(_logs(), _snapshot())
    found = _verdicts(outcome)
    for name in (MESSAGES, CONSISTENT, INVARIANTS):
        assert found[name][0], (name, found[name])
    assert found[MESSAGES][1].startswith("2 messages, each received once with its bytes, in channel order")
    assert "kvshard's invariants (every key exactly once)" in found[CONSISTENT][1]
    figures = checks.figures(outcome)
    assert figures["duplicates"] == 0 and figures["money_lost"] is None
    words = f"{found}\n{checks.table(figures)}".lower()
    assert not [w for w in ("money", "balance", "amount", "conserved") if w in words], words


def test_a_duplicated_receive_is_caught() -> None:
    logs = _logs()
    logs["p2"].append({**logs["p2"][-1], "lsn": 7})
    outcome = _outcome(logs, _snapshot())
    passed, detail = _verdicts(outcome)[MESSAGES]
    assert not passed and "transfer p1:p2:3 received twice" in detail and "received twice: 1" in detail, detail
    assert checks.figures(outcome)["duplicates"] == 1


def test_a_lost_message_is_caught_though_every_cut_holds() -> None:
    logs = _logs()
    del logs["p2"][-1]  # p1:p2:3, sent after every cut, never received
    found = _verdicts(_outcome(logs, _snapshot()))
    passed, detail = found[MESSAGES]
    assert not passed and detail == "lost (sent, never received): 1 e.g. ['p1:p2:3']", detail
    assert found[CONSISTENT][0], found[CONSISTENT]  # the loss is after the cut: the snapshot still holds


def test_bytes_changed_in_transit_are_caught() -> None:
    logs = _logs()
    logs["p2"][-1]["payload"] = pack(encode({"type": "update", "key": "p1/b", "value": 3}))
    passed, detail = _verdicts(_outcome(logs, _snapshot()))[MESSAGES]
    assert not passed and f"p1:p2:3 sent as {pack(HANDOFF_B)} on p1->p2, received as" in detail, detail


def test_a_state_that_is_not_its_cuts_is_caught() -> None:
    # Its invariant holds (p1/a is once, in flight): only the digest tells the state is not p1's at its cut.
    lie = encode({"keys": {}, "moved": {}, "created": ["p1/a"], "deleted": []})
    found = _verdicts(_outcome(_logs(), _snapshot(p1=lie)))
    passed, detail = found[CONSISTENT]
    assert not passed and f"p1 recorded {digest(lie)}, its cut says {digest(P1_AT_CUT)}" in detail, detail
    assert found[INVARIANTS][0], found[INVARIANTS]
    assert found[MESSAGES][0], found[MESSAGES]


def test_a_snapshot_true_to_its_logs_still_holds_the_apps_invariant() -> None:
    # p2's cut really recorded p1/a while the handoff was in flight: the logs and the snapshot
    # agree byte for byte, and kvshard's invariant finds the key twice.
    doubled = encode({"keys": {"p1/a": {"value": 1, "created_at": "p1"}}, "moved": {}, "created": [], "deleted": []})
    found = _verdicts(_outcome(_logs(p2_at_cut=doubled), _snapshot(p2=doubled)))
    passed, detail = found[CONSISTENT]
    assert not passed and "kvshard's invariant 'every key exactly once': key p1/a seen 2 times" in detail, detail
    assert "its cut says" not in detail
    assert not found[INVARIANTS][0] and "p1/a seen 2 times" in found[INVARIANTS][1], found[INVARIANTS]



def test_after_a_restore_only_the_last_epoch_must_have_received_every_send() -> None:
    # Both nodes restore s1 (epoch 2): p1:p2:3, sent after p1's cut and not received, is dropped
    # by design. A send of epoch 2 (msg ids start over) that never arrives is lost.
    logs = _logs()
    del logs["p2"][-1]
    for node, state in (("p1", P1_AT_CUT), ("p2", EMPTY)):
        logs[node].append({"node": node, "lsn": len(logs[node]) + 1, "kind": "restore", "snapshot_id": "s1",
                           "epoch": 2, "state": pack(state), "deliveries": 0})
    assert _verdicts(_outcome(logs, _snapshot()))[MESSAGES][0]
    logs["p1"].append({"node": "p1", "lsn": len(logs["p1"]) + 1, **_message("send", 1, HANDOFF_B)})
    passed, detail = _verdicts(_outcome(logs, _snapshot()))[MESSAGES]
    assert not passed and detail == "lost (sent, never received): 1 e.g. ['p1:p2:1']", detail
