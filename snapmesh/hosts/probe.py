"""The round-trip probe: how long a TCP connect to HOST:PORT takes, N times;
and a one-way reachability check with UDP datagrams.

    python -m snapmesh.hosts.probe rtt HOST PORT [--count N]
    python -m snapmesh.hosts.probe listen ADDRESS PORT --seconds S   # prints `got` at the first datagram
    python -m snapmesh.hosts.probe send HOST PORT [--count N]
    python -m snapmesh.hosts.probe sink ADDRESS PORT       # one TCP connection read to its end
    python -m snapmesh.hosts.probe blast HOST PORT --count BYTES   # prints the seconds it took

A connect returns when the SYN-ACK is back: one round trip, through both
hosts' links (and their delays), without any server code in the path.
Run on a host (`snapmesh.processes.child.run_on_host`); prints one JSON line
{"count", "min_ms", "median_ms", "p90_ms"}. Runs under SCHED_FIFO when it may,
so a busy machine's late wake-ups do not count as network time.
Exit 1 when no connect succeeded. A TCP connect needs both ways, so a one-way
partition is seen with `listen` on the receiver and `send` on the sender.
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


def listen(address: str, port: int, seconds: float) -> bool:
    """Did a datagram reach address:port within `seconds`? Returns at the first."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((address, port))
        print("listening", flush=True)
        sock.settimeout(seconds)
        try:
            sock.recv(64)
        except TimeoutError:
            return False
    return True


def send(host: str, port: int, count: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(count):
            sock.sendto(b"probe", (host, port))
            time.sleep(0.02)


def sink(address: str, port: int) -> int:
    with socket.create_server((address, port)) as server:
        print("listening", flush=True)
        conn, _ = server.accept()
        total = 0
        with conn:
            while chunk := conn.recv(1 << 16):
                total += len(chunk)
    return total


def blast(host: str, port: int, size: int) -> float:
    """Seconds to send `size` bytes and see the receiver close after reading them all."""
    with socket.create_connection((host, port), timeout=60) as sock:
        begin = time.perf_counter()
        sock.sendall(b"x" * size)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)
        return time.perf_counter() - begin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapmesh.hosts.probe", description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    for mode in ("rtt", "listen", "send", "sink", "blast"):
        sub = modes.add_parser(mode)
        sub.add_argument("host")
        sub.add_argument("port", type=int)
        sub.add_argument("--count", type=int, default=20)
        sub.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.mode == "listen":
        print("got" if listen(args.host, args.port, args.seconds) else "nothing", flush=True)
        return 0
    if args.mode == "sink":
        print(json.dumps({"received": sink(args.host, args.port)}))
        return 0
    if args.mode == "blast":
        print(json.dumps({"seconds": round(blast(args.host, args.port, args.count), 3)}))
        return 0
    if args.mode == "send":
        send(args.host, args.port, args.count)
        return 0
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
