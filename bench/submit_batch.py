"""The generic path on a 4-node mesh: SubmitBatch of three apps, and unary Submit: `python -m bench submit_batch`.

SubmitBatch, one fresh mesh per app. Closed-loop callers (asyncio, in this
process) send SubmitBatch calls of `--batch` commands round-robin to the four
nodes for `--seconds`. The apps:
  - minimal (bench.minimal_app): a command sends one message, and does nothing else;
  - bank (services/app/bank.py, its JSON command): each pays 1 to the next peer, one message;
  - kvshard (services/app/kvshard.py): puts and gets over 100 keys per node (no messages).
Figures, from one window after a warm-up, per app:
  - submit_batch_rate_4n_<app>: commands per second (every item answered in the window);
  - cpu_us_per_command_4n_<app>: the whole machine's busy CPU over the
    window, per command, as `cpu_us_per_transfer_4n_peak` is measured (the
    client's CPU included: it is the cost a caller pays too).
Unary Submit on the minimal app's mesh (after its batches), UNARY_CALLERS
concurrent callers, then raw gRPC's unary calls from as many callers
(bench/grpc_raw.py, an echo server) in the same run:
  - submit_unary_rate_4n_minimal: unary commands per second;
  - submit_unary_records_per_commit_4n: records per group commit (the nodes'
    `snapmesh_log_committed_records_total` over `snapmesh_log_fsync_seconds_count`);
  - raw_unary_calls_per_s, and submit_unary_over_raw_unary: the ratio of the two rates.
embed's in-process submit (bench/embed_submit.py: four processes, each a server
embedding a node and calling it in process, the minimal app), as many callers:
  - embed_submit_many_rate_4n_minimal, embed_cpu_us_per_command_4n_minimal:
    `node.submit_many` of `--batch` commands;
  - embed_submit_rate_4n_minimal: unary `node.submit`.
Each rate over one raw batched gRPC stream's messages/s in the same run
(bench/grpc_raw.py, 100 messages a frame): `<rate's key>_over_raw_batched`.
Also printed: the nodes' own CPU per command, records per group commit, the
channel frames written per message and the share of messages that arrived
packed in payload runs (services/node/frames.py), the client's CPU and the
machine's CPU outside this bench ("not ours"), so a reader can tell whether
the client or another tenant was the bottleneck. `--smoke` runs a few seconds
with small batches on the minimal app's mesh alone, to check the bench works,
not to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench import embed_submit, grpc_raw, smoke
from bench import results as bench_results
from bench.phases import own_argv
from bench.observe import cpu_s, machine_busy_s
from snapmesh.processes.supervisor import Cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

NODES = 4
UNARY_CALLERS = grpc_raw.UNARY_CALLERS
KV_KEYS = 100  # kvshard's keys per node


def _minimal(node: str, peers: list[str], batch: int) -> list[bytes]:
    return [b"x"] * batch


def _bank(node: str, peers: list[str], batch: int) -> list[bytes]:
    return [json.dumps({"to": peers[i % len(peers)], "amount": 1}).encode() for i in range(batch)]


def _kvshard(node: str, peers: list[str], batch: int) -> list[bytes]:
    """A put then a get of each key in turn (the first put of a key creates it, at its own node: K1)."""
    out = []
    for i in range(batch):
        key = f"{node}/k{(i // 2) % KV_KEYS}"
        out.append(json.dumps({"op": "put", "key": key, "value": f"v{i}"} if i % 2 == 0 else {"op": "get", "key": key})
                   .encode())
    return out


# name -> (the app's spec, its [app] params, the commands of one batch to `node`)
APPS: dict[str, tuple[str, dict[str, int], Callable[[str, list[str], int], list[bytes]]]] = {
    "minimal": ("bench.minimal_app:app", {}, _minimal),
    "bank": ("snapmesh.services.app.bank:app", {"initial_balance": 10**15}, _bank),  # its App: the generic path
    "kvshard": ("kvshard", {}, _kvshard),
}


def _scrape(address: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    wanted = ("snapmesh_messages_received_total", "snapmesh_log_committed_records_total",
              "snapmesh_log_fsync_seconds_count", "snapmesh_channel_frames_sent_total",
              "snapmesh_channel_payload_run_messages_total", "snapmesh_transfers_received_total")
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


class _Window:
    """Counts answered commands while open; the CPU and metrics around it."""

    def __init__(self) -> None:
        self.open = False
        self.commands = self.refused = 0


async def drive(cluster: Cluster, callers: int, send: Callable, warmup_s: float, seconds: float) -> dict[str, float]:
    """`callers` closed-loop tasks, each `await send(stub, node) -> (answered, refused)` round-robin over the nodes."""
    channels = [grpc.aio.insecure_channel(cluster.node_address(n.id), options=CLIENT_OPTIONS) for n in cluster.config.nodes]
    targets = list(zip([pb_grpc.NodeStub(c) for c in channels], [n.id for n in cluster.config.nodes], strict=True))
    window = _Window()
    stop_at = time.monotonic() + warmup_s + seconds

    async def caller(first: int) -> None:
        for stub, node in itertools.islice(itertools.cycle(targets), first, None):
            if time.monotonic() >= stop_at:
                return
            answered, refused = await send(stub, node)
            if window.open:
                window.commands += answered
                window.refused += refused

    tasks = [asyncio.create_task(caller(i % len(targets))) for i in range(callers)]
    try:
        await asyncio.sleep(warmup_s)
        pids = [child.pid for child in cluster.nodes.values()]
        before, cpu_before, client_before = _totals(cluster), sum(map(cpu_s, pids)), cpu_s(os.getpid())
        machine_before, started = machine_busy_s(), time.monotonic()
        window.open = True
        await asyncio.sleep(seconds)
        window.open = False
        after, cpu_after, client_after = _totals(cluster), sum(map(cpu_s, pids)), cpu_s(os.getpid())
        machine_after, elapsed = machine_busy_s(), time.monotonic() - started
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for channel in channels:
            await channel.close()
    commands = window.commands
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}  # payload runs: absent on an older node
    # A node older than the app host (bench.bank_pair's baseline) counts its transfers only.
    messages = delta.get("snapmesh_messages_received_total", delta.get("snapmesh_transfers_received_total", 0.0))
    nodes_s, client_s, machine_s = cpu_after - cpu_before, client_after - client_before, machine_after - machine_before
    return {
        "rate": commands / elapsed,
        "cpu_us_per_command": machine_s / max(commands, 1) * 1e6,
        "nodes_cpu_us_per_command": nodes_s / max(commands, 1) * 1e6,
        "records_per_commit": delta["snapmesh_log_committed_records_total"] / max(delta["snapmesh_log_fsync_seconds_count"], 1),
        "messages_per_command": messages / max(commands, 1),
        "frames_per_message": delta["snapmesh_channel_frames_sent_total"] / max(messages, 1),
        "messages_in_runs_share": delta.get("snapmesh_channel_payload_run_messages_total", 0.0) / max(messages, 1),
        "client_cores": client_s / elapsed,
        "not_ours_cores": (machine_s - nodes_s - client_s) / elapsed,
        "refused": float(window.refused),
    }


@contextlib.contextmanager
def _cluster(app: str) -> Iterator[Cluster]:
    """A fresh 4-node mesh running `app` (with its [app] params), stopped after."""
    spec, params, _ = APPS[app]
    with tempfile.TemporaryDirectory(prefix=f"bench-submit-batch-{app}-") as tmp:
        root = Path(tmp)
        path = write_cluster(root / "cluster.toml", nodes=NODES, topology="mesh", data_dir=root / "data")
        table = "".join(f"{key} = {value}\n" for key, value in params.items())
        path.write_text(path.read_text() + f'\n[app]\nmodule = "{spec}"\n{table}')
        cluster = Cluster(path, app=spec).start()
        try:
            yield cluster
        finally:
            cluster.stop()


def batch_requests(app: str, cluster: Cluster, batch: int) -> dict[str, pb.SubmitBatchRequest]:
    """Node id -> the SubmitBatch request its callers send (the same one each time)."""
    topology = cluster.config.topology
    return {n.id: pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=c) for c in APPS[app][2](
        n.id, sorted(topology.outgoing(n.id)), batch)]) for n in cluster.config.nodes}


def measure_batch(app: str, cluster: Cluster, *, callers: int, batch: int, warmup_s: float, seconds: float) -> dict[str, float]:
    """SubmitBatch of `app`'s commands on `cluster` (running `app`)."""
    requests = batch_requests(app, cluster, batch)

    async def send(stub, node: str) -> tuple[int, int]:
        response = await stub.SubmitBatch(requests[node], timeout=60)
        return len(response.results), sum(1 for r in response.results if r.code)

    return asyncio.run(drive(cluster, callers, send, warmup_s, seconds))


