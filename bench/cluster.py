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
  - the raw gRPC figures from `bench.grpc_raw.measure()` (one batched stream,
    one unary round trip) and the cluster's rate as a fraction of them.

The load generator runs in a process of its own (`python -m bench.cluster
loadgen`, driven over its stdin), sends pre-serialized batches and does not
parse the answers, so it stays cheap; the table says how much CPU it used
beside the nodes (utime+stime from /proc/<pid>/stat), and how busy the rest of
the machine was, so a reader can judge whether it was the bottleneck.

Everything runs in a temporary directory that is removed at the end; every
process started here is stopped (the load generator also exits on its own
when this process goes away: its stdin closes).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from snapmesh.config import write_cluster
from snapmesh.supervisor import Cluster
from snapmesh.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

BATCH = 200  # transfers per TransferBatch call
RAMP_CALLERS = (1, 2, 4, 8, 16, 32)  # concurrent callers per node, in ramp order
RAMP_GROWTH = 1.05  # a ramp step that beats the best so far by less than 5% does not count as growth
RAMP_PATIENCE = 2  # the ramp ends after this many steps in a row without growth
SETTLE_S = 1.5  # after a load change, before a window opens
WINDOW_S = 4.0  # one measurement window
AB_PAIRS = 5  # A (no snapshots) / B (a snapshot every 100 ms) window pairs
SNAPSHOT_EVERY_S = 0.1
LATENCY_SNAPSHOTS = 50  # per cluster size and load, back to back with wait=true
LATENCY_CAP_S = 20.0  # ... or fewer, if they take longer than this in all
LATENCY_FRACTIONS = (0.25, 0.5)  # paced offered load, as fractions of the 4-node peak
DRAIN_CAP_S = 30.0  # longest wait for the controller to go idle after a B window
INITIAL_BALANCE = 10**12  # nobody runs out of money: refusals would not be load
DEADLINE_S = 10.0
TRANSFER_PATH = "/snapmesh.v1.Node/TransferBatch"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------- load generator


@dataclass
class _GenStats:
    calls: int = 0
    errors: int = 0
    last_error: str = ""


async def _loadgen(spec: dict) -> None:
    """The child process: callers per node, changed by commands on stdin.

    stdin lines: {"callers": C, "rate": R} (C callers per node, R transfers/s
    in all, 0 = as fast as answers come back); "stats" (one JSON line back);
    EOF: exit.
    """
    loop = asyncio.get_running_loop()
    rng = random.Random(spec.get("seed", 1))
    batch = spec["batch"]
    stats = _GenStats()
    channels = []
    calls = {}
    payloads: dict[str, list[bytes]] = {}
    for node_id, node in spec["nodes"].items():
        channel = grpc.aio.insecure_channel(node["address"], options=CLIENT_OPTIONS)
        channels.append(channel)
        # Raw bytes in, raw bytes out: the generator neither builds nor parses
        # messages per call.
        calls[node_id] = channel.unary_unary(TRANSFER_PATH)
        payloads[node_id] = [
            pb.TransferBatchRequest(
                transfers=[
                    pb.TransferRequest(to=rng.choice(node["neighbours"]), amount=rng.randint(1, 100))
                    for _ in range(batch)
                ]
            ).SerializeToString()
            for _ in range(16)
        ]

    async def caller(node_id: str, index: int, interval: float) -> None:
        call, mine = calls[node_id], payloads[node_id]
        k = index
        due = loop.time() + (interval * rng.random() if interval else 0.0)  # spread the paced callers
        while True:
            if interval:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                due = max(due + interval, loop.time() - interval)  # a late call does not start a burst
            try:
                await call(mine[k % len(mine)], timeout=30)
                stats.calls += 1
            except grpc.aio.AioRpcError as error:
                stats.errors += 1
                stats.last_error = f"{node_id}: {error.code().name}: {error.details()}"
                await asyncio.sleep(0.1)
            k += 1

    tasks: list[asyncio.Task] = []
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            line = line.strip()
            if line == "stats":
                print(json.dumps(stats.__dict__), flush=True)
                continue
            command = json.loads(line)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            tasks = []
            per_node, rate = command["callers"], command.get("rate", 0)
            interval = 0.0
            if rate:
                interval = batch * per_node * len(calls) / rate  # seconds between one caller's calls
            for node_id in calls:
                for index in range(per_node):
                    tasks.append(asyncio.create_task(caller(node_id, index, interval)))
            print("ok", flush=True)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()


