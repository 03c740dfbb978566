"""Classic and overtake snapshot modes side by side, in one run: `python -m bench overtake`.

Figures (all from this one run; compare them as ratios):
  - raw gRPC: unary round trip p99, one batched stream's rate (`bench.grpc_raw`);
  - the 4-node mesh's highest rate in a short closed-loop ramp (nodes' counters);
  - per mode, on a 4-node mesh at that peak load: rate with a snapshot every
    100 ms / without (interleaved A/B windows) and the controller-side p99 of
    those snapshots, and how many FAILED;
  - CPU per transfer (the cost of an event): the whole machine's busy CPU microseconds per
    transfer the nodes counted, at the 4-node peak and, per phase, on the
    8-node mesh paced before its snapshots run (a window without snapshots);
  - per mode, on an 8-node mesh paced at 50% of the 4-node peak: snapshot p99,
    trigger to COMPLETE as the client sees it; overtake mode at two
    flow-control marks (SNAPMESH_FLOW_MARK); both modes again at 25%;
    beside each, the p99 of one node round trip (`GetState`, which answers
    after one log round) under the same load, and how busy the machine was;
  - a 32-node mesh (992 channels) in overtake mode under a light paced load:
    snapshot latency.
  - the 4-node mesh's peak rate and CPU per transfer with every server on
    asyncio's loop and on uvloop's (SNAPMESH_EVENT_LOOP), two meshes side by
    side, ramp steps interleaved: `uvloop_over_asyncio_rate_4n`.
It prints a table and merges its figures into bench/results.json (a flat
object name -> number, plus `date` and `machine`), keeping other keys.
The phases are `bench.phases`' set named `overtake`; flags: `--phases`, `--peak`,
`--smoke` (every phase for a moment, no 32-node mesh), `--no-write`.
"""

from __future__ import annotations

import sys
import time

from bench import phases, results


def main(argv: list[str] | None = None) -> int:
    args = phases.parse("overtake", phases.own_argv("overtake", argv))
    started = time.perf_counter()
    run = phases.run_set("overtake", phases.sayer(), settings=phases.settings_for("overtake", args.smoke),
                         topology=args.topology, topology_seed=args.topology_seed,
                         only=phases.smoke_phases("overtake", args), peak=args.peak)
    for name, value in run.out.items():
        print(f"{name:<52} {value:>14,.3f}")
    if not args.no_write:
        results.merge(run.out)
    where = "not written (--no-write)" if args.no_write else f"written to {results.RESULTS}"
    print(f"{where}; one run ({time.perf_counter() - started:.0f}s) on a shared, noisy machine: "
          "compare ratios within it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
