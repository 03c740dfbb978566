"""The bench's results and the table it prints; `percentile`, the one helper
every benchmark computes its percentiles with."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.observe import Window


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0 < q < 100), interpolated between the closest ranks; nan for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    return cuts[round(q * 10) - 1]


def p50_p99(values: list[float], digits: int = 1) -> str:
    if not values:
        return "n/a"
    return f"{percentile(values, 50):.{digits}f} / {percentile(values, 99):.{digits}f}"


@dataclass
class Latency:
    nodes: int
    fraction: float
    client_ms: list[float]
    controller_ms: list[float]
    failed: int
    in_flight: list[int]
    window: Window


@dataclass
class Markers:
    nodes: int
    channels: int
    counts: list[int]  # per COMPLETE snapshot, from the logs
    not_complete: int
    metric_sent: float  # markers_sent_total over the cluster's life
    snapshots_in_logs: int


@dataclass
class Results:
    raw: dict[str, float] = field(default_factory=dict)
    ramp: list[tuple[int, Window]] = field(default_factory=list)
    peak: Window | None = None
    peak_callers: int = 0
    ab: list[tuple[Window, Window]] = field(default_factory=list)
    ab_drain_s: list[float] = field(default_factory=list)
    ab_durations: list[float] = field(default_factory=list)
    ab_in_flight: list[int] = field(default_factory=list)
    ab_failed: int = 0
    ab_running: int = 0
    latency: list[Latency] = field(default_factory=list)
    markers: list[Markers] = field(default_factory=list)
    gen_errors: list[str] = field(default_factory=list)
    window_s: float = 0.0  # one measurement window
    batch: int = 0  # transfers per TransferBatch call


def _row(label: str, figure: str) -> str:
    return f"{label:<62} {figure:>24}".rstrip()


def _cpu_text(cpu: dict[str, float]) -> str:
    return (
        f"nodes {cpu['nodes']:.2f}, controller {cpu['controller']:.2f}, load generator {cpu['loadgen']:.2f}, "
        f"bench {cpu['bench']:.2f}, not ours {cpu['other']:.2f}"
    )


def table(r: Results) -> list[str]:
    peak = r.peak
    raw = r.raw
    rows = [_row("snapmesh on loopback, one run", "figure")]
    rows.append(_row("raw gRPC: one stream, 100 msgs/frame, acked (msgs/s)", f"{raw['stream_batched_per_s']:,.0f}"))
    rows.append(_row("raw gRPC: one stream, 1 msg/frame, acked (msgs/s)", f"{raw['stream_single_per_s']:,.0f}"))
    if "cpu_us_per_frame_acked" in raw:
        rows.append(_row("raw gRPC: CPU per frame and its ack, both processes (µs)",
                         f"{raw['cpu_us_per_frame_acked']:.1f}"))
    rows.append(_row("raw gRPC: unary round trip p50 / p99 (ms)", f"{raw['unary_p50_ms']:.3f} / {raw['unary_p99_ms']:.3f}"))
    rows.append(_row("raw gRPC: unary sequential calls/s", f"{raw['unary_per_s']:,.0f}"))
    a_windows = [a for a, _ in r.ab]
    a_rates = [a.received_per_s for a in a_windows]
    b_rates = [b.received_per_s for _, b in r.ab]
    sustained = statistics.mean(a_rates)
    rows.append(_row("4-node mesh: highest sustained rate (transfers/s, node-counted)", f"{sustained:,.0f}"))
    rows.append(
        _row(
            f"  mean of {len(a_rates)} {r.window_s:g}s windows at {r.peak_callers} callers/node x {r.batch}",
            f"min {min(a_rates):,.0f} max {max(a_rates):,.0f}",
        )
    )
    ramp = " ".join(f"{c}:{w.received_per_s / 1e3:.0f}k" for c, w in r.ramp)
    rows.append(_row("  ramp, callers per node : rate (best window)", f"{ramp} ({peak.received_per_s:,.0f})"))
    rows.append(_row("  / raw batched stream rate", f"{sustained / raw['stream_batched_per_s']:.3f}"))
    rows.append(_row("  / raw unary calls per second", f"{sustained / raw['unary_per_s']:.1f}x"))
    commits = statistics.mean(a.commits_per_s for a in a_windows)
    sent = statistics.mean(a.sent_per_s for a in a_windows)
    rows.append(_row("  log group commits/s, all nodes (transfers sent per commit)", f"{commits:,.0f} ({sent / commits:.0f})"))
    rows.append(_row("  deepest channel outbox seen at window ends (msgs)", f"{max(a.max_unacked for a in a_windows):,.0f}"))
    a_cpu = {k: statistics.mean(a.cpu[k] for a in a_windows) for k in peak.cpu}
    rows.append("    CPU, cores of 2: " + _cpu_text(a_cpu))
    ratio = sum(b_rates) / sum(a_rates)
    rows.append(_row("rate with a snapshot every 100 ms / without (same load)", f"{ratio:.2f}"))
    pairs = " ".join(f"{b / a:.2f}" for a, b in zip(a_rates, b_rates, strict=True))
    rows.append(_row(f"  per A/B pair ({r.window_s:g}s windows, interleaved)", pairs))
    b_cpu = {k: statistics.mean(b.cpu[k] for _, b in r.ab) for k in peak.cpu}
    rows.append("    CPU in B windows: " + _cpu_text(b_cpu))
    n_ab = sum(len(b.snapshots) for _, b in r.ab)
    rows.append(_row("  B snapshots: triggered / failed / unfinished", f"{n_ab} / {r.ab_failed} / {r.ab_running}"))
    rows.append(_row("  B snapshots: controller p50 / p99 (ms)", p50_p99(r.ab_durations, 0)))
    rows.append(_row("  B snapshots: in-flight transfers recorded, p50 / max", p50_max(r.ab_in_flight)))
    drains = " ".join(f"{d:.1f}" for d in r.ab_drain_s)
    rows.append(_row("  controller still busy after each B window (s)", drains))
    for lat in r.latency:
        w = lat.window
        rows.append(
            _row(
                f"snapshot latency, {lat.nodes} nodes, paced at {lat.fraction:.0%} of the ramp's best",
                f"{w.received_per_s:,.0f} transfers/s",
            )
        )
        rows.append(_row("  COMPLETE back to back (not COMPLETE)", f"{len(lat.client_ms)} ({lat.failed})"))
        rows.append(_row("  trigger -> COMPLETE, client, p50 / p99 (ms)", p50_p99(lat.client_ms)))
        rows.append(_row("  started_at -> finished_at, controller, p50 / p99 (ms)", p50_p99(lat.controller_ms)))
        rows.append(_row("  in-flight transfers recorded, p50 / max", p50_max(lat.in_flight)))
        rows.append("    CPU: " + _cpu_text(w.cpu))
    for m in r.markers:
        counts = sorted(set(m.counts))
        figure = "/".join(str(c) for c in counts) or "n/a"
        verdict = "equal" if counts == [m.channels] else "DIFFERENT"
        rows.append(
            _row(
                f"markers per snapshot, {m.nodes} nodes (logs, {len(m.counts)} COMPLETE)",
                f"{figure} vs {m.channels} channels: {verdict}",
            )
        )
        per = m.metric_sent / m.snapshots_in_logs if m.snapshots_in_logs else float("nan")
        rows.append(_row("  markers_sent_total / snapshots seen in the logs", f"{per:.2f}"))
    for error in r.gen_errors:
        rows.append(f"load generator: {error}")
    return rows


def p50_max(values: list[int]) -> str:
    if not values:
        return "n/a"
    return f"{percentile(values, 50):,.0f} / {max(values):,}"
