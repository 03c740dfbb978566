"""The multi-host phase of `python -m bench cluster`: 8 nodes, one host each
(snapmesh.hosts), a 5 ms one-way delay on every host's link, paced at 25% of
the 4-node peak, in both snapshot modes.

Per mode:
  - the host round trip: a TCP connect from p1's host to p2's (the SYN and the
    SYN-ACK each cross one delayed link: about 2 x 5 ms), median of 50, under
    the load (snapmesh.hosts.probe);
  - snapshot latency, back-to-back `TriggerSnapshot{wait: true}`, client side,
    p50 and p99;
  - the path after the cut, hop by hop: each hop's p99 over those snapshots, from
    every process's `snapmesh_snapshot_hop_seconds` (bench.hop_split).
A snapshot's floor is about two round trips plus a log round; the goal is
p99 <= 5 x the host round trip (`snapshot_p99_over_host_rtt_8n_hosts_5ms`).

Keys (bench/results.json): `host_rtt_ms_5ms`, `snapshot_p50_ms_8n_hosts_5ms`,
`snapshot_p99_ms_8n_hosts_5ms` (classic mode, the default), and each with
`_classic` / `_overtake` appended; per mode `hop_p99_ms_<hop>_8n_hosts_5ms_<mode>`.

Alone (a smoke, or to repeat only this phase): `python -m bench.hosts --peak
RATE [--snapshots N] [--modes classic] [--no-write]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from bench import hop_split
from bench import results as bench_results
from bench import utilisation
from bench.calls import INITIAL_BALANCE, latency_run, paced_callers
from bench.loadgen import LoadGen
from snapmesh.hosts.cluster import NODE_PORT, HostsCluster
from snapmesh.hosts.net import missing_rights
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

NODES = 8
DELAY_MS = 5.0
FRACTION = 0.25  # of the 4-node peak
BATCH = 200
SETTLE_S = 1.5
SNAPSHOTS = 50
CAP_S = 30.0
DEADLINE_S = 10.0
PROBES = 50
MODES = ("classic", "overtake")
GOAL_RTTS = 5.0  # snapshot p99 <= this many host round trips
UTIL_TARGET = 0.5  # the paced-to-utilisation variant (utilisation.py): the machine measured this busy
# The paced-to-utilisation variant starts a snapshot every this many seconds (search and
# figures alike). Back to back, the snapshots alone kept the machine 0.5 busy with no
# transfers at all (about 10 a second, each ~100 ms of CPU in all: nodes 62 ms, the
# delayers 25, the controller 14; docs/bench-cluster.md), so no pace reached 0.5.
UTIL_SNAPSHOT_EVERY_S = 0.25


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_mode(root: Path, mode: str, rate: float, say: Callable[[str], None], snapshots: int = SNAPSHOTS,
             target: float | None = None) -> dict[str, float]:
    """One mode: the hosts cluster, the delays, the paced load, the probe, the snapshots.
    With `target`, `rate` is only where the search for the pace at that measured
    utilisation starts (bench.utilisation), a snapshot starts every
    UTIL_SNAPSHOT_EVERY_S (in the search too), and the figures add the busy
    fraction, the run-queue waits and the hop split."""
    every_s = UTIL_SNAPSHOT_EVERY_S if target is not None else 0.0
    hosts = HostsCluster(root / f"hosts-{mode}", nodes=NODES, deadline=DEADLINE_S, initial_balance=INITIAL_BALANCE,
                         snapshot_mode=mode, startup_timeout=120)
    loadgen = channel = None
    try:
        hosts.start()
        for host in hosts.plan.hosts:
            hosts.network.apply(hosts.plan.delay(host.name, DELAY_MS))
        say(f"  {mode}: {NODES} nodes on hosts (run {hosts.run_id}), {DELAY_MS:g} ms one way on every link; "
            f"paced {rate:,.0f}/s")
        loadgen = LoadGen(hosts.cluster, batch=BATCH, seed=NODES)
        extra: dict[str, float] = {}
        channel = grpc.insecure_channel(hosts.controller_address, options=CLIENT_OPTIONS)
        if target is not None:  # each step measured while snapshots run back to back, as the figures' do
            stub = pb_grpc.ControllerStub(channel)
            rate = utilisation.search_on(loadgen, NODES, target, rate, SETTLE_S, say,
                                         snapshots=lambda seconds: latency_run(stub, snapshots, seconds, {},
                                                                               every_s=every_s))
        loadgen.set(paced_callers(NODES), rate=rate)
        time.sleep(SETTLE_S)
        rtt = hosts.network.probe("p1", "p2", NODE_PORT, count=PROBES)
        watch = utilisation.Watch(hosts.cluster)
        journal = utilisation.read_journal(hosts.cluster.controller_metrics_address)
        endpoints = hop_split.addresses(hosts.cluster)
        hops = hop_split.read_hops(endpoints)
        complete: list = []
        client, _, failed, _ = latency_run(pb_grpc.ControllerStub(channel), snapshots, CAP_S, {}, complete,
                                           every_s=every_s)
        journal_end = utilisation.read_journal(hosts.cluster.controller_metrics_address)
        extra = {**watch.stop(), **utilisation.split_figures(complete, lambda v: _percentile(v, 0.99)),
                 **utilisation.tail_figures(complete, lambda v: _percentile(v, 0.99)),
                 **utilisation.journal_figures(journal, journal_end),
                 **hop_split.hop_figures(hops, hop_split.read_hops(endpoints)), "pace_per_s": rate,
                 "snapshot_every_ms": every_s * 1e3}
        if target is not None:
            extra["util_valid"] = float(utilisation.valid(extra["cpu_busy"], target))
        stats = loadgen.stats()
        loadgen.set(0)
    finally:
        if channel is not None:
            channel.close()
        if loadgen is not None:
            loadgen.close()
        left = hosts.stop()
        if left:
            say(f"  left behind: {', '.join(left)}")
    p50, p99 = (statistics.median(client) if client else float("nan")), _percentile(client, 0.99)
    say(f"  {mode}: host round trip {rtt['median_ms']:.2f} ms (min {rtt['min_ms']:.2f}, p90 {rtt['p90_ms']:.2f}); "
        f"snapshot p50/p99 {p50:.1f} / {p99:.1f} ms ({len(client)} COMPLETE, {failed} not); "
        f"p99 = {p99 / rtt['median_ms']:.1f} round trips (goal <= {GOAL_RTTS:g}); load errors {stats['errors']}")
    say(f"  {mode}: {hop_split.line(extra)}")
    if target is not None:
        say(f"  {mode}: trigger->last cut p99 {extra['trigger_to_last_cut_p99_ms']:.1f} ms, last cut->COMPLETE p99 "
            f"{extra['last_cut_to_complete_p99_ms']:.1f} ms (last node's recording p99 "
            f"{extra['last_node_recording_p99_ms']:.1f} ms, its report p99 {extra['last_node_report_p99_ms']:.1f} ms); "
            f"journal p99 trigger <= {extra['journal_trigger_wait_p99_ms']:.2f} ms, COMPLETE <= "
            f"{extra['journal_complete_wait_p99_ms']:.2f} ms, {extra['journal_syncs_per_snapshot']:.1f} rounds "
            f"per snapshot{utilisation.validity(extra['cpu_busy'], target)}")
    return {"host_rtt_ms": rtt["median_ms"], "p50": p50, "p99": p99, "complete": len(client), "failed": failed,
            **extra}


def hop_keys() -> tuple[str, ...]:
    """The 25%-paced phase's hop keys (bench.hop_split), per mode."""
    return tuple(f"{k}_8n_hosts_5ms_{m}" for m in MODES for k in hop_split.FIGURES)