class LoadGen:
    """The parent's handle on the load generator process."""

    def __init__(self, cluster: Cluster, *, batch: int = BATCH, seed: int = 1) -> None:
        topology = cluster.config.topology
        spec = {
            "batch": batch,
            "seed": seed,
            "nodes": {
                n: {"address": cluster.node_address(n), "neighbours": sorted(topology.outgoing(n))}
                for n in topology.nodes
            },
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.cluster", "loadgen"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._send(json.dumps(spec), expect=None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, line: str, expect: str | None = "ok") -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if expect is None:
            return ""
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the load generator exited")
        return answer.strip()

    def set(self, callers: int, rate: float = 0.0) -> None:
        self._send(json.dumps({"callers": callers, "rate": rate}))

    def stats(self) -> dict:
        return json.loads(self._send("stats", expect="json"))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------- observation


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle (all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / _CLK_TCK


_SAMPLE = re.compile(r"^(snapmesh_[a-z_]+?)(?:\{([^}]*)\})? (\S+)$", re.M)


def _scrape(address: str) -> dict[str, float]:
    """Sum of every snapmesh_* series, by metric name (labels summed away)."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for name, _labels, value in _SAMPLE.findall(text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def _scrape_max(address: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    values = [float(v) for n, _l, v in _SAMPLE.findall(text) if n == name]
    return max(values, default=0.0)


@dataclass
class Sample:
    at: float
    metrics: dict[str, float]
    cpu: dict[str, float]
    machine: float


@dataclass
class Window:
    seconds: float
    received_per_s: float
    sent_per_s: float
    commits_per_s: float
    cpu: dict[str, float]  # cores used, by group
    snapshots: list[str] = field(default_factory=list)
    max_unacked: float = 0.0


class Observer:
    """Scrapes the nodes' metrics and the CPU of every process of one cluster."""

    def __init__(self, cluster: Cluster, loadgen: LoadGen) -> None:
        self.cluster = cluster
        self.loadgen = loadgen
        self.metrics_addresses = [cluster.config.node(n).metrics_address for n in cluster.node_ids]

    def sample(self) -> Sample:
        totals: dict[str, float] = {}
        for address in self.metrics_addresses:
            for name, value in _scrape(address).items():
                totals[name] = totals.get(name, 0.0) + value
        cpu = {
            "nodes": sum(_cpu_s(self.cluster.node_pid(n)) for n in self.cluster.node_ids),
            "controller": _cpu_s(self.cluster.controller_pid),
            "loadgen": _cpu_s(self.loadgen.pid),
            "bench": _cpu_s(os.getpid()),
        }
        return Sample(time.perf_counter(), totals, cpu, _machine_busy_s())

    def window(self, seconds: float, *, snapshot_every: float = 0.0, controller=None) -> Window:
        start = self.sample()
        snapshots: list[str] = []
        if snapshot_every:
            _trigger_every(controller, snapshot_every, start.at + seconds, snapshots)
        else:
            time.sleep(max(0.0, start.at + seconds - time.perf_counter()))
        max_unacked = max(_scrape_max(a, "snapmesh_channel_unacked_messages") for a in self.metrics_addresses)
        end = self.sample()
        return _window(start, end, snapshots, max_unacked)


def _window(start: Sample, end: Sample, snapshots: list[str], max_unacked: float) -> Window:
    elapsed = end.at - start.at

    def rate(name: str) -> float:
        return (end.metrics.get(name, 0.0) - start.metrics.get(name, 0.0)) / elapsed

    cpu = {k: (end.cpu[k] - start.cpu[k]) / elapsed for k in start.cpu}
    ours = sum(cpu.values())
    cpu["other"] = max(0.0, (end.machine - start.machine) / elapsed - ours)
    return Window(
        seconds=elapsed,
        received_per_s=rate("snapmesh_transfers_received_total"),
        sent_per_s=rate("snapmesh_transfers_sent_total"),
        commits_per_s=rate("snapmesh_log_fsync_seconds_count"),
        cpu=cpu,
        snapshots=snapshots,
        max_unacked=max_unacked,
    )


def _trigger_every(controller: pb_grpc.ControllerStub, every: float, until: float, ids: list[str]) -> None:
    """TriggerSnapshot (no wait, random initiator) every `every` seconds until `until`."""
    due = time.perf_counter()
    while due < until:
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        snapshot = controller.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=False), timeout=5)
        ids.append(snapshot.snapshot_id)
        due += every
    time.sleep(max(0.0, until - time.perf_counter()))


