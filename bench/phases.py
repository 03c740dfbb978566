"""The one driver of the cluster benches' phases, and their named phase sets.

A phase is a step of a bench run on real clusters (`bench.lab`): it measures, adds
rows to the printed table (`Results`) and writes figures under the bench/results.json
keys it declares. A phase set is the ordered phases one bench runs:

    cluster    `python -m bench cluster`: the ramp, A/B, latency and marker table, then
               the phase on hosts (its keys are the only ones it writes);
    overtake   `python -m bench overtake`: classic vs overtake modes, CPU per transfer,
               the 8- and 32-node meshes, and asyncio vs uvloop side by side.

A new figure is one phase (or one more key of a phase) here, and a place in a set.
The driver refuses a key a phase did not declare, so the declared keys are the keys
written; tests/cluster/test_bench_phases.py runs every set on a lab without processes and
checks them against the keys bench/results.json has always had.

Flags (after the bench's name): `--phases NAME ...` runs only those phases of the set
(in the set's order; `--peak RATE` stands for the 4-node peak when the ramp is not
among them), `--smoke` runs every phase briefly (short windows, few snapshots, no
32-node mesh) to prove it works, `--no-write` leaves bench/results.json alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import smoke, util_phase
from bench.lab import BATCH, Lab, p99
from bench.observe import Window
from bench.phase_kit import (PHASES, Phase, Run, Settings, ab, closing, eight_node_suffix, latencies, paced_latency,
                             phase, ramp)
from bench.utilisation import RUNQ_FIGURES
from snapmesh.settings import topologies

__all__ = ["PHASES", "Phase", "Run", "Settings", "util_phase"]  # tests and benches reach these through here

CLUSTER = Settings(ramp_callers=(1, 2, 4, 8, 16, 32), window_s=4.0, ab_pairs=5, latency_snapshots=50,
                   latency_cap_s=20.0, drain_cap_s=30.0)
OVERTAKE = Settings(ramp_callers=(4, 16), window_s=3.0, ab_pairs=2, latency_snapshots=30, latency_cap_s=15.0,
                    drain_cap_s=20.0, startup_timeout=120)
SMOKE = dict(ramp_callers=(4,), window_s=0.5, ab_pairs=1, latency_snapshots=3, latency_cap_s=5.0, drain_cap_s=5.0,
             settle_s=0.3, node_rtt_calls=5, large_mesh=0, util_search_steps=2,
             # one paced 8-node mesh, and one paced to a utilisation: each kind differs only in its settings
             eight_nodes=((0.25, "overtake", None),), util_variants=(("overtake", False),))

MARKS = (2_000, 20_000)  # flow-control marks: the nodes' default, and the one before it
# The 8-node paced phases: (fraction of the 4-node peak, mode, flow-control mark or None for the default).
EIGHT_NODES = ((0.5, "classic", None), (0.5, "overtake", None), (0.5, "overtake", MARKS[1]),
               (0.25, "classic", None), (0.25, "overtake", None))
MODES = ("classic", "overtake")
LOOPS = ("asyncio", "uvloop")  # SNAPMESH_EVENT_LOOP values, measured side by side


# ------------------------------------------------------------------ the phases


@phase("baseline")
def _baseline(run: Run) -> None:
    """The raw gRPC figures, for the cluster table."""
    run.say(" raw gRPC baseline")
    run.results.raw = run.lab.raw()


@phase("raw", keys=("unary_rtt_p99_ms", "raw_batched_stream_msgs_per_s", "raw_cpu_us_per_frame_acked"))
def _raw(run: Run) -> None:
    run.say(" raw gRPC baseline")
    run.results.raw = raw = run.lab.raw()
    run.out["unary_rtt_p99_ms"] = raw["unary_p99_ms"]
    run.out["raw_batched_stream_msgs_per_s"] = raw["stream_batched_per_s"]
    run.out["raw_cpu_us_per_frame_acked"] = raw["cpu_us_per_frame_acked"]


@phase("mesh4")
def _mesh4(run: Run) -> None:
    """4 nodes: the ramp, latency under paced load (before the A/B, so the
    controller has no backlog), then the A/B at the peak's load."""
    run.say(" 4-node mesh: starting")
    with run.lab.mesh(4, startup_timeout=run.settings.startup_timeout) as mesh:
        ramp(run, mesh)
        latencies(run, mesh)
        r = run.results
        found = ab(run, mesh, r.peak_callers)
        r.ab, r.ab_drain_s = found.pairs, found.drain_s
        r.ab_durations, r.ab_in_flight, r.ab_failed, r.ab_running = (
            found.durations, found.in_flight, found.failed, found.running)
        closing(run, mesh)


