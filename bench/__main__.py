"""`python -m bench [NAME ...]`: run the named benchmarks (default: all), in order.

Each module has `main() -> int` and prints its own table. The machine is shared
and noisy, so every table pairs a figure with a baseline measured in the same run.
`--smoke` before the names runs them at tiny sizes and writes no figures (bench/smoke.py).
"""

from __future__ import annotations

import importlib
import os
import sys

from bench import smoke

BENCHMARKS = {
    "grpc": "bench.grpc_raw",  # raw gRPC: one batched stream, one unary round trip
    "cluster": "bench.cluster",  # a local cluster: rate, snapshot latency, overhead
    "reconcile": "bench.reconcile",  # Spark job vs a single-process baseline
    "store": "bench.controller_store",  # controller: proto JSON vs compact snapshot files
    "controller": "bench.controller_p99",  # controller-side p99, a snapshot every 100 ms at peak
    "restart": "bench.restart",  # a bank-app node's restart after 1M commands: one file / segments
    "report": "bench.overtake_report",  # an overtake report's outbox: per-entry messages vs packed columns
    "submit_batch": "bench.submit_batch",  # SubmitBatch of the minimal app on 4 nodes: commands/s, CPU per command
    "bank_pair": "bench.bank_pair",  # the bank natively (TransferBatch) and as an app (SubmitBatch), alternating
    "overtake": "bench.overtake",  # classic vs overtake snapshots side by side; writes bench/results.json
    "logrecords": "bench.logrecords",  # a generic command step's log records, made and encoded: today vs an older commit
    "undo": "bench.undo",  # taking back a failed app command (apphost.H4) vs a copy before every step
    "sim_scale": "bench.sim_scale",  # the simulator, 10-1,000 nodes, mesh/ring/random-regular:8; writes docs/sim-scale.svg
    "scale64": "bench.scale64",  # 64 node processes: random-regular:8 against the full mesh
    "state": "bench.state",  # blob and kvshard at N MiB per node: bytes per snapshot, time vs size, restore, RSS
}


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip().splitlines()[0])
        print("\nbenchmarks (all when none is named), each a module of bench/:")
        for name, module in BENCHMARKS.items():
            print(f"  {name:<12} {module}")
        print("\nmake bench BENCH='overtake reconcile' runs two of them; figures go to bench/results.json.")
        print("`python -m bench reconcile --size N --skip-standalone`: flags go to the one benchmark named.")
        print("`python -m bench --smoke [NAME ...]`: every one (or those named) at tiny sizes, nothing written.")
        return 0
    if argv[:1] == ["--smoke"]:
        argv = argv[1:]
        os.environ[smoke.ENV] = "1"  # the benches and every process they start see it
        sys.argv[1:] = argv  # the benches that read their flags from sys.argv see `python -m bench NAME ...`
    # The names come first; from the first flag on, the rest (values too) is the benchmark's own.
    first_flag = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names = argv[:first_flag] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    status = 0
    for name in names:
        print(f"\n=== bench {name} ===", flush=True)
        status |= importlib.import_module(BENCHMARKS[name]).main()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