def _ts(stamp) -> float:
    return stamp.seconds + stamp.nanos / 1e9


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-int(q * 1000) * len(ordered) // 1000))  # ceil(q * n)
    return ordered[min(rank, len(ordered)) - 1]


def _p50_p99(values: list[float], digits: int = 1) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.{digits}f} / {_percentile(values, 0.99):.{digits}f}"


@dataclass
class Latency:
    nodes: int
    fraction: float
    client_ms: list[float]
    controller_ms: list[float]
    failed: int
    in_flight: list[int]
    window: Window


def _latency_run(controller, count: int, cap_s: float, statuses: dict[str, int]):
    """Back-to-back snapshots with wait=true: client and controller durations (ms)."""
    client, server, in_flight, failed = [], [], [], 0
    until = time.perf_counter() + cap_s
    for _ in range(count):
        if time.perf_counter() > until:
            break
        t0 = time.perf_counter()
        try:
            snapshot = controller.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=DEADLINE_S + 10)
        except grpc.RpcError:
            failed += 1
            continue
        elapsed = time.perf_counter() - t0
        statuses[snapshot.snapshot_id] = snapshot.status
        if snapshot.status != pb.Snapshot.COMPLETE:
            failed += 1
            continue
        client.append(elapsed * 1e3)
        server.append((_ts(snapshot.finished_at) - _ts(snapshot.started_at)) * 1e3)
        in_flight.append(sum(len(c.in_flight) for c in snapshot.channels))
    return client, server, failed, in_flight


def _finished(controller, ids: list[str], statuses: dict[str, int], wait_s: float = 15.0):
    """Controller-side durations (ms) and in-flight counts of the COMPLETE ones;
    how many FAILED; how many were still running after `wait_s`."""
    deadline = time.monotonic() + wait_s
    durations, in_flight, failed, running = [], [], 0, 0
    for sid in ids:
        while True:
            snapshot = controller.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=10)
            if snapshot.status != pb.Snapshot.IN_PROGRESS or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        statuses[sid] = snapshot.status
        if snapshot.status == pb.Snapshot.COMPLETE:
            durations.append((_ts(snapshot.finished_at) - _ts(snapshot.started_at)) * 1e3)
            in_flight.append(sum(len(c.in_flight) for c in snapshot.channels))
        elif snapshot.status == pb.Snapshot.FAILED:
            failed += 1
        else:
            running += 1
    return durations, in_flight, failed, running


def _wait_controller_idle(cluster: Cluster, cap_s: float) -> float:
    """Wait until the controller stops burning CPU (it persists finished snapshots
    after answering for them); return how long that took."""
    start = time.perf_counter()
    pid = cluster.controller_pid
    while time.perf_counter() - start < cap_s:
        before = _cpu_s(pid)
        time.sleep(0.5)
        if _cpu_s(pid) - before < 0.03:  # under 6% of a core
            break
    return time.perf_counter() - start


def _markers_per_snapshot(cluster: Cluster) -> dict[str, int]:
    """marker_sent records per snapshot id, from every node's transfer log."""
    paths = [str(cluster.config.log_path(n)) for n in cluster.node_ids]
    out = subprocess.run(
        ["grep", "-hF", '"kind":"marker_sent"', *paths], capture_output=True, text=True, check=False
    ).stdout
    counts: dict[str, int] = {}
    for line in out.splitlines():
        try:
            sid = json.loads(line)["snapshot_id"]
        except (json.JSONDecodeError, KeyError):
            continue  # a line still being written
        counts[sid] = counts.get(sid, 0) + 1
    return counts


# ------------------------------------------------------------------ phases


@dataclass
class Markers:
    nodes: int
    channels: int
    counts: list[int]  # per COMPLETE snapshot, from the logs
    not_complete: int
    metric_sent: float  # markers_sent_total over the cluster's life
    snapshots_in_logs: int