@phase("mesh8")
def _mesh8(run: Run) -> None:
    run.say(" 8-node mesh: starting")
    with run.lab.mesh(8, startup_timeout=run.settings.startup_timeout) as mesh:
        latencies(run, mesh)
        closing(run, mesh)


@phase("table")
def _table(run: Run) -> None:
    """The cluster table, printed before the phase on hosts: a failure there loses none of it."""
    from bench.report import table

    r = run.results
    if not (r.raw and r.ab):
        run.say(" no table: it needs the baseline and mesh4 phases")
        return
    r.window_s, r.batch = run.settings.window_s, BATCH
    for line in table(run.results):
        print(line, flush=True)


def _hosts_keys() -> tuple[str, ...]:
    from bench.hosts import MODES as HOST_MODES, hop_keys

    names = ("host_rtt_ms_5ms", "snapshot_p50_ms_8n_hosts_5ms", "snapshot_p99_ms_8n_hosts_5ms",
             "snapshot_p99_over_host_rtt_8n_hosts_5ms")
    return (*names, *(f"{n}_{m}" for m in HOST_MODES for n in (*names, "snapshots_not_complete_8n_hosts_5ms")),
            *hop_keys())


@phase("hosts", keys=_hosts_keys())
def _hosts(run: Run) -> None:
    """8 nodes on hosts, 5 ms one way on every link (bench.hosts); exit status 2 without the rights."""
    from bench import hosts

    if problem := run.lab.missing_rights():
        print(f"bench cluster: the phase on hosts {problem}", file=sys.stderr)
        run.status = 2
        return
    run.say(f" {hosts.NODES} nodes on hosts, {hosts.DELAY_MS:g} ms one way on every link")
    run.out.update(run.lab.hosts(run.peak, run.say, snapshots=run.settings.latency_snapshots))


def _hosts_util_keys() -> tuple[str, ...]:
    from bench.hosts import util_keys

    return util_keys()


@phase("hosts_util", keys=_hosts_util_keys())
def _hosts_util(run: Run) -> None:
    """The phase on hosts again, paced to a measured utilisation of 0.5 (bench.hosts.measure_util)."""
    if problem := run.lab.missing_rights():
        print(f"bench cluster: the phase on hosts {problem}", file=sys.stderr)
        run.status = 2
        return
    start = 0.1 * run.peak_rate if run.peak_rate else util_phase.START_RATE
    run.say(" 8 nodes on hosts, 5 ms one way, paced to a measured utilisation of 50%")
    run.out.update(run.lab.hosts_util(start, run.say, snapshots=run.settings.latency_snapshots))


@phase("modes4", keys=(
    "cluster_rate_4n", "cluster_rate_4n_over_raw_batched", "cpu_us_per_transfer_4n_peak", "cpu_busy_4n_peak",
    "frames_per_transfer_4n_peak", "records_per_commit_4n_peak",
    *(f"{k}_{m}" for m in MODES for k in ("overhead_ratio_100ms", "controller_p99_ms_100ms",
                                          "snapshots_not_complete_100ms")),
    "controller_p99_ms_100ms"))
