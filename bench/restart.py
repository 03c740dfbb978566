"""Benchmark: a node's restart after 1M logged commands, with log segments against the same
history in one file (a restart reads the active segment from its checkpoint, not the whole history).

One history, written twice by the pure node machine (`snapmesh.protocol.node.machine.Node`)
hosting the bank app (services/app/bank.py, as every node does): N commands "1 p2" (pay 1 to
the peer), each a `command` and a `send` record, to a peer that acknowledges every 1,000.

- after: the node with segments of `segment_records`: the data dir it leaves is sealed
  segments plus an active one that opens with a checkpoint (the app's state and the outbox);
- before: the same node with segments off (`segment_records` and `segment_bytes` above the
  history): every record in one file, the way a node wrote its log before segments.

Each restart runs today's code in a fresh process (`snapmesh.services.node.recovery.recover`,
which replays the logged commands through the bank app, then `Node`) and reports the time to
rebuild the node, and (in another process, under tracemalloc) the peak memory that rebuilding
allocated; both must end with the same balance. Acknowledgements are not logged, so the
one file's outbox is every message ever sent (the peer drops the resent ones); a checkpoint
carries the outbox as it was.

`python -m bench restart` (or `python -m bench.restart [--commands N] [--segment-records R]`).
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
PARAMS = {"initial_balance": 10**9}  # the bank's [app] table: enough for every command to pay
NEVER = 2**62  # segments off: no history reaches this many records or bytes

_CHILD = r"""
import json, sys, time, tracemalloc
from pathlib import Path
path, traced, params = Path(sys.argv[1]), sys.argv[2] == "memory", json.loads(sys.argv[3])
from snapmesh.app import load_app
from snapmesh.protocol.node.machine import Node
from snapmesh.services.node.recovery import recover
bank = load_app("bank")  # loaded before the clock and the trace: the same for both sides
if traced:
    tracemalloc.start()
started = time.perf_counter()
state = recover(path, "p1", incoming=("p2",), outgoing=("p2",), repair=False, app=bank,
                app_params=params)
node = Node(node_id="p1", incoming=("p2",), outgoing=("p2",), recovered=state, app=bank, app_params=params)
elapsed = time.perf_counter() - started
peak = tracemalloc.get_traced_memory()[1] if traced else 0
print(json.dumps({"seconds": elapsed, "peak_mib": peak / 2**20, "balance": int(node.app_state()),
                  "outbox": node.senders["p2"].unacked}))
"""


def write_history(directory: Path, commands: int, segment_records: int) -> Path:
    """The data dir of a bank-app node that ran `commands` commands; its active segment's path."""
    from snapmesh.app import load_app
    from snapmesh.protocol import wal
    from snapmesh.protocol.node import recovery
    from snapmesh.protocol.node.effects import Append, Seal
    from snapmesh.protocol.node.machine import Node
    from snapmesh.protocol.node.steps import DEFAULT_SEGMENT_BYTES

    directory.mkdir(parents=True)
    bank, peers = load_app("bank"), ("p2",)
    node = Node(
        node_id="p1", incoming=peers, outgoing=peers, segment_records=segment_records,
        segment_bytes=NEVER if segment_records >= NEVER else DEFAULT_SEGMENT_BYTES,
        recovered=recovery.fresh(incoming=peers, outgoing=peers), app=bank, app_params=PARAMS,
    )
    node.connect("p2", 1)
    encoder = wal.Encoder("p1")
    path = directory / wal.active_name("p1")
    active = open(path, "w")
    first = 1

    def drain() -> None:
        nonlocal active, first
        for effect in node.drain():
            if type(effect) is Append:
                active.write(encoder.record(effect.record))
            elif type(effect) is Seal:
                active.close()
                os.replace(path, directory / wal.sealed_name("p1", first))
                first = effect.next_lsn
                active = open(path, "w")
                active.write(encoder.record(effect.checkpoint))  # the checkpoint opens the next segment

    for i in range(1, commands + 1):
        node.submit(b"1 p2")  # the bank app's compact command: pay 1 to p2
        if i % 1000 == 0:
            node.durable(node.last_lsn)
            node.acked("p2", 1, node.senders["p2"].next_seq - 1)
        drain()
    node.durable(node.last_lsn)
    drain()
    active.close()
    return path


def measure(path: Path) -> dict:
    """Time in one fresh process, peak memory (tracemalloc, which slows it) in another."""
    def run(mode: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path), mode, json.dumps(PARAMS)], cwd=REPO, capture_output=True,
            text=True, check=True,
        ).stdout
        return json.loads(out)

    timed, traced = run("time"), run("memory")
    return {**timed, "peak_mib": traced["peak_mib"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.restart")
    parser.add_argument("--commands", "--transfers", dest="commands", type=int, default=1_000_000)
    parser.add_argument("--segment-records", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv or [])
    if smoke.on():  # a few segments, one run: every step, no measurement
        args.commands, args.segment_records, args.runs = 3_000, 1_000, 1
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        after = write_history(data / "after", args.commands, args.segment_records)
        before = write_history(data / "before", args.commands, NEVER)
        segments = len(os.listdir(after.parent))
        print(f"{args.commands:,} commands: one file of {before.stat().st_size / 2**20:.0f} MiB before; "
              f"{segments} segments after, the active one {after.stat().st_size / 2**20:.1f} MiB")
        rows = []
        for _ in range(args.runs):  # interleaved, so both see the same machine
            rows.append((measure(before), measure(after)))
        b = min(rows, key=lambda r: r[0]["seconds"])[0]
        a = min(rows, key=lambda r: r[1]["seconds"])[1]
        assert a["balance"] == b["balance"], (a, b)  # acks are not logged: only a checkpoint trims the outbox
        print(f"{'':8} {'restart s':>10} {'peak MiB':>9} {'outbox':>9}")
        for name, r in (("before", b), ("after", a)):
            print(f"{name:8} {r['seconds']:10.3f} {r['peak_mib']:9.1f} {r['outbox']:9,}")
        print(f"after/before: time {a['seconds'] / b['seconds']:.4f}, memory {a['peak_mib'] / b['peak_mib']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
