"""The path after the cut, hop by hop, as the bench reads it: `snapmesh_snapshot_hop_seconds`
from every node and the controller (snapmesh/protocol/hops.py, docs/metrics.md), read
before and after the snapshots of a phase.

Each hop's histogram is summed over the nodes (a sum of histograms with the same
buckets is the histogram of all their observations), and its p99 over what was
observed between the two reads is the bound of the bucket that holds it
(`bench.utilisation.bucket_p99`): at most that, and neighbouring bounds are at most 2.5x apart.
Keys: `hop_p99_ms_<hop>` for each hop of `HOPS`, in path order, with the phase's
suffix (`_8n_util50_<mode>`, `_8n_hosts_5ms_<mode>`, ...) appended by the phase.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bench.utilisation import bucket_p99
from snapmesh.checking.scrape import samples
from snapmesh.protocol.hops import PATH

HOPS = (*PATH, "answered")  # the path in order, then the node's round trip over received + journaled
METRIC = "snapmesh_snapshot_hop_seconds_bucket"
SUM = "snapmesh_snapshot_hop_seconds_sum"
FIGURES = tuple(f"hop_p99_ms_{hop}" for hop in HOPS)


@dataclass(frozen=True)
class HopRead:
    """Each hop's cumulative observations per bucket bound (inf the last), summed over the processes read."""

    buckets: dict[str, dict[float, float]]
    sums: dict[str, float] | None = None  # each hop's seconds observed in all, summed over the processes read


def read_hops(metrics_addresses: Iterable[str]) -> HopRead:
    """The hops at one moment, from the metrics endpoints of the nodes and the controller."""
    buckets: dict[str, dict[float, float]] = {hop: {} for hop in HOPS}
    sums = dict.fromkeys(HOPS, 0.0)
    for address in metrics_addresses:
        for sample in samples(address):
            if sample.name == METRIC and sample.labels.get("hop") in buckets:
                le = float(sample.labels["le"])
                per = buckets[sample.labels["hop"]]
                per[le] = per.get(le, 0.0) + sample.value
            elif sample.name == SUM and sample.labels.get("hop") in sums:
                sums[sample.labels["hop"]] += sample.value
    return HopRead(buckets, sums)


def addresses(cluster) -> list[str]:
    """A supervisor cluster's metrics endpoints, every node's then the controller's (on hosts: each host's address)."""
    hosts = cluster.hosts

    def node(node_id: str) -> str:
        config = cluster.config.node(node_id)
        return f"{hosts[node_id].address}:{config.metrics_port}" if node_id in hosts else config.metrics_address

    return [*map(node, cluster.node_ids), cluster.controller_metrics_address]


def hop_figures(before: HopRead, after: HopRead) -> dict[str, float]:
    """Each hop's p99 (ms, a bucket bound) over what was observed between two reads (nan: nothing)."""
    return {f"hop_p99_ms_{hop}": bucket_p99(before.buckets.get(hop, {}), after.buckets.get(hop, {})) * 1e3
            for hop in HOPS}


def hop_means(before: HopRead, after: HopRead) -> dict[str, float]:
    """Each hop's mean (ms) over what was observed between two reads (nan: nothing), in path order:
    where a snapshot's time goes on average, which a bucket-bound p99 is too coarse to split."""
    means = {}
    for hop in HOPS:
        count = after.buckets[hop].get(float("inf"), 0.0) - before.buckets[hop].get(float("inf"), 0.0)
        total = (after.sums or {}).get(hop, 0.0) - (before.sums or {}).get(hop, 0.0)
        means[hop] = total / count * 1e3 if count > 0 else float("nan")
    return means


def line(figures: dict[str, float], suffix: str = "") -> str:
    """One progress line: each hop's p99 in path order."""
    return "hops p99 <= " + ", ".join(f"{hop} {figures[f'hop_p99_ms_{hop}{suffix}']:.1f}" for hop in HOPS) + " ms"