@dataclass
class Results:
    raw: dict[str, float] = field(default_factory=dict)
    ramp: list[tuple[int, Window]] = field(default_factory=list)
    peak: Window | None = None
    peak_callers: int = 0
    ab: list[tuple[Window, Window]] = field(default_factory=list)
    ab_drain_s: list[float] = field(default_factory=list)
    ab_durations: list[float] = field(default_factory=list)
    ab_in_flight: list[int] = field(default_factory=list)
    ab_failed: int = 0
    ab_running: int = 0
    latency: list[Latency] = field(default_factory=list)
    markers: list[Markers] = field(default_factory=list)
    gen_errors: list[str] = field(default_factory=list)


def _start_cluster(root: Path, nodes: int) -> Cluster:
    data = root / f"mesh-{nodes}"
    config = write_cluster(
        data / "cluster.toml", nodes=nodes, topology="mesh", deadline=DEADLINE_S, initial_balance=INITIAL_BALANCE
    )
    return Cluster(config).start()


def _run_cluster(root: Path, nodes: int, results: Results, say, body) -> None:
    """Start an N-node mesh and a load generator, run `body`, count markers, stop all."""
    say(f" {nodes}-node mesh: starting")
    cluster = _start_cluster(root, nodes)
    loadgen = None
    channel = grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS)
    try:
        controller = pb_grpc.ControllerStub(channel)
        loadgen = LoadGen(cluster, seed=nodes)
        observer = Observer(cluster, loadgen)
        statuses: dict[str, int] = {}
        body(cluster, controller, loadgen, observer, statuses)
        loadgen.set(0)
        results.gen_errors += _gen_errors(loadgen)
        counts = _markers_per_snapshot(cluster)
        complete = [sid for sid, status in statuses.items() if status == pb.Snapshot.COMPLETE]
        results.markers.append(
            Markers(
                nodes=nodes,
                channels=len(cluster.config.topology.channels),
                counts=[counts.get(sid, 0) for sid in complete],
                not_complete=len(statuses) - len(complete),
                metric_sent=observer.sample().metrics.get("snapmesh_markers_sent_total", 0.0),
                snapshots_in_logs=len(counts),
            )
        )
    finally:
        channel.close()
        if loadgen is not None:
            loadgen.close()
        cluster.stop()


def _latencies(cluster, controller, loadgen: LoadGen, observer: Observer, statuses, results: Results, say) -> None:
    nodes = len(cluster.node_ids)
    for fraction in LATENCY_FRACTIONS:
        rate = fraction * results.peak.received_per_s
        loadgen.set(_paced_callers(nodes), rate=rate)
        time.sleep(SETTLE_S)
        start = observer.sample()
        client, server, failed, in_flight = _latency_run(controller, LATENCY_SNAPSHOTS, LATENCY_CAP_S, statuses)
        max_unacked = max(_scrape_max(a, "snapmesh_channel_unacked_messages") for a in observer.metrics_addresses)
        window = _window(start, observer.sample(), [], max_unacked)
        results.latency.append(Latency(nodes, fraction, client, server, failed, in_flight, window))
        say(
            f"  latency, {nodes} nodes, offered {rate:,.0f}/s, achieved {window.received_per_s:,.0f}/s: "
            f"{len(client)} COMPLETE, {failed} not; client p50/p99 {_p50_p99(client)} ms"
        )


def _paced_callers(nodes: int) -> int:
    """Paced callers per node: enough that the pacing, not round trips, sets the rate."""
    return 4 if nodes <= 4 else 2


