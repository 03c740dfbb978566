"""The verdicts on a campaign that ran an app (`snapmesh chaos --app kvshard`).

The app is judged on its own terms, by the checkers' part that knows no app
(`snapmesh.checking.payloads.Payloads`, given the app and its params): what its
logs and snapshots show as bytes, and what its invariants say of each snapshot.
No money, no count standing in for one:

- every message sent is received exactly once: per channel, each message received
  at most once, with the bytes sent, in channel order, none never sent (the log
  checker over the logs alone); none lost once the cluster settled (`Deliveries`);
  each command retried across a kill ran once;
- every COMPLETE snapshot is consistent with the logs (`check_logs_by_epoch`, the
  app's part): each node's recorded state hashes to its cut record's digest, each
  channel's in-flight payloads are exactly the sends before the sender's cut not
  received before the receiver's, one marker each way after the cut, and the app's
  invariants hold on it; then Spark's reconciliation (msg ids and seqs);
- every COMPLETE snapshot's app invariants hold: the controller's verdict, and
  checked again here;
- once the faults stopped and the cluster settled, a snapshot whose invariants
  hold; for kvshard, its keys against what the client was told: none lost, none doubled.

The checks that are the bank's as much as an app's (every snapshot known and
finished, every restart clean) are snapmesh.chaos.checks'.
"""

from __future__ import annotations

from snapmesh.services.app.drive import snapshot_problems
from snapmesh.chaos import appmode
from snapmesh.chaos.campaign import Outcome
from snapmesh.chaos.checks import Check, restarts, snapshot_ids, spark_reconcile
from snapmesh.chaos.deliveries import Deliveries
from snapmesh.checking.logcheck import InvariantViolation, check_logs_by_epoch, split_epochs
from snapmesh.checking.node_logs import LogReadError
from snapmesh.checking.payloads import Payloads
from snapmesh.v1 import snapmesh_pb2 as pb

MESSAGES = "every message sent is received exactly once"
CONSISTENT = "every COMPLETE snapshot is consistent with the logs"


def app_checks(outcome: Outcome, *, reconcile: bool = True) -> list[Check]:
    part = Payloads(outcome.app, outcome.app_params)  # the app's part of the checkers: bytes, and its invariants
    result: list[Check] = [_messages(outcome, part)]
    result.append(snapshot_ids(outcome))
    complete = [s for s in outcome.snapshots.values() if s.status == pb.Snapshot.COMPLETE]
    result.append(_consistency(outcome, part, complete, reconcile))
    result.append(_invariants(outcome, complete))
    result.append(_settled(outcome))
    result.append(restarts(outcome))
    return result


def _consistency(outcome: Outcome, part: Payloads, complete: list[pb.Snapshot], reconcile: bool) -> Check:
    if problems := _logs_problems(outcome, part, complete):
        return CONSISTENT, False, _some(problems)
    names = ", ".join(outcome.app.invariants) or "none"
    detail = (f"{len(complete)} COMPLETE snapshots against the logs: state digests, in-flight payloads, markers, "
              f"and {outcome.app.name}'s invariants ({names})")
    if not reconcile:
        return CONSISTENT, True, detail + "; Spark reconciliation skipped"
    if problem := spark_reconcile(outcome):
        return CONSISTENT, False, problem
    return CONSISTENT, True, detail + "; snapmesh reconcile (msg ids and seqs; it reads no payloads yet): exit 0"


def _messages(outcome: Outcome, part: Payloads) -> Check:
    # The logs alone (no snapshot): the log checker's transport rules, per channel and epoch.
    problems = _logs_problems(outcome, part, [])
    epochs = [logs for _, logs in sorted(split_epochs(outcome.logs, part).items())] or [{}]
    counts = [Deliveries.of(logs) for logs in epochs]
    # Only the last epoch must have received every send: a restore drops what was sent after its cut.
    for i, delivered in enumerate(counts):
        problems += [f"{kind}: {len(ids)} e.g. {ids[:3]}"
                     for kind, ids in delivered.wrong(settled=i == len(counts) - 1).items()]
    runs = appmode.command_runs(outcome.logs, [rid for rid, _ in outcome.retries])
    wrong = [f"{rid} ran {runs[rid]} times" for rid, how in outcome.retries if runs[rid] != (how == "answered")]
    if wrong:
        problems.append(f"retried commands: {wrong[:3]}")
    detail = _some(problems) if problems else (
        f"{sum(c.sent for c in counts)} messages, each received once with its bytes, in channel order; "
        f"{len(outcome.retries)} commands retried across a kill, each run once")
    if outcome.settle_error:
        detail += f"; {outcome.settle_error}"
    return MESSAGES, not problems, detail


def _logs_problems(outcome: Outcome, part: Payloads, complete: list[pb.Snapshot]) -> list[str]:
    """What the log checker, given the app's part, finds wrong with the logs and the `complete` snapshots."""
    try:
        check_logs_by_epoch(outcome.logs, complete, channels=outcome.channels, total=None, app=part)
    except (InvariantViolation, LogReadError) as violation:
        return str(violation).splitlines()
    return []


def _some(problems: list[str]) -> str:
    return "; ".join(problems[:3]) + (f" ... {len(problems)} in all" if len(problems) > 3 else "")


def _invariants(outcome: Outcome, complete: list[pb.Snapshot]) -> Check:
    problems = [p for snap in complete for p in snapshot_problems(outcome.app, snap, outcome.app_params)]
    names = ", ".join(outcome.app.invariants) or "none"
    detail = f"{len(complete)} COMPLETE snapshots, each CHECKED by the controller and checked again: {names}"
    if problems:
        detail = _some(problems)
    return "every COMPLETE snapshot's app invariants hold", bool(complete) and not problems, detail


def _settled(outcome: Outcome) -> Check:
    snap = outcome.settled
    if outcome.keys is None:
        name = "once settled, a COMPLETE snapshot's invariants hold"
    else:
        name = "once settled, every key exactly once: 0 keys lost or duplicated"
    if snap is None:
        return name, False, "no COMPLETE snapshot once the faults stopped and every send was received"
    problems = snapshot_problems(outcome.app, snap, outcome.app_params)
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
