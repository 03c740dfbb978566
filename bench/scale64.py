"""64 real processes on this machine: random-regular:8 (512 channels) against the full mesh (4,032).

`python -m bench scale64 [--nodes 64] [--k 8] [--snapshots 20]`

For each topology: a cluster of `--nodes` node processes and a controller on
loopback (`bench.lab.start_cluster`), idle but for the snapshots; `--snapshots`
back-to-back snapshots with wait=true (`bench.calls.latency_run`); then

  snapshot p50 / p99    trigger to COMPLETE as the client sees it (ms)
  controller CPU        the controller process's user+system CPU over the
                        snapshots (/proc), divided by the COMPLETE ones (ms)
  memory per node       each node process's resident set after them (MiB, median and max)

The machine is shared: it prints the load average beside the figures. Figures
go to bench/results.json under `scale64_<sparse|mesh>_*` (a smoke run: 6 nodes,
random-regular:3, nothing written). Every process started is stopped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench import results as bench_results
from bench import smoke
from bench.calls import latency_run
from bench.lab import p99, start_cluster
from bench.observe import cpu_s
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

FIGURES = ("channels", "snapshot_p50_ms", "snapshot_p99_ms", "controller_cpu_ms_per_snapshot",
           "node_rss_mib_median", "node_rss_mib_max", "snapshots_complete")
STARTUP_S = 900.0  # 64 processes on a busy 2-core machine take minutes to come up


def keys() -> list[str]:
    return [f"scale64_{label}_{figure}" for label in ("sparse", "mesh") for figure in FIGURES]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure_one(root: Path, nodes: int, topology: str, snapshots: int, say) -> dict[str, float]:
    started = time.perf_counter()
    cluster = start_cluster(root, nodes, topology=topology, topology_seed=1, startup_timeout=STARTUP_S)
    try:
        say(f"  {topology}: {nodes} nodes up in {time.perf_counter() - started:.0f} s")
        with grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS) as channel:
            controller = pb_grpc.ControllerStub(channel)
            latency_run(controller, 1, 120.0, {})  # a first one warms every channel up
            before = cpu_s(cluster.controller_pid)
            statuses: dict[str, int] = {}
            client, _server, failed, _ = latency_run(controller, snapshots, 60.0 + 10.0 * snapshots, statuses)
            spent = cpu_s(cluster.controller_pid) - before
        rss = [rss_mib(cluster.node_pid(n)) for n in cluster.node_ids]
        complete = sum(1 for s in statuses.values() if s == pb.Snapshot.COMPLETE)
        if not client:
            raise RuntimeError(f"{topology}: no snapshot completed ({failed} failed)")
        return {
            "channels": len(cluster.config.topology.channels),
            "snapshot_p50_ms": statistics.median(client),
            "snapshot_p99_ms": p99(client),
            "controller_cpu_ms_per_snapshot": spent * 1000 / max(complete, 1),
            "node_rss_mib_median": statistics.median(rss),
            "node_rss_mib_max": max(rss),
            "snapshots_complete": complete,
        }
    finally:
        cluster.stop()


def measure(nodes: int, k: int, snapshots: int, say=print) -> dict[str, float]:
    """Both topologies, one after the other; the figures under their keys."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="snapmesh-bench-scale64-") as tmp:
        for label, topology in (("sparse", f"random-regular:{k}"), ("mesh", "mesh")):
            figures = measure_one(Path(tmp), nodes, topology, snapshots, say)
            out |= {f"scale64_{label}_{name}": value for name, value in figures.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench scale64", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64, help="node processes (default: 64)")
    parser.add_argument("--k", type=int, default=8, help="the sparse topology's degree (default: 8)")
    parser.add_argument("--snapshots", type=int, default=20, help="snapshots per topology (default: 20)")
    args = parser.parse_args(sys.argv[2:] if argv is None and sys.argv[1:2] == ["scale64"] else argv or [])
    nodes, k, snapshots = smoke.size(args.nodes, 6), smoke.size(args.k, 3), smoke.size(args.snapshots, 2)
    if not 1 <= k < nodes:
        parser.error(f"--k must be at least 1 and below --nodes ({nodes}), got {k}")
    load = os.getloadavg()
    print(f"{nodes} node processes, random-regular:{k} then mesh, {snapshots} snapshots each, idle cluster; "
          f"load average {load[0]:.1f} on {os.cpu_count()} cores at the start", flush=True)
    out = measure(nodes, k, snapshots, say=lambda text: print(text, flush=True))
    print(f"{'':<34} {'random-regular:' + str(k):>18} {'mesh':>10}")
    for figure in FIGURES:
        print(f"{figure:<34} {out[f'scale64_sparse_{figure}']:>18.1f} {out[f'scale64_mesh_{figure}']:>10.1f}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    bench_results.merge(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
