"""The controller's journal file: what it must not forget in a crash, made durable cheaply.

`<data_dir>/controller/journal`, append-only, one framed record per fact. Which
records there are, when each must be durable and how they are encoded is
`snapmesh.protocol.controller.journal`'s (pure); this module holds the file.

The full snapshot file is written later, in the background
(`store.StoreWriter`); once it is, `forget` marks the snapshot's records dead,
and the file is rewritten with only the live ones when it has grown past
`ROTATE_BYTES` and is mostly dead (which frames are live and when to rewrite:
`LiveFrames`, pure).

The journal's own thread writes (never the event loop's shared executor, where
a report's block writes and reads queue: a round never waits behind them). The
queue is taken on the loop, one loop turn after the first append of a round
(`call_soon`), and appends are made by synchronous code on the loop, so a step's
records (a completing report's and the outcome, all one `carry_out` appends)
always share one fdatasync: a step costs one log round, never two. Every append
queued while a round is in the thread goes into the next round (group commit).
The thread hands the round back to the loop with one `call_soon_threadsafe`,
and that one callback settles the round's futures and then calls the
`listen`ers (the engine's steps go on there: the effects a record held back are
carried out in the very loop turn that learned it durable, with no task to wake).
A rewrite runs after the round's waiters have heard, so it is never on their
path. It first calls `before_rewrite` (the block store's `settle`,
blockdir.py D8): a record it drops may be what made the blocks it carries
durable. `on_round` hears how many records each round made durable (the
controller's metrics). A torn or corrupt frame (a crash mid-write) ends the
journal: reading stops there and the file is cut back to the last good frame.
After a failed write or fdatasync nothing more is written (retrying fsync is
not safe): every later append fails with the same error (`LiveFrames.failed`,
pure).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from snapmesh.protocol.controller import journalchanges
from snapmesh.protocol.controller.journal import LiveFrames, Record, decode_all, encode
from snapmesh.serving.durable import fsync_dir

log = logging.getLogger(__name__)

ROTATE_BYTES = 32 * 1024 * 1024


# ------------------------------------------------------------------ the file


class Journal:
    """The journal file and its one writer thread. `append`, `forget` and `listen` are
    called on the event loop; futures resolve there once the bytes are on disk."""

    def __init__(self, path: Path, *, rotate_bytes: int = ROTATE_BYTES,
                 on_round: Callable[[int], None] | None = None,
                 before_rewrite: Callable[[], object] | None = None) -> None:
        self.path = Path(path)
        self._fd = -1
        self._live = LiveFrames(rotate_bytes)  # which frames matter, when to rewrite (pure)
        self._queue: list[tuple[str, bytes | None, asyncio.Future[None] | None]] = []  # LiveFrames.take's, and who waits
        self._thread: ThreadPoolExecutor | None = None  # one worker: the journal's alone
        self._busy = False  # a round or a rewrite is in the thread; what is queued meanwhile waits for it
        self._taking = False  # a `_take` is due on the loop
        self._idle = asyncio.Event()  # nothing queued, nothing in the thread (`close` waits for it)
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_round = on_round  # a round's records, once durable (a rewrite's own syncs are not a round)
        self._listeners: list[Callable[[], None]] = []  # called on the loop once a round's futures are settled
        self._before_rewrite = before_rewrite  # in the thread, before a rewrite drops dead records

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
        whole, gone = journalchanges.expanded(records)  # changes with their full manifests, before any reader (JC2)
        self._live.read(data[:good], records, whole)  # a change record written whole at a rewrite (JC3)
        warnings.extend(gone.values())
        self._loop = asyncio.get_running_loop()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="controller-journal")
        return journalchanges.kept(whole, gone), warnings

    def listen(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on the loop right after each round's futures are settled (in
        the same callback: whatever waits for a record can go on without a loop turn)."""
        self._listeners.append(listener)

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
        self._idle.clear()
        if not self._busy and not self._taking and self._thread is not None:
            self._taking = True  # after this loop turn: the rest of the step's appends join the round
            self._loop.call_soon(self._take)
        return future  # type: ignore[return-value]

    async def close(self) -> None:
        """What is queued is written, then the thread ends and the file is closed."""
        try:
            if self._thread is not None:
                if self._queue and not self._busy and not self._taking:
                    self._take()
                while not self._idle.is_set():
                    await self._idle.wait()
                self._thread.shutdown(wait=True)
        finally:
            self._thread = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # -- the writer: the queue taken on the loop, written and synced in the thread

    def _take(self) -> None:
        self._taking = False
        if self._busy:
            return  # the round in the thread takes the queue when it is back
        if not self._queue:
            self._idle.set()
            return
        batch, self._queue = self._queue, []  # appends from now on: the next round
        data = b""
        if self._live.broken is None:
            data = self._live.take((sid, frame) for sid, frame, _ in batch)
        if not data:  # forgets and barriers only, or broken: nothing to write
            self._round_back(batch, None)
            return
        self._in_thread(self._write, (data,), lambda error: self._round_back(batch, error, wrote=True))

    def _in_thread(self, write: Callable[..., None], args: tuple, back: Callable[[BaseException | None], None]) -> None:
        """`write(*args)` in the journal's thread; `back(error)` on the loop, called from the thread."""
        self._busy = True
        loop = self._loop
        assert loop is not None and self._thread is not None

        def done(ran: Future[None]) -> None:
            try:
                loop.call_soon_threadsafe(back, ran.exception())
            except RuntimeError:  # pragma: no cover  (the loop closed first: at exit)
                pass

        self._thread.submit(write, *args).add_done_callback(done)

    def _round_back(self, batch: list, error: BaseException | None, *, wrote: bool = False) -> None:
        """On the loop: a round is durable (or failed). Its waiters hear, then the listeners, in this one call."""
        self._busy = False
        if error is not None:
            self._failed(error)
        elif wrote and self._on_round is not None:
            self._on_round(sum(1 for _, frame, _ in batch if frame))
        for _, _, future in batch:
            if future is not None:
                _settle(future, self._live.broken)
        for listener in self._listeners:
            listener()
        if self._live.broken is None and self._live.rewrite_due():  # the round's waiters heard first
            self._in_thread(self._rewrite, (), self._rewritten)
        else:
            self._take()

    def _rewritten(self, error: BaseException | None) -> None:
        self._busy = False
        if error is not None:
            self._failed(error)
        self._take()

    def _failed(self, exc: BaseException) -> None:
        # not only OSError: a bug here must fail the waiters, not hang them
        failure = exc if isinstance(exc, OSError) else OSError(f"journal writer failed: {exc!r}")
        log.error("journal %s: write failed, appending nothing more: %s", self.path, failure)
        self._live.failed(failure)

    def _write(self, data: bytes) -> None:
        _write_all(self._fd, data)
        os.fdatasync(self._fd)

    def _rewrite(self) -> None:
        if self._before_rewrite is not None:  # what the dead records alone made durable (blockdir.py D8)
            self._before_rewrite()
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
