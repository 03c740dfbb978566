"""The 8-node latency phase paced to a measured utilisation (`util8`, in the set `overtake`).

Per snapshot mode, one 8-node mesh: for each target utilisation (0.5, 0.8) the pace
is searched (bench.utilisation.find_pace) on the first mesh, then, at that pace, the
figures of `paced8` (CPU and frames per transfer in a window before, a node round
trip, snapshot p99) with what makes them readable beside them: the machine's busy
fraction while the snapshots ran, each process's run-queue wait, and each
snapshot's split into trigger -> cuts -> COMPLETE. The search measures each step
while snapshots run back to back (as the figures' do), so the pace puts the
machine at the target with them, and `util_valid` says whether they ran within
0.1 of it (bench.utilisation.valid; INVALID is printed otherwise). Keys end in
`_8n_util50_<mode>` / `_8n_util80_<mode>` (classic, overtake, hybrid at the cluster
file's default align_timeout_ms); the broadcast trigger is measured beside overtake
(`_overtake_broadcast`). Every variant runs at the pace the first one's search found:
the transfer path is the same in every mode, so a search per variant only added its
noise to the comparison the issue's hybrid goal makes (2026-11-28, one 80% target:
21,000 / 26,500 / 28,400 transfers/s for classic / overtake / hybrid, node round trip
p99 39 / 40 / 59 ms). The tail (last cut -> COMPLETE) is split further by the last
node's recording and report, and the controller's journal hops are read from its
metrics (bench.utilisation); the path after the cut, hop by hop (`hop_p99_ms_<hop>`),
from every process's `snapmesh_snapshot_hop_seconds` (bench.hop_split).

Alone: `python -m bench overtake --phases util8 [--smoke] [--no-write]`.
"""

from __future__ import annotations

from bench import hop_split
from bench.calls import paced_callers
from bench.lab import p99
from bench.observe import busy_fraction
from bench.phase_kit import Run, phase
from bench.utilisation import (JOURNAL_FIGURES, TAIL_FIGURES, TARGETS, Pace, find_pace, journal_figures,
                               split_figures, tail_figures, util_suffix, valid, validity, wait_figures)

NODES = 8
# (snapshot mode, broadcast trigger): each its own mesh.
VARIANTS = (("classic", False), ("overtake", False), ("hybrid", False), ("overtake", True))
FIGURES = ("snapshot_p99_ms", "snapshot_p50_ms", "snapshots_not_complete", "node_rtt_p99_ms", "cpu_busy", "pace_per_s",
           "cpu_us_per_transfer", "frames_per_transfer", "runq_wait_nodes_mean", "runq_wait_nodes_max",
           "runq_wait_controller", "trigger_to_cut_p99_ms", "trigger_to_last_cut_p99_ms", "last_cut_to_complete_p99_ms",
           *TAIL_FIGURES, *JOURNAL_FIGURES, *hop_split.FIGURES, "util_valid")
START_RATE = 2_000.0  # transfers/s to start the search at when no 4-node peak is known


def variant_name(mode: str, broadcast: bool) -> str:
    return mode + ("_broadcast" if broadcast else "")


def util_keys() -> tuple[str, ...]:
    suffixes = [f"{NODES}n_{util_suffix(t)}_{variant_name(*v)}" for t in TARGETS for v in VARIANTS]
    return (*(f"{k}_{s}" for s in suffixes for k in FIGURES),
            *(f"snapshot_p99_over_node_rtt_p99_{NODES}n_{util_suffix(t)}_overtake" for t in TARGETS))


def _busy_at(run: Run, mesh, rate: float) -> float:
    """The machine's busy fraction at `rate` offered (0: no load) while snapshots run
    back to back, as `measure_at`'s do (for one window at most)."""
    s = run.settings
    if rate > 0:
        mesh.load(paced_callers(mesh.nodes), rate=rate, settle_s=s.settle_s)
    else:
        mesh.load(0, settle_s=s.settle_s)
    start = mesh.sample()
    mesh.latency_run(s.latency_snapshots, s.window_s)
    return busy_fraction(start, mesh.sample())


