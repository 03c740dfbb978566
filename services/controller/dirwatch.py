"""The names removed from a directory, as Linux's inotify reports them: the block directory's
files lost behind the controller's back (blockdir.py D9), without a listing per snapshot.

A listing of controller/blocks is a readdir of every file (35,000 at 64 MiB a node and four
nodes, growing with each snapshot): about 20 ms of a lone core, more than the rest of an
incremental snapshot's bookkeeping, and it took the GIL from the reports it raced.

W1. `removed` gives every name deleted or moved out of the directory since the last call
    (or since `reset`), in order; None when the watch cannot say: there is no inotify
    (another kernel, no instance left), its queue overflowed, or the directory itself went.
    The caller then lists the directory, and `reset`s the watch first, so nothing that
    happens during its listing is lost.
W2. The watch holds one inotify instance (a file descriptor), closed by `close` or when the
    watch is collected: instances are few (128 a user by default).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import weakref

IN_MOVED_FROM = 0x40
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_LOST = IN_Q_OVERFLOW | IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED  # W1: the watch cannot say
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name, NUL-padded

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
    _libc.inotify_init1  # noqa: B018  (not Linux: no watch, the caller lists)
except (OSError, AttributeError):
    _libc = None


class DirWatch:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        self._fd: int | None = None
        self._lost = True  # nothing watched yet: the caller lists first (W1)
        self._gone = False  # the directory watched was removed or moved: watched afresh at `reset`
        self._closer: weakref.finalize | None = None

    @property
    def watching(self) -> bool:
        return self._fd is not None

    def reset(self) -> None:
        """Watch from now on (made on the first call), every event so far dropped (W1); a
        directory that went (and maybe came back) is watched afresh."""
        if self._fd is not None and self._gone:
            self.close()
        if self._fd is None and not self._start():
            return
        self._drain()
        self._lost = False

    def removed(self) -> list[str] | None:
        """The names removed since the last call or `reset` (W1); None: list the directory."""
        if self._fd is None or self._lost:
            return None
        names = self._drain()
        return None if self._lost else names

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
        self._fd, self._lost, self._gone, self._closer = None, True, False, None

    def _start(self) -> bool:
        if _libc is None:
            return False
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return False
        mask = IN_DELETE | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
        if _libc.inotify_add_watch(fd, os.fsencode(self.directory), mask) < 0:
            os.close(fd)
            return False
        self._fd = fd
        self._closer = weakref.finalize(self, os.close, fd)  # W2
        return True

    def _drain(self) -> list[str]:
        names: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 1 << 16)  # type: ignore[arg-type]
            except BlockingIOError:
                return names
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self._lost = True
                return names
            at = 0
            while at + _HEADER.size <= len(data):
                _, mask, _, length = _HEADER.unpack_from(data, at)
                name = data[at + _HEADER.size:at + _HEADER.size + length].rstrip(b"\0")
                at += _HEADER.size + length
                if mask & _LOST:
                    self._lost = True
                    self._gone = self._gone or bool(mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED))
                elif name:
                    names.append(os.fsdecode(name))
