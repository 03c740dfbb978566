"""Where a transfer's CPU goes: `python -m bench.profile` (py-spy flame graphs under load).

Starts a 4-node mesh (the bench's load generator at a closed-loop load, a
snapshot every 100 ms from here), samples one node and the controller with
py-spy (a sampling profiler, `pip install py-spy`) for a few seconds, and
writes per process a flame graph (SVG) and a table of where the samples went,
by the categories of docs/profile.md (`categorize`). Sampling proportions hold
on a busy machine too: they are shares of the process's own CPU time.

    python -m bench.profile [--seconds 10] [--callers 8] [--mode overtake] [--out docs]

Every process it starts is stopped at the end (py-spy exits on its own after
--seconds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from bench.calls import INITIAL_BALANCE
from bench.loadgen import LoadGen
from bench.observe import Observer
from snapmesh.settings.config import write_cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

BATCH = 200
RATE_HZ = 250  # samples per second per process

# Category of a stack: the innermost frame that a rule names (rules tried in this order).
# A frame is "function (file:line)" in py-spy's collapsed format.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics", ("prometheus_client", "services/node/metrics.py", "_metrics (services/node/engine.py")),
    ("log encode", ("Encoder.", "encode (snapmesh/protocol/wal.py", "append_record (services/node/translog.py")),
    ("commit (write + fdatasync)", ("_write_all_and_sync", "_flush_once", "_chunks (services/node/translog.py")),
    ("snapshot report", ("services/node/reporter.py", "full_state_message", "report_message")),
    ("app host (the app's code, its Context, the undo log)", ("snapmesh/protocol/node/apphost.py",
                                                               "snapmesh/protocol/node/undo.py", "snapmesh/app/",
                                                               "bench/minimal_app.py", "services/app/")),
    ("core + link (pure machine)", ("snapmesh/protocol/node/core.py", "snapmesh/protocol/node/link.py",
                                     "snapmesh/protocol/node/machine.py", "snapmesh/protocol/node/effects.py",
                                     "snapmesh/protocol/node/epochs.py", "snapmesh/protocol/node/steps.py",
                                     "snapmesh/protocol/node/requests.py", "<wal.")),
    ("overtake merge", ("snapmesh/protocol/overtake.py",)),
    ("engine (effects, frames out)", ("services/node/engine.py",)),
    ("channels (frames in and out, acks)", ("services/node/channels.py", "_decode (services/node/servicer.py",
                                            "services/node/frames.py", "_receive (services/node/servicer.py")),
    ("client RPC (servicer, edge)", ("services/node/servicer.py", "services/node/edge.py")),
    ("controller tracker", ("snapmesh/protocol/controller/",)),
    ("controller journal", ("services/controller/journal.py",)),
    ("controller store (files)", ("services/controller/store.py", "services/controller/export.py")),
    ("controller RPC", ("services/controller/servicer.py", "services/controller/engine.py")),
    ("protobuf", ("google/protobuf",)),
    ("gRPC (aio server, channels)", ("grpc/", "grpc_")),
    ("asyncio + gRPC Cython (task steps, callbacks, wake-ups)", ("asyncio/", "uvloop")),
)


WAITING = "waiting (off CPU: select, fsync, idle threads)"
# Leaf frames that wait rather than compute: py-spy (non-blocking) still samples a
# thread sitting in a blocking C call, so they are set apart from the CPU shares.
_WAIT_LEAVES = ("EpollSelector.select", "_PollLikeSelector.select", "Condition.wait", "_worker (concurrent/futures/thread.py",
                "Thread.run (threading.py", "Event.wait (threading.py")


def _sync_lines() -> tuple[str, ...]:
    """'file:line' of every fsync / fdatasync call in the project's own code."""
    root = Path(__file__).resolve().parent.parent
    out = []
    for rel in ("services/node/translog.py", "services/controller/journal.py", "snapmesh/serving/durable.py",
                "services/node/reporter.py", "services/controller/store.py"):
        try:
            lines = (root / rel).read_text().splitlines()
        except OSError:
            continue
        out += [f"{rel}:{n})" for n, text in enumerate(lines, 1) if "os.fsync(" in text or "os.fdatasync(" in text]
    return tuple(out)


_SYNC_LINES = _sync_lines()


def categorize(stack: str) -> str:
    frames = stack.split(";")
    leaf = frames[-1]
    if any(w in leaf for w in _WAIT_LEAVES) or any(leaf.endswith(s) for s in _SYNC_LINES):
        return WAITING
    for frame in reversed(frames):  # the innermost frame that any rule names decides
        for name, needles in RULES:
            if any(n in frame for n in needles):
                return name
    return "other"


def shares(collapsed: Path) -> tuple[Counter, int]:
    """Samples per category from py-spy's raw (collapsed) output."""
    counts: Counter = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        counts[categorize(stack)] += int(n)
        total += int(n)
    return counts, total


