"""Classic and overtake snapshot modes side by side, in one run: `python -m bench overtake`.

Figures (all from this one run; compare them as ratios):
  - raw gRPC: unary round trip p99, one batched stream's rate (`bench.grpc_raw`);
  - the 4-node mesh's highest rate in a short closed-loop ramp (nodes' counters);
  - per mode, on a 4-node mesh at that peak load: rate with a snapshot every
    100 ms / without (interleaved A/B windows) and the controller-side p99 of
    those snapshots, and how many FAILED;
  - CPU per transfer: the whole machine's busy CPU microseconds per
    transfer the nodes counted, at the 4-node peak and, per phase, on the
    8-node mesh paced before its snapshots run (a window without snapshots);
  - per mode, on an 8-node mesh paced at 50% of the 4-node peak: snapshot p99,
    trigger to COMPLETE as the client sees it; overtake mode at two
    flow-control marks (SNAPMESH_FLOW_MARK); both modes again at 25%;
    beside each, the p99 of one node round trip (`GetState`, which answers
    after one log round) under the same load, and how busy the machine was;
  - a 32-node mesh (992 channels) in overtake mode under a light paced load:
    snapshot latency.
It prints a table and merges its figures into bench/results.json (a flat
object name -> number, plus `date` and `machine`), keeping other keys.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench import results
from bench.cluster import INITIAL_BALANCE, _finished, _latency_run, _paced_callers, _wait_controller_idle
from bench.loadgen import LoadGen
from bench.observe import Observer, busy_fraction
from snapmesh.settings.config import write_cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

BATCH = 200
RAMP_CALLERS = (4, 16)
SETTLE_S = 1.5
WINDOW_S = 3.0
AB_PAIRS = 2
SNAPSHOT_EVERY_S = 0.1
LATENCY_SNAPSHOTS = 30
LATENCY_CAP_S = 15.0
MARKS = (2_000, 20_000)
DEADLINE_S = 10.0
NODE_RTT_CALLS = 100
NODE_RTT_GAP_S = 0.01
# The 8-node phases: (fraction of the 4-node peak, mode, flow-control mark or None for the default).
PHASES = ((0.5, "classic", None), (0.5, "overtake", None), (0.5, "overtake", MARKS[1]),
          (0.25, "classic", None), (0.25, "overtake", None))
LARGE_MESH = 32  # nodes of the last phase (0: skip it, for a smoke run)


def _p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class _Mesh:
    """An N-node mesh, its controller stub, a load generator and an observer."""

    def __init__(self, root: Path, nodes: int, mode: str, mark: int | None = None) -> None:
        name = f"mesh-{nodes}-{mode}-{mark or 'default'}"
        path = write_cluster(root / name / "cluster.toml", nodes=nodes, deadline=DEADLINE_S,
                             initial_balance=INITIAL_BALANCE, snapshot_mode=mode)
        env = dict(os.environ)
        if mark is not None:
            env["SNAPMESH_FLOW_MARK"] = str(mark)
        self.cluster = Cluster(path, env=env, startup_timeout=120).start()
        self.channel = grpc.insecure_channel(self.cluster.controller_address, options=CLIENT_OPTIONS)
        self.controller = pb_grpc.ControllerStub(self.channel)
        self.loadgen = LoadGen(self.cluster, batch=BATCH, seed=nodes)
        self.observer = Observer(self.cluster, self.loadgen)

    def close(self) -> None:
        self.channel.close()
        self.loadgen.close()
        self.cluster.stop()

    def __enter__(self) -> _Mesh:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ab(mesh: _Mesh, callers: int) -> tuple[float, float, int]:
    """Rate with a snapshot every 100 ms / without; controller p99 (ms) of those; FAILED or unfinished."""
    mesh.loadgen.set(callers)
    time.sleep(SETTLE_S)
    ratios, ids = [], []
    for _ in range(AB_PAIRS):
        a = mesh.observer.window(WINDOW_S)
        b = mesh.observer.window(WINDOW_S, snapshot_every=SNAPSHOT_EVERY_S, controller=mesh.controller)
        ratios.append(b.received_per_s / a.received_per_s)
        ids += b.snapshots
        _wait_controller_idle(mesh.cluster, 20.0)
    mesh.loadgen.set(0)
    durations, _, failed, running = _finished(mesh.controller, ids, {})
    return sum(ratios) / len(ratios), _p99(durations), failed + running


def _latency(mesh: _Mesh, rate: float, *, probe: bool = True) -> tuple[float, int, int, float, float, float]:
    """At a paced load: client-side snapshot p99 (ms), how many COMPLETE, how
    many not; with `probe`, the p99 (ms) of one node round trip under the same
    load (else NaN); the fraction of the machine busy while the snapshots ran;
    with `probe`, the machine's CPU µs per transfer in a window before them (else NaN)."""
    mesh.loadgen.set(_paced_callers(len(mesh.cluster.node_ids)), rate=rate)
    time.sleep(SETTLE_S)
    cpu_us = mesh.observer.window(WINDOW_S).cpu_us_per_transfer if probe else float("nan")
    node_rtt = _node_rtt_p99(mesh) if probe else float("nan")
    start = mesh.observer.sample()
    client, _, failed, _ = _latency_run(mesh.controller, LATENCY_SNAPSHOTS, LATENCY_CAP_S, {})
    busy = busy_fraction(start, mesh.observer.sample())
    mesh.loadgen.set(0)
    return _p99(client), len(client), failed, node_rtt, busy, cpu_us


