"""Reading a snapmesh server's Prometheus endpoint (with prometheus_client's
own parser): for the benchmarks and the tests that count what servers did."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(metrics_address: str, prefix: str = "snapmesh_") -> Iterator[Sample]:
    """Every sample whose name starts with `prefix`, from http://ADDRESS/metrics."""
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                yield sample


def sums(metrics_address: str) -> dict[str, float]:
    """Every snapmesh_* series summed over its labels, by sample name."""
    out: dict[str, float] = {}
    for sample in samples(metrics_address):
        out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def largest(metrics_address: str, name: str) -> float:
    """The largest value of one series over its labels (0 when absent)."""
    return max((s.value for s in samples(metrics_address) if s.name == name), default=0.0)