def _modes4(run: Run) -> None:
    """4 nodes per mode: the ramp (classic), then rate with snapshots every 100 ms /
    without and the controller p99 of those snapshots, at the peak's load."""
    out = run.out
    for mode in MODES:
        run.say(f" 4-node mesh, {mode}")
        with run.lab.mesh(4, mode=mode, startup_timeout=run.settings.startup_timeout) as mesh:
            if mode == "classic":
                ramp(run, mesh)
                peak = run.results.peak
                out["cluster_rate_4n"] = peak.received_per_s
                out["cpu_us_per_transfer_4n_peak"] = peak.cpu_us_per_transfer
                out["cpu_busy_4n_peak"] = peak.machine_cores / (os.cpu_count() or 1)
                out["frames_per_transfer_4n_peak"] = (
                    peak.frames_per_s / peak.received_per_s if peak.received_per_s else float("nan"))
                out["records_per_commit_4n_peak"] = peak.records_per_commit
                raw = out.get("raw_batched_stream_msgs_per_s") or run.results.raw.get("stream_batched_per_s")
                if raw:
                    out["cluster_rate_4n_over_raw_batched"] = peak.received_per_s / raw
            found = ab(run, mesh, run.results.peak_callers or run.settings.ramp_callers[0], f" {mode}")
        ratio, controller_p99 = found.ratio, p99(found.durations)
        bad = found.failed + found.running
        run.say(f"  A/B {mode}: ratio {ratio:.2f}, controller p99 {controller_p99:.0f} ms, {bad} not COMPLETE")
        out[f"overhead_ratio_100ms_{mode}"] = ratio
        out[f"controller_p99_ms_100ms_{mode}"] = controller_p99
        out[f"snapshots_not_complete_100ms_{mode}"] = bad
    out["controller_p99_ms_100ms"] = out["controller_p99_ms_100ms_overtake"]


@phase("paced8", keys=(
    *(f"{k}_{eight_node_suffix(*p)}" for p in EIGHT_NODES
      for k in ("snapshot_p99_ms", "node_rtt_p99_ms", "cpu_busy", "cpu_us_per_transfer", "frames_per_transfer",
                *RUNQ_FIGURES)),
    "cpu_us_per_transfer_8n_25pct", "cpu_us_per_transfer_8n_25pct_frame_floor", "snapshot_p99_ms_8n_50pct_overtake_mark2000",
    "snapshot_p99_over_unary_p99_overtake", "snapshot_p99_over_node_rtt_p99_overtake"))
def _paced8(run: Run) -> None:
    """8 nodes paced at fractions of the 4-node peak, per mode and mark: snapshot p99,
    a node round trip under the same load, CPU per transfer before the snapshots."""
    out = run.out
    for fraction, mode, mark in run.settings.eight_nodes or EIGHT_NODES:
        rate = fraction * run.peak
        run.say(f" 8-node mesh, {mode}, mark {mark or MARKS[0]}, paced {rate:,.0f}/s "
                f"({fraction:.0%} of the 4-node peak)")
        with run.lab.mesh(8, mode=mode, mark=mark, startup_timeout=run.settings.startup_timeout) as mesh:
            snapshot_p99, done, failed, node_rtt, busy, cpu_us, frames, runq = paced_latency(run, mesh, rate)
        run.say(f"  snapshot p99 {snapshot_p99:.1f} ms ({done} COMPLETE, {failed} not); node round trip p99 "
                f"{node_rtt:.1f} ms; machine {busy:.0%} busy; {cpu_us:.1f} µs CPU per transfer before")
        suffix = eight_node_suffix(fraction, mode, mark)
        out[f"snapshot_p99_ms_{suffix}"] = snapshot_p99
        out[f"node_rtt_p99_ms_{suffix}"] = node_rtt
        out[f"cpu_busy_{suffix}"] = busy
        out[f"cpu_us_per_transfer_{suffix}"] = cpu_us
        out[f"frames_per_transfer_{suffix}"] = frames
        out.update({f"{k}_{suffix}": v for k, v in runq.items()})
    # The headline figure: 8 nodes paced at 25% of the 4-node peak, overtake mode (the
    # controller_p99_ms_100ms convention); the classic one is beside it.
    out["cpu_us_per_transfer_8n_25pct"] = out["cpu_us_per_transfer_8n_25pct_overtake"]
    # What the raw gRPC stream alone costs for the frames those transfers rode in
    # (a frame and its ack, measured in this run with nothing of snapmesh in it).
    frame_cpu = out.get("raw_cpu_us_per_frame_acked") or run.results.raw.get("cpu_us_per_frame_acked")
    if frame_cpu:
        out["cpu_us_per_transfer_8n_25pct_frame_floor"] = out["frames_per_transfer_8n_25pct_overtake"] * frame_cpu
    if "snapshot_p99_ms_8n_50pct_overtake" not in out:  # a smoke run's one mesh: no 50% figures to compare
        return
    out["snapshot_p99_ms_8n_50pct_overtake_mark2000"] = out["snapshot_p99_ms_8n_50pct_overtake"]
    unary = out.get("unary_rtt_p99_ms") or run.results.raw.get("unary_p99_ms")
    if unary:
        out["snapshot_p99_over_unary_p99_overtake"] = out["snapshot_p99_ms_8n_50pct_overtake"] / unary
    out["snapshot_p99_over_node_rtt_p99_overtake"] = (
        out["snapshot_p99_ms_8n_50pct_overtake"] / out["node_rtt_p99_ms_8n_50pct_overtake"])