def measure(peak_per_s: float, say: Callable[[str], None], *, snapshots: int = SNAPSHOTS,
            modes: tuple[str, ...] = MODES, run=run_mode) -> dict[str, float]:
    """The phase's figures, as bench/results.json keys; `run` measures one mode (`run_mode`'s arguments)."""
    rate = FRACTION * peak_per_s
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="snapmesh-bench-hosts-") as tmp:
        for mode in modes:
            figures = run(Path(tmp), mode, rate, say, snapshots)
            out[f"host_rtt_ms_5ms_{mode}"] = figures["host_rtt_ms"]
            out[f"snapshot_p50_ms_8n_hosts_5ms_{mode}"] = figures["p50"]
            out[f"snapshot_p99_ms_8n_hosts_5ms_{mode}"] = figures["p99"]
            out[f"snapshots_not_complete_8n_hosts_5ms_{mode}"] = figures["failed"]
            out[f"snapshot_p99_over_host_rtt_8n_hosts_5ms_{mode}"] = figures["p99"] / figures["host_rtt_ms"]
            out.update({f"{k}_8n_hosts_5ms_{mode}": figures[k] for k in hop_split.FIGURES})
    first = "classic" if "classic" in modes else modes[0]
    for key in ("host_rtt_ms_5ms", "snapshot_p50_ms_8n_hosts_5ms", "snapshot_p99_ms_8n_hosts_5ms",
                "snapshot_p99_over_host_rtt_8n_hosts_5ms"):
        out[key] = out[f"{key}_{first}"]
    return out


