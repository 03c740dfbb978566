"""The block files of answered reports, written by one thread in batches (blockdir.py D12).

What is pending and who waits for what is snapmesh/protocol/controller/blockwrites.py's
(BW1-BW5, pure); this holds the thread and the lock. The thread starts at the first
deferral and ends at `close` (the controller's orderly stop, after every block
deferred is written: a SIGTERM drains; a SIGKILL leaves them to the replay, JB3).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from snapmesh.protocol.controller.blockwrites import DEFAULT_MAX_BYTES, PendingWrites

log = logging.getLogger(__name__)


class BlockWriter:
    def __init__(self, write: Callable[[dict[bytes, bytes]], None],
                 failed: Callable[[list[bytes], OSError], None], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._write = write  # a batch's files, unsynced (blockdir.py D8), in the thread
        self._failed = failed  # a batch that could not be written: its names, and why (BW3)
        self._pending = PendingWrites(max_bytes)
        self._changed = threading.Condition()  # over every call on `_pending` but `get` (BW2)
        self._thread: threading.Thread | None = None
        self._closing = False

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, name: bytes) -> bool:
        return name in self._pending

    def names(self) -> set[bytes]:
        with self._changed:
            return self._pending.names()

    def defer(self, blocks: dict[bytes, bytes]) -> dict[bytes, bytes]:
        """Have `blocks` written by the thread (BW1); those to write now (past the bound, or stopping) given back."""
        with self._changed:
            if self._closing:
                return blocks
            now = self._pending.defer(blocks)
            if len(now) < len(blocks):
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="controller-block-writes", daemon=True)
                    self._thread.start()
                self._changed.notify_all()
            return now

    def get(self, name: bytes) -> bytes | None:
        """Pending block `name`, from memory (BW2: no lock)."""
        return self._pending.get(name) if self._pending else None

    def claim(self, names: Iterable[bytes]) -> None:
        """Take `names` out of the queue, after the batch under way has written any of them (BW4)."""
        if not self._pending:
            return
        with self._changed:
            waiting = self._pending.claim(names)
            while waiting and self._pending.in_batch(waiting):
                self._changed.wait()

    def flush(self) -> None:
        """Return once every block deferred so far is written (BW5)."""
        if not self._pending:
            return
        with self._changed:
            mark = self._pending.mark()
            while not self._pending.flushed(mark):
                self._changed.wait()

    def close(self) -> None:
        """Write every block deferred, then end the thread (the controller's orderly stop: BW5)."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closing:
                    self._changed.wait()
                if not self._pending:
                    return
                batch = self._pending.take()
            try:
                self._write(batch)
            except OSError as exc:  # its record still holds the blocks (BW3)
                log.error("cannot write %d block files of answered reports (their journal records hold them): %s",
                          len(batch), exc)
                self._failed(list(batch), exc)
            except Exception:  # a bug must not hang every reader that waits for the batch
                log.exception("cannot write %d block files of answered reports", len(batch))
                self._failed(list(batch), OSError("block writer failed"))
            finally:
                with self._changed:
                    self._pending.written()
                    self._changed.notify_all()
