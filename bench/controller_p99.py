"""Controller-side snapshot latency at peak load, a snapshot every 100 ms:
`python -m bench controller`.

A 4-node mesh, the load generator of `bench.cluster` at the most concurrent
callers a short ramp finds best; then, for WINDOW_S, `TriggerSnapshot` (no wait)
every 100 ms. Each snapshot's latency is the controller's own view:
`finished_at - started_at` (trigger to COMPLETE). In the same run, the unary
round trip to the same controller under the same load (GetCluster) gives the
baseline the figure is read against. Keys merged into bench/results.json:
`controller_p99_ms_100ms`, `controller_p50_ms_100ms`,
`controller_p99_over_unary_p99_100ms`, `controller_failed_100ms`, and the per-node
p99s of `Snapshot.stats` (`controller_{start_delay,recording,report_time}_p99_ms_100ms`)
that say whether the time is spent at the nodes or at the controller.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import grpc

from bench.lab import BATCH, settled, start_cluster
from bench import results, smoke
from bench.loadgen import LoadGen
from bench.observe import Observer, cpu_s
from bench.report import percentile
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.checking.snapshots import duration_s
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

NODES = 4
RAMP_CALLERS = (4, 8, 16)
SETTLE_S = 1.5
RAMP_WINDOW_S = 3.0
WINDOW_S = 10.0
EVERY_S = 0.1
PROBES_PER_TRIGGER = 3  # unary round trips between two triggers, at most


def _trigger_and_probe(controller, seconds: float) -> tuple[list[str], list[float]]:
    """A trigger every EVERY_S; between triggers, unary GetCluster round trips."""
    ids: list[str] = []
    rtts: list[float] = []
    start = time.perf_counter()
    due = start
    while due < start + seconds:
        ids.append(controller.TriggerSnapshot(pb.TriggerSnapshotRequest(), timeout=10).snapshot_id)
        due += EVERY_S
        for _ in range(PROBES_PER_TRIGGER):
            if time.perf_counter() > due - 0.01:
                break
            t0 = time.perf_counter()
            controller.GetCluster(pb.GetClusterRequest(), timeout=10)
            rtts.append((time.perf_counter() - t0) * 1e3)
        time.sleep(max(0.0, due - time.perf_counter()))
    return ids, rtts


def _outcomes(controller, ids: list[str], wait_s: float = 30.0) -> list[pb.Snapshot]:
    deadline = time.monotonic() + wait_s
    return [settled(controller, sid, deadline, poll_s=0.05) for sid in ids]


def measure(say=print) -> dict[str, float]:
    ramp_callers = RAMP_CALLERS[:1] if smoke.on() else RAMP_CALLERS  # a smoke run: one ramp step, short windows
    settle_s, ramp_window_s, window_s = (0.3, 0.5, 1.0) if smoke.on() else (SETTLE_S, RAMP_WINDOW_S, WINDOW_S)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_cluster(Path(tmp), NODES)
        loadgen = None
        channel = grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS)
        try:
            controller = pb_grpc.ControllerStub(channel)
            loadgen = LoadGen(cluster, batch=BATCH, seed=7)
            observer = Observer(cluster, loadgen)
            best, best_callers = 0.0, ramp_callers[0]
            for callers in ramp_callers:
                loadgen.set(callers)
                time.sleep(settle_s)
                rate = observer.window(ramp_window_s).received_per_s
                say(f"  ramp: {callers} callers/node -> {rate:,.0f} transfers/s")
                if rate > best:
                    best, best_callers = rate, callers
            loadgen.set(best_callers)
            time.sleep(settle_s)
            cpu0, t0 = cpu_s(cluster.controller_pid), time.perf_counter()
            ids, rtts = _trigger_and_probe(controller, window_s)
            controller_cores = (cpu_s(cluster.controller_pid) - cpu0) / (time.perf_counter() - t0)
            loadgen.set(0)
            snapshots = _outcomes(controller, ids)
        finally:
            channel.close()
            if loadgen is not None:
                loadgen.close()
            cluster.stop()
    complete = [duration_s(s) * 1e3 for s in snapshots if s.status == pb.Snapshot.COMPLETE]
    failed = sum(s.status != pb.Snapshot.COMPLETE for s in snapshots)
    p99, unary_p99 = percentile(complete, 99), percentile(rtts, 99)
    entries = statistics.mean(s.stats.in_flight_messages for s in snapshots)
    say(
        f"  {len(snapshots)} snapshots at {best_callers} callers/node ({best:,.0f} transfers/s), {failed} not COMPLETE; "
        f"{entries:,.0f} in-flight entries each on average; controller used {controller_cores:.2f} cores"
    )
    say(
        f"  controller-side trigger to COMPLETE: p50 {statistics.median(complete):.1f} ms, p99 {p99:.1f} ms; "
        f"unary RTT to the controller, same run: p99 {unary_p99:.2f} ms ({len(rtts)} calls)"
    )
    # where the time goes (Flink's per-node figures): markers and data (start delay,
    # recording) are the nodes' share; report time (node done to the report journaled
    # and accepted) is the controller's.
    parts = {}
    for field in ("start_delay_ms", "recording_duration_ms", "report_time_ms"):
        values = [getattr(n, field) for s in snapshots if s.status == pb.Snapshot.COMPLETE for n in s.stats.nodes]
        parts[field] = percentile(values, 99)
    say("  per node p99: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    return {
        "controller_p99_ms_100ms": round(p99, 1),
        "controller_start_delay_p99_ms_100ms": round(parts["start_delay_ms"], 1),
        "controller_recording_p99_ms_100ms": round(parts["recording_duration_ms"], 1),
        "controller_report_time_p99_ms_100ms": round(parts["report_time_ms"], 1),
        "controller_p50_ms_100ms": round(statistics.median(complete), 1),
        "controller_p99_over_unary_p99_100ms": round(p99 / unary_p99, 1),
        "controller_failed_100ms": failed,
    }


def main() -> int:
    figures = measure()
    print(f"controller p99 / unary p99 (same run): {figures['controller_p99_over_unary_p99_100ms']}x")
    results.merge(figures)
    return 0 if figures["controller_failed_100ms"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
