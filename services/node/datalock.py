"""The data-dir lock: one process per node id on one data dir.

A second `snapmesh node` started on a live node's data dir would otherwise
recover from the live log, append to it (a `restart` record with an lsn the
live node hands out too) and only then fail to bind: the live node's next
restart dies on the duplicate lsn. So a node takes `<data_dir>/<node_id>.lock`
with an exclusive `flock` before it reads or writes anything there, and holds
it (the open file) until the process ends. The kernel drops the lock when the
process dies, SIGKILL included, so a crashed node never leaves a stale lock.

The file holds the holder's pid, for the message a refused process prints.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DataDirLocked(RuntimeError):
    """Another live process holds this node's lock; the message says which."""


class DataDirLock:
    """Held from `acquire` until `release` or the end of the process."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path, node_id: str) -> DataDirLock:
        """Take the lock without waiting; raises DataDirLocked if a live process
        holds it (nothing else in the data dir is touched), OSError if the lock
        file cannot be opened."""
        path = data_dir / f"{node_id}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DataDirLocked(
                f"data dir {data_dir} is in use by another process for node {node_id!r}"
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
