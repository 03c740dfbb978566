"""`snapmesh cluster down|status [--data-dir D]`: the cluster `cluster up` runs on D, from any shell.

`cluster up` holds `D/cluster.pid` (an exclusive flock, the file holding its
pid) for as long as it runs; the kernel drops the lock when the launcher ends,
however it ends, so a stale file never reads as a live cluster. The file ends in
`.pid`, so it never meets a node's `<id>.lock` (snapmesh.serving.datalock).

`down` sends the launcher SIGTERM (it stops every child, as Ctrl-C does) and
waits until the lock is free: exit 0 once stopped, 1 when no cluster runs on D
or it did not stop in time. `status` prints the launcher's pid and, from
D/cluster.toml, each process's address and its gRPC health answer: exit 0 when
the launcher runs and every process is SERVING, 1 otherwise. A D without a
cluster.toml exits 2.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from pathlib import Path

from snapmesh.settings import config as cluster_config
from snapmesh.settings import target

PID_FILE = "cluster.pid"
PROG = "snapmesh cluster"


class LauncherLock:
    """`cluster up`'s hold on D/cluster.pid, until `release` or its end."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold_launcher(data_dir: Path) -> LauncherLock:
    """Take D/cluster.pid for this process (the data-dir locks, taken first, keep a
    second launcher out; a lock still held here means one is starting: refuse)."""
    from snapmesh.serving.datalock import DataDirLocked

    fd = os.open(data_dir / PID_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirLocked(f"data dir {data_dir} is in use by another `snapmesh cluster up` "
                            f"({data_dir / PID_FILE}); refusing to start") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return LauncherLock(fd)


def running_launcher(data_dir: Path) -> int | None:
    """The pid of the `cluster up` running on D, or None when none runs."""
    try:
        fd = os.open(data_dir / PID_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        return None  # free: nobody holds it
    finally:
        os.close(fd)


def default_data_dir() -> Path:
    """Where `cluster up` with no arguments runs: the shipped file's data dir (./data, or $SNAPMESH_DATA_DIR)."""
    return cluster_config.load(cluster_config.DEFAULT_CONFIG).data_dir


def down(data_dir: Path, timeout: float) -> int:
    pid = running_launcher(data_dir)
    if pid is None:
        print(f"{PROG} down: no cluster runs on {data_dir} (no `snapmesh cluster up` holds "
              f"{data_dir / PID_FILE})", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while running_launcher(data_dir) is not None:
        if time.monotonic() > deadline:
            print(f"{PROG} down: the cluster of {data_dir} (pid {pid}) did not stop within {timeout:g}s",
                  file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"stopped the cluster of {data_dir} (pid {pid})")
    return 0


def health(address: str, identity, timeout: float) -> str:
    """The gRPC health answer at `address` as a word: SERVING, NOT_SERVING, ... or unreachable."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from snapmesh.serving import credentials

    try:
        with credentials.open_channel(address, identity) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    except grpc.RpcError as error:
        return "unreachable" if error.code() == grpc.StatusCode.UNAVAILABLE else error.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def status(data_dir: Path, timeout: float) -> int:
    found = target.find(None, data_dir, None)
    cfg = target.cluster_file(data_dir)
    pid = running_launcher(data_dir)
    print(f"cluster {data_dir}: " + (f"running (launcher pid {pid})" if pid else "not running"))
    rows = [("controller", cfg.controller.address)] + [(f"node {n.id}", n.address) for n in cfg.nodes]
    answers = [health(address, found.identity, timeout) for _, address in rows]
    width = max(len(name) for name, _ in rows)
    wide = max(len(address) for _, address in rows)
    for (name, address), answer in zip(rows, answers, strict=True):
        print(f"{name:<{width}}  {address:<{wide}}  {answer}")
    return 0 if pid and all(a == "SERVING" for a in answers) else 1


def main(args) -> int:
    data_dir = Path(args.data_dir).resolve() if args.data_dir else default_data_dir()
    prog = f"{PROG} {args.command}"
    try:
        if args.command == "down":
            target.cluster_file(data_dir)  # a dir that holds no cluster is a usage error
            return down(data_dir, args.timeout)
        return status(data_dir, args.timeout)
    except (target.TargetError, cluster_config.ConfigError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