UTIL_FIGURES = ("cpu_busy", "pace_per_s", "snapshot_every_ms", *utilisation.RUNQ_FIGURES, "trigger_to_cut_p99_ms",
                "trigger_to_last_cut_p99_ms", "last_cut_to_complete_p99_ms", *utilisation.TAIL_FIGURES,
                *utilisation.JOURNAL_FIGURES, *hop_split.FIGURES, "util_valid")


def util_keys(target: float = UTIL_TARGET) -> tuple[str, ...]:
    suffix = f"8n_hosts_5ms_{utilisation.util_suffix(target)}"
    names = (f"host_rtt_ms_5ms_{utilisation.util_suffix(target)}", f"snapshot_p50_ms_{suffix}",
             f"snapshot_p99_ms_{suffix}", f"snapshot_p99_over_host_rtt_{suffix}")
    per_mode = (*names, f"snapshots_not_complete_{suffix}", *(f"{k}_{suffix}" for k in UTIL_FIGURES))
    return (*names, *(f"{n}_{m}" for m in MODES for n in per_mode))


def measure_util(start_per_s: float, say: Callable[[str], None], *, target: float = UTIL_TARGET,
                 snapshots: int = SNAPSHOTS, modes: tuple[str, ...] = MODES, run=run_mode) -> dict[str, float]:
    """The phase on hosts paced to a measured utilisation (`target`), as bench/results.json keys;
    the search starts at `start_per_s` (`run` measures one mode, `run_mode`'s arguments)."""
    util = utilisation.util_suffix(target)
    suffix = f"8n_hosts_5ms_{util}"
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="snapmesh-bench-hosts-util-") as tmp:
        for mode in modes:
            f = run(Path(tmp), mode, start_per_s, say, snapshots, target)
            out[f"host_rtt_ms_5ms_{util}_{mode}"] = f["host_rtt_ms"]
            out[f"snapshot_p50_ms_{suffix}_{mode}"] = f["p50"]
            out[f"snapshot_p99_ms_{suffix}_{mode}"] = f["p99"]
            out[f"snapshots_not_complete_{suffix}_{mode}"] = f["failed"]
            out[f"snapshot_p99_over_host_rtt_{suffix}_{mode}"] = f["p99"] / f["host_rtt_ms"]
            out.update({f"{k}_{suffix}_{mode}": f[k] for k in UTIL_FIGURES})
    first = "classic" if "classic" in modes else modes[0]
    for key in (f"host_rtt_ms_5ms_{util}", f"snapshot_p50_ms_{suffix}", f"snapshot_p99_ms_{suffix}",
                f"snapshot_p99_over_host_rtt_{suffix}"):
        out[key] = out[f"{key}_{first}"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__.splitlines()[0])
    parser.add_argument("--peak", type=float, required=True, help="the 4-node peak (transfers/s) to pace at 25%% of")
    parser.add_argument("--snapshots", type=int, default=SNAPSHOTS)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--no-write", action="store_true", help="print, do not merge into bench/results.json")
    args = parser.parse_args(argv)
    if problem := missing_rights():
        print(f"bench hosts: {problem}", file=sys.stderr)
        return 2
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:5.1f}s]{text}", file=sys.stderr, flush=True)

    figures = measure(args.peak, say, snapshots=args.snapshots, modes=tuple(args.modes))
    for name, value in figures.items():
        print(f"{name:<52} {value:>12,.3f}")
    if not args.no_write:
        bench_results.merge(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