@phase("large", keys=("snapshot_p99_ms_32n_overtake", "snapshots_complete_32n_overtake"))
def _large(run: Run) -> None:
    """A 32-node mesh (992 channels) in overtake mode under a light paced load: snapshot latency."""
    nodes = run.settings.large_mesh
    if not nodes:
        return
    run.say(f" {nodes}-node mesh ({nodes * (nodes - 1)} channels), overtake, light paced load")
    try:
        with run.lab.mesh(nodes, mode="overtake", startup_timeout=run.settings.startup_timeout) as mesh:
            snapshot_p99, done, failed, *_ = paced_latency(run, mesh, 0.05 * run.peak, probe=False)
    except Exception as exc:  # report it; the other figures stand
        run.say(f"  {nodes}-node mesh failed: {type(exc).__name__}: {exc}")
        return
    run.out[f"snapshot_p99_ms_{nodes}n_overtake"] = snapshot_p99
    run.out[f"snapshots_complete_{nodes}n_overtake"] = done
    run.say(f"  snapshot p99 {snapshot_p99:.1f} ms ({done} COMPLETE, {failed} not)")


@phase("loops", keys=(*(f"{k}_{loop}" for loop in LOOPS for k in ("cluster_rate_4n", "cpu_us_per_transfer_4n_peak")),
                      "uvloop_over_asyncio_rate_4n"))
def _loops(run: Run) -> None:
    """The 4-node peak rate and CPU per transfer with every server on asyncio's loop
    and on uvloop's (SNAPMESH_EVENT_LOOP): two meshes up at once, their ramp steps
    interleaved (each first in turn), so both see the same machine; the load
    generator is the same for both."""
    s = run.settings
    best: dict[str, Window] = {}
    with ExitStack() as stack:
        meshes = {}
        for loop in LOOPS:
            run.say(f" 4-node mesh, every server on {loop}")
            meshes[loop] = stack.enter_context(run.lab.mesh(4, loop=loop, startup_timeout=s.startup_timeout))
        for step, callers in enumerate(s.ramp_callers):
            for loop in LOOPS[::-1] if step % 2 else LOOPS:  # each goes first as often as the other
                mesh = meshes[loop]
                mesh.load(callers, settle_s=s.settle_s)
                window = mesh.window(s.window_s)
                mesh.load(0)  # the other mesh's window runs on a quiet machine
                run.say(f"  {loop}, {callers} callers/node: {window.received_per_s:,.0f} transfers/s, "
                        f"{window.cpu_us_per_transfer:.1f} µs CPU per transfer"
                        + ("" if window.received_per_s else " (no transfers in the window: no figure)"))
                if loop not in best or window.received_per_s > best[loop].received_per_s:
                    best[loop] = window
    for loop in LOOPS:
        run.out[f"cluster_rate_4n_{loop}"] = best[loop].received_per_s
        run.out[f"cpu_us_per_transfer_4n_peak_{loop}"] = best[loop].cpu_us_per_transfer
    # A loaded machine can leave asyncio's window without a transfer (a smoke's is half a second): no ratio then,
    # nan rather than a crash or a 0 that reads as a measurement
    asyncio_rate = best["asyncio"].received_per_s
    run.out["uvloop_over_asyncio_rate_4n"] = (
        best["uvloop"].received_per_s / asyncio_rate if asyncio_rate else float("nan"))


PHASE_SETS: dict[str, tuple[str, ...]] = {
    "cluster": ("baseline", "mesh4", "mesh8", "table", "hosts", "hosts_util"),
    "overtake": ("raw", "modes4", "paced8", "util8", "large", "loops"),
}
SETTINGS = {"cluster": CLUSTER, "overtake": OVERTAKE}
# The phases `python -m bench --smoke` leaves out, so that the whole smoke lane stays near a minute: the
# ones on hosts need root and network namespaces and take half a minute even briefly (tests/hosts
# covers the namespaces), the 32-node mesh is skipped by SMOKE's large_mesh=0 anyway, and the
# event-loop phase runs for real in tests/cluster/test_bench_phases.py. Two more are run by another
# bench of the same smoke: cluster's 8-node mesh (overtake's paced8 and util8 start 8-node meshes
# and measure their latencies the same way) and overtake's raw gRPC figures (the grpc bench's, and
# cluster's baseline phase). Every phase's logic runs there too, on a lab of stand-ins.
SMOKE_SKIPS = {"cluster": ("mesh8", "hosts", "hosts_util"), "overtake": ("raw", "large", "loops")}


