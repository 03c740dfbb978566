"""The simulator at scale: one snapshot on mesh, ring and random-regular:8 up to 1,000 nodes.

`python -m bench sim_scale [--sizes 10,30,100,300,1000] [--mesh-max 300] [--seed 1] [--svg docs/sim-scale.svg]`

Each point is one seeded run of snapmesh/sim/scale.py with the default latency
model (snapmesh/sim/latency.py): 1-5 ms in a rack of 20, 5-20 ms between racks
of a region, 20-80 ms across 3 regions, 0.02 ms per message sent, 2 ms per log
round. Every figure but the CPU times is the same on every machine for a seed.
A traffic series (random-regular:8, 300 nodes, 0 to 64 transfers a node) moves
the number of channels holding recorded messages with the graph fixed. It
prints a table, merges a few figures into bench/results.json and writes the SVG
(docs/simulator.md shows it); a smoke run does neither.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import results as bench_results
from bench import smoke
from bench.svgplot import Panel, render
from snapmesh.sim.latency import LatencyModel
from snapmesh.sim.scale import ScaleResult, run_scale

SVG = Path(__file__).resolve().parents[1] / "docs" / "sim-scale.svg"
SHAPES = ("mesh", "ring", "random-regular:8")
TRAFFIC = (0, 4, 16, 64)


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench sim_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,30,100,300,1000", help="node counts (default: 10,30,100,300,1000)")
    parser.add_argument("--mesh-max", type=int, default=300,
                        help="largest mesh run: N nodes have N(N-1) channels (default: 300)")
    parser.add_argument("--seed", type=int, default=1, help="the runs' seed (default: 1)")
    parser.add_argument("--svg", type=Path, default=SVG, help=f"where the figure goes (default: {SVG.name} in docs/)")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: a comma-separated list of node counts, got {args.sizes!r}")
    if any(n < 10 for n in args.sizes):  # random-regular:8 needs more than 8 nodes
        parser.error(f"--sizes: every size must be at least 10, got {args.sizes}")
    return args


def measure(sizes: list[int], mesh_max: int, seed: int) -> tuple[list[ScaleResult], list[ScaleResult]]:
    runs = [run_scale(shape, n, seed) for shape in SHAPES for n in sizes if shape != "mesh" or n <= mesh_max]
    traffic = [run_scale("random-regular:8", smoke.size(300, 10), seed, traffic=t) for t in TRAFFIC]
    return runs, traffic


def table(runs: list[ScaleResult]) -> str:
    head = (f"{'topology':<17} {'N':>5} {'channels':>8} {'diam':>4} {'ms':>8} {'recorded':>8} {'steps':>6} "
            f"{'effects':>7} {'rep bytes':>9} {'B/(N+rec)':>9} {'ctl cpu ms':>10} {'of it, answer':>13}")
    rows = [head]
    for r in runs:
        rows.append(
            f"{r.topology:<17} {r.nodes:>5} {r.channels:>8} {r.diameter:>4} {r.duration_s * 1000:>8.1f} "
            f"{r.recorded_channels:>8} {r.steps:>6} {r.effects:>7} {r.report_bytes:>9} "
            f"{r.report_bytes / (r.nodes + r.recorded_channels):>9.1f} {r.controller_cpu_s * 1000:>10.1f} "
            f"{r.completion_cpu_s * 1000:>13.1f}")
    return "\n".join(rows)


def figure(runs: list[ScaleResult], traffic: list[ScaleResult]) -> str:
    duration = Panel("Snapshot duration vs diameter", "diameter (hops)", "trigger to COMPLETE (ms)")
    size = Panel("Report bytes per snapshot", "N + channels with recorded messages", "report bytes")
    reports = Panel("Controller CPU: the reports", "channels", "ms per snapshot (measured)")
    answer = Panel("Controller CPU: the v1 answer", "channels", "ms per snapshot (measured)")
    for r in runs:
        duration.add(r.topology, r.diameter, r.duration_s * 1000)
        size.add(r.topology, r.nodes + r.recorded_channels, r.report_bytes)
        reports.add(r.topology, r.channels, (r.controller_cpu_s - r.completion_cpu_s) * 1000)
        answer.add(r.topology, r.channels, r.completion_cpu_s * 1000)
    for r in traffic:
        size.add(f"random-regular:8, N={r.nodes}, 0-64 transfers/node", r.nodes + r.recorded_channels, r.report_bytes)
    return render([duration, size, reports, answer],
                  "one seeded run per point (snapmesh/sim/scale.py); python -m bench sim_scale; CPU on a shared machine")


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[2:] if argv is None and sys.argv[1:2] == ["sim_scale"] else argv or [])
    sizes = [smoke.size(n, 10) for n in args.sizes][:smoke.size(len(args.sizes), 1)]
    print(f"seed {args.seed}; latency: {LatencyModel().describe()}")
    runs, traffic = measure(sizes, args.mesh_max, args.seed)
    print(table(runs))
    print("\nrandom-regular:8, more transfers in flight (the graph fixed):")
    print(table(traffic))
    figures = {}
    for r in runs:
        key = f"sim_scale_{r.topology.replace('random-regular:', 'rr')}_{r.nodes}"
        figures |= {f"{key}_duration_ms": r.duration_s * 1000, f"{key}_report_bytes": r.report_bytes,
                    f"{key}_controller_cpu_ms": r.controller_cpu_s * 1000}
    bench_results.merge(figures)
    if not smoke.on():
        args.svg.write_text(figure(runs, traffic), encoding="utf-8")
        print(f"\nwrote {args.svg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
