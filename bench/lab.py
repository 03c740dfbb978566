"""What the phases of `bench.phases` measure with: a local mesh and the calls it answers.

`Lab` makes the things a phase needs: the raw gRPC baseline (`bench.grpc_raw`), an
N-node `Mesh` (a supervisor `Cluster` in a temporary directory, its controller stub,
the bench's load generator and an `Observer`), and the phase on hosts
(`bench.hosts`). A `Mesh` offers each measurement as one method, so a phase reads as
the steps it takes, and a test can hand the driver a lab of its own that answers
without processes (tests/cluster/test_bench_phases.py).

Every process a mesh starts is stopped when it closes; the load generator also exits
on its own when this process goes away (its stdin closes).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import grpc

from bench.calls import DEADLINE_S, INITIAL_BALANCE, latency_run
from bench.hop_split import HopRead, read_hops, addresses as hop_addresses
from bench.loadgen import LoadGen
from bench.observe import Observer, Sample, Window, cpu_s, window_between
from bench.report import Markers
from bench.utilisation import JournalRead, read_journal, runq_wait_ns
from snapmesh.checking.scrape import largest
from snapmesh.checking.snapshots import duration_s
from snapmesh.processes.supervisor import Cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS, EVENT_LOOP_ENV
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

BATCH = 200  # transfers per TransferBatch call


def p99(values: list[float]) -> float:
    """The nearest-rank 99th percentile; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def settled(controller, snapshot_id: str, deadline: float, poll_s: float = 0.1) -> pb.Snapshot:
    """The snapshot once it is no longer IN_PROGRESS, or as it is at `deadline` (time.monotonic)."""
    while True:
        snapshot = controller.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snapshot_id), timeout=10)
        if snapshot.status != pb.Snapshot.IN_PROGRESS or time.monotonic() > deadline:
            return snapshot
        time.sleep(poll_s)


def finished(controller, ids: list[str], statuses: dict[str, int], wait_s: float = 15.0):
    """Controller-side durations (ms) and in-flight counts of the COMPLETE ones;
    how many FAILED; how many were still running after `wait_s`."""
    deadline = time.monotonic() + wait_s
    durations, in_flight, failed, running = [], [], 0, 0
    for sid in ids:
        snapshot = settled(controller, sid, deadline)
        statuses[sid] = snapshot.status
        if snapshot.status == pb.Snapshot.COMPLETE:
            durations.append(duration_s(snapshot) * 1e3)
            in_flight.append(sum(len(c.in_flight) for c in snapshot.channels))
        elif snapshot.status == pb.Snapshot.FAILED:
            failed += 1
        else:
            running += 1
    return durations, in_flight, failed, running


def wait_controller_idle(cluster: Cluster, cap_s: float) -> float:
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


def markers_per_snapshot(cluster: Cluster) -> dict[str, int]:
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


def start_cluster(root: Path, nodes: int, *, mode: str | None = None, mark: int | None = None,
                  loop: str | None = None, startup_timeout: float | None = None, topology: str = "mesh",
                  topology_seed: int = 0) -> Cluster:
    """A started N-node cluster under `root`, a full mesh unless `topology` names another
    (snapmesh.settings.topologies, drawn from `topology_seed`; see `Mesh` for the other options)."""
    name = f"{topology.replace(':', '')}-{nodes}" + "".join(f"-{p}" for p in (mode, mark, loop) if p is not None)
    options = {"snapshot_mode": mode} if mode is not None else {}
    path = write_cluster(root / name / "cluster.toml", nodes=nodes, topology=topology, topology_seed=topology_seed,
                         deadline=DEADLINE_S, initial_balance=INITIAL_BALANCE, **options)
    env = dict(os.environ)
    if mark is not None:
        env["SNAPMESH_FLOW_MARK"] = str(mark)
    if loop is not None:
        env[EVENT_LOOP_ENV] = loop
    timeout = {"startup_timeout": startup_timeout} if startup_timeout is not None else {}
    return Cluster(path, env=env, **timeout).start()