def declared_keys(set_name: str) -> set[str]:
    """Every bench/results.json key the phases of a set write."""
    return {k for name in PHASE_SETS[set_name] for k in PHASES[name].keys}


def run_set(set_name: str, say: Callable[[str], None], *, settings: Settings | None = None, lab: Any = None,
            only: tuple[str, ...] = (), peak: float | None = None, topology: str = "mesh",
            topology_seed: int = 0) -> Run:
    """Run the phases of a set (or those of them in `only`), in order, on `lab`
    (default: real processes in a temporary directory, on `topology`)."""
    names = [n for n in PHASE_SETS[set_name] if not only or n in only]
    unknown = set(only) - set(PHASE_SETS[set_name])
    if unknown:
        raise ValueError(f"no phase {', '.join(sorted(unknown))} in {set_name}: {', '.join(PHASE_SETS[set_name])}")
    with ExitStack() as stack:
        if lab is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"snapmesh-bench-{set_name}-"))
            lab = Lab(Path(tmp), topology, topology_seed)
        run = Run(settings or SETTINGS[set_name], lab, say, peak_rate=peak)
        for name in names:
            before = set(run.out)
            PHASES[name].run(run)
            stray = set(run.out) - before - set(PHASES[name].keys)
            if stray:
                raise AssertionError(f"phase {name} wrote keys it does not declare: {', '.join(sorted(stray))}")
    return run


def parse(set_name: str, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m bench {set_name}",
                                     description=f"phases: {' '.join(PHASE_SETS[set_name])}")
    parser.add_argument("--phases", nargs="+", choices=PHASE_SETS[set_name], default=[])
    parser.add_argument("--peak", type=float, help="the 4-node peak (transfers/s) when the ramp is not run")
    parser.add_argument("--smoke", action="store_true", help="every phase briefly: proves it runs, measures nothing")
    parser.add_argument("--no-write", action="store_true", help="print, do not merge into bench/results.json")
    parser.add_argument("--topology", type=_topology, default="mesh", metavar="NAME",
                        help="every cluster's channels: mesh (default), ring or random-regular:K (K below the "
                        "smallest cluster's nodes); other than mesh implies --no-write (results.json holds the mesh)")
    parser.add_argument("--topology-seed", type=int, default=0, metavar="N",
                        help="the seed that draws a random-regular:K graph (default 0)")
    args = parser.parse_args(argv)
    args.no_write = args.no_write or args.topology != "mesh"
    args.smoke = args.smoke or smoke.on()  # `python -m bench --smoke`'s (bench/smoke.py): tiny sizes, nothing written
    return args


def _topology(text: str) -> str:
    try:
        topologies.parse(text)
    except topologies.ShapeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def smoke_phases(set_name: str, args: argparse.Namespace) -> tuple[str, ...]:
    """The phases to run (empty: all): those named, else in `python -m bench --smoke` all
    but SMOKE_SKIPS' (the bench's own `--smoke` still runs every phase briefly)."""
    if args.phases or not smoke.on():
        return tuple(args.phases)
    return tuple(n for n in PHASE_SETS[set_name] if n not in SMOKE_SKIPS[set_name])


def own_argv(set_name: str, argv: list[str] | None) -> list[str]:
    """The flags meant for this bench: from the first flag on, when it is the one bench
    named (`python -m bench NAME --flag`, `python -m bench.NAME --flag`); else none."""
    if argv is not None:
        return argv
    args = sys.argv[1:]
    first_flag = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    return args[first_flag:] if args[:first_flag] in ([], [set_name]) else []


def settings_for(set_name: str, smoke: bool) -> Settings:
    return replace(SETTINGS[set_name], **SMOKE) if smoke else SETTINGS[set_name]


def sayer() -> Callable[[str], None]:
    """Progress lines on stderr, stamped with seconds since the start."""
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:5.1f}s]{text}", file=sys.stderr, flush=True)

    return say
