"""What the controller measures, decided: its metrics (names, help, labels and
buckets: docs/metrics.md) and what each effect, refusal and journal round moves.

The shell (services/controller/metrics.py) registers `METRICS` with Prometheus
and applies the `Measure`s that `of`, `refused`, `loaded`, `journal_round` and
`journal_wait` return. Nothing here imports Prometheus, so the table is checked
against the effects without a registry, as `loglines` decides what is said.
Status label values are the API's (Snapshot.Status, Restore.Status names), so a
query and a GetSnapshot answer spell them alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from snapmesh.protocol.controller.effects import Effect, Finished, RestoreDone
from snapmesh.protocol.controller.refusals import StaleReport, TooManySnapshots
from snapmesh.protocol.controller.tracker import COMPLETE, duration_s
from snapmesh.protocol.hops import CONTROLLER_HOPS, HOP_SECONDS
from snapmesh.v1 import snapmesh_pb2 as pb

FINISHED = ("COMPLETE", "FAILED")  # a finished snapshot's status, as the API names it
NODE = "node"  # a label whose values are the cluster's nodes (the shell knows them)

# Flink's checkpoint statistics, one observation per node report (per COMPLETE snapshot below).
SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
COUNTS = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
BYTES = (0, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)
# Finer than the snapshot histograms at the low end: one journal round is an fdatasync (0.1-10 ms).
JOURNAL_WAIT_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
JOURNAL_STEPS = ("trigger", "complete")


@dataclass(frozen=True)
class Metric:
    kind: str  # "counter", "gauge" or "histogram"
    name: str
    doc: str
    label: tuple[str, tuple[str, ...]] | None = None  # its one label, and the values that are series from the start
    buckets: tuple[float, ...] = ()  # a histogram's
    reads: str = ""  # a gauge read from the machine's attribute of that name when scraped
    rises: bool = False  # a gauge set only forward (never back to an older value)


def _per_node(name: str, doc: str, buckets: tuple[float, ...]) -> Metric:
    return Metric("histogram", name, doc, (NODE, ()), buckets)


# Every metric of the controller, by the attribute that holds it.
METRICS = {
    "snapshots": Metric("counter", "snapmesh_snapshots_total", "Finished snapshots by final status", ("status", FINISHED)),
    # The one histogram of a snapshot's duration (0.1.0 also had an end-to-end one
    # measuring the same thing); `status` keeps FAILED ones, which last until the
    # deadline, out of the COMPLETE quantiles.
    "duration": Metric("histogram", "snapmesh_snapshot_duration_seconds",
                       "Per finished snapshot: trigger to COMPLETE (the last report) or FAILED", ("status", FINISHED),
                       (*SECONDS, 30, 60)),
    "in_progress": Metric("gauge", "snapmesh_snapshots_in_progress", "Snapshots started and not yet finished",
                          reads="in_progress"),
    "state_size": Metric("histogram", "snapmesh_snapshot_state_size_bytes", "Per COMPLETE snapshot: bytes of every report",
                         buckets=(100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)),
    "stale_reports": Metric("counter", "snapmesh_stale_epoch_reports_refused_total",
                            "ReportState calls from an epoch before the last restore, refused"),
    "last_complete": Metric("gauge", "snapmesh_last_complete_snapshot_timestamp_seconds",
                            "When the newest COMPLETE snapshot finished (Unix time; 0: none yet)", rises=True),
    "epoch": Metric("gauge", "snapmesh_controller_epoch", "The controller's epoch (one more per restore)", reads="epoch"),
    "restores": Metric("counter", "snapmesh_restores_total", "Finished restores by outcome",
                       ("status", ("RESTORED", "FAILED"))),
    "refused_triggers": Metric("counter", "snapmesh_snapshot_triggers_refused_total",
                               "TriggerSnapshot calls (and periodic ticks) refused at the limit of snapshots in progress"),
    # Per node of a COMPLETE snapshot, from the node's stats (NodeSnapshotStats): PER_NODE says which field.
    "start_delay": _per_node("snapmesh_snapshot_start_delay_seconds", "Per node: trigger to the node's local cut", SECONDS),
    "recording_duration": _per_node("snapmesh_snapshot_recording_duration_seconds",
                                    "Per node: local cut to the last marker in", SECONDS),
    "report_time": _per_node("snapmesh_snapshot_report_time_seconds", "Per node: node done to the report accepted", SECONDS),
    "node_in_flight_messages": _per_node("snapmesh_snapshot_node_in_flight_messages",
                                         "Per node: in-flight transfers recorded", COUNTS),
    "node_in_flight_bytes": _per_node("snapmesh_snapshot_node_in_flight_bytes",
                                      "Per node: bytes of in-flight transfers recorded", BYTES),
    # Two steps of a snapshot wait for the journal: the trigger (StartSnapshot leaves
    # once the Started record is durable) and the completing report (COMPLETE is shown
    # and answered once the report's record and the outcome are). Each should cost one
    # log round: a step's records go into one fdatasync.
    "journal_wait": Metric("histogram", "snapmesh_controller_journal_wait_seconds",
                           "Per step on a snapshot's critical path (trigger, complete): received to its journal records durable",
                           ("step", JOURNAL_STEPS), JOURNAL_WAIT_SECONDS),
    # The controller's hops of a snapshot's path after a node's cut (snapmesh/protocol/hops.py): received and
    # journaled per report, visible per COMPLETE snapshot a trigger waits for. The nodes export theirs by the same name.
    "hop": Metric("histogram", "snapmesh_snapshot_hop_seconds",
                  "One hop of a snapshot's path after a node's cut, at the controller (snapmesh/protocol/hops.py)",
                  ("hop", CONTROLLER_HOPS), HOP_SECONDS),
    "journal_syncs": Metric("counter", "snapmesh_controller_journal_syncs", "fdatasync rounds of the controller's journal"),
    "journal_records": Metric("counter", "snapmesh_controller_journal_records",
                              "Records the controller's journal made durable"),
}

# The per-node histograms: each one's field of NodeSnapshotStats, and what it is divided by (ms to s).
PER_NODE = (
    ("start_delay", "start_delay_ms", 1e3),
    ("recording_duration", "recording_duration_ms", 1e3),
    ("report_time", "report_time_ms", 1e3),
    ("node_in_flight_messages", "in_flight_messages", 1),
    ("node_in_flight_bytes", "in_flight_bytes", 1),
)

REFUSALS = {TooManySnapshots: "refused_triggers", StaleReport: "stale_reports"}  # a refusal's counter


@dataclass(frozen=True)
class Measure:
    """One move of a metric: a counter goes up by `value`, a histogram observes
    it, a gauge is set to it (a `rises` one only if it is more)."""

    metric: str  # its attribute in METRICS
    value: float
    label: str | None = None  # the value of its one label


def of(effect: Effect) -> list[Measure]:
    """What an effect moves as the engine carries it out: a finished snapshot's and a settled restore's."""
    if isinstance(effect, Finished):
        return finished(effect.snapshot)
    if isinstance(effect, RestoreDone):
        return [Measure("restores", 1, "RESTORED" if effect.restore.status == pb.Restore.RESTORED else "FAILED")]
    return []


def finished(snapshot: pb.Snapshot) -> list[Measure]:
    """A snapshot COMPLETE or FAILED: counted and its duration observed, by status;
    a COMPLETE one's statistics too (the per-node ones per report)."""
    status = pb.Snapshot.Status.Name(snapshot.status)
    moved = [Measure("snapshots", 1, status), Measure("duration", duration_s(snapshot), status)]
    if snapshot.status != COMPLETE:
        return moved
    for node in snapshot.stats.nodes:
        moved += [Measure(metric, getattr(node, field) / per, node.node_id) for metric, field, per in PER_NODE]
    return [*moved, Measure("state_size", snapshot.stats.state_size_bytes), *loaded([snapshot])]


