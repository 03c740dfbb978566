"""The controller's journal hops on a snapshot's critical path, as Prometheus metrics (docs/metrics.md).

Two steps of a snapshot wait for the journal: the trigger (StartSnapshot leaves
once the Started record is durable) and the completing report (COMPLETE is shown
and answered once the report's record and the outcome are). Each should cost one
log round (services/controller/journal.py appends a step's records together):

  snapmesh_controller_journal_wait_seconds{step}  the step received -> its records durable
  snapmesh_controller_journal_syncs_total         fdatasync rounds of the journal
  snapmesh_controller_journal_records_total       records made durable by them

The counts are the journal writer's own (`Journal.syncs`, `Journal.records`),
read when scraped, so its thread touches no metric.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily

STEPS = ("trigger", "complete")
# Finer than the snapshot histograms at the low end: one round is an fdatasync (0.1-10 ms).
WAIT_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def wait_histogram(registry: CollectorRegistry) -> Histogram:
    histogram = Histogram(
        "snapmesh_controller_journal_wait_seconds",
        "Per step on a snapshot's critical path (trigger, complete): received to its journal records durable",
        ["step"], buckets=WAIT_SECONDS, registry=registry,
    )
    for step in STEPS:  # both series exist from the start (0 observations)
        histogram.labels(step=step)
    return histogram


def time_until_durable(histogram: Histogram, step: str, durable: asyncio.Future[None] | None, since_s: float,
                       clock_s: Callable[[], float]) -> None:
    """Observe `step`'s wait once `durable` resolves: `clock_s()` then, less `since_s`
    (a record that could not be made durable is not a wait: the step failed)."""
    if durable is None:
        return

    def settled(future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None:
            histogram.labels(step=step).observe(max(0.0, clock_s() - since_s))

    durable.add_done_callback(settled)


class JournalCounts:
    """A collector of the journal's rounds and records (register it with the controller's registry)."""

    def __init__(self, journal) -> None:
        self.journal = journal

    def describe(self) -> Iterator[CounterMetricFamily]:
        return self._families(0, 0)

    def collect(self) -> Iterator[CounterMetricFamily]:
        return self._families(self.journal.syncs, self.journal.records)

    @staticmethod
    def _families(syncs: int, records: int) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("snapmesh_controller_journal_syncs", "fdatasync rounds of the controller's journal",
                                  value=syncs)
        yield CounterMetricFamily("snapmesh_controller_journal_records",
                                  "Records the controller's journal made durable", value=records)