def _four_nodes(cluster, controller, loadgen: LoadGen, observer: Observer, statuses, results: Results, say) -> None:
    # Ramp: more concurrent callers (closed loop) until the achieved rate stops growing.
    best, flat = 0.0, 0
    for callers in RAMP_CALLERS:
        loadgen.set(callers)
        time.sleep(SETTLE_S)
        window = observer.window(WINDOW_S)
        results.ramp.append((callers, window))
        say(f"  ramp: {callers} callers/node -> {window.received_per_s:,.0f} transfers/s")
        if results.peak is None or window.received_per_s > results.peak.received_per_s:
            results.peak, results.peak_callers = window, callers
        if window.received_per_s < best * RAMP_GROWTH:
            flat += 1
            if flat == RAMP_PATIENCE:
                break  # stopped growing
        else:
            flat = 0
        best = max(best, window.received_per_s)
    # Snapshot latency under paced load (before the A/B: no backlog at the controller).
    _latencies(cluster, controller, loadgen, observer, statuses, results, say)
    # A/B at the peak's offered load: A without snapshots, B with one every 100 ms.
    # After each B the controller still persists what finished; wait for it, so
    # no window pays for the previous one's snapshots.
    loadgen.set(results.peak_callers)
    time.sleep(SETTLE_S)
    b_ids: list[str] = []
    for _ in range(AB_PAIRS):
        a = observer.window(WINDOW_S)
        b = observer.window(WINDOW_S, snapshot_every=SNAPSHOT_EVERY_S, controller=controller)
        results.ab.append((a, b))
        b_ids += b.snapshots
        results.ab_drain_s.append(_wait_controller_idle(cluster, DRAIN_CAP_S))
        say(
            f"  A/B: {a.received_per_s:,.0f} / {b.received_per_s:,.0f} transfers/s "
            f"({len(b.snapshots)} snapshots; controller busy {results.ab_drain_s[-1]:.1f}s after)"
        )
    loadgen.set(0)
    found = _finished(controller, b_ids, statuses)
    results.ab_durations, results.ab_in_flight, results.ab_failed, results.ab_running = found


def _eight_nodes(cluster, controller, loadgen: LoadGen, observer: Observer, statuses, results: Results, say) -> None:
    _latencies(cluster, controller, loadgen, observer, statuses, results, say)


def _gen_errors(loadgen: LoadGen) -> list[str]:
    stats = loadgen.stats()
    return [f"{stats['errors']} failed calls, last: {stats['last_error']}"] if stats["errors"] else []


# ------------------------------------------------------------------- table


def _row(label: str, figure: str) -> str:
    return f"{label:<62} {figure:>24}".rstrip()


def _cpu_text(cpu: dict[str, float]) -> str:
    return (
        f"nodes {cpu['nodes']:.2f}, controller {cpu['controller']:.2f}, load generator {cpu['loadgen']:.2f}, "
        f"bench {cpu['bench']:.2f}, not ours {cpu['other']:.2f}"
    )


