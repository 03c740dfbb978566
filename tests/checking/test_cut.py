"""snapmesh/checking/cut.py, the one definition of a snapshot consistent with the
logs: pure (the protocol layer's import rule holds for it), and its rules on a
hand-written two-node run, each lie named by the rule it breaks."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.layers import violations

from snapmesh.checking import cut
import snapmesh.bank.cut as bank_cut
from snapmesh.bank import v1records
from snapmesh.protocol import wal
from support.logs import P1, P2

HONEST = dict(nodes=[("p1", 90), ("p2", 100)], channels=[("p1", "p2", [("p1:p2:1", 10, 1)]), ("p2", "p1", [])])


def rules(snapshot: cut.Snapshot, logs: dict | None = None, **options) -> list[str]:
    index = cut.LogIndex.of(logs or {"p1": P1, "p2": P2}, reading=bank_cut.Reading())
    return [p.rule for p in cut.check_snapshot(index, snapshot, markers=True, **options).problems]


def test_cut_is_pure() -> None:
    source = (Path(cut.__file__)).read_text()
    assert violations(source) == []


def test_the_honest_snapshot_breaks_no_rule() -> None:
    index = cut.LogIndex.of({"p1": P1, "p2": P2}, reading=bank_cut.Reading())
    verdict = cut.check_snapshot(index, cut.Snapshot("s1", **HONEST), markers=True)
    assert verdict.problems == [] and verdict.whole.observed == verdict.whole.total == 200
    assert verdict.expected == {("p1", "p2"): [("p1:p2:1", 10, 1)], ("p2", "p1"): []}


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"nodes": [("p1", 91), ("p2", 100)]}, cut.STATE),
        ({"nodes": [("p1", 90)]}, cut.MISSING_NODE),
        ({"nodes": [("p1", 90), ("p2", 100), ("p9", 0)]}, cut.UNKNOWN_NODE),
        ({"channels": [("p1", "p2", []), ("p2", "p1", [])]}, cut.MISSING_IN_FLIGHT),
        ({"channels": [("p1", "p2", [("p1:p2:1", 10, 1), ("p1:p2:3", 5, 3)]), ("p2", "p1", [])]},
         cut.IN_FLIGHT_AFTER_CUT),
        ({"channels": [("p1", "p2", [("p1:p2:1", 11, 1)]), ("p2", "p1", [])]}, cut.IN_FLIGHT_CONTENT),
        ({"channels": [("p1", "p2", [("p1:p2:1", 10, 1)])]}, cut.MISSING_CHANNEL),
    ],
)
def test_each_lie_breaks_its_rule(changes: dict, rule: str) -> None:
    assert rule in rules(cut.Snapshot("s1", **{**HONEST, **changes}))


def test_a_receipt_before_the_receivers_cut_of_a_send_after_the_senders_is_an_orphan() -> None:
    p2 = [P2[0], P2[3], P2[4], P2[5], v1records.Cut(lsn=7, snapshot_id="s1", tally=115)]
    found = rules(cut.Snapshot("s1", nodes=[("p1", 90), ("p2", 115)], channels=HONEST["channels"]),
                  {"p1": P1, "p2": p2})
    assert cut.ORPHAN_RECEIPT in found


def test_a_second_marker_breaks_the_one_marker_rule() -> None:
    p2 = P2 + [wal.MarkerRecv(lsn=7, snapshot_id="s1", src="p1", dst="p2", seq=4)]
    assert cut.MARKERS in rules(cut.Snapshot("s1", **HONEST), {"p1": P1, "p2": p2})


def test_an_epoch_is_a_run_of_its_own_from_its_restore() -> None:
    log = [v1records.Init(lsn=1, tally=100), v1records.Send(lsn=2, msg_id="m", src="a", dst="b", seq=1, tally=7),
           v1records.Restore(lsn=3, snapshot_id="s", epoch=2, tally=90, deliveries=1),
           v1records.Replay(lsn=4, snapshot_id="s", msg_id="r", src="b", dst="a", seq=1, tally=4),
           v1records.Cut(lsn=5, snapshot_id="t", tally=94)]
    bank = bank_cut.Reading()
    assert cut.epoch_logs({"a": log}, 1, bank) == {"a": log[:2]}
    assert cut.epoch_logs({"a": log}, 2, bank) == {"a": [v1records.Init(lsn=3, tally=94), log[4]]}
    assert cut.epoch_logs({"a": log}, 3, bank) == {}
