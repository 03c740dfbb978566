"""The controller's Prometheus metrics (names and labels: docs/metrics.md).

What moves them is one table each: the machine's effects as the engine carries
them out (`carried_out`), and the refusals it raises (`refused`).

Two steps of a snapshot wait for the journal: the trigger (StartSnapshot leaves
once the Started record is durable) and the completing report (COMPLETE is shown
and answered once the report's record and the outcome are). Each should cost one
log round (services/controller/journal.py: a step's records share one round):

  snapmesh_controller_journal_wait_seconds{step}  the step received -> its records durable
  snapmesh_controller_journal_syncs_total         fdatasync rounds of the journal
  snapmesh_controller_journal_records_total       records made durable by them

The engine observes the wait once the step's records are durable; the journal's
writer task moves the counts after each round (`journal_round`, on the loop).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from snapmesh.protocol.controller import machine as ctl
from snapmesh.protocol.controller.tracker import COMPLETE, duration_s
from snapmesh.serving.metrics import labelled
from snapmesh.v1 import snapmesh_pb2 as pb

FINISHED = ("COMPLETE", "FAILED")  # a finished snapshot's status, as the API names it

# Flink's checkpoint statistics, one observation per node report (per COMPLETE snapshot below).
SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
COUNTS = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
BYTES = (0, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)
# Per node of a COMPLETE snapshot, one histogram with a `node` label: its name, what it
# measures, the field of the node's stats (NodeSnapshotStats) and what it is divided by.
PER_NODE = (
    ("snapmesh_snapshot_start_delay_seconds", "Per node: trigger to the node's local cut", "start_delay_ms", 1e3, SECONDS),
    ("snapmesh_snapshot_recording_duration_seconds", "Per node: local cut to the last marker in",
     "recording_duration_ms", 1e3, SECONDS),
    ("snapmesh_snapshot_report_time_seconds", "Per node: node done to the report accepted", "report_time_ms", 1e3, SECONDS),
    ("snapmesh_snapshot_node_in_flight_messages", "Per node: in-flight transfers recorded", "in_flight_messages", 1, COUNTS),
    ("snapmesh_snapshot_node_in_flight_bytes", "Per node: bytes of in-flight transfers recorded", "in_flight_bytes", 1, BYTES),
)

JOURNAL_STEPS = ("trigger", "complete")
# Finer than the snapshot histograms at the low end: one round is an fdatasync (0.1-10 ms).
JOURNAL_WAIT_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


# Every other metric of the controller: the attribute that holds it, its kind, name and
# help, and its one label with the label's values (a series each from the start) or
# None, then a histogram's buckets. Status label values are the API's
# (Snapshot.Status, Restore.Status names), so a query and a GetSnapshot answer spell them alike.
METRICS = (
    ("snapshots", Counter, "snapmesh_snapshots_total", "Finished snapshots by final status", ("status", FINISHED)),
    # The one histogram of a snapshot's duration (0.1.0 also had an end-to-end one
    # measuring the same thing); `status` keeps FAILED ones, which last until the
    # deadline, out of the COMPLETE quantiles.
    ("duration", Histogram, "snapmesh_snapshot_duration_seconds",
     "Per finished snapshot: trigger to COMPLETE (the last report) or FAILED", ("status", FINISHED), (*SECONDS, 30, 60)),
    ("in_progress", Gauge, "snapmesh_snapshots_in_progress", "Snapshots started and not yet finished", None),
    ("state_size", Histogram, "snapmesh_snapshot_state_size_bytes", "Per COMPLETE snapshot: bytes of every report", None,
     (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)),
    ("stale_reports", Counter, "snapmesh_stale_epoch_reports_refused_total",
     "ReportState calls from an epoch before the last restore, refused", None),
    ("last_complete", Gauge, "snapmesh_last_complete_snapshot_timestamp_seconds",
     "When the newest COMPLETE snapshot finished (Unix time; 0: none yet)", None),
    ("epoch", Gauge, "snapmesh_controller_epoch", "The controller's epoch (one more per restore)", None),
    ("restores", Counter, "snapmesh_restores_total", "Finished restores by outcome", ("status", ("RESTORED", "FAILED"))),
    ("refused_triggers", Counter, "snapmesh_snapshot_triggers_refused_total",
     "TriggerSnapshot calls (and periodic ticks) refused at the limit of snapshots in progress", None),
    # The journal: the trigger's and COMPLETE's hops, and its rounds (moved by `journal_round`).
    ("journal_wait", Histogram, "snapmesh_controller_journal_wait_seconds",
     "Per step on a snapshot's critical path (trigger, complete): received to its journal records durable",
     ("step", JOURNAL_STEPS), JOURNAL_WAIT_SECONDS),
    ("journal_syncs", Counter, "snapmesh_controller_journal_syncs_total", "fdatasync rounds of the controller's journal", None),
    ("journal_records", Counter, "snapmesh_controller_journal_records_total",
     "Records the controller's journal made durable", None),
)


def _declared(registry: CollectorRegistry, kind, name: str, doc: str, label, buckets=None):
    """One row of METRICS, registered (each of its label's values a series from the start)."""
    extra = {} if buckets is None else {"buckets": buckets}
    if label is None:
        return kind(name, doc, registry=registry, **extra)
    return labelled(kind(name, doc, [label[0]], registry=registry, **extra), label[1])


class ControllerMetrics:
    """The controller's metrics (names and labels: docs/metrics.md): METRICS, then one
    histogram per row of PER_NODE, each with a `node` label from the start. Durations in seconds."""

    def __init__(self, registry: CollectorRegistry, nodes: Iterable[str] = ()) -> None:
        nodes = list(nodes)
        for attribute, *row in METRICS:
            setattr(self, attribute, _declared(registry, *row))
        self.per_node = [  # every node's series exists from the start (0 observations)
            (labelled(Histogram(name, doc, ["node"], buckets=buckets, registry=registry), nodes), field, per)
            for name, doc, field, per, buckets in PER_NODE
        ]
        self._last_complete_s = 0.0

    def carried_out(self, effect: ctl.Effect) -> None:
        if isinstance(effect, ctl.Finished):
            self.finished(effect.snapshot)
        elif isinstance(effect, ctl.RestoreDone):
            self.restores.labels(status="RESTORED" if effect.restore.status == pb.Restore.RESTORED else "FAILED").inc()

    def journal_round(self, records: int) -> None:
        """The journal made `records` durable in one fdatasync round (its `on_round`)."""
        self.journal_syncs.inc()
        self.journal_records.inc(records)

    def refused(self, refusal: Exception) -> None:
        counter = {ctl.TooManySnapshots: self.refused_triggers, ctl.StaleReport: self.stale_reports}.get(type(refusal))
        if counter is not None:
            counter.inc()

    def finished(self, snapshot: pb.Snapshot) -> None:
        """A snapshot COMPLETE or FAILED: counted and its duration observed, by status;
        a COMPLETE one's statistics (the per-node ones per report)."""
        status = pb.Snapshot.Status.Name(snapshot.status)
        self.snapshots.labels(status=status).inc()
        self.duration.labels(status=status).observe(duration_s(snapshot))
        if snapshot.status != COMPLETE:
            return
        for node in snapshot.stats.nodes:
            for histogram, field, per in self.per_node:
                histogram.labels(node.node_id).observe(getattr(node, field) / per)
        self.state_size.observe(snapshot.stats.state_size_bytes)
        self.completed_at(snapshot)

    def completed_at(self, snapshot: pb.Snapshot) -> None:
        """Move the last-COMPLETE time forward to `snapshot`'s finish (never back)."""
        finished = snapshot.finished_at.ToNanoseconds() / 1e9
        if finished > self._last_complete_s:
            self._last_complete_s = finished
            self.last_complete.set(finished)
