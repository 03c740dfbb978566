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

The pieces: this module runs the phases; `bench.loadgen` is the load
generator (the project's, in a process of its own, driven over its stdin);
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

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.loadgen import LoadGen
from bench.observe import Observer, cpu_s, window_between
from bench.report import Latency, Markers, Results, p50_p99, table
from snapmesh.settings.config import write_cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.checking.scrape import largest
from snapmesh.checking.snapshots import duration_s
from snapmesh.processes.supervisor import Cluster
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
        server.append(duration_s(snapshot) * 1e3)
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
            durations.append(duration_s(snapshot) * 1e3)
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
        before = cpu_s(pid)
        time.sleep(0.5)
        if cpu_s(pid) - before < 0.03:  # under 6% of a core
            break
    return time.perf_counter() - start


def _markers_per_snapshot(cluster: Cluster) -> dict[str, int]:
    """marker_sent records per snapshot id, from every node's transfer log."""
    from snapmesh.checking.node_logs import log_files

    # every segment, sealed ones too: at today's rates a run fills several
    paths = [str(p) for n in cluster.node_ids for p in log_files(cluster.config.data_dir, n)]
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
        loadgen = LoadGen(cluster, batch=BATCH, seed=nodes)
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
        max_unacked = max(largest(a, "snapmesh_channel_unacked_messages") for a in observer.metrics_addresses)
        window = window_between(start, observer.sample(), [], max_unacked)
        results.latency.append(Latency(nodes, fraction, client, server, failed, in_flight, window))
        say(
            f"  latency, {nodes} nodes, offered {rate:,.0f}/s, achieved {window.received_per_s:,.0f}/s: "
            f"{len(client)} COMPLETE, {failed} not; client p50/p99 {p50_p99(client)} ms"
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


def main() -> int:
    from bench.grpc_raw import measure

    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:5.1f}s]{text}", file=sys.stderr, flush=True)

    results = Results(window_s=WINDOW_S, batch=BATCH)
    say(" raw gRPC baseline")
    results.raw = measure()
    with tempfile.TemporaryDirectory(prefix="snapmesh-bench-") as tmp:
        root = Path(tmp)
        _run_cluster(root, 4, results, say, lambda *a: _four_nodes(*a, results, say))
        _run_cluster(root, 8, results, say, lambda *a: _eight_nodes(*a, results, say))
        say(" done; cleaning up")
    for line in table(results):  # before the phase on hosts: a failure there loses none of it
        print(line, flush=True)
    hosts_figures, status = _on_hosts(results, say)
    for name, value in hosts_figures.items():
        print(f"{name:<52} {value:>12,.3f}")
    print(
        f"caveat: one run ({time.perf_counter() - started:.0f}s) on a shared, noisy 2-core machine; 'not ours' is "
        "CPU other tenants used meanwhile; compare figures within one run, not across runs."
    )
    return status


def _on_hosts(results: Results, say) -> tuple[dict[str, float], int]:
    """The multi-host phase (bench.hosts), merged into bench/results.json; exit status 2 without the rights."""
    from bench import hosts
    from bench import results as bench_results
    from snapmesh.hosts.net import missing_rights

    if problem := missing_rights():
        print(f"bench cluster: the phase on hosts {problem}", file=sys.stderr)
        return {}, 2
    say(f" {hosts.NODES} nodes on hosts, {hosts.DELAY_MS:g} ms one way on every link")
    figures = hosts.measure(results.peak.received_per_s, say)
    bench_results.merge(figures)
    return figures, 0


if __name__ == "__main__":
    sys.exit(main())
