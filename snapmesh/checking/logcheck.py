"""The checks of a run: a trace, or real nodes' logs against their snapshots.

- `trace.check_trace(events)` and `steps.StepChecker`: a list of
  trace events (a simulator's, or `node_logs.log_events` of real logs), after the
  run or step by step.
- `check_logs(logs, snapshots, channels=..., app=...)`: the nodes' transfer logs (read
  with `node_logs.read_logs`) against the COMPLETE snapshots the cluster produced. It
  runs `check_trace` on the logs (every snapshot id in them, finished or not, for
  safety) and asks `cut.check_snapshot`, the one definition of a snapshot
  consistent with the logs, about each COMPLETE snapshot: each recorded state is
  what the node's `cut` and its log before the cut give; each channel's in-flight
  list is exactly the sends before the sender's cut minus the receives before the
  receiver's cut, in seq order, with their contents and seqs; one marker per channel
  each way, sent after the cut; and the app's whole-snapshot rules hold.
- `app` is the app's part of the checkers, which its caller hands in: how it reads
  its logs and the snapshots it recorded, what its states and contents are, what
  a restore sets (the bank's is snapmesh/bank/logs.py, which reads its old native
  logs and the bank app's bytes alike).
- Across restores: `check_logs_by_epoch` (each epoch on its own) and
  `check_restore` (the restore records themselves).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from snapmesh.checking import cut
from snapmesh.checking.node_logs import log_events
from snapmesh.checking.trace import Channel, Event, InvariantViolation, Report, _name, check_trace

__all__ = [
    "InvariantViolation", "RecordedSnapshot", "Report", "check_logs",
    "check_logs_by_epoch", "check_restore", "restores_in_logs", "split_epochs",
]

# ------------------------------------------------------------ real node logs


@dataclass(frozen=True, slots=True)
class RecordedSnapshot:
    """What a COMPLETE snapshot recorded, independent of how it was delivered (the
    app's part reads its own snapshots into one: `app.recorded(snapshot)`)."""

    snapshot_id: str
    states: dict[str, Any]  # node -> the state it recorded, as the app's reading reads it
    in_flight: dict[Channel, list[tuple[str, Any, int]]]  # (msg_id, content, seq), in order


def recorded(snapshot: Any, app: Any) -> RecordedSnapshot:
    """`snapshot` as a RecordedSnapshot: one already, or the app's own (`app.recorded`: its
    (snapshot_id, states, in_flight))."""
    return snapshot if isinstance(snapshot, RecordedSnapshot) else RecordedSnapshot(*app.recorded(snapshot))


def check_logs(
    logs: Mapping[str, list[Mapping[str, Any]]],
    snapshots: Iterable[RecordedSnapshot | Any],
    *,
    channels: Iterable[Channel],
    app: Any,
    total: Any = None,
) -> Report:
    """Check real node logs and the COMPLETE `snapshots` taken while they were
    written (RecordedSnapshot, or the app's own). `channels`: the topology. `app`:
    the app's part (`read`, `recorded`, `snapshot_problems`, `trace`, `reading`, `initial_total`,
    `whole_problems`, and `value` and the keys for `node_logs.log_events`); `total`
    defaults to its `initial_total(logs)`. Read the logs at rest (no transfer being
    made), or a receive may outrun the send read before it."""
    channels = list(channels)
    logs = app.read(logs)
    problems: list[str] = []
    snaps = []
    for snapshot in snapshots:
        if not isinstance(snapshot, RecordedSnapshot):
            problems += app.snapshot_problems(snapshot)  # the app's own rules over what it recorded
        snaps.append(recorded(snapshot, app))
    events: list[Event] = [{"event": "channel", "src": s, "dst": d} for s, d in channels]
    events += log_events(logs, app)
    for snap in snaps:
        events += [
            {"event": "channel_recorded", "snapshot": snap.snapshot_id, "src": c[0], "dst": c[1],
             "msgs": [m for m, _, _ in items], app.contents_key: [a for _, a, _ in items]}
            for c, items in snap.in_flight.items()
        ]
        events += [{"event": "completed", "node": n, "snapshot": snap.snapshot_id} for n in snap.states]
    try:
        report = check_trace(events, app=app.trace, require_complete=False)
    except InvariantViolation as violation:
        problems += str(violation).splitlines()
        report = Report()
    expected_total = app.initial_total(logs) if total is None else total
    reading = app.reading(expected_total)
    older = getattr(reading, "older", None)  # the app's decoder of its old logs' lines, if it has one
    index = cut.LogIndex.of(
        {node: [cut.record(r, node, older) for r in records] for node, records in logs.items()} if snaps else {},
        snapshot_ids=[snap.snapshot_id for snap in snaps],
        reading=reading,
    )
    for snap in snaps:
        problems += _snapshot_against_logs(snap, index, channels, expected_total, app)
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise InvariantViolation("\n".join(shown))
    return report


def _snapshot_against_logs(
    snap: RecordedSnapshot, index: cut.LogIndex, channels: list[Channel], total: Any, app: Any,
) -> list[str]:
    """`cut.check_snapshot`'s problems in this checker's words (the tests and the
    chaos campaign read them): the nodes first, and only when they hold, the channels."""
    sid = snap.snapshot_id
    listed = cut.Snapshot(
        snapshot_id=sid,
        nodes=list(snap.states.items()),
        channels=[(src, dst, items) for (src, dst), items in snap.in_flight.items()],
    )
    verdict = cut.check_snapshot(index, listed, topology=channels, markers=True)
    rules = {problem.rule for problem in verdict.problems}
    p: list[str] = []
    say = p.append
    if rules & {cut.MISSING_NODE, cut.UNKNOWN_NODE}:
        say(f"snapshot {sid}: records nodes {sorted(snap.states)}, the logs are of {sorted(index.nodes)}")
    if rules & {cut.MISSING_CHANNEL, cut.UNKNOWN_CHANNEL}:
        say(f"snapshot {sid}: records channels {sorted(snap.in_flight)}, the topology has {sorted(channels)}")
    for node in sorted(index.nodes):
        state = index.cut(sid, node)
        if state is None:
            say(f"snapshot {sid}: no cut record in {node}'s log")
        elif any(q.rule in (cut.STATE, *index.reading.node_rules) and q.args[0] == node for q in verdict.problems):
            say(f"snapshot {sid}: {node} recorded {snap.states.get(node)}, its cut says {index.reading.said(state.record)}, "
                f"its log before the cut gives {index.reading.state(node, state)}")
    if p:
        return p

    for src, dst in channels:
        channel = _name((src, dst))
        expected = verdict.expected.get((src, dst), [])
        got = snap.in_flight.get((src, dst), [])
        if got != expected:
            say(f"snapshot {sid}: {channel} in flight {got}; sent before {src}'s cut and not received before "
                f"{dst}'s cut: {expected}")
        for problem in verdict.problems:
            if problem.args[:2] != (src, dst):
                continue
            if problem.rule == cut.MARKERS:
                say(f"snapshot {sid}: {channel} carried {problem.args[2]} markers out and {problem.args[3]} in, "
                    "expected one")
            elif problem.rule == cut.MARKER_BEFORE_CUT:
                say(f"snapshot {sid}: {src} sent the marker on {channel} before its cut")
    p += app.whole_problems(sid, rules, verdict.whole, total)
    return p


# ------------------------------------------------------------ across epochs (restores)


def split_epochs(
    logs: Mapping[str, list[Mapping[str, Any]]], app: Any,
) -> dict[int, dict[str, list[Mapping[str, Any]]]]:
    """Each node's log cut at its `restore` records: {epoch: {node: records}}.
    Epoch 1 is the log up to the first restore; epoch E starts at the (last)
    restore record of E, as an `init` holding the state after the restore
    (`app.opening` and `app.with_replay`), so each epoch is checked as a run
    of its own (msg ids and seqs start over in every epoch)."""
    logs = app.read(logs)
    by_epoch: dict[int, dict[str, list[Mapping[str, Any]]]] = defaultdict(dict)
    for node, records in logs.items():
        epoch, current = 1, []
        by_epoch[1][node] = current
        for r in records:
            kind = r.get("kind")
            if kind == "restore":
                epoch = r["epoch"]
                current = [app.opening(node, r)]
                by_epoch[epoch][node] = current  # a restore redone after a crash replaces the cut-short one
            elif kind == "replay":
                current[0] = app.with_replay(current[0], r)
            else:
                current.append(r)
    return dict(by_epoch)


def restores_in_logs(logs: Mapping[str, list[Mapping[str, Any]]]) -> dict[int, dict[str, tuple[Mapping, list]]]:
    """{epoch: {node: (its last restore record of that epoch, the replays after it)}}."""
    found: dict[int, dict[str, tuple[Mapping, list]]] = defaultdict(dict)
    for node, records in logs.items():
        replays: list | None = None
        for r in records:
            if r.get("kind") == "restore":
                replays = []
                found[r["epoch"]][node] = (r, replays)
            elif r.get("kind") == "replay" and replays is not None:
                replays.append(r)
    return dict(found)


def check_restore(
    logs: Mapping[str, list[Mapping[str, Any]]], snapshot: RecordedSnapshot | Any, epoch: int, app: Any,
) -> None:
    """The restore itself: in `epoch` every node's log sets the snapshot's
    recorded state and then replays, per channel in channel order, exactly
    the transfers the snapshot recorded in flight towards it."""
    logs = app.read(logs)
    snap = recorded(snapshot, app)
    found = restores_in_logs(logs).get(epoch, {})
    problems = []
    for node, state in snap.states.items():
        if node not in found:
            problems.append(f"restore of {snap.snapshot_id} in epoch {epoch}: no restore record in {node}'s log")
            continue
        record, replays = found[node]
        problems += app.restore_problems(epoch, node, record, snap.snapshot_id, state)
        for (src, dst), items in snap.in_flight.items():
            if dst != node:
                continue
            got = [app.replayed_item(r) for r in replays if r["src"] == src]
            if got != list(items):
                problems.append(f"epoch {epoch}: {src}->{node} replayed {got}, the snapshot holds {items}")
        if len(replays) != record["deliveries"]:
            problems.append(f"epoch {epoch}: {node} announced {record['deliveries']} replays and logged {len(replays)}")
    if problems:
        raise InvariantViolation("\n".join(problems))


def check_logs_by_epoch(
    logs: Mapping[str, list[Mapping[str, Any]]],
    snapshots: Iterable[Any],
    *,
    channels: Iterable[Channel],
    total: Any,
    app: Any,
) -> dict[int, Report]:
    """`check_logs` on each epoch on its own: every COMPLETE controller
    Snapshot against the log of the epoch it was taken in (`Snapshot.epoch`)."""
    channels = list(channels)
    snapshots = list(snapshots)
    reports = {}
    for epoch, epoch_logs in sorted(split_epochs(logs, app).items()):
        if set(epoch_logs) != set(logs):  # a restore some node never took (FAILED): nothing to check there
            continue
        taken = [s for s in snapshots if (s.epoch or 1) == epoch]
        reports[epoch] = check_logs(epoch_logs, taken, channels=channels, total=total, app=app)
    return reports
