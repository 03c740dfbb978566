"""What the phases of `bench.phases` are made of: their settings, the run they share,
the registry `@phase` fills, and the measuring steps several phases take.

Its own module so that phases may live in more than one module (`bench.phases`,
`bench.util_phase`) and register here without importing each other.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.calls import paced_callers
from bench.lab import p99
from bench.observe import Window, busy_fraction
from bench.report import Latency, Results, p50_p99
from bench.utilisation import wait_figures

@dataclass(frozen=True)
class Settings:
    """How long and how hard each phase measures."""

    ramp_callers: tuple[int, ...]  # concurrent callers per node, in ramp order
    window_s: float  # one measurement window
    ab_pairs: int  # A (no snapshots) / B (a snapshot every 100 ms) window pairs
    latency_snapshots: int  # per cluster size and load, back to back with wait=true
    latency_cap_s: float  # ... or fewer, if they take longer than this in all
    drain_cap_s: float  # longest wait for the controller to go idle after a B window
    ramp_growth: float = 1.05  # a step that beats the best so far by less than 5% does not count as growth
    ramp_patience: int = 2  # the ramp ends after this many steps in a row without growth
    settle_s: float = 1.5  # after a load change, before a window opens
    snapshot_every_s: float = 0.1
    latency_fractions: tuple[float, ...] = (0.25, 0.5)  # paced load, as fractions of the 4-node peak
    node_rtt_calls: int = 100
    node_rtt_gap_s: float = 0.01
    large_mesh: int = 32  # nodes of the light-load latency phase (0: skip it)
    startup_timeout: float | None = None  # None: the supervisor's
    util_search_steps: int = 5  # windows the pace search may take per target
    eight_nodes: tuple | None = None  # the paced 8-node meshes (fraction, mode, mark) to run (None: all of them)
    util_variants: tuple | None = None  # util8's (mode, broadcast) meshes to run (None: all of them)



@dataclass
class Run:
    """One run of a phase set: what its phases share."""

    settings: Settings
    lab: Any  # bench.lab.Lab, or a test's stand-in
    say: Callable[[str], None]
    out: dict[str, float] = field(default_factory=dict)  # bench/results.json keys
    results: Results = field(default_factory=Results)  # the cluster table
    peak_rate: float | None = None  # the 4-node peak (transfers/s): the ramp's best window
    status: int = 0  # the bench's exit status

    @property
    def peak(self) -> float:
        if self.peak_rate is None:
            raise RuntimeError("this phase paces at a fraction of the 4-node peak: run the ramp or give --peak")
        return self.peak_rate


@dataclass(frozen=True)
class Phase:
    name: str
    keys: tuple[str, ...]  # the bench/results.json keys it writes (when it completes)
    run: Callable[[Run], None]


PHASES: dict[str, Phase] = {}


def phase(name: str, keys: tuple[str, ...] = ()) -> Callable[[Callable[[Run], None]], Callable[[Run], None]]:
    def register(fn: Callable[[Run], None]) -> Callable[[Run], None]:
        PHASES[name] = Phase(name, tuple(keys), fn)
        return fn

    return register


# ------------------------------------------------------------------ steps shared by phases


def ramp(run: Run, mesh, log: str = "") -> None:
    """More concurrent callers (closed loop) until the achieved rate stops growing;
    the best window is the 4-node peak."""
    s, r = run.settings, run.results
    best, flat = 0.0, 0
    for callers in s.ramp_callers:
        mesh.load(callers, settle_s=s.settle_s)
        window = mesh.window(s.window_s)
        r.ramp.append((callers, window))
        run.say(f"  ramp{log}: {callers} callers/node -> {window.received_per_s:,.0f} transfers/s, "
                f"{window.cpu_us_per_transfer:.1f} µs CPU per transfer ({window.machine_cores:.2f} cores busy)")
        if r.peak is None or window.received_per_s > r.peak.received_per_s:
            r.peak, r.peak_callers = window, callers
        if window.received_per_s < best * s.ramp_growth:
            flat += 1
            if flat == s.ramp_patience:
                break  # stopped growing
        else:
            flat = 0
        best = max(best, window.received_per_s)
    run.peak_rate = r.peak.received_per_s


@dataclass
class AB:
    pairs: list[tuple[Window, Window]]
    drain_s: list[float]
    durations: list[float]  # controller-side, of the B snapshots that completed
    in_flight: list[int]
    failed: int
    running: int

    @property
    def ratio(self) -> float:
        """The mean of the per-pair rate ratios, with snapshots / without."""
        return statistics.mean(b.received_per_s / a.received_per_s for a, b in self.pairs)


def ab(run: Run, mesh, callers: int, label: str = "") -> AB:
    """A/B at one offered load: A without snapshots, B with one every 100 ms. After
    each B the controller still persists what finished; wait for it, so no window
    pays for the previous one's snapshots."""
    s = run.settings
    mesh.load(callers, settle_s=s.settle_s)
    pairs, drains, ids = [], [], []
    for _ in range(s.ab_pairs):
        a = mesh.window(s.window_s)
        b = mesh.window(s.window_s, snapshot_every=s.snapshot_every_s)
        pairs.append((a, b))
        ids += b.snapshots
        drains.append(mesh.wait_controller_idle(s.drain_cap_s))
        run.say(f"  A/B{label}: {a.received_per_s:,.0f} / {b.received_per_s:,.0f} transfers/s "
                f"({len(b.snapshots)} snapshots; controller busy {drains[-1]:.1f}s after)")
    mesh.load(0)
    durations, in_flight, failed, running = mesh.finished(ids)
    return AB(pairs, drains, durations, in_flight, failed, running)


