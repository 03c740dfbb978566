"""`bench state`'s mesh and what it reads of it: a fresh 4-node mesh of one app, its
nodes' counters, the controller's peak memory, the bytes on disk, and commands
sent in batches that fit the node's bounds."""

from __future__ import annotations

import contextlib
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
from prometheus_client.parser import text_string_to_metric_families

from snapmesh.processes.supervisor import Cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.services.node.edge import MAX_BATCH_BYTES, MAX_BATCH_COMMANDS
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

NODES = 4
SENT = "snapmesh_report_sent_bytes_total"
RESTORED = "snapmesh_restore_received_bytes_total"

T = TypeVar("T")


def label(mib: float) -> str:
    return f"{mib:g}mib".replace(".", "_")


def timeout_s(mib: float) -> float:
    """How long one call, wait or start may take at `mib` MiB per node before it is a
    hang, not a figure: 10 minutes, and a second more per MiB (the first snapshot
    at 64 MiB took 10 s on a loaded machine)."""
    return 600.0 + mib


def counter(cluster: Cluster, name: str) -> dict[str, float]:
    """Node id -> the node's counter `name` (its samples summed)."""
    out = {}
    for node in cluster.config.nodes:
        text = urllib.request.urlopen(f"http://{node.metrics_address}/metrics", timeout=10).read().decode()
        out[node.id] = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)
    return out


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM in /proc/<pid>/status), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"bench state: no VmHWM in /proc/{pid}/status")


def bytes_under(*directories: Path) -> int:
    return sum(p.stat().st_size for d in directories if d.is_dir() for p in d.iterdir() if p.is_file())


def until(probe: Callable[[], T | None], what: str, timeout: float) -> T:
    """`probe()` until it is truthy (`timeout` seconds at most); its value."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench state: no {what} after {timeout:.0f}s")
        time.sleep(0.05)
    return value


@contextlib.contextmanager
def mesh(app: str, mib: float) -> Iterator[tuple[Cluster, Path]]:
    """A fresh 4-node mesh of `app` ("module:attr", given [app] mib), and its data dir; stopped after."""
    with tempfile.TemporaryDirectory(prefix=f"bench-state-{label(mib)}-") as tmp:
        root = Path(tmp)
        # The snapshots' deadline comes before the client's call gives up: a snapshot that
        # cannot complete is answered FAILED, with its reason.
        path = write_cluster(root / "cluster.toml", nodes=NODES, topology="mesh", data_dir=root / "data",
                             deadline=0.9 * timeout_s(mib))
        path.write_text(path.read_text() + f'\n[app]\nmodule = "{app}"\nmib = {mib}\n')
        # A node's start writes its opening state to its log (1 GiB per node at 1 GiB): 30 s is not enough.
        cluster = Cluster(path, app=app, startup_timeout=timeout_s(mib)).start()
        try:
            yield cluster, root / "data"
        finally:
            cluster.stop()


def batches(commands: Sequence[bytes]) -> Iterator[pb.SubmitBatchRequest]:
    """The commands in order, in SubmitBatch requests within the node's bounds
    (services/node/edge.py E3: MAX_BATCH_COMMANDS, MAX_BATCH_BYTES of commands)."""
    batch: list[bytes] = []
    size = 0
    for command in commands:
        if batch and (len(batch) == MAX_BATCH_COMMANDS or size + len(command) > MAX_BATCH_BYTES):
            yield pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=c) for c in batch])
            batch, size = [], 0
        batch.append(command)
        size += len(command)
    if batch:
        yield pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=c) for c in batch])


def submit(cluster: Cluster, node_id: str, commands: Sequence[bytes], timeout: float) -> None:
    """Every command at the node, in batches; a refusal is an error."""
    with grpc.insecure_channel(cluster.node_address(node_id), options=CLIENT_OPTIONS) as channel:
        stub = pb_grpc.NodeStub(channel)
        for request in batches(commands):
            answer = stub.SubmitBatch(request, timeout=timeout)
            refused = [r.message for r in answer.results if r.code]
            if refused:
                raise RuntimeError(f"bench state: node {node_id} refused a change: {refused[0]}")


def snapshot(cluster: Cluster, stub, data: Path, sent_before: dict[str, float],
             timeout: float) -> tuple[pb.Snapshot, float, float]:
    """One snapshot, waited for, filed and exported, and every node's report
    counted: it, the client's seconds, and the bytes the reports sent."""
    started = time.perf_counter()
    taken = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=timeout)
    took = time.perf_counter() - started
    if taken.status != pb.Snapshot.COMPLETE:
        raise RuntimeError(f"bench state: snapshot {taken.snapshot_id} is {pb.Snapshot.Status.Name(taken.status)}: "
                           f"{taken.reason}")
    sid = taken.snapshot_id
    until(lambda: (data / "controller" / "snapshots" / f"{sid}.pb").exists()
          and (data / "snapshots" / f"{sid}.json").exists(), f"files of snapshot {sid}", timeout)

    def counted() -> dict[str, float] | None:
        now = counter(cluster, SENT)
        return now if all(now[n] > sent_before.get(n, 0) for n in now) else None

    sent = until(counted, f"report of every node for snapshot {sid}", timeout)
    return taken, took, sum(sent.values()) - sum(sent_before.values())


def restore(cluster: Cluster, stub, snapshot_id: str, timeout: float) -> tuple[float, float]:
    """RestoreSnapshot of `snapshot_id`, to RESTORED: the client's seconds, and the
    bytes the nodes received for it (a fresh mesh has received none before)."""
    started = time.perf_counter()
    answer = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=snapshot_id), timeout=timeout)
    took = time.perf_counter() - started
    if answer.status != pb.Restore.RESTORED:
        raise RuntimeError(f"bench state: restore of {snapshot_id}: {answer.reason}")

    def counted() -> dict[str, float] | None:
        now = counter(cluster, RESTORED)
        return now if all(now.values()) else None

    received = until(counted, f"restore counted at every node for {snapshot_id}", timeout)
    return took, sum(received.values())
