"""What the bench sees of a running cluster: the nodes' Prometheus metrics
(`snapmesh.checking.scrape`), the CPU of every process
(utime+stime from /proc/<pid>/stat) and of the whole machine, over windows."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.loadgen import LoadGen
from snapmesh.checking.scrape import largest, sums
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    return sum(cpu_parts_s(pid))


def cpu_parts_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process (all its threads); (0, 0) once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK  # utime, stime


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle (all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / _CLK_TCK


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
    frames_per_s: float = 0.0  # channel frames the nodes wrote (each one read and acked by its receiver)
    snapshots: list[str] = field(default_factory=list)
    max_unacked: float = 0.0
    machine_cores: float = 0.0  # the whole machine's busy cores (every process, ours or not)
    records_per_s: float = 0.0  # log records the nodes' group commits made durable

    @property
    def records_per_commit(self) -> float:
        """Log records per group commit (write + fdatasync), over the nodes."""
        return self.records_per_s / self.commits_per_s if self.commits_per_s else float("nan")

    @property
    def cpu_us_per_transfer(self) -> float:
        """The machine's busy CPU microseconds per transfer the nodes counted in this window."""
        return self.machine_cores * 1e6 / self.received_per_s if self.received_per_s else float("nan")


class Observer:
    """Scrapes the nodes' metrics and the CPU of every process of one cluster."""

    def __init__(self, cluster: Cluster, loadgen: LoadGen) -> None:
        self.cluster = cluster
        self.loadgen = loadgen
        self.metrics_addresses = [cluster.config.node(n).metrics_address for n in cluster.node_ids]

    def sample(self) -> Sample:
        totals: dict[str, float] = {}
        for address in self.metrics_addresses:
            for name, value in sums(address).items():
                totals[name] = totals.get(name, 0.0) + value
        cpu = {
            "nodes": sum(cpu_s(self.cluster.node_pid(n)) for n in self.cluster.node_ids),
            "controller": cpu_s(self.cluster.controller_pid),
            "loadgen": cpu_s(self.loadgen.pid),
            "bench": cpu_s(os.getpid()),
        }
        return Sample(time.perf_counter(), totals, cpu, machine_busy_s())

    def window(self, seconds: float, *, snapshot_every: float = 0.0, controller=None) -> Window:
        start = self.sample()
        snapshots: list[str] = []
        if snapshot_every:
            _trigger_every(controller, snapshot_every, start.at + seconds, snapshots)
        else:
            time.sleep(max(0.0, start.at + seconds - time.perf_counter()))
        max_unacked = max(largest(a, "snapmesh_channel_unacked_messages") for a in self.metrics_addresses)
        end = self.sample()
        return window_between(start, end, snapshots, max_unacked)


def busy_fraction(start: Sample, end: Sample, cores: int | None = None) -> float:
    """The share of the whole machine's CPU time that was busy between two samples."""
    capacity = (end.at - start.at) * (cores or os.cpu_count() or 1)
    return (end.machine - start.machine) / capacity if capacity > 0 else float("nan")


def window_between(start: Sample, end: Sample, snapshots: list[str], max_unacked: float) -> Window:
    elapsed = end.at - start.at

    def rate(name: str) -> float:
        return (end.metrics.get(name, 0.0) - start.metrics.get(name, 0.0)) / elapsed

    cpu = {k: (end.cpu[k] - start.cpu[k]) / elapsed for k in start.cpu}
    ours = sum(cpu.values())
    machine = (end.machine - start.machine) / elapsed
    cpu["other"] = max(0.0, machine - ours)
    return Window(
        seconds=elapsed,
        received_per_s=rate("snapmesh_transfers_received_total"),
        sent_per_s=rate("snapmesh_transfers_sent_total"),
        commits_per_s=rate("snapmesh_log_fsync_seconds_count"),
        frames_per_s=rate("snapmesh_channel_frames_sent_total"),
        records_per_s=rate("snapmesh_log_committed_records_total"),
        cpu=cpu,
        snapshots=snapshots,
        max_unacked=max_unacked,
        machine_cores=machine,
    )


def _trigger_every(controller: pb_grpc.ControllerStub, every: float, until: float, ids: list[str]) -> None:
    """TriggerSnapshot (no wait, random initiator) every `every` seconds until `until`."""
    due = time.perf_counter()
    while due < until:
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            snapshot = controller.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=False), timeout=5)
        except grpc.RpcError as error:  # past the controller's admission limit on snapshots in progress: this tick is skipped
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        else:
            ids.append(snapshot.snapshot_id)
        due += every
    time.sleep(max(0.0, until - time.perf_counter()))
