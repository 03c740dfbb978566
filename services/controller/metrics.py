"""The controller's Prometheus metrics: `measures.METRICS` registered, and the
`Measure`s the machine's effects, its refusals and the journal's rounds move
(which ones: snapmesh/protocol/controller/measures.py; names and labels:
docs/metrics.md). Durations in seconds."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from snapmesh.protocol.controller import measures
from snapmesh.serving.metrics import labelled

KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


class ControllerMetrics:
    """Every metric of `measures.METRICS`, each of its label's values a series from
    the start (a `node` label's: `nodes`)."""

    def __init__(self, registry: CollectorRegistry, nodes: Iterable[str] = ()) -> None:
        nodes = list(nodes)
        self._metrics = {attribute: _registered(registry, metric, nodes) for attribute, metric in measures.METRICS.items()}
        self._set: dict[str, float] = {}  # a `rises` gauge's value (a Gauge cannot be read back)

    def reading(self, machine: object) -> None:
        """The gauges read from the machine (`reads`) read `machine` when scraped."""
        for attribute, metric in measures.METRICS.items():
            if metric.reads:
                self._metrics[attribute].set_function(lambda name=metric.reads: getattr(machine, name))

    def apply(self, moved: Iterable[measures.Measure]) -> None:
        for measure in moved:
            metric = measures.METRICS[measure.metric]
            series = self._metrics[measure.metric]
            if measure.label is not None:
                series = series.labels(measure.label)
            if metric.kind == "counter":
                series.inc(measure.value)
            elif metric.kind == "histogram":
                series.observe(measure.value)
            elif not metric.rises or measure.value > self._set.get(measure.metric, 0.0):
                self._set[measure.metric] = measure.value
                series.set(measure.value)

    def carried_out(self, effect: object) -> None:
        self.apply(measures.of(effect))  # type: ignore[arg-type]

    def refused(self, refusal: Exception) -> None:
        self.apply(measures.refused(refusal))

    def journal_round(self, records: int) -> None:
        """The journal's writer made `records` durable in one fdatasync round (on the loop)."""
        self.apply(measures.journal_round(records))


def _registered(registry: CollectorRegistry, metric: measures.Metric, nodes: list[str]):
    extra = {"buckets": metric.buckets} if metric.buckets else {}
    if metric.label is None:
        return KINDS[metric.kind](metric.name, metric.doc, registry=registry, **extra)
    name, values = metric.label
    made = KINDS[metric.kind](metric.name, metric.doc, [name], registry=registry, **extra)
    return labelled(made, nodes if name == measures.NODE else values)
