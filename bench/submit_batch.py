"""SubmitBatch on a 4-node mesh running the minimal app: `python -m bench submit_batch`.

Closed-loop callers (asyncio, in this process) send SubmitBatch calls of
`--batch` commands round-robin to the four nodes for `--seconds`. Figures, from
one window after a warm-up:
  - submit_batch_rate_4n_minimal: commands per second, counted by the nodes
    (the messages they received, `snapmesh_messages_received_total`: each
    command of bench.minimal_app sends exactly one);
  - cpu_us_per_command_4n_minimal: the whole machine's busy CPU over the
    window, per command, as `cpu_us_per_transfer_4n_peak` is measured (the
    client's CPU included: it is the cost a caller pays too).
Also printed: the nodes' own CPU per command, records per group commit, the
channel frames written per message and the share of messages that arrived
packed in payload runs (services/node/frames.py), the
client's CPU and the machine's CPU outside this bench ("not ours"), so a
reader can tell whether the client or another tenant was the bottleneck. `--smoke` runs a few seconds
with small batches, to check the bench works, not to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench import results as bench_results
from bench import smoke
from bench.phases import own_argv
from bench.observe import cpu_s, machine_busy_s
from snapmesh.processes.supervisor import Cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

APP = "bench.minimal_app:app"
NAME = "minimal"
NODES = 4


def _scrape(address: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    wanted = ("snapmesh_messages_received_total", "snapmesh_log_committed_records_total",
              "snapmesh_log_fsync_seconds_count", "snapmesh_channel_frames_sent_total",
              "snapmesh_channel_payload_run_messages_total")
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:  # a family per peer sums over its peers
            if sample.name in wanted:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def _totals(cluster: Cluster) -> dict[str, float]:
    totals: dict[str, float] = {}
    for node in cluster.config.nodes:
        for name, value in _scrape(node.metrics_address).items():
            totals[name] = totals.get(name, 0.0) + value
    return totals


async def _drive(cluster: Cluster, callers: int, batch: int, warmup_s: float, seconds: float) -> dict[str, float]:
    channels = [grpc.aio.insecure_channel(cluster.node_address(n.id), options=CLIENT_OPTIONS) for n in cluster.config.nodes]
    stubs = [pb_grpc.NodeStub(c) for c in channels]
    request = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=b"x")] * batch)
    refused = 0
    stop_at = time.monotonic() + warmup_s + seconds

    async def caller(first: int) -> None:
        nonlocal refused
        for stub in itertools.islice(itertools.cycle(stubs), first, None):
            if time.monotonic() >= stop_at:
                return
            response = await stub.SubmitBatch(request, timeout=60)
            refused += sum(1 for r in response.results if r.code)

    tasks = [asyncio.create_task(caller(i % len(stubs))) for i in range(callers)]
    try:
        await asyncio.sleep(warmup_s)
        pids = [child.pid for child in cluster.nodes.values()]
        before, cpu_before, client_before = _totals(cluster), sum(map(cpu_s, pids)), cpu_s(os.getpid())
        machine_before, started = machine_busy_s(), time.monotonic()
        await asyncio.sleep(seconds)
        after, cpu_after, client_after = _totals(cluster), sum(map(cpu_s, pids)), cpu_s(os.getpid())
        machine_after, elapsed = machine_busy_s(), time.monotonic() - started
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for channel in channels:
            await channel.close()
    commands = after["snapmesh_messages_received_total"] - before["snapmesh_messages_received_total"]
    commits = after["snapmesh_log_fsync_seconds_count"] - before["snapmesh_log_fsync_seconds_count"]
    records = after["snapmesh_log_committed_records_total"] - before["snapmesh_log_committed_records_total"]
    frames = after["snapmesh_channel_frames_sent_total"] - before["snapmesh_channel_frames_sent_total"]
    run_key = "snapmesh_channel_payload_run_messages_total"  # absent on a node from before payload runs
    in_runs = after.get(run_key, 0.0) - before.get(run_key, 0.0)
    nodes_s, client_s, machine_s = cpu_after - cpu_before, client_after - client_before, machine_after - machine_before
    return {
        f"submit_batch_rate_4n_{NAME}": commands / elapsed,
        f"cpu_us_per_command_4n_{NAME}": machine_s / max(commands, 1) * 1e6,
        "nodes_cpu_us_per_command": nodes_s / max(commands, 1) * 1e6,
        "records_per_commit": records / max(commits, 1),
        "frames_per_message": frames / max(commands, 1),
        "messages_in_runs_share": in_runs / max(commands, 1),
        "client_cores": client_s / elapsed,
        "not_ours_cores": (machine_s - nodes_s - client_s) / elapsed,
        "refused": float(refused),
    }


def measure(*, callers: int, batch: int, warmup_s: float, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-submit-batch-") as tmp:
        root = Path(tmp)
        path = write_cluster(root / "cluster.toml", nodes=NODES, topology="mesh", data_dir=root / "data")
        cluster = Cluster(path, app=APP).start()
        try:
            return asyncio.run(_drive(cluster, callers, batch, warmup_s, seconds))
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench submit_batch", description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=8, help="concurrent closed-loop SubmitBatch callers")
    parser.add_argument("--batch", type=int, default=1000, help="commands per SubmitBatch")
    parser.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    parser.add_argument("--smoke", action="store_true", help="a few seconds, small batches: does it run")
    parser.add_argument("--no-write", action="store_true", help="print, do not merge into bench/results.json")
    args = parser.parse_args(own_argv("submit_batch", argv))
    args.smoke = args.smoke or smoke.on()  # `python -m bench --smoke`'s too (bench/smoke.py)
    if args.smoke:
        args.callers, args.batch, args.seconds = 4, 100, 2.0
    figures = measure(callers=args.callers, batch=args.batch, warmup_s=1.0 if args.smoke else 3.0, seconds=args.seconds)
    keys = (f"submit_batch_rate_4n_{NAME}", f"cpu_us_per_command_4n_{NAME}")
    if not args.no_write and not args.smoke:
        bench_results.merge({k: figures[k] for k in keys})
    for name, value in figures.items():
        print(f"{name:<40} {value:>12,.3f}")
    print("caveat: one run on a shared, noisy machine; compare figures within one run, not across runs.")
    return 0 if figures["refused"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
