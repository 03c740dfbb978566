"""The round-trip probe: how long a TCP connect to HOST:PORT takes, N times.

    python -m snapmesh.hosts.probe HOST PORT [--count N]

A connect returns when the SYN-ACK is back: one round trip, through both
hosts' links (and their delays), without any server code in the path.
Run on a host (`supervisor.run_on_host`); prints one JSON line
{"count", "min_ms", "median_ms", "p90_ms"}. Runs under SCHED_FIFO when it may,
so a busy machine's late wake-ups do not count as network time.
Exit 1 when no connect succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time


def probe(host: str, port: int, count: int, timeout: float = 5.0) -> list[float]:
    address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    samples = []
    for _ in range(count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            begin = time.perf_counter()
            try:
                sock.connect(address)
            except OSError:
                continue
            samples.append((time.perf_counter() - begin) * 1000)
        time.sleep(0.01)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "min_ms": round(ordered[0], 3),
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapmesh.hosts.probe", description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--count", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        pass
    samples = probe(args.host, args.port, args.count)
    if not samples:
        print(f"probe: no connect to {args.host}:{args.port} succeeded", file=sys.stderr)
        return 1
    print(json.dumps(summary(samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