def measure_at(run: Run, mesh, rate: float, broadcast: bool) -> dict[str, float]:
    """At `rate` offered: the paced8 figures plus utilisation, run-queue waits and the hop split."""
    s = run.settings
    mesh.load(paced_callers(mesh.nodes), rate=rate, settle_s=s.settle_s)
    before = mesh.window(s.window_s)
    node_rtt = mesh.node_rtt_p99(s.node_rtt_calls, s.node_rtt_gap_s)
    first = len(mesh.complete)
    start, waits, journal, hops = mesh.sample(), mesh.runq(), mesh.controller_journal(), mesh.hops()
    client, _, failed, _ = mesh.latency_run(s.latency_snapshots, s.latency_cap_s, broadcast=broadcast)
    end, waits_end, journal_end, hops_end = mesh.sample(), mesh.runq(), mesh.controller_journal(), mesh.hops()
    elapsed = end.at - start.at
    figures = {
        "snapshot_p99_ms": p99(client),
        "snapshot_p50_ms": sorted(client)[len(client) // 2] if client else float("nan"),
        "snapshots_not_complete": float(failed),
        "node_rtt_p99_ms": node_rtt,
        "cpu_busy": busy_fraction(start, end),
        "pace_per_s": rate,
        "cpu_us_per_transfer": before.cpu_us_per_transfer,
        "frames_per_transfer": before.frames_per_s / before.received_per_s if before.received_per_s else float("nan"),
        **wait_figures({k: (waits_end[k] - waits[k]) / 1e9 / elapsed for k in waits} if elapsed > 0 else {}),
        **split_figures(mesh.complete[first:], p99),
        **tail_figures(mesh.complete[first:], p99),
        **journal_figures(journal, journal_end),
        **hop_split.hop_figures(hops, hops_end),
    }
    return figures


@phase("util8", keys=util_keys())
def _util8(run: Run) -> None:
    out, s = run.out, run.settings
    paces: dict[float, Pace] = {}  # target -> the pace the first variant's search found
    for mode, broadcast in s.util_variants or VARIANTS:
        name = variant_name(mode, broadcast)
        run.say(f" {NODES}-node mesh, {name}: pace searched to a measured utilisation of "
                f"{', '.join(f'{t:.0%}' for t in TARGETS)}")
        with run.lab.mesh(NODES, mode=mode, startup_timeout=s.startup_timeout) as mesh:
            idle = None if paces else _busy_at(run, mesh, 0.0)
            rate = 0.1 * run.peak_rate if run.peak_rate else START_RATE
            for target in TARGETS:
                if target not in paces:
                    paces[target] = find_pace(lambda r: _busy_at(run, mesh, r), target, start=rate,
                                              steps=s.util_search_steps, idle=idle)
                pace = paces[target]
                rate = pace.rate  # the next, higher target starts from here
                figures = measure_at(run, mesh, pace.rate, broadcast)
                suffix = f"{NODES}n_{util_suffix(target)}_{name}"
                figures["util_valid"] = float(valid(figures["cpu_busy"], target))
                out.update({f"{k}_{suffix}": v for k, v in figures.items()})
                missed = "" if pace.found(target) else " NOT REACHED"
                run.say(f"  target {target:.0%}{missed}: pace {pace.rate:,.0f}/s ({pace.busy:.0%} busy in the search, "
                        f"{pace.steps} steps, idle {pace.idle_busy:.0%}); snapshots ran at "
                        f"{figures['cpu_busy']:.0%} busy: "
                        f"p99 {figures['snapshot_p99_ms']:.1f} ms, node round trip p99 "
                        f"{figures['node_rtt_p99_ms']:.1f} ms; run-queue wait nodes "
                        f"{figures['runq_wait_nodes_mean']:.1%} (worst {figures['runq_wait_nodes_max']:.1%}); "
                        f"trigger->last cut p99 {figures['trigger_to_last_cut_p99_ms']:.1f} ms, last cut->COMPLETE "
                        f"p99 {figures['last_cut_to_complete_p99_ms']:.1f} ms")
                run.say(f"   tail: last node's recording p99 {figures['last_node_recording_p99_ms']:.1f} ms, its "
                        f"report p99 {figures['last_node_report_p99_ms']:.1f} ms; journal p99 trigger <= "
                        f"{figures['journal_trigger_wait_p99_ms']:.2f} ms, COMPLETE <= "
                        f"{figures['journal_complete_wait_p99_ms']:.2f} ms; "
                        f"{figures['journal_syncs_per_snapshot']:.1f} rounds per snapshot, "
                        f"{figures['journal_records_per_sync']:.1f} records per round")
                run.say(f"   {hop_split.line(figures)}")
                if not figures["util_valid"]:
                    run.say(f"  ->{validity(figures['cpu_busy'], target)}")
            mesh.load(0)
    for target in TARGETS:
        suffix = f"{NODES}n_{util_suffix(target)}_overtake"
        out[f"snapshot_p99_over_node_rtt_p99_{suffix}"] = (
            out[f"snapshot_p99_ms_{suffix}"] / out[f"node_rtt_p99_ms_{suffix}"])
