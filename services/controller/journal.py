"""The controller's journal file: what it must not forget in a crash, made durable cheaply.

`<data_dir>/controller/journal`, append-only, one framed record per fact. Which
records there are, when each must be durable and how they are encoded is
`snapmesh.protocol.controller.journal`'s (pure); this module holds the file.

The full snapshot file is written later, in the background
(`store.StoreWriter`); once it is, `forget` marks the snapshot's records dead,
and the file is rewritten with only the live ones when it has grown past
`ROTATE_BYTES` and is mostly dead (which frames are live and when to rewrite:
`LiveFrames`, pure).

One task on the event loop writes: it takes the whole queue, writes and
fdatasyncs it in a thread, and every append queued meanwhile goes into the next
round (group commit). Appends are made by synchronous code on the loop and the
queue is taken only when the writer runs there, so a step's records (a
completing report's and the outcome, all one `carry_out` appends) always share
one fdatasync: a step costs one log round, never two. A rewrite runs after the
round's waiters have heard, so it is never on their path. `on_round` hears how
many records each round made durable (the controller's metrics). A torn or
corrupt frame (a crash mid-write) ends the journal: reading stops there and the
file is cut back to the last good frame. After a failed write or fdatasync
nothing more is written (retrying fsync is not safe): every later append fails
with the same error (`LiveFrames.failed`, pure).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from snapmesh.protocol.controller.journal import LiveFrames, Record, decode_all, encode
from snapmesh.serving.durable import fsync_dir

log = logging.getLogger(__name__)

ROTATE_BYTES = 32 * 1024 * 1024


# ------------------------------------------------------------------ the file


class Journal:
    """The journal file and its one writer task. `append` and `forget` are called
    on the event loop; futures resolve there once the bytes are on disk."""

    def __init__(self, path: Path, *, rotate_bytes: int = ROTATE_BYTES,
                 on_round: Callable[[int], None] | None = None) -> None:
        self.path = Path(path)
        self._fd = -1
        self._live = LiveFrames(rotate_bytes)  # which frames matter, when to rewrite (pure)
        self._queue: list[tuple[str, bytes | None, asyncio.Future[None] | None]] = []  # LiveFrames.take's, and who waits
        self._wake = asyncio.Event()  # set by `_put` and `close`
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_round = on_round  # a round's records, once durable (a rewrite's own syncs are not a round)

    def open(self) -> tuple[list[Record], list[str]]:
        """Read what is there (cutting off a torn tail), then start appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        records, good, problem = decode_all(data)
        warnings = []
        if problem is not None:
            warnings.append(f"journal {self.path}: {problem}; keeping the {len(records)} records before it")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        if good < len(data):
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
        os.lseek(self._fd, good, os.SEEK_SET)
        self._live.read(data[:good], records)
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="controller-journal")
        return records, warnings

    def append(self, record: Record) -> asyncio.Future[None]:
        """Queue a record; the future resolves once it is durable (or fails with the OSError)."""
        return self._put(record.snapshot_id, encode(record))

    def barrier(self) -> asyncio.Future[None]:
        """Resolves once everything appended so far is durable."""
        return self._put("", b"")

    def forget(self, snapshot_id: str) -> None:
        """The snapshot is in its file: its records need not survive the next rewrite."""
        self._put(snapshot_id, None)

    def _put(self, sid: str, frame: bytes | None) -> asyncio.Future[None]:
        assert self._loop is not None, "journal not open"
        future = self._loop.create_future() if frame is not None else None
        if self._live.broken is not None and future is not None:
            future.set_exception(self._live.broken)
            return future
        self._queue.append((sid, frame, future))
        self._wake.set()
        return future  # type: ignore[return-value]

    async def close(self) -> None:
        """What is queued is written, then the writer ends and the file is closed."""
        self._closing = True
        self._wake.set()
        try:
            if self._task is not None:
                await self._task
        finally:
            self._task = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # -- the writer task

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._queue = self._queue, []  # appends from now on: the next round
            if self._live.broken is None:
                data = self._live.take((sid, frame) for sid, frame, _ in batch)
                if data and await self._failing(self._write, data) and self._on_round is not None:
                    self._on_round(sum(1 for _, frame, _ in batch if frame))
            for _, _, future in batch:
                if future is not None:
                    _settle(future, self._live.broken)
            if self._live.rewrite_due():  # the round's waiters heard first
                await self._failing(self._rewrite)

    async def _failing(self, write: Callable[..., None], *args: object) -> bool:
        """`write(*args)` in a thread; False (the journal broken) when it raised."""
        try:
            await asyncio.to_thread(write, *args)
        except Exception as exc:  # not only OSError: a bug here must fail the waiters, not hang them
            failure = exc if isinstance(exc, OSError) else OSError(f"journal writer failed: {exc!r}")
            log.error("journal %s: write failed, appending nothing more: %s", self.path, failure)
            self._live.failed(failure)
            return False
        return True

    def _write(self, data: bytes) -> None:
        _write_all(self._fd, data)
        os.fdatasync(self._fd)

    def _rewrite(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, self._live.rewritten())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = fd
        self._live.rewrote()
        log.info("journal %s rewritten: %d live bytes", self.path, self._live.size)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)  # os.write may write less than it is given
    while view:
        view = view[os.write(fd, view):]


def _settle(future: asyncio.Future[None], error: OSError | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