def loaded(snapshots: Iterable[pb.Snapshot]) -> list[Measure]:
    """The snapshots a controller starts with: the newest COMPLETE one's finish is the last-COMPLETE time."""
    return [Measure("last_complete", s.finished_at.ToNanoseconds() / 1e9) for s in snapshots if s.status == COMPLETE]


def refused(refusal: Exception) -> list[Measure]:
    """A refusal the machine raised: counted if it is one the metrics count."""
    metric = REFUSALS.get(type(refusal))
    return [] if metric is None else [Measure(metric, 1)]


def journal_round(records: int) -> list[Measure]:
    """One fdatasync round of the journal that made `records` durable."""
    return [Measure("journal_syncs", 1), Measure("journal_records", records)]


def hop(name: str, seconds: float | None) -> list[Measure]:
    """One of CONTROLLER_HOPS took `seconds` (None: not known, nothing observed)."""
    if name not in CONTROLLER_HOPS:
        raise ValueError(f"no controller hop {name!r}: {', '.join(CONTROLLER_HOPS)}")
    return [] if seconds is None else [Measure("hop", max(0.0, seconds), name)]


def journal_wait(step: str, seconds: float) -> list[Measure]:
    """A step on the critical path (JOURNAL_STEPS) waited `seconds` for its records."""
    return [Measure("journal_wait", max(0.0, seconds), step)]
