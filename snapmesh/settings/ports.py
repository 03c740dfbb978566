"""Free TCP ports on this machine, for clusters started on loopback."""

from __future__ import annotations

import random
import socket
from pathlib import Path


class NoFreePorts(RuntimeError):
    """Not enough free ports below the ephemeral range."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that were free a moment ago.

    Drawn below the kernel's ephemeral range: ports the kernel hands out (to
    every outgoing connection on the machine) would soon be taken by a client
    socket, and the server started on them later would fail to bind.
    """
    low, _ = _ephemeral_range()
    candidates = range(max(1024, low - 16384), low)
    rng = random.SystemRandom()
    ports: list[int] = []
    for _ in range(count * 50):
        if len(ports) == count:
            break
        port = rng.choice(candidates)
        if port not in ports and port_is_free(host, port):
            ports.append(port)
    if len(ports) < count:
        raise NoFreePorts(f"found only {len(ports)} free ports below {low}, needed {count}")
    return ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(host: str, port: int) -> bool:
    """Nothing listens on host:port: a server could bind it now (SO_REUSEADDR, as
    gRPC servers use, so connections closing in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