def table(r: Results) -> list[str]:
    peak = r.peak
    raw = r.raw
    rows = [_row("snapmesh on loopback, one run", "figure")]
    rows.append(_row("raw gRPC: one stream, 100 msgs/frame, acked (msgs/s)", f"{raw['stream_batched_per_s']:,.0f}"))
    rows.append(_row("raw gRPC: one stream, 1 msg/frame, acked (msgs/s)", f"{raw['stream_single_per_s']:,.0f}"))
    rows.append(_row("raw gRPC: unary round trip p50 / p99 (ms)", f"{raw['unary_p50_ms']:.3f} / {raw['unary_p99_ms']:.3f}"))
    rows.append(_row("raw gRPC: unary sequential calls/s", f"{raw['unary_per_s']:,.0f}"))
    a_windows = [a for a, _ in r.ab]
    a_rates = [a.received_per_s for a in a_windows]
    b_rates = [b.received_per_s for _, b in r.ab]
    sustained = statistics.mean(a_rates)
    rows.append(_row("4-node mesh: highest sustained rate (transfers/s, node-counted)", f"{sustained:,.0f}"))
    rows.append(
        _row(
            f"  mean of {len(a_rates)} {WINDOW_S:g}s windows at {r.peak_callers} callers/node x {BATCH}",
            f"min {min(a_rates):,.0f} max {max(a_rates):,.0f}",
        )
    )
    ramp = " ".join(f"{c}:{w.received_per_s / 1e3:.0f}k" for c, w in r.ramp)
    rows.append(_row("  ramp, callers per node : rate (best window)", f"{ramp} ({peak.received_per_s:,.0f})"))
    rows.append(_row("  / raw batched stream rate", f"{sustained / raw['stream_batched_per_s']:.3f}"))
    rows.append(_row("  / raw unary calls per second", f"{sustained / raw['unary_per_s']:.1f}x"))
    commits = statistics.mean(a.commits_per_s for a in a_windows)
    sent = statistics.mean(a.sent_per_s for a in a_windows)
    rows.append(_row("  log group commits/s, all nodes (transfers sent per commit)", f"{commits:,.0f} ({sent / commits:.0f})"))
    rows.append(_row("  deepest channel outbox seen at window ends (msgs)", f"{max(a.max_unacked for a in a_windows):,.0f}"))
    a_cpu = {k: statistics.mean(a.cpu[k] for a in a_windows) for k in peak.cpu}
    rows.append("    CPU, cores of 2: " + _cpu_text(a_cpu))
    ratio = sum(b_rates) / sum(a_rates)
    rows.append(_row("rate with a snapshot every 100 ms / without (same load)", f"{ratio:.2f}"))
    pairs = " ".join(f"{b / a:.2f}" for a, b in zip(a_rates, b_rates, strict=True))
    rows.append(_row(f"  per A/B pair ({WINDOW_S:g}s windows, interleaved)", pairs))
    b_cpu = {k: statistics.mean(b.cpu[k] for _, b in r.ab) for k in peak.cpu}
    rows.append("    CPU in B windows: " + _cpu_text(b_cpu))
    n_ab = sum(len(b.snapshots) for _, b in r.ab)
    rows.append(_row("  B snapshots: triggered / failed / unfinished", f"{n_ab} / {r.ab_failed} / {r.ab_running}"))
    rows.append(_row("  B snapshots: controller p50 / p99 (ms)", _p50_p99(r.ab_durations, 0)))
    rows.append(_row("  B snapshots: in-flight transfers recorded, p50 / max", _p50_max(r.ab_in_flight)))
    drains = " ".join(f"{d:.1f}" for d in r.ab_drain_s)
    rows.append(_row("  controller still busy after each B window (s)", drains))
    for lat in r.latency:
        w = lat.window
        rows.append(
            _row(
                f"snapshot latency, {lat.nodes} nodes, paced at {lat.fraction:.0%} of the ramp's best",
                f"{w.received_per_s:,.0f} transfers/s",
            )
        )
        rows.append(_row("  COMPLETE back to back (not COMPLETE)", f"{len(lat.client_ms)} ({lat.failed})"))
        rows.append(_row("  trigger -> COMPLETE, client, p50 / p99 (ms)", _p50_p99(lat.client_ms)))
        rows.append(_row("  started_at -> finished_at, controller, p50 / p99 (ms)", _p50_p99(lat.controller_ms)))
        rows.append(_row("  in-flight transfers recorded, p50 / max", _p50_max(lat.in_flight)))
        rows.append("    CPU: " + _cpu_text(w.cpu))
    for m in r.markers:
        counts = sorted(set(m.counts))
        figure = "/".join(str(c) for c in counts) or "n/a"
        verdict = "equal" if counts == [m.channels] else "DIFFERENT"
        rows.append(
            _row(
                f"markers per snapshot, {m.nodes} nodes (logs, {len(m.counts)} COMPLETE)",
                f"{figure} vs {m.channels} channels: {verdict}",
            )
        )
        per = m.metric_sent / m.snapshots_in_logs if m.snapshots_in_logs else float("nan")
        rows.append(_row("  markers_sent_total / snapshots seen in the logs", f"{per:.2f}"))
    for error in r.gen_errors:
        rows.append(f"load generator: {error}")
    return rows


def _p50_max(values: list[int]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):,.0f} / {max(values):,}"


def main() -> int:
    from bench.grpc_raw import measure

    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:5.1f}s]{text}", file=sys.stderr, flush=True)

    results = Results()
    say(" raw gRPC baseline")
    results.raw = measure()
    with tempfile.TemporaryDirectory(prefix="snapmesh-bench-") as tmp:
        root = Path(tmp)
        _run_cluster(root, 4, results, say, lambda *a: _four_nodes(*a, results, say))
        _run_cluster(root, 8, results, say, lambda *a: _eight_nodes(*a, results, say))
        say(" done; cleaning up")
    for line in table(results):
        print(line)
    print(
        f"caveat: one run ({time.perf_counter() - started:.0f}s) on a shared, noisy 2-core machine; 'not ours' is "
        "CPU other tenants used meanwhile; compare figures within one run, not across runs."
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["loadgen"]:
        asyncio.run(_loadgen(json.loads(sys.stdin.readline())))
    else:
        sys.exit(main())
