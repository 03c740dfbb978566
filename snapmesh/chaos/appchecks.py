"""The verdicts on a campaign that ran an app (`snapmesh chaos --app kvshard`).

The bank's checks that are not about money stand as they are (every snapshot
known and finished, every COMPLETE snapshot consistent with the logs, every
restart clean). The money check is the bank's and is left out: an app's
verdicts speak of its own invariants, not money. The per-message check counts
messages by msg_id and compares their bytes. Added: every COMPLETE snapshot's invariants hold (the controller's
verdict, and checked again here over the snapshot's states and in-flight
payloads, whose bytes are held against the logs; Spark's reconciliation
checks msg ids and seqs, not payloads), and, once the faults
stopped and the cluster settled, a snapshot whose invariants hold; for
kvshard, its keys against what the client was told: none lost, none doubled.
"""

from __future__ import annotations

from snapmesh.services.app.drive import snapshot_problems
from snapmesh.chaos import appmode
from snapmesh.chaos.campaign import Outcome
from snapmesh.chaos.checks import Check, restarts, snapshot_ids, spark_reconcile
from snapmesh.checking.logcheck import InvariantViolation, check_logs
import snapmesh.bank.logs as bank_logs
from snapmesh.bank.logs import money_check
from snapmesh.v1 import snapmesh_pb2 as pb


def app_checks(outcome: Outcome, *, reconcile: bool = True) -> list[Check]:
    # No money row: an app speaks of its own invariants (_invariants), never of the bank's money.
    result: list[Check] = [_messages(outcome)]
    result.append(snapshot_ids(outcome))
    complete = [s for s in outcome.snapshots.values() if s.status == pb.Snapshot.COMPLETE]
    result.append(_consistency(outcome, complete, reconcile))
    result.append(_invariants(outcome, complete))
    result.append(_settled(outcome))
    result.append(restarts(outcome))
    return result


def _consistency(outcome: Outcome, complete: list[pb.Snapshot], reconcile: bool) -> Check:
    name = "every COMPLETE snapshot is consistent with the logs"
    logs, recorded = appmode.unit_logs(outcome.logs, complete)
    try:
        check_logs(logs, recorded, channels=outcome.channels, total=appmode.UNITS * len(logs), app=bank_logs)
    except InvariantViolation as violation:
        return name, False, str(violation).splitlines()[0]
    if wrong := appmode.snapshot_against_logs(outcome.logs, complete, outcome.channels):
        return name, False, "; ".join(wrong[:3]) + (f" ... {len(wrong)} in all" if len(wrong) > 3 else "")
    detail = (f"{len(complete)} COMPLETE snapshots against the logs: in-flight lists, markers, messages sent = "
              "received + in flight, payloads and state digests (each message counted as one unit)")
    if not reconcile:
        return name, True, detail + "; Spark reconciliation skipped"
    if problem := spark_reconcile(outcome):
        return name, False, problem
    return name, True, detail + "; snapmesh reconcile (msg ids and seqs; it reads no payloads yet): exit 0"


def _messages(outcome: Outcome) -> Check:
    try:
        report = money_check(outcome.logs)  # by msg_id: sends against receives (the amounts are all 0)
    except AssertionError as exc:
        return "every message sent is received exactly once", False, str(exc)
    bad = {k: report[k] for k in ("duplicated", "phantom", "unreceived") if report[k]}
    if other := appmode.payload_mismatches(outcome.logs):
        bad["received other bytes than sent"] = other
    runs = appmode.command_runs(outcome.logs, [rid for rid, _ in outcome.retries])
    wrong = [f"{rid} ran {runs[rid]} times" for rid, how in outcome.retries if runs[rid] != (how == "answered")]
    detail = f"{len(report['sends'])} messages, each received once with its bytes; " \
             f"{len(outcome.retries)} commands retried across a kill, each run once"
    if bad:
        detail = "; ".join(f"{k}: {len(v)} e.g. {v[:3]}" for k, v in bad.items())
    if outcome.settle_error:
        detail += f"; {outcome.settle_error}"
    if wrong:
        detail += f"; retried commands: {wrong[:3]}"
    return "every message sent is received exactly once", not bad and not wrong, detail


def _invariants(outcome: Outcome, complete: list[pb.Snapshot]) -> Check:
    problems = [p for snap in complete for p in snapshot_problems(outcome.app, snap)]
    names = ", ".join(outcome.app.invariants) or "none"
    detail = f"{len(complete)} COMPLETE snapshots, each CHECKED by the controller and checked again: {names}"
    if problems:
        detail = "; ".join(problems[:3]) + (f" ... {len(problems)} in all" if len(problems) > 3 else "")
    return "every COMPLETE snapshot's app invariants hold", bool(complete) and not problems, detail


def _settled(outcome: Outcome) -> Check:
    snap = outcome.settled
    if outcome.keys is None:
        name = "once settled, a COMPLETE snapshot's invariants hold"
    else:
        name = "once settled, every key exactly once: 0 keys lost or duplicated"
    if snap is None:
        return name, False, "no COMPLETE snapshot once the faults stopped and every send was received"
    problems = snapshot_problems(outcome.app, snap)
    if outcome.keys is None:
        return name, not problems, "; ".join(problems[:3]) or f"{snap.snapshot_id}: every invariant holds"
    k = outcome.keys.against(snap)
    detail = (f"{snap.snapshot_id}: {k['found']} keys found, {k['live']} live by the client's replies "
              f"({k['created']} created, {k['deleted']} deleted, {k['unknown']} unknown outcome); the snapshot's "
              f"own count: {k['snapshot_live']} live of {k['snapshot_created']} created")
    wrong = {w: k[w] for w in ("lost", "duplicated", "stray") if k[w]}
    counts_differ = k["snapshot_live"] != k["found"] or (not k["unknown"] and k["found"] != k["live"])
    if wrong or problems or counts_differ:
        detail = "; ".join([*problems[:3], *(f"{w}: {len(v)} e.g. {v[:3]}" for w, v in wrong.items()), detail])
    return name, not (wrong or problems or counts_differ), detail
