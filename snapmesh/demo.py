"""`snapmesh demo` (`make demo`): the whole story on one machine.

1. start a 4-node full-mesh cluster on loopback (free ports, a fresh data dir);
2. run the bank workload: transfers between nodes, a snapshot from a random
   initiator every 2 s, each printed as a table;
3. stop the cluster cleanly;
4. reconcile every exported snapshot against the nodes' transfer logs with the
   Spark job (local mode) and print the verdicts.

Exit 0 when every snapshot completed, was conserved and reconciled as consistent.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from snapmesh.bank.workload import ControllerUnreachable, WorkloadParams, run_workload
from snapmesh.config import write_cluster
from snapmesh.supervisor import Cluster, SupervisorError

DEFAULT_DATA_ROOT = Path("data")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snapmesh demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="cluster size (default 4)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of workload (default 10)")
    parser.add_argument("--snapshot-every", type=float, default=2.0, help="seconds between snapshots (default 2)")
    parser.add_argument("--seed", type=int, default=None, help="workload seed (default: random, printed)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where logs and snapshots go (default: a new data/demo-<time> directory)",
    )
    parser.add_argument("--skip-reconcile", action="store_true", help="do not run the Spark job at the end")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 2:
        print("snapmesh demo: --nodes must be at least 2", file=sys.stderr)
        return 2

    data_dir = args.data_dir or DEFAULT_DATA_ROOT / time.strftime("demo-%Y%m%d-%H%M%S")
    if data_dir.exists() and any(data_dir.iterdir()):
        print(f"snapmesh demo: {data_dir} is not empty; give a new --data-dir", file=sys.stderr)
        return 2
    data_dir = data_dir.resolve()
    config_path = write_cluster(data_dir / "cluster.toml", nodes=args.nodes, topology="mesh", data_dir=data_dir)
    print(f"== snapmesh demo: {args.nodes} nodes, data in {data_dir}")

    params = WorkloadParams(duration=args.duration, snapshot_every=args.snapshot_every, seed=args.seed)
    try:
        with Cluster(config_path) as cluster:
            print(f"controller: {cluster.controller_address}  (process logs in {cluster.log_dir})", flush=True)
            summary = run_workload(cluster.controller_address, params, out=sys.stdout)
    except (SupervisorError, ControllerUnreachable) as exc:
        print(f"snapmesh demo: {exc}", file=sys.stderr)
        return 1
    print("== cluster stopped")
    from snapmesh.trace.main import write_run_trace

    print(f"== {write_run_trace(data_dir)}", flush=True)
    status = summary.exit_code
    if args.skip_reconcile:
        return status

    print("== reconciling every snapshot against the transfer logs (Spark, local mode)", flush=True)
    from snapmesh.reconcile.main import main as reconcile_main

    verdict = reconcile_main(["--data-dir", str(data_dir), "--out", str(data_dir / "reconcile")])
    print(f"== demo {'passed' if status == 0 and verdict == 0 else 'FAILED'}: data in {data_dir}")
    return status or verdict


if __name__ == "__main__":
    sys.exit(main())