def latencies(run: Run, mesh) -> None:
    """Back-to-back snapshot latency at each paced fraction of the 4-node peak (table rows)."""
    s = run.settings
    for fraction in s.latency_fractions:
        rate = fraction * run.peak
        mesh.load(paced_callers(mesh.nodes), rate=rate, settle_s=s.settle_s)
        start = mesh.sample()
        client, server, failed, in_flight = mesh.latency_run(s.latency_snapshots, s.latency_cap_s)
        window = mesh.window_since(start)
        run.results.latency.append(Latency(mesh.nodes, fraction, client, server, failed, in_flight, window))
        run.say(f"  latency, {mesh.nodes} nodes, offered {rate:,.0f}/s, achieved {window.received_per_s:,.0f}/s: "
                f"{len(client)} COMPLETE, {failed} not; client p50/p99 {p50_p99(client)} ms")


def paced_latency(
    run: Run, mesh, rate: float, *, probe: bool = True
) -> tuple[float, int, int, float, float, float, float, dict[str, float]]:
    """At a paced load: client-side snapshot p99 (ms), how many COMPLETE, how many
    not; with `probe`, the p99 (ms) of one node round trip under the same load (else
    NaN); the fraction of the machine busy while the snapshots ran; with `probe`, the
    machine's CPU µs per transfer and the channel frames per transfer in a window
    before them (else NaN); the run-queue waits while the snapshots ran (bench.utilisation.wait_figures)."""
    s = run.settings
    mesh.load(paced_callers(mesh.nodes), rate=rate, settle_s=s.settle_s)
    before = mesh.window(s.window_s) if probe else None
    cpu_us = before.cpu_us_per_transfer if before else float("nan")
    frames = before.frames_per_s / before.received_per_s if before and before.received_per_s else float("nan")
    node_rtt = mesh.node_rtt_p99(s.node_rtt_calls, s.node_rtt_gap_s) if probe else float("nan")
    start, waits = mesh.sample(), mesh.runq()
    client, _, failed, _ = mesh.latency_run(s.latency_snapshots, s.latency_cap_s)
    end, waits_end = mesh.sample(), mesh.runq()
    elapsed = end.at - start.at
    runq = wait_figures({k: (waits_end[k] - waits[k]) / 1e9 / elapsed for k in waits} if elapsed > 0 else {})
    mesh.load(0)
    return p99(client), len(client), failed, node_rtt, busy_fraction(start, end), cpu_us, frames, runq


def closing(run: Run, mesh) -> None:
    """After a cluster-table mesh: the load stopped, its errors and its markers kept."""
    mesh.load(0)
    run.results.gen_errors += mesh.gen_errors()
    run.results.markers.append(mesh.markers())


def eight_node_suffix(fraction: float, mode: str, mark: int | None) -> str:
    return f"8n_{fraction * 100:.0f}pct_{mode}" + (f"_mark{mark}" if mark else "")
