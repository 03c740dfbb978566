"""Files that survive a crash: the one place the node, its pending reports and
the controller's journal and store get `fsync_dir`, `write_atomically`,
`write_pieces_durably`, `write_unsynced`, `sync_files`, `sync_renamed` and `sync_with_log`."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Sequence
from pathlib import Path


def _load_syncfs():  # Linux's syncfs(2), which Python's os module lacks; None elsewhere
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs


_SYNCFS = _load_syncfs()


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a create, a rename) durable."""
    _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(directory: Path) -> bool:
    """One syncfs(2) of `directory`'s file system; False where there is none or it failed."""
    if _SYNCFS is None:
        return False
    fd = os.open(directory, os.O_RDONLY)
    try:
        return _SYNCFS(fd) == 0
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> Path:
    """`path` holds `data` or what it held before, never part of it: a temp file
    (`.<name>.tmp`), fsync, rename, fsync the directory."""
    _replace(path, data, sync=True)
    fsync_dir(path.parent)
    return path


def write_pieces_durably(path: Path, pieces: Sequence[bytes | memoryview]) -> Path:
    """`write_atomically` of the pieces joined, never joined in memory: a temp file,
    the pieces, the rename, the file's fdatasync, the directory's fsync. Its syncs are
    this file's and its directory's alone: no other process's writes are waited for.
    Renamed before its sync (it is whole by then: a process that dies keeps it whole
    or not at all), the file's one journal commit (ext4, xfs) carries its name too, and
    the directory's fsync finds little or nothing left to commit; a power loss between
    the two may keep the name without the bytes, which the reader must drop."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, pieces)
        os.replace(tmp, path)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    return path


def write_unsynced(path: Path, data: bytes) -> Path:
    """`write_atomically` without its two syncs: a process crash leaves `path`
    whole or as it was (the rename is atomic and the page cache survives it);
    making it durable is the caller's (`sync_with_log`)."""
    return _replace(path, data, sync=False)


def _replace(path: Path, data: bytes, *, sync: bool) -> Path:
    """`data` written to `.<name>.tmp` (fsynced when `sync`), then renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, (data,))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


_IOV_MAX = 1024  # Linux's: the most pieces one writev(2) takes


def _write_all(fd: int, pieces: Sequence[bytes | memoryview]) -> None:
    """Every piece, in order: many (a report's blocks) by writev(2), one call for
    many blocks, not one each; a lone one by write(2)."""
    views = [memoryview(piece) for piece in pieces if len(piece)]
    if len(views) == 1:
        view = views[0]
        while view:
            view = view[os.write(fd, view):]
        return
    at = 0
    while at < len(views):
        written = os.writev(fd, views[at:at + _IOV_MAX])
        while written:  # past what went whole; a piece written in part goes on from where it stopped
            size = len(views[at])
            if written < size:
                views[at] = views[at][written:]
                break
            written -= size
            at += 1


def sync_with_log(log_fd: int, directory: Path, paths: Sequence[Path]) -> int:
    """Make a log (`log_fd`, in `directory`) and the files `write_unsynced` put
    beside it (their names too) durable: one syncfs(2) of that file system where
    there is one, else (or when it fails) an fsync of every file and of every
    directory holding one, then the log's fdatasync, in that order. How many
    sync calls it made."""
    if _syncfs(directory):
        return 1
    for path in paths:
        _fsync(path)
    parents = dict.fromkeys(path.parent for path in paths)
    for parent in parents:
        fsync_dir(parent)
    os.fdatasync(log_fd)
    return len(paths) + len(parents) + 1


def sync_files(directory: Path, paths: Sequence[Path]) -> int:
    """Make the content of every file of `paths` (all on `directory`'s file system)
    durable, with one syncfs(2) of that file system where there is one, else (or
    when it fails: a sandbox may refuse it) one fsync per file, whose own error
    then says what is wrong. How many sync calls it made (1, or len(paths))."""
    if not paths:
        return 0
    if _syncfs(directory):
        return 1
    for path in paths:
        _fsync(path)
    return len(paths)


def sync_renamed(directory: Path, paths: Sequence[Path]) -> int:
    """Make files written unsynced and renamed into `directory` durable, content and
    names: one syncfs(2) of its file system where there is one, else an fsync of each
    that is still there (one deleted meanwhile needs none) and of the directory. How
    many sync calls it made."""
    if not paths:
        return 0
    if _syncfs(directory):
        return 1
    synced = 0
    for path in paths:
        try:
            _fsync(path)
        except FileNotFoundError:
            continue
        synced += 1
    fsync_dir(directory)
    return synced + 1
