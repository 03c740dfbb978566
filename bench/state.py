"""A snapshot's cost against the size of the state and what changed: `python -m bench state`.

The app (bench/blob_app.py) holds a blob of N MiB per node, on a 4-node mesh
(a fresh one per size). Per size, in one run:
  1. a first snapshot (every block new to the controller);
  2. 0.1% of every node's state changed: runs of 1 KiB at random offsets (64 at
     64 MiB; at least one), by SubmitBatch to each node;
  3. a second snapshot, the incremental one;
  4. a restore of the second.
Figures, `<n>` the size (`1mib`, `64mib`):
  - state_sent_fraction_<n>: the bytes the nodes' reports of the second snapshot
    sent (`snapmesh_report_sent_bytes_total`, as sent: the manifest and the new
    blocks) over the states' bytes (4 x N MiB);
  - state_stored_fraction_<n>: what the second snapshot added to the controller's
    store (controller/blocks and controller/snapshots) over the states' bytes;
  - state_export_fraction_<n>: what it added to the JSON exports (snapshots/);
  - state_first_snapshot_s_<n>, state_snapshot_s_<n>: trigger to COMPLETE, as the
    client sees it (TriggerSnapshot with `wait`), the first and the second;
  - state_restore_s_<n>: RestoreSnapshot of the second, called to RESTORED;
  - state_snapshot_s_64mib_over_1mib: the second snapshot's time at 64 MiB over 1 MiB.
Also printed: the bytes themselves, and the controller's own started_at..finished_at.
`--sizes 1,64` picks the sizes (MiB); `--no-write` prints without writing
bench/results.json. `--smoke`: one mesh of 256 KiB states, to check the bench
works, not to measure.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench import blob_app, smoke
from bench import results as bench_results
from bench.phases import own_argv
from snapmesh.processes.supervisor import Cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

NODES = 4
RUN_BYTES = 1024  # one changed run
CHANGED = 0.001  # the share of each state changed between the two snapshots
TIMEOUT_S = 600.0  # a call or a wait that takes longer is a hang, not a figure
SENT = "snapmesh_report_sent_bytes_total"


def _label(mib: float) -> str:
    return f"{mib:g}mib".replace(".", "_")


def _report_bytes(cluster: Cluster) -> dict[str, float]:
    """Node id -> its `snapmesh_report_sent_bytes_total`."""
    out = {}
    for node in cluster.config.nodes:
        text = urllib.request.urlopen(f"http://{node.metrics_address}/metrics", timeout=10).read().decode()
        out[node.id] = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == SENT)
    return out


def _bytes_under(*directories: Path) -> int:
    return sum(p.stat().st_size for d in directories if d.is_dir() for p in d.iterdir() if p.is_file())


def _until(probe, what: str):
    """`probe()` until it is truthy (TIMEOUT_S at most); its value."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench state: no {what} after {TIMEOUT_S:.0f}s")
        time.sleep(0.05)
    return value


@contextlib.contextmanager
def _mesh(mib: float) -> Iterator[tuple[Cluster, Path]]:
    """A fresh 4-node mesh of the blob app with `mib` MiB per node, and its data dir; stopped after."""
    with tempfile.TemporaryDirectory(prefix=f"bench-state-{_label(mib)}-") as tmp:
        root = Path(tmp)
        path = write_cluster(root / "cluster.toml", nodes=NODES, topology="mesh", data_dir=root / "data",
                             deadline=TIMEOUT_S)
        path.write_text(path.read_text() + f'\n[app]\nmodule = "bench.blob_app:app"\nmib = {mib}\n')
        cluster = Cluster(path, app="bench.blob_app:app").start()
        try:
            yield cluster, root / "data"
        finally:
            cluster.stop()


def _changes(node: str, size: int, rng: random.Random) -> pb.SubmitBatchRequest:
    runs = max(1, round(size * CHANGED / RUN_BYTES))
    return pb.SubmitBatchRequest(items=[
        pb.SubmitRequest(command=blob_app.write(rng.randrange(size - RUN_BYTES), rng.randbytes(RUN_BYTES)))
        for _ in range(runs)])