def _node_rtt_p99(mesh: _Mesh, calls: int = NODE_RTT_CALLS) -> float:
    """`GetState` on one node, one call at a time: a round trip plus one log
    round (it answers once its log is durable), which is what each hop of a
    snapshot costs. The raw unary RTT is measured on an idle server; this one
    on a node of the loaded mesh."""
    node = mesh.cluster.node_ids[0]
    with grpc.insecure_channel(mesh.cluster.node_address(node), options=CLIENT_OPTIONS) as channel:
        stub = pb_grpc.NodeStub(channel)
        stub.GetState(pb.GetStateRequest(), timeout=10)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            stub.GetState(pb.GetStateRequest(), timeout=10)
            times.append((time.perf_counter() - started) * 1e3)
            time.sleep(NODE_RTT_GAP_S)
    return _p99(times)


def measure(say) -> dict[str, float]:
    from bench.grpc_raw import measure as raw_measure

    out: dict[str, float] = {}
    say(" raw gRPC baseline")
    raw = raw_measure()
    out["unary_rtt_p99_ms"] = raw["unary_p99_ms"]
    out["raw_batched_stream_msgs_per_s"] = raw["stream_batched_per_s"]
    with tempfile.TemporaryDirectory(prefix="snapmesh-bench-overtake-") as tmp:
        root = Path(tmp)
        peak, peak_callers = 0.0, RAMP_CALLERS[0]
        for mode in ("classic", "overtake"):
            say(f" 4-node mesh, {mode}")
            with _Mesh(root, 4, mode) as mesh:
                if mode == "classic":
                    for callers in RAMP_CALLERS:
                        mesh.loadgen.set(callers)
                        time.sleep(SETTLE_S)
                        window = mesh.observer.window(WINDOW_S)
                        rate = window.received_per_s
                        say(f"  ramp {callers} callers/node: {rate:,.0f}/s, {window.cpu_us_per_transfer:.1f} µs CPU "
                            f"per transfer ({window.machine_cores:.2f} cores busy)")
                        if rate > peak:
                            peak, peak_callers = rate, callers
                            out["cpu_us_per_transfer_4n_peak"] = window.cpu_us_per_transfer
                            out["cpu_busy_4n_peak"] = window.machine_cores / (os.cpu_count() or 1)
                    out["cluster_rate_4n"] = peak
                    out["cluster_rate_4n_over_raw_batched"] = peak / out["raw_batched_stream_msgs_per_s"]
                ratio, p99, bad = _ab(mesh, peak_callers)
                say(f"  A/B {mode}: ratio {ratio:.2f}, controller p99 {p99:.0f} ms, {bad} not COMPLETE")
                out[f"overhead_ratio_100ms_{mode}"] = ratio
                out[f"controller_p99_ms_100ms_{mode}"] = p99
                out[f"snapshots_not_complete_100ms_{mode}"] = bad
        out["controller_p99_ms_100ms"] = out["controller_p99_ms_100ms_overtake"]
        for fraction, mode, mark in PHASES:
            rate = fraction * peak
            say(f" 8-node mesh, {mode}, mark {mark or MARKS[0]}, paced {rate:,.0f}/s ({fraction:.0%} of the 4-node peak)")
            with _Mesh(root, 8, mode, mark) as mesh:
                p99, done, failed, node_rtt, busy, cpu_us = _latency(mesh, rate)
            say(f"  snapshot p99 {p99:.1f} ms ({done} COMPLETE, {failed} not); node round trip p99 "
                f"{node_rtt:.1f} ms; machine {busy:.0%} busy; {cpu_us:.1f} µs CPU per transfer before")
            suffix = f"8n_{fraction * 100:.0f}pct_{mode}" + (f"_mark{mark}" if mark else "")
            out[f"snapshot_p99_ms_{suffix}"] = p99
            out[f"node_rtt_p99_ms_{suffix}"] = node_rtt
            out[f"cpu_busy_{suffix}"] = busy
            out[f"cpu_us_per_transfer_{suffix}"] = cpu_us
        # The figure: 8 nodes paced at 25% of the 4-node peak, overtake mode (the
        # controller_p99_ms_100ms convention); the classic one is beside it.
        out["cpu_us_per_transfer_8n_25pct"] = out["cpu_us_per_transfer_8n_25pct_overtake"]
        out["snapshot_p99_ms_8n_50pct_overtake_mark2000"] = out["snapshot_p99_ms_8n_50pct_overtake"]
        out["snapshot_p99_over_unary_p99_overtake"] = out["snapshot_p99_ms_8n_50pct_overtake"] / out["unary_rtt_p99_ms"]
        out["snapshot_p99_over_node_rtt_p99_overtake"] = (
            out["snapshot_p99_ms_8n_50pct_overtake"] / out["node_rtt_p99_ms_8n_50pct_overtake"])
        if not LARGE_MESH:
            return out
        say(f" {LARGE_MESH}-node mesh ({LARGE_MESH * (LARGE_MESH - 1)} channels), overtake, light paced load")
        try:
            with _Mesh(root, LARGE_MESH, "overtake") as mesh:
                p99, done, failed, _, _, _ = _latency(mesh, 0.05 * peak, probe=False)
            out["snapshot_p99_ms_32n_overtake"] = p99
            out["snapshots_complete_32n_overtake"] = done
            say(f"  snapshot p99 {p99:.1f} ms ({done} COMPLETE, {failed} not)")
        except Exception as exc:  # report it; the other figures stand
            say(f"  32-node mesh failed: {type(exc).__name__}: {exc}")
    return out


def main() -> int:
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:5.1f}s]{text}", file=sys.stderr, flush=True)

    figures = measure(say)
    for name, value in figures.items():
        print(f"{name:<52} {value:>14,.3f}")
    results.merge(figures)
    print(f"written to {results.RESULTS}; one run ({time.perf_counter() - started:.0f}s) on a shared, noisy machine: "
          "compare ratios within it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
