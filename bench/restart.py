"""Benchmark: a node's restart after 1M logged transfers, before and after log segments (a restart
reads the active segment from its checkpoint, not the whole history).

One history, written twice: the pure node machine (`snapmesh.protocol.node.machine.Node`, with
segments of `segment_records`) pays N transfers to a peer that acknowledges
every 1,000. "after" is the data dir that node leaves: sealed segments plus an
active one that opens with a checkpoint. "before" is the same records in one
file, the way the node wrote its log before segments. Each restart runs in a
fresh process and reports the time to rebuild the node, and (in another
process, under tracemalloc) the peak memory that rebuilding allocated:

- before: the pre-segment recovery (`git show BASE:services/node/recovery.py`:
  the whole file is read, the outbox holds every message ever sent) + core.Process;
- after: `snapmesh.services.node.recovery.recover` (the active segment only) + `Node`.

`python -m bench restart` (or `python -m bench.restart [--transfers N] [--base REV]`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import smoke

REPO = Path(__file__).resolve().parent.parent
BASE = "317a3ff"  # the last commit before segments

_CHILD = r"""
import json, sys, time, tracemalloc
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from snapmesh.protocol.node import core
import snapmesh.services.node.recovery, snapmesh.protocol.node.machine
which, path, traced = sys.argv[1], Path(sys.argv[2]), sys.argv[4] == "memory"
if which == "before":
    import old_recovery
if traced:
    tracemalloc.start()
started = time.perf_counter()
if which == "before":
    state = old_recovery.recover(path, "p1", initial_balance=10**9, incoming=("p2",), outgoing=("p2",), repair=False)
    process = core.Process(node_id="p1", tally=state.balance, incoming=("p2",), outgoing=("p2",),
                           abandoned=state.abandoned)
    outbox = sum(len(v) for v in state.outbox.values())
else:
    from snapmesh.services.node.recovery import recover
    from snapmesh.protocol.node.machine import Node
    state = recover(path, "p1", initial_tally=10**9, incoming=("p2",), outgoing=("p2",), repair=False)
    node = Node(node_id="p1", incoming=("p2",), outgoing=("p2",), recovered=state)
    outbox = node.senders["p2"].unacked
elapsed = time.perf_counter() - started
peak = tracemalloc.get_traced_memory()[1] if traced else 0
tally = state.balance if which == "before" else state.tally
print(json.dumps({"seconds": elapsed, "peak_mib": peak / 2**20, "balance": tally, "outbox": outbox}))
"""


def write_history(data: Path, transfers: int, segment_records: int) -> tuple[Path, Path]:
    """The node's segmented data dir, and the same records as one old-style file."""
    from snapmesh.protocol.node import recovery
    from snapmesh.protocol import wal
    from snapmesh.protocol.node.machine import Append, Node, Seal

    seg_dir, one_dir = data / "after", data / "before"
    seg_dir.mkdir(parents=True)
    one_dir.mkdir()
    encoder = wal.Encoder("p1")
    node = Node(
        node_id="p1", incoming=("p2",), outgoing=("p2",), segment_records=segment_records,
        recovered=recovery.fresh(initial_tally=10**9, incoming=("p2",), outgoing=("p2",)),
    )
    node.connect("p2", 1)
    active = open(seg_dir / wal.active_name("p1"), "w")
    single = open(one_dir / wal.active_name("p1"), "w")
    first = 1

    def drain() -> None:
        nonlocal active, first
        for effect in node.drain():
            if type(effect) is Append:
                line = encoder.record(effect.record)
                active.write(line)
                single.write(line)
            elif type(effect) is Seal:
                active.close()
                os.replace(seg_dir / wal.active_name("p1"), seg_dir / wal.sealed_name("p1", first))
                first = effect.next_lsn
                active = open(seg_dir / wal.active_name("p1"), "w")
                line = encoder.record(effect.checkpoint)  # the checkpoint opens the next segment
                active.write(line)
                single.write(line)

    for i in range(1, transfers + 1):
        node.transfer("p2", 1)
        if i % 1000 == 0:
            node.durable(node.last_lsn)
            node.acked("p2", 1, node.senders["p2"].next_seq - 1)
        drain()
    node.durable(node.last_lsn)
    drain()
    active.close()
    single.close()
    return seg_dir / wal.active_name("p1"), one_dir / wal.active_name("p1")


def old_recovery_module(where: Path, base: str) -> None:
    source = subprocess.run(
        ["git", "show", f"{base}:services/node/recovery.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    kinds = 'frozenset({"init", "restart", "send", "recv", "cut", "marker_sent", "marker_recv", "abort"})'
    # The record kinds of that day, in place of its import: at BASE the node's package was
    # `services` (now a shim that refuses the import), later `snapmesh.services`.
    for package in ("services", "snapmesh.services"):
        source = source.replace(f"from {package}.node.translog import KINDS", f"KINDS = {kinds}")
    (where / "old_recovery.py").write_text(source)


def measure(which: str, path: Path, modules: Path) -> dict:
    """Time in one fresh process, peak memory (tracemalloc, which slows it) in another."""
    def run(mode: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, which, str(path), str(modules), mode], cwd=REPO, capture_output=True,
            text=True, check=True,
        ).stdout
        return json.loads(out)

    timed, traced = run("time"), run("memory")
    return {**timed, "peak_mib": traced["peak_mib"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.restart")
    parser.add_argument("--transfers", type=int, default=1_000_000)
    parser.add_argument("--segment-records", type=int, default=100_000)
    parser.add_argument("--base", default=BASE, help="the commit whose recovery is 'before'")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv or [])
    if smoke.on():  # a few segments, one run: every step, no measurement
        args.transfers, args.segment_records, args.runs = 3_000, 1_000, 1
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        after, before = write_history(data, args.transfers, args.segment_records)
        old_recovery_module(data, args.base)
        segments = len(os.listdir(after.parent))
        print(f"{args.transfers:,} transfers: one file of {before.stat().st_size / 2**20:.0f} MiB before; "
              f"{segments} segments after, the active one {after.stat().st_size / 2**20:.1f} MiB")
        rows = []
        for _ in range(args.runs):  # interleaved, so both see the same machine
            rows.append((measure("before", before, data), measure("after", after, data)))
        b = min(rows, key=lambda r: r[0]["seconds"])[0]
        a = min(rows, key=lambda r: r[1]["seconds"])[1]
        assert a["balance"] == b["balance"], (a, b)
        print(f"{'':8} {'restart s':>10} {'peak MiB':>9} {'outbox':>9}")
        for name, r in (("before", b), ("after", a)):
            print(f"{name:8} {r['seconds']:10.3f} {r['peak_mib']:9.1f} {r['outbox']:9,}")
        print(f"after/before: time {a['seconds'] / b['seconds']:.4f}, memory {a['peak_mib'] / b['peak_mib']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