def measure_unary(cluster: Cluster, *, callers: int, warmup_s: float, seconds: float) -> dict[str, float]:
    """Unary Submit of the minimal app from `callers` concurrent callers on `cluster` (running it)."""
    request = pb.SubmitRequest(command=b"x")

    async def send(stub, node: str) -> tuple[int, int]:
        await stub.Submit(request, timeout=60)
        return 1, 0

    return asyncio.run(drive(cluster, callers, send, warmup_s, seconds))


def _unary(cluster: Cluster, written: dict[str, float], warmup_s: float, seconds: float) -> None:
    figures = measure_unary(cluster, callers=UNARY_CALLERS, warmup_s=warmup_s, seconds=seconds)
    raw = grpc_raw.raw_unary_calls_per_s(seconds)
    written.update({
        "submit_unary_rate_4n_minimal": figures["rate"],
        "submit_unary_records_per_commit_4n": figures["records_per_commit"],
        "raw_unary_calls_per_s": raw,
        "submit_unary_over_raw_unary": figures["rate"] / raw,
    })
    print(f"-- unary Submit, minimal: {UNARY_CALLERS} callers; raw gRPC unary calls from as many, same run")
    for name in ("submit_unary_rate_4n_minimal", "submit_unary_records_per_commit_4n", "raw_unary_calls_per_s",
                 "submit_unary_over_raw_unary"):
        print(f"{name:<40} {written[name]:>12,.3f}")
    for name in ("nodes_cpu_us_per_command", "client_cores", "not_ours_cores"):
        print(f"{name:<40} {figures[name]:>12,.3f}")


