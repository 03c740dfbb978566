"""The data-dir locks: one process per node id, and one controller, on one data dir.

A second `snapmesh node` started on a live node's data dir would otherwise
recover from the live log, append to it (a `restart` record with an lsn the
live node hands out too) and only then fail to bind: the live node's next
restart dies on the duplicate lsn. So a node takes `<data_dir>/<node_id>.lock`
with an exclusive `flock` before it reads or writes anything there, and holds
it (the open file) until the process ends. The kernel drops the lock when the
process dies, SIGKILL included, so a crashed node never leaves a stale lock.

The controller does the same with `<data_dir>/controller.lock` ("controller"
cannot be a node id): a second controller would load the live one's journal and
snapshots and write beside it. `cluster up` takes every lock of the cluster it is
about to start (`acquire_all`) before it writes anything (cluster.toml, certificates,
logs), so a second `cluster up` on a live data dir changes nothing there.

The file holds the holder's pid, for the message a refused process prints.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

CONTROLLER = "controller"  # the controller's lock name; never a node id (snapmesh.settings.config)


class DataDirLocked(RuntimeError):
    """Another live process holds this node's lock; the message says which."""


class DataDirLock:
    """Held from `acquire` until `release` or the end of the process."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path, node_id: str) -> DataDirLock:
        """Take the lock of node `node_id` (or of the controller: CONTROLLER)
        without waiting; raises DataDirLocked if a live process holds it (nothing
        else in the data dir is touched), OSError if the lock file cannot be opened."""
        path = data_dir / f"{node_id}.lock"
        owner = "the controller" if node_id == CONTROLLER else f"node {node_id!r}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DataDirLocked(
                f"data dir {data_dir} is in use by another process for {owner}"
                f" ({path} is locked by {holder}); refusing to start"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        # Ours now: record who holds it (the pid is for humans; the flock is the lock).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "an unknown process"


def acquire_all(data_dir: Path, names: Iterable[str]) -> list[DataDirLock]:
    """Every lock in `names` (node ids, CONTROLLER), or none: DataDirLocked for
    the first one a live process holds (those taken so far are released)."""
    held: list[DataDirLock] = []
    try:
        for name in names:
            held.append(DataDirLock.acquire(data_dir, name))
    except BaseException:
        release_all(held)
        raise
    return held


def release_all(locks: Iterable[DataDirLock]) -> None:
    for lock in locks:
        lock.release()


async def serve_holding(data_dir: Path, name: str, program: str, serve: Callable[[], Awaitable[int]]) -> int:
    """A server's start: take `name`'s lock (a node id, CONTROLLER) in `data_dir`
    before anything there is read or written, run `serve` holding it, release it.

    A data dir another process holds, or one that cannot be made or locked: one
    line on stderr after `program` ("snapmesh node"), exit status 2, nothing served."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        lock = DataDirLock.acquire(data_dir, name)
    except DataDirLocked as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{program}: cannot lock data dir {data_dir}: {exc}", file=sys.stderr)
        return 2
    try:
        return await serve()
    finally:
        lock.release()