class Mesh:
    """An N-node mesh, its controller stub, a load generator and an observer.

    `mode`: the snapshot mode written to the cluster file (None: the default);
    `mark`: SNAPMESH_FLOW_MARK for the nodes (None: theirs); `loop`: SNAPMESH_EVENT_LOOP
    for every server (None: theirs)."""

    def __init__(self, root: Path, nodes: int, *, mode: str | None = None, mark: int | None = None,
                 loop: str | None = None, startup_timeout: float | None = None, topology: str = "mesh",
                 topology_seed: int = 0) -> None:
        self.cluster = start_cluster(root, nodes, mode=mode, mark=mark, loop=loop, startup_timeout=startup_timeout,
                                     topology=topology, topology_seed=topology_seed)
        self.loadgen: LoadGen | None = None
        self.channel = grpc.insecure_channel(self.cluster.controller_address, options=CLIENT_OPTIONS)
        try:
            self.controller = pb_grpc.ControllerStub(self.channel)
            self.loadgen = LoadGen(self.cluster, batch=BATCH, seed=nodes)
            self.observer = Observer(self.cluster, self.loadgen)
        except BaseException:
            self.close()
            raise
        self.nodes = nodes
        self.statuses: dict[str, int] = {}  # snapshot id -> status, of every snapshot seen finished
        self.complete: list[pb.Snapshot] = []  # every COMPLETE snapshot of a latency run, with its statistics

    def close(self) -> None:
        self.channel.close()
        if self.loadgen is not None:
            self.loadgen.close()
        self.cluster.stop()

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- load and windows

    def load(self, callers: int, rate: float = 0.0, settle_s: float = 0.0) -> None:
        """`callers` per node (closed loop, or paced at `rate` transfers/s in all); then settle."""
        self.loadgen.set(callers, rate=rate)
        if settle_s:
            time.sleep(settle_s)

    def window(self, seconds: float, snapshot_every: float = 0.0) -> Window:
        return self.observer.window(seconds, snapshot_every=snapshot_every, controller=self.controller)

    def sample(self) -> Sample:
        return self.observer.sample()

    def window_since(self, start: Sample) -> Window:
        """The window from `start` to now, with the deepest outbox seen now."""
        max_unacked = max(largest(a, "snapmesh_channel_unacked_messages") for a in self.observer.metrics_addresses)
        return window_between(start, self.sample(), [], max_unacked)

    # -- snapshots

    def latency_run(self, count: int, cap_s: float, *, broadcast: bool = False):
        return latency_run(self.controller, count, cap_s, self.statuses, self.complete, broadcast=broadcast)

    def runq(self) -> dict[str, int]:
        """Each process's run-queue wait so far (ns; bench.utilisation), by node id and "controller"."""
        pids = {n: self.cluster.node_pid(n) for n in self.cluster.node_ids}
        pids["controller"] = self.cluster.controller_pid
        return {name: runq_wait_ns(pid) for name, pid in pids.items()}

    def finished(self, ids: list[str]):
        return finished(self.controller, ids, self.statuses)

    def controller_journal(self) -> JournalRead:
        """The controller's journal waits and rounds so far (its metrics port)."""
        return read_journal(self.cluster.controller_metrics_address)

    def hops(self) -> HopRead:
        """Every process's hops of the path after the cut so far (bench.hop_split)."""
        return read_hops(hop_addresses(self.cluster))

    def wait_controller_idle(self, cap_s: float) -> float:
        return wait_controller_idle(self.cluster, cap_s)

    def node_rtt_p99(self, calls: int, gap_s: float) -> float:
        """`GetState` on one node, one call at a time: a round trip plus one log
        round (it answers once its log is durable), which is what each hop of a
        snapshot costs. The raw unary RTT is measured on an idle server; this one
        on a node of the loaded mesh."""
        node = self.cluster.node_ids[0]
        with grpc.insecure_channel(self.cluster.node_address(node), options=CLIENT_OPTIONS) as channel:
            stub = pb_grpc.NodeStub(channel)
            stub.GetState(pb.GetStateRequest(), timeout=10)
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                stub.GetState(pb.GetStateRequest(), timeout=10)
                times.append((time.perf_counter() - started) * 1e3)
                time.sleep(gap_s)
        return p99(times)

    # -- at the end

    def gen_errors(self) -> list[str]:
        stats = self.loadgen.stats()
        return [f"{stats['errors']} failed calls, last: {stats['last_error']}"] if stats["errors"] else []

    def markers(self) -> Markers:
        """The markers each COMPLETE snapshot seen left in the transfer logs, against N(N-1)."""
        counts = markers_per_snapshot(self.cluster)
        complete = [sid for sid, status in self.statuses.items() if status == pb.Snapshot.COMPLETE]
        return Markers(
            nodes=self.nodes,
            channels=len(self.cluster.config.topology.channels),
            counts=[counts.get(sid, 0) for sid in complete],
            not_complete=len(self.statuses) - len(complete),
            metric_sent=self.sample().metrics.get("snapmesh_markers_sent_total", 0.0),
            snapshots_in_logs=len(counts),
        )


class Lab:
    """Real processes on this machine, under one temporary directory; every cluster on
    `topology` (`python -m bench cluster --topology NAME`; default: the full mesh)."""

    def __init__(self, root: Path, topology: str = "mesh", topology_seed: int = 0) -> None:
        self.root = root
        self.topology, self.topology_seed = topology, topology_seed

    def raw(self) -> dict[str, float]:
        from bench.grpc_raw import measure

        return measure()

    def mesh(self, nodes: int, **options) -> Mesh:
        return Mesh(self.root, nodes, topology=self.topology, topology_seed=self.topology_seed, **options)

    def missing_rights(self) -> str | None:
        from snapmesh.hosts.net import missing_rights

        return missing_rights()

    def hosts(self, peak_per_s: float, say, snapshots: int) -> dict[str, float]:
        """The phase on hosts (bench.hosts), in a temporary directory of its own."""
        from bench import hosts

        return hosts.measure(peak_per_s, say, snapshots=snapshots)

    def hosts_util(self, start_per_s: float, say, snapshots: int) -> dict[str, float]:
        """The phase on hosts paced to a measured utilisation (bench.hosts.measure_util)."""
        from bench import hosts

        return hosts.measure_util(start_per_s, say, snapshots=snapshots)
