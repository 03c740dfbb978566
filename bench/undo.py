"""What taking back a failed app command costs (apphost.H4), against what it saves.

`python -m bench undo`. The app is kvshard; its state is N KiB of keys, and K
puts were taken since the undo log's base. A refused command (a `get` of a key
that is not there: NOT_FOUND) makes the Host rebuild the app: restore the base,
replay the K puts, take the rebuilt state as the new base (when K > 0). The baseline, in the
same run: one put that goes through (the success path, which the undo log costs
one append), and one snapshot(), which a copy before every step would add to
every command. Pure, one process, a few seconds.
"""

from __future__ import annotations

import json
import statistics
import time

from bench import smoke
from snapmesh.protocol.node import apphost, core
from snapmesh.services.app import kvshard

SIZES_KIB = (4, 64, 1024)
STEPS = (0, 100, None)  # None: the most an undo replays, one input short of moving the base (apphost.H5)
ROUNDS = 7


def _host(kib: int) -> apphost.Host:
    host = apphost.Host(kvshard.app, node_id="p1", incoming=("p2",), outgoing=("p2",))
    value = "v" * 100
    n = 0
    while len(host.snapshot()) < kib * 1024:
        for _ in range(50):
            host.command(kvshard.encode({"op": "put", "key": f"p1/k{n:07d}", "value": value}))
            n += 1
    host.keys = n  # type: ignore[attr-defined]  (how many, for the puts below)
    return host


def _put(host: apphost.Host, i: int) -> None:
    # A value as long as the first ones: the state keeps its size.
    host.command(kvshard.encode({"op": "put", "key": f"p1/k{i % host.keys:07d}", "value": f"w{i:099d}"}))  # type: ignore[attr-defined]


def _most(host: apphost.Host) -> int:
    """How many puts since the base an undo may have to replay: one short of moving the base."""
    host.snapshot()
    i = 0
    while not host.undo.full:
        _put(host, i)
        i += 1
    host.snapshot()
    return i - 1


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f}"


def main() -> int:
    missing = kvshard.encode({"op": "get", "key": "p1/missing"})
    print(f"{'state':>9} {'since':>6} {'undo ms':>9} {'put ms':>9} {'snapshot ms':>12}")
    rows = []
    rounds = smoke.size(ROUNDS, 1)
    for kib in SIZES_KIB[:1] if smoke.on() else SIZES_KIB:  # a smoke run: the smallest state, one round
        host = _host(kib)
        host.snapshot()  # the base
        for steps in STEPS:
            if steps is None:
                steps = _most(host)
            undo, put, copy = [], [], []
            for r in range(rounds):
                for i in range(steps):
                    started = time.perf_counter()
                    _put(host, r * steps + i)
                    put.append(time.perf_counter() - started)
                assert len(host.undo) == steps
                started = time.perf_counter()
                try:
                    host.command(missing)
                except core.AppRefusal:
                    pass
                undo.append(time.perf_counter() - started)
                started = time.perf_counter()
                host.snapshot()
                copy.append(time.perf_counter() - started)
            # The best of the rounds: the machine is shared, and other work only ever adds.
            row = {"state_kib": kib, "steps_since_base": steps, "undo_ms": min(undo) * 1e3,
                   "put_ms": statistics.fmean(put) * 1e3 if put else None, "snapshot_ms": min(copy) * 1e3}
            rows.append(row)
            put_text = _ms(row["put_ms"] / 1e3) if put else f"{'-':>9}"
            print(f"{kib:>6} KiB {steps:>6} {_ms(row['undo_ms'] / 1e3)} {put_text} {_ms(row['snapshot_ms'] / 1e3):>12}")
    print(json.dumps(rows))
    print("success path with the undo log: put ms (its share of the base moving up included);"
          " a copy before every step would add snapshot ms to each")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