def table(counts: Counter, total: int) -> str:
    """Shares of the on-CPU samples (waiting ones apart, as a share of all samples)."""
    waiting = counts.get(WAITING, 0)
    busy = total - waiting
    rows = [f"| {name} | {n / busy:.1%} |" for name, n in counts.most_common() if name != WAITING] if busy else []
    return "\n".join([
        "| where (on CPU) | share of on-CPU samples |", "|---|---|", *rows,
        f"| (on-CPU samples) | {busy} |",
        f"| (waiting samples, not in the shares) | {waiting} ({waiting / total:.0%} of all) |" if total else "",
    ])


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("bench.profile: py-spy is not installed (pip install py-spy; it is in the dev extras)")
    return found


def _record(pid: int, out: Path, seconds: float, fmt: str) -> subprocess.Popen:
    return subprocess.Popen(
        [_py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(RATE_HZ),
         "--format", fmt, "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def profile(*, seconds: float, callers: int, mode: str, out_dir: Path, snapshot_every: float, say) -> dict[str, str]:
    """Run the mesh, sample node-1 and the controller; write SVGs + collapsed stacks; return the tables."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="snapmesh-profile-") as tmp:
        path = write_cluster(Path(tmp) / "cluster.toml", nodes=4, deadline=10.0,
                             initial_balance=INITIAL_BALANCE, snapshot_mode=mode)
        cluster = Cluster(path, startup_timeout=120).start()
        loadgen = None
        try:
            loadgen = LoadGen(cluster, batch=BATCH, seed=4)
            observer = Observer(cluster, loadgen)
            loadgen.set(callers)
            time.sleep(1.5)
            node = cluster.node_ids[0]
            targets = {"node": cluster.node_pid(node), "controller": cluster.controller_pid}
            recorders = []
            for name, pid in targets.items():
                for fmt, suffix in (("flamegraph", "svg"), ("raw", "txt")):
                    target = out_dir / f"profile-{name}.{suffix}"
                    recorders.append((name, suffix, target, _record(pid, target, seconds, fmt)))
            stop = threading.Event()
            ids: list[str] = []
            with grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS) as channel:
                controller = pb_grpc.ControllerStub(channel)

                def trigger() -> None:
                    while not stop.wait(snapshot_every):
                        try:
                            ids.append(controller.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=False), timeout=5).snapshot_id)
                        except grpc.RpcError:
                            pass

                thread = threading.Thread(target=trigger, daemon=True)
                thread.start() if snapshot_every else None
                window = observer.window(seconds)
                for _, _, _, proc in recorders:
                    _, err = proc.communicate(timeout=seconds + 60)
                    if proc.returncode:
                        say(f"py-spy failed ({proc.returncode}): {err.strip()[-400:]}")
                stop.set()
                thread.join(timeout=10) if snapshot_every else None
            say(f"{window.received_per_s:,.0f} transfers/s, {window.cpu_us_per_transfer:.1f} µs machine CPU per "
                f"transfer ({window.machine_cores:.2f} cores busy: nodes {window.cpu['nodes']:.2f}, controller "
                f"{window.cpu['controller']:.2f}, load generator {window.cpu['loadgen']:.2f}); {len(ids)} snapshots")
            per_node_us = window.cpu["nodes"] * 1e6 / window.received_per_s if window.received_per_s else float("nan")
            tables["_summary"] = (
                f"{window.received_per_s:,.0f} transfers/s counted by the nodes; machine {window.machine_cores:.2f} "
                f"cores busy = {window.cpu_us_per_transfer:.1f} µs per transfer; the 4 nodes alone "
                f"{per_node_us:.1f} µs per transfer; {len(ids)} snapshots triggered (every {snapshot_every * 1e3:.0f} ms)"
            )
            for name in targets:
                raw = out_dir / f"profile-{name}.txt"
                if raw.exists():
                    counts, total = shares(raw)
                    tables[name] = table(counts, total)
        finally:
            if loadgen is not None:
                loadgen.close()
            cluster.stop()
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--callers", type=int, default=8, help="closed-loop callers per node")
    parser.add_argument("--mode", choices=("classic", "overtake"), default="overtake")
    parser.add_argument("--snapshot-every", type=float, default=0.1, help="seconds (0: no snapshots)")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    if args.seconds < 1 or args.callers < 1:
        parser.error("--seconds and --callers must be at least 1")
    if os.geteuid() != 0 and Path("/proc/sys/kernel/yama/ptrace_scope").exists():
        print("note: py-spy needs ptrace rights over the processes (root, or ptrace_scope 0)", file=sys.stderr)
    tables = profile(seconds=args.seconds, callers=args.callers, mode=args.mode, out_dir=args.out,
                     snapshot_every=args.snapshot_every, say=lambda t: print(t, file=sys.stderr))
    for name, text in tables.items():
        print(f"\n## {name}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