def _embed(written: dict[str, float], callers: int, batch: int, warmup_s: float, seconds: float) -> float:
    """embed's in-process submit_many and submit; returns the items refused."""
    measured = embed_submit.measure(("batch", "unary"), callers=callers, batch=batch, warmup_s=warmup_s,
                                    seconds=seconds)
    many, unary = measured["batch"], measured["unary"]
    written.update({
        "embed_submit_many_rate_4n_minimal": many["rate"],
        "embed_cpu_us_per_command_4n_minimal": many["cpu_us_per_command"],
        "embed_submit_rate_4n_minimal": unary["rate"],
    })
    print(f"-- embed's in-process submit, minimal: submit_many of {batch} from {callers} callers; "
          f"submit from {UNARY_CALLERS}")
    for name in ("embed_submit_many_rate_4n_minimal", "embed_cpu_us_per_command_4n_minimal",
                 "embed_submit_rate_4n_minimal"):
        print(f"{name:<40} {written[name]:>12,.3f}")
    print(f"{'hosts_cpu_us_per_command (submit_many)':<40} {many['hosts_cpu_us_per_command']:>12,.3f}")
    return many["refused"] + unary["refused"]


def _over_raw_batched(written: dict[str, float]) -> None:
    """Every commands/s figure over one raw batched gRPC stream's messages/s, same run."""
    raw = grpc_raw.raw_batched_stream_msgs_per_s()
    rates = [k for k in written if k.endswith(tuple(f"_4n_{app}" for app in APPS)) and "_rate_" in k]
    print(f"-- over one raw batched gRPC stream ({raw:,.0f} messages/s, 100 a frame, same run)")
    for name in rates:
        written[f"{name}_over_raw_batched"] = written[name] / raw
        print(f"{name + '_over_raw_batched':<52} {written[name + '_over_raw_batched']:>8,.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench submit_batch", description=__doc__.splitlines()[0])
    parser.add_argument("--apps", nargs="+", choices=list(APPS), default=[],
                        help="the apps, in order (default: all; a smoke run: minimal)")
    parser.add_argument("--no-embed", action="store_true",
                        help="leave out embed's in-process submit (default: measured after the apps)")
    parser.add_argument("--no-unary", action="store_true",
                        help="leave out unary Submit (on the minimal app's mesh) and raw gRPC's unary calls")
    parser.add_argument("--callers", type=int, default=8, help="concurrent closed-loop SubmitBatch callers")
    parser.add_argument("--batch", type=int, default=1000, help="commands per SubmitBatch")
    parser.add_argument("--seconds", type=float, default=20.0, help="each measured window")
    parser.add_argument("--smoke", action="store_true", help="a few seconds, small batches: does it run")
    parser.add_argument("--no-write", action="store_true", help="print, do not merge into bench/results.json")
    args = parser.parse_args(own_argv("submit_batch", argv))
    args.smoke = args.smoke or smoke.on()  # `python -m bench --smoke`'s too (bench/smoke.py)
    if args.smoke:
        args.callers, args.batch, args.seconds = 4, 100, 1.0
    warmup_s = 0.5 if args.smoke else 3.0
    written: dict[str, float] = {}
    refused = 0.0
    # A smoke run: one mesh, the minimal app's (tests/shells/test_bench_commands.py runs the others' commands).
    apps = args.apps or (["minimal"] if args.smoke else list(APPS))
    for app in apps:
        with _cluster(app) as cluster:
            figures = measure_batch(app, cluster, callers=args.callers, batch=args.batch, warmup_s=warmup_s,
                                    seconds=args.seconds)
            written[f"submit_batch_rate_4n_{app}"] = figures.pop("rate")
            written[f"cpu_us_per_command_4n_{app}"] = figures.pop("cpu_us_per_command")
            refused += figures["refused"]
            print(f"-- SubmitBatch, {app}: {args.callers} callers, {args.batch} commands a call")
            for name, value in (*((k, v) for k, v in written.items() if k.endswith(f"_{app}")), *figures.items()):
                print(f"{name:<40} {value:>12,.3f}")
            if app == "minimal" and not args.no_unary:  # unary Submit on the same mesh, after the batches
                _unary(cluster, written, warmup_s, args.seconds)
    if not args.no_embed:
        refused += _embed(written, args.callers, args.batch, warmup_s, args.seconds)
    _over_raw_batched(written)
    if not args.no_write and not args.smoke:
        bench_results.merge(written)
    print("caveat: one run on a shared, noisy machine; compare figures within one run, not across runs.")
    return 0 if refused == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