def _snapshot(cluster: Cluster, stub, data: Path, sent_before: dict[str, float]) -> tuple[pb.Snapshot, float, float]:
    """One snapshot, waited for, filed, and every node's report counted: it, the
    client's seconds, and the bytes the reports sent."""
    started = time.perf_counter()
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=TIMEOUT_S)
    took = time.perf_counter() - started
    if snapshot.status != pb.Snapshot.COMPLETE:
        raise RuntimeError(f"bench state: snapshot {snapshot.snapshot_id} is {pb.Snapshot.Status.Name(snapshot.status)}")
    sid = snapshot.snapshot_id
    _until(lambda: (data / "controller" / "snapshots" / f"{sid}.pb").exists()
           and (data / "snapshots" / f"{sid}.json").exists(), f"files of snapshot {sid}")

    def counted() -> dict[str, float] | None:
        now = _report_bytes(cluster)
        return now if all(now[n] > sent_before.get(n, 0) for n in now) else None

    sent = _until(counted, f"report of every node for snapshot {sid}")
    return snapshot, took, sum(sent.values()) - sum(sent_before.values())


def measure(mib: float, seed: int = 0) -> dict[str, float]:
    size = int(mib * blob_app.MIB)
    total = NODES * size
    label = _label(mib)
    rng = random.Random(f"bench-state-{seed}-{mib}")
    with _mesh(mib) as (cluster, data):
        channel = grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS)
        stub = pb_grpc.ControllerStub(channel)
        try:
            first, first_s, first_sent = _snapshot(cluster, stub, data, {})
            store = (data / "controller" / "blocks", data / "controller" / "snapshots")
            stored, exported, sent_before = _bytes_under(*store), _bytes_under(data / "snapshots"), _report_bytes(cluster)
            for node in cluster.config.nodes:
                with grpc.insecure_channel(cluster.node_address(node.id), options=CLIENT_OPTIONS) as node_channel:
                    answer = pb_grpc.NodeStub(node_channel).SubmitBatch(_changes(node.id, size, rng), timeout=TIMEOUT_S)
                refused = [r.message for r in answer.results if r.code]
                if refused:
                    raise RuntimeError(f"bench state: node {node.id} refused a change: {refused[0]}")
            second, second_s, second_sent = _snapshot(cluster, stub, data, sent_before)
            stored_added = _bytes_under(*store) - stored
            exported_added = _bytes_under(data / "snapshots") - exported
            started = time.perf_counter()
            restore = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=second.snapshot_id), timeout=TIMEOUT_S)
            restore_s = time.perf_counter() - started
            if restore.status != pb.Restore.RESTORED:
                raise RuntimeError(f"bench state: restore of {second.snapshot_id}: {restore.reason}")
        finally:
            channel.close()
    controller_s = second.finished_at.ToNanoseconds() / 1e9 - second.started_at.ToNanoseconds() / 1e9
    print(f"{label}: first snapshot {first_s:.2f}s sent {first_sent:,.0f} B; second {second_s:.2f}s "
          f"(controller {controller_s:.2f}s) sent {second_sent:,.0f} B, stored +{stored_added:,} B, "
          f"exports +{exported_added:,} B; restore {restore_s:.2f}s; states {total:,} B", flush=True)
    return {
        f"state_sent_fraction_{label}": second_sent / total,
        f"state_stored_fraction_{label}": stored_added / total,
        f"state_export_fraction_{label}": exported_added / total,
        f"state_first_snapshot_s_{label}": first_s,
        f"state_snapshot_s_{label}": second_s,
        f"state_restore_s_{label}": restore_s,
        f"state_sent_bytes_{label}": float(second_sent),
        f"state_stored_bytes_{label}": float(stored_added),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench state", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,64", help="MiB per node, comma-separated (default: 1,64)")
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave bench/results.json")
    args = parser.parse_args(own_argv("state", argv))
    sizes = [0.25] if smoke.on() else [float(s) for s in args.sizes.split(",") if s]
    out: dict[str, float] = {}
    for mib in sizes:
        out.update(measure(mib))
    if "state_snapshot_s_64mib" in out and "state_snapshot_s_1mib" in out:
        out["state_snapshot_s_64mib_over_1mib"] = out["state_snapshot_s_64mib"] / out["state_snapshot_s_1mib"]
    for name, value in out.items():
        print(f"{name:<44} {value:>14,.4f}")
    if out and not args.no_write:
        bench_results.merge(out)
    print("caveat: one run on a shared machine; compare figures within one run, not across runs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
