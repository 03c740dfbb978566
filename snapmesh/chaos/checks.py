"""The verdicts on a finished campaign, and its table of figures.

Every check reads what the run left on disk (the nodes' transfer logs, read
independently of the node's code by snapmesh.checking.node_logs) and what the
controller says; `checks` returns one (name, ok, detail) per line, and the
run passes only if all do.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from snapmesh.chaos.campaign import Outcome
from snapmesh.chaos.deliveries import Deliveries
from snapmesh.checking.logcheck import InvariantViolation, check_logs
import snapmesh.bank.logs as bank_logs
from snapmesh.bank.logs import money_check
from snapmesh.settings.appsettings import PARAMS_ENV
from snapmesh.v1 import snapmesh_pb2 as pb

Check = tuple[str, bool, str]


def checks(outcome: Outcome, *, reconcile: bool = True) -> list[Check]:
    """The bank's verdicts, one (name, ok, detail) each (an app's: snapmesh.chaos.appchecks)."""
    logs = outcome.logs
    try:
        money = money_check(logs)
    except AssertionError as exc:  # a msg_id sent twice
        money = {"error": str(exc), "duplicated": ["?"], "phantom": [], "mismatched": [], "unreceived": [],
                 "balances": {}, "sends": {}}
    balances = money["balances"]
    lost = outcome.total - sum(balances.values())
    result: list[Check] = []

    detail = f"total {outcome.total}, the logs' balances sum to {sum(balances.values())}"
    ok = lost == 0 and balances == outcome.served_balances and not money.get("error")
    if balances != outcome.served_balances:
        detail += f"; the nodes served {outcome.served_balances}, their logs give {balances}"
    result.append(("money is conserved", ok, money.get("error") or detail))

    bad = {k: money[k] for k in ("duplicated", "phantom", "mismatched", "unreceived") if money[k]}
    retried = [(rid, m) for rid, m in outcome.retries if m not in money["sends"]]
    detail = f"{len(money['sends'])} sends, each received once; {len(outcome.retries)} retries answered alike"
    if bad:
        detail = "; ".join(f"{k}: {len(v)} e.g. {v[:3]}" for k, v in bad.items())
    if outcome.settle_error:
        detail += f"; {outcome.settle_error}"
    if retried:
        detail += f"; retried transfers with no send in the logs: {retried[:3]}"
    result.append(("every transfer sent is received exactly once", not bad and not retried, detail))

    result.append(snapshot_ids(outcome))
    result.append(_consistency(outcome, reconcile))

    result.append(restarts(outcome))
    return result


def restarts(outcome: Outcome) -> Check:
    ok = not outcome.problems and outcome.second_instances == Counter(f.kind for f in outcome.faults
                                                                     if not f.skipped)["second_instance"]
    detail = f"{outcome.restarts} restarts, {outcome.second_instances} second instances refused (exit 2)"
    if outcome.problems:
        detail = "; ".join(outcome.problems[:5]) + (f" ... and {len(outcome.problems) - 5} more"
                                                   if len(outcome.problems) > 5 else "")
    return "every restart succeeded and the second instance was refused", ok, detail


def snapshot_ids(outcome: Outcome) -> Check:
    nodes = sorted(outcome.served_balances) or sorted(outcome.logs)
    unknown, stuck, unexplained = [], [], []
    for sid, _ in outcome.triggered:
        snap = outcome.snapshots.get(sid)
        if snap is None:
            unknown.append(sid)
        elif snap.status == pb.Snapshot.FAILED:
            if not any(node in snap.reason for node in nodes):
                unexplained.append(f"{sid}: {snap.reason!r}")
        elif snap.status != pb.Snapshot.COMPLETE:
            stuck.append(sid)
    ok = not (unknown or stuck or unexplained)
    detail = f"{len(outcome.triggered)} triggered, all COMPLETE or FAILED naming the missing nodes"
    if not ok:
        detail = f"unknown to the controller: {unknown[:3]}; stuck: {stuck[:3]}; FAILED without naming nodes: " \
                 f"{unexplained[:3]}"
    return "every triggered snapshot is known, COMPLETE or FAILED with a reason, none stuck", ok, detail


def _consistency(outcome: Outcome, reconcile: bool) -> Check:
    complete = [s for s in outcome.snapshots.values() if s.status == pb.Snapshot.COMPLETE]
    try:
        check_logs(outcome.logs, complete, channels=outcome.channels, total=outcome.total, app=bank_logs)
    except InvariantViolation as violation:
        return "every COMPLETE snapshot is consistent with the logs", False, str(violation).splitlines()[0]
    detail = f"{len(complete)} COMPLETE snapshots against the logs"
    if not reconcile:
        return "every COMPLETE snapshot is consistent with the logs", True, detail + " (Spark reconciliation skipped)"
    problem = spark_reconcile(outcome)
    if problem:
        return "every COMPLETE snapshot is consistent with the logs", False, problem
    return "every COMPLETE snapshot is consistent with the logs", True, detail + "; snapmesh reconcile: exit 0"


def spark_reconcile(outcome: Outcome) -> str:
    """`snapmesh reconcile` on the run's data dir: "" when it exits 0, else what it said last."""
    argv = [sys.executable, "-m", "snapmesh.cli", "reconcile", "--data-dir", str(outcome.data_dir),
            "--out", str(outcome.data_dir.parent / "reconcile")]
    # The cluster file is not in the data dir: the app's params (for the bank, the file's
    # initial_balance) reach reconcile as a deployment's do (snapmesh.reconcile.invariants).
    env = {**os.environ, PARAMS_ENV: json.dumps(outcome.app_params)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return f"snapmesh reconcile exited {done.returncode}: {' | '.join(tail)}"
    return ""


def figures(outcome: Outcome) -> dict[str, Any]:
    applied = [f for f in outcome.faults if not f.skipped]
    statuses = Counter(pb.Snapshot.Status.Name(s.status) for s in outcome.snapshots.values())
    during = [sid for sid, faulty in outcome.triggered if faulty]
    complete_during = sum(1 for sid in during if sid in outcome.snapshots
                          and outcome.snapshots[sid].status == pb.Snapshot.COMPLETE)
    money = _money(outcome) if outcome.app is None else {"lost": None, "duplicates": _duplicates(outcome)}
    recovery = {}
    for kind in sorted({f.kind for f in applied}):
        times = [f.recover_s for f in applied if f.kind == kind and f.recover_s is not None]
        recovery[kind] = {"p50_s": round(statistics.median(times), 3) if times else None,
                          "max_s": max(times) if times else None,
                          "unrecovered": sum(1 for f in applied if f.kind == kind and f.recover_s is None)}
    return {
        "seed": outcome.options.seed,
        "cluster": "compose" if outcome.options.compose else "hosts" if outcome.options.hosts else "local",
        "duration_s": outcome.options.duration,
        "faults_s": max(outcome.options.duration, outcome.faults_s or 0),  # longer when the first round was
        "nodes": outcome.options.nodes,
        "faults": dict(sorted(Counter(f.kind for f in applied).items())),
        "faults_total": len(applied),
        "skipped": dict(Counter(f.kind for f in outcome.faults if f.skipped)),
        "skipped_why": {f.kind: f.skipped for f in outcome.faults if f.skipped},
        "app": outcome.app.name if outcome.app else "bank",
        "mode": outcome.mode,
        "commands" if outcome.app else "transfers": outcome.transfers,
        **({"keys": _keys(outcome)} if outcome.keys is not None else {}),
        **({"in_flight": _in_flight(outcome)} if outcome.app is not None else {}),
        "snapshots": {"COMPLETE": statuses.get("COMPLETE", 0), "FAILED": statuses.get("FAILED", 0),
                      "IN_PROGRESS": statuses.get("IN_PROGRESS", 0)},
        "money_lost": money["lost"],
        "duplicates": money["duplicates"],
        "recovery": recovery,
        "snapshot_success_during_faults": {"triggered": len(during), "complete": complete_during,
                                           "rate": round(complete_during / len(during), 3) if during else None},
        "restarts": outcome.restarts,
        "second_instances_refused": outcome.second_instances,
        "retries": len(outcome.retries),
    }


def _money(outcome: Outcome) -> dict[str, int]:
    try:
        report = money_check(outcome.logs)
    except AssertionError:
        return {"lost": -1, "duplicates": -1}
    return {"lost": outcome.total - sum(report["balances"].values()), "duplicates": len(report["duplicated"])}


def _duplicates(outcome: Outcome) -> int:
    """An app's messages received more than once, by msg id (Deliveries: no money read)."""
    return len(Deliveries.of(outcome.logs).duplicated)


def _in_flight(outcome: Outcome) -> dict[str, int]:
    """An app's COMPLETE snapshots that caught messages in flight, and how many messages."""
    counts = [sum(len(c.in_flight) for c in s.channels) for s in outcome.snapshots.values()
              if s.status == pb.Snapshot.COMPLETE]
    return {"snapshots": sum(1 for n in counts if n), "messages": sum(counts)}


def _keys(outcome: Outcome) -> dict[str, Any]:
    """kvshard: the settled snapshot's keys against the client's tally (lost and duplicated as counts)."""
    if outcome.settled is None:
        return {"lost": None, "duplicated": None}
    found = outcome.keys.against(outcome.settled)
    return {**found, **{k: len(found[k]) for k in ("lost", "duplicated", "stray")}}


def table(fig: dict[str, Any]) -> str:
    rows = [("faults injected", f"{fig['faults_total']} in {fig['faults_s']:g} s (seed {fig['seed']}, "
                                   f"{fig.get('cluster', 'local')})")]
    rows += [(f"  {kind}", str(count)) for kind, count in fig["faults"].items()]
    rows += [(f"  {kind}", f"skipped: {reason}") for kind, reason in fig["skipped_why"].items()]
    kind = "transfers" if "transfers" in fig else "commands"
    t = fig[kind]
    rows.append((f"{kind} ok / refused / failed", f"{t.get('ok', 0)} / {t.get('refused', 0)} / {t.get('failed', 0)}"))
    s = fig["snapshots"]
    rows.append(("snapshots COMPLETE / FAILED", f"{s['COMPLETE']} / {s['FAILED']}"))
    if fig["money_lost"] is not None:  # None: an app that holds no money, which is not spoken of
        rows.append(("money lost", str(fig["money_lost"])))
    if "keys" in fig:
        k = fig["keys"]
        rows.append(("keys created / deleted / live", f"{k.get('created')} / {k.get('deleted')} / {k.get('live')} "
                                                       f"(the settled snapshot holds {k.get('found')})"))
        rows.append(("keys lost / duplicated", f"{k['lost']} / {k['duplicated']}"))
    if "in_flight" in fig:
        rows.append(("snapshots with messages in flight", f"{fig['in_flight']['snapshots']} "
                                                          f"({fig['in_flight']['messages']} messages)"))
    rows.append(("duplicates", str(fig["duplicates"])))
    rows.append(("time to recover (p50 / max)", ""))
    for kind, r in fig["recovery"].items():
        text = "-" if r["p50_s"] is None else f"{r['p50_s']:.2f} s / {r['max_s']:.2f} s"
        rows.append((f"  {kind}", text + (f" ({r['unrecovered']} never)" if r["unrecovered"] else "")))
    d = fig["snapshot_success_during_faults"]
    rate = "-" if d["rate"] is None else f"{100 * d['rate']:.1f}% ({d['complete']} of {d['triggered']})"
    rows.append(("snapshot success rate while faults run", rate))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def write_json(path: Path, fig: dict[str, Any], results: list[Check], replay: str) -> None:
    document = {**fig, "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in results], "replay": replay}
    Path(path).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
