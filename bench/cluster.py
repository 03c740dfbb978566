"""A local cluster on loopback, measured in one run: `python -m bench cluster`.

What it measures (every figure from this one run, beside its raw-gRPC baseline):
  - the highest sustained transfer rate of a 4-node full mesh: a ramp of
    concurrent TransferBatch callers (closed loop) until the achieved rate stops
    growing. The rate is counted by the nodes themselves
    (`snapmesh_transfers_received_total` on their Prometheus endpoints), never
    by the client's request count;
  - the rate with a snapshot every 100 ms divided by the rate without, on the
    same cluster at the same (peak) offered load, in interleaved A/B windows;
  - snapshot latency, trigger to COMPLETE, back to back with `wait: true`, at 4
    and at 8 nodes under a paced load (a fraction of the 4-node peak), both as the
    client sees it and as the controller's `started_at`/`finished_at` say;
  - markers per snapshot (the `marker_sent` records in the transfer logs, per
    snapshot id) against the channel count N(N-1);
  - 8 nodes on hosts (one network namespace each, a 5 ms one-way delay on
    every link, paced at 25% of the 4-node peak), both snapshot modes: the host
    round trip and snapshot p50/p99 (`bench.hosts`; root: else exit 2, the
    other figures printed); these go to bench/results.json;
  - the raw gRPC figures from `bench.grpc_raw.measure()` (one batched stream,
    one unary round trip) and the cluster's rate as a fraction of them.

The pieces: `bench.phases` runs the phases (the set named `cluster`; flags
`--phases`, `--peak`, `--smoke`, `--no-write`); `bench.lab` starts the meshes and
measures on them; `bench.loadgen` is the load generator (the project's, in a process of its own, driven over its stdin);
`bench.observe` scrapes metrics and CPU over windows; `bench.report` holds the
results and prints the table. The table says how much CPU the generator used
beside the nodes, and how busy the rest of the machine was, so a reader can
judge whether it was the bottleneck.

Clusters are started by the supervisor (`snapmesh.processes.supervisor.Cluster`) in a
temporary directory that is removed at the end; every process started here is
stopped (the load generator also exits on its own when this process goes away:
its stdin closes).
"""

from __future__ import annotations

import sys
import time

from bench import phases
from bench import results as bench_results


def main(argv: list[str] | None = None) -> int:
    args = phases.parse("cluster", phases.own_argv("cluster", argv))
    started = time.perf_counter()
    run = phases.run_set("cluster", phases.sayer(), settings=phases.settings_for("cluster", args.smoke),
                         topology=args.topology, topology_seed=args.topology_seed,
                         only=phases.smoke_phases("cluster", args), peak=args.peak)
    if run.out and not args.no_write:
        bench_results.merge(run.out)
    for name, value in run.out.items():
        print(f"{name:<52} {value:>12,.3f}")
    print(
        f"caveat: one run ({time.perf_counter() - started:.0f}s) on a shared, noisy 2-core machine; 'not ours' is "
        "CPU other tenants used meanwhile; compare figures within one run, not across runs."
    )
    return run.status


if __name__ == "__main__":
    sys.exit(main())
