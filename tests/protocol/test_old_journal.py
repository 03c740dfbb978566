"""An old controller's journal replayed (journal.py `replay`, v1fields.py F5): the
journal commit 2b5e557 wrote for the bank's native nodes (tests/fixtures/data-2b5e557)
holds reports with the balances and amounts in the v1 fields and no state bytes.
Replayed with no snapshot file loaded, each report goes through the bank's adapter
once, and every snapshot it rebuilds is the one that controller filed: COMPLETE,
conserved, the same balances and amounts in flight. The framework maps nothing itself:
a side without an adapter is handed the reports as they were written."""

from __future__ import annotations

import json
from pathlib import Path

from snapmesh.checking import snapshot_file
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller.tracker import COMPLETE, Now, Tracker
from snapmesh.protocol.topology import Topology
from support import bank_reports as bank

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data-2b5e557"
OLD = json.loads((FIXTURE / "fixture.json").read_text())["bank"]
NOW = Now(mono=0.0, wall=1_795_000_000.0)
NODES = ["p1", "p2", "p3"]


def records() -> list[R.Record]:
    found, _, problem = R.decode_all((FIXTURE / "bank" / "controller" / "journal").read_bytes())
    assert problem is None
    return found


def filed(snapshot_id: str):
    path = FIXTURE / "bank" / "controller" / "snapshots" / f"{snapshot_id}.pb"
    snapshot, _ = snapshot_file.read_stored(path)
    return snapshot_file.whole(snapshot, path)


def figures(snapshot) -> tuple:
    return ({n.node_id: n.balance for n in snapshot.nodes},
            {(c.src, c.dst): [(t.seq, t.amount) for t in c.in_flight] for c in snapshot.channels if len(c.in_flight)})


def test_the_old_journal_holds_native_reports():
    reports = [r.state for r in records() if isinstance(r, R.Reported)]
    assert reports and not any(state.HasField("state") for state in reports)


def test_the_bank_journal_of_2b5e557_replays_to_the_snapshots_it_filed():
    machine = M.Controller(bank.tracker(Topology.build(NODES, None), expected_total=OLD["total"], deadline_s=5))
    replayed = machine.replayed(records(), NOW)
    assert (replayed.finished, replayed.warnings) == (OLD["complete"], [])
    for sid in OLD["complete"]:
        snapshot = machine.tracker.get(sid)
        assert snapshot.status == COMPLETE and snapshot.reason == "" and snapshot.app.name == "bank", snapshot.reason
        assert snapshot.conserved and snapshot.total == OLD["total"]
        assert figures(snapshot) == figures(filed(sid))


def test_a_side_without_an_adapter_gets_the_old_reports_as_they_were_written():
    seen = []

    class Watching(AppChecker):
        def part(self, state, items):
            seen.append(state.HasField("state"))
            super().part(state, items)

    tracker = Tracker(topology=Topology.build(NODES, None), deadline_s=5, checker=Watching(bank.SPEC, bank.APP))
    R.replay(records(), tracker, NOW, skip=set())
    assert len(seen) == 9 and not any(seen)
