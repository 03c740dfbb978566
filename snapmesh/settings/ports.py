"""Free TCP ports on this machine, for clusters started on loopback."""

from __future__ import annotations

import collections
import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

# Every process that draws ports takes a lock on one byte per port (the port
# number as the offset) of one machine-wide file, and holds it while it lives.
# A port a test's node left free while it is killed and restarted is then not
# handed to a second test session drawing at the same time. Record locks die
# with their process, so a crashed session frees its ports; the newest
# HELD_PER_PROCESS draws are held, so a long session does not hold every port.
LOCK_NAME = "snapmesh-ports.lock"  # in the temporary directory, found when first needed
HELD_PER_PROCESS = 512


class NoFreePorts(RuntimeError):
    """Not enough free ports below the ephemeral range."""


class _Reservations:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._fd: int | None = None
        self._pid = 0

    def take(self, port: int) -> bool:
        """Hold `port` for this process: False when another process holds it."""
        with self._lock:
            fd = self._file()
            if fd is None:
                return True  # no lock file (a read-only /tmp): the bind check alone decides
            if port in self._held:
                return False  # drawn before by this process: a port is handed out once
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except OSError:
                return False
            self._held[port] = None
            while len(self._held) > HELD_PER_PROCESS:
                oldest, _ = self._held.popitem(last=False)
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, oldest)
            return True

    def _file(self) -> int | None:
        if self._pid != os.getpid():  # a forked child inherits no record locks: start afresh
            self._fd, self._pid, self._held = None, os.getpid(), collections.OrderedDict()
            try:
                # A read-only container may have no usable temporary directory at all.
                lock_file = Path(tempfile.gettempdir()) / LOCK_NAME
                self._fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError:
                self._fd = None
        return self._fd


_reservations = _Reservations()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that were free a moment ago, held for this process.

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
        if port not in ports and port_is_free(host, port) and _reservations.take(port):
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
