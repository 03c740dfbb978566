"""The transfer log on disk: `<data_dir>/<node_id>.log.jsonl`, the node's source of truth.

The record format (kinds, fields, encoding) is `snapmesh.protocol.wal`'s; this module
is the file side: group commit, fsync, and sealing segments.

Group commit: `append_*` only encodes the record into an in-memory buffer and
returns its lsn, so the caller applies an event and logs it in one synchronous
step (log order == apply order). One flusher task writes the whole buffer with
one write + fdatasync per round; `durable_lsn` says how far the disk holds, and
`wait_durable(lsn)` is what every acknowledgement awaits.

Who joins a round (Postgres' commit_siblings rule): the flusher wakes on
the first record buffered after a round and takes every record buffered by
then. It waits longer only when it pays:
- while a writer is known to be pending (`writer_pending()`: a client batch
  that handed the loop back between its steps and appends again on its next
  turn), it yields the loop once so that writer's records join this round;
- while the log is concurrent (a round among the last few had two or more
  callers in `wait_durable`, i.e. clients' calls), it waits for as many
  callers as the busiest of those rounds had, while they keep coming, unless
  it holds a snapshot's record (services/node/commitgather.py holds the rule
  and its figures).
  Concurrent unary calls reach the loop one at a time, each a few hundred
  microseconds of gRPC's work apart, so a round that starts on the first
  record holds one or two of them (64 concurrent unary callers made one
  fsync per 1-2 commands).
Otherwise it flushes at once: a lone caller (a client alone, a snapshot's
hop, a channel's frame at low load) never waits for company. Waiting never
lets anything out early: `durable_lsn` and `on_durable` move only after the
round's write and fdatasync, and every ack, frame and answer waits for them.

Where a round syncs (`sync_inline`): a small round (at most
INLINE_SYNC_MAX_BYTES) on a disk whose last sync was fast, while the log is
not concurrent, is written and synced on the event loop itself; a large round,
a round while the log is concurrent, or any round while the disk is slow, on a
worker thread. Every hop of a snapshot (a marker, an ack, a report)
waits for one round, and at low load a round is a few records. Handing those to
a thread costs a thread wake-up and two GIL hand-offs, which on a busy machine
took ~20 ms against a 0.3 ms fdatasync, and more CPU than the sync. A large
round comes at high load, where the node should go on applying while the disk
works; a slow disk must never stall the loop for long. Concurrent callers
come at high load too, even when each round is small: a sync on the loop
blocks it, so the calls in flight cannot reach the log meanwhile; on a
thread, the next round fills while this one syncs.

Work that must reach the disk with records (`before_records(action, nbytes)`):
the action joins the round that writes the records buffered now, and that
round carries it out first, before writing any of them, on the path the round
takes (`sync_inline`, its bytes counted with the records'), so it costs no
thread hand-off of its own. An action may return files it wrote without
syncing them (`serving.durable.write_unsynced`); the round then makes them and
its records durable with one sync (`durable.sync_with_log`: one syncfs of the
data directory's file system, or, where there is none, each file's fsync, its
directory's, then the log's fdatasync) instead of the log's fdatasync alone.
A pending-report file that is not a record of the log is one (a large state's syncs
its own file before the records are written and returns none: savedblocks.py SV1; a
small state's report is a record of the log itself, wal.Report: the fdatasync alone;
services/node/reporter.py). Actions run
in the order given, each at most once; one that raises is logged and the round
goes on: it never fails the log. A round with actions and no records is a
round too. After the log failed none runs (no record after them will be
written either).

Segments: `seal(first_lsn, checkpoint)` queues a seal behind what is buffered.
`active_bytes` is the active segment's size, what is on disk and what is
buffered (counted in characters as encoded: the same as bytes but for a
non-ASCII id); `appended_bytes` the same without the checkpoint that opened
it. The engine tells the node machine the latter, which seals past
`segment_bytes` (machine.py N7), so a segment is bounded by bytes as well as
records. The checkpoint is left out of the count because it is as large as
the state it carries: counted, a checkpoint larger than `segment_bytes`
would seal the segment at every step, writing the state again each time.
The flusher writes and syncs the records before it, writes the checkpoint to
`<active>.next` and syncs it, renames the active file to its sealed name
`<node>.log.<first lsn, 12 digits>.jsonl`, renames `.next` to the active name
and syncs the directory. A crash anywhere in between is finished or undone by
recovery (`snapmesh.services.node.recovery.finish_interrupted_seal`).

A failed write or fdatasync fails the log for good: the file may now end in a
torn line, and after a failed fdatasync the kernel may have dropped the dirty
pages while marking them clean, so a retry could "succeed" without the data
(retrying fsync is not safe). Nothing more is written, by the flusher or by
`flush_sync`/`close` on the way down; every `wait_durable` raises
`LogFailedError`; the flusher task ends with the error, which stops the node.
The file then holds a prefix of the records (at worst a torn last line, which
recovery cuts off), so a restart recovers from it cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from snapmesh.services.node.commitgather import CommitGather
from snapmesh.services.node.logpieces import Text as _Text
from snapmesh.services.node.logpieces import chunks as _chunks, line as _line, pieces as _pieces, size as _size
from snapmesh.services.node.logpieces import write_all as _write_all
from snapmesh.services.node.recovery import next_path
from snapmesh.protocol import wal
from snapmesh.serving.durable import fsync_dir, sync_with_log

log = logging.getLogger(__name__)

INLINE_SYNC_MAX_BYTES = 8192  # ~80 records: at most this many bytes per round are synced on the loop
INLINE_SYNC_MAX_S = 0.002  # ... and only while the last sync took at most this long

# A snapshot's records: their round waits for no caller (commitgather.py).
_HURRIED = frozenset({wal.Cut, wal.MarkerSent, wal.MarkerRecv, wal.Abort})


def sync_inline(nbytes: int, last_sync_s: float, concurrent: bool = False) -> bool:
    """Whether a round of `nbytes` is written and synced on the event loop (see the module doc);
    `concurrent`: callers have been waiting for rounds together."""
    return nbytes <= INLINE_SYNC_MAX_BYTES and last_sync_s <= INLINE_SYNC_MAX_S and not concurrent


@dataclass(frozen=True, slots=True)
class _Action:
    run: Callable[[], Sequence[Path] | None]  # the files it wrote unsynced, for the round's sync
    nbytes: int  # what it writes, for the round's path (sync_inline)


@dataclass(frozen=True, slots=True)
class _Seal:
    sealed: Path  # the name the active segment gets
    checkpoint: str | wal.Line  # the first line of the next segment


class LogClosedError(RuntimeError):
    """The log was closed (the node is stopping); nothing more becomes durable."""


class LogFailedError(LogClosedError):
    """A write or fdatasync failed: nothing after `durable_lsn` will ever be written."""


class TransferLog:
    """Append-only, group-committed. Drive it from one event loop."""

    def __init__(
        self,
        path: Path,
        node_id: str,
        *,
        last_lsn: int,
        on_durable: Callable[[int], None] | None = None,
        observe_fsync: Callable[[float, int], None] | None = None,
        observe_round: Callable[[int], None] | None = None,  # records each round made durable
    ) -> None:
        self.path = path
        self.node_id = node_id
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lsn = last_lsn  # last lsn handed out
        self.active_bytes = os.fstat(self._fd).st_size  # the active segment, buffered records included
        self._head = _first_line_bytes(path) if self.active_bytes else 0  # its opening checkpoint (or init)
        self.durable_lsn = last_lsn  # last lsn on disk
        self._buffer: list[str | wal.Line | _Seal] = []
        self._before: list[_Action] = []  # carried out by the next round before it writes the buffer
        self._encoder = wal.Encoder(node_id)
        self._lines = self._encoder.lines
        self._on_durable = on_durable
        self._observe_fsync = observe_fsync
        self._observe_round = observe_round
        self._siblings = 0  # writers known to append on their next loop turn (writer_pending)
        self._callers = CommitGather()  # who the next round waits for (concurrent callers)
        self._gathered: asyncio.Event | None = None  # set once the round has every caller it waits for, or is hurried
        self._pending = asyncio.Event()
        self._last_sync_s = 0.0  # how long the last round's write + fdatasync took
        # ... and the last round's that made files durable with its records (sync_with_log: a
        # syncfs, which writes back the whole file system: 5.6 ms median against the fdatasync's
        # 1.3 on one node of the hosts bench); each kind of round is placed by its own last time.
        self._last_files_sync_s = 0.0
        self._round: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self._closing = False
        self.failure: OSError | None = None  # the failed write or fdatasync; the log is dead

    # ------------------------------------------------------------ appending

    @property
    def last_lsn(self) -> int:
        return self._lsn

    @property
    def appended_bytes(self) -> int:
        """The active segment's bytes after its opening checkpoint (what `segment_bytes` bounds)."""
        return self.active_bytes - self._head

    def _add(self, line: str | wal.Line | _Seal) -> int:
        if self.failure is not None:
            return self._lsn  # never written; whoever waits for it gets LogFailedError
        self._buffer.append(line)
        self._pending.set()
        return self._lsn

    def append_record(self, record: wal.Record) -> int:
        """Append `record` (its lsn must be the next one)."""
        lsn = record.lsn
        if lsn != self._lsn + 1:
            raise ValueError(f"{self.path}: record lsn {lsn}, expected {self._lsn + 1}")
        self._lsn = lsn
        line_of = self._lines.get(type(record))  # Encoder.record, inline: ~3 records a command
        if line_of is not None:
            line = line_of(record)
        else:
            line = _line(wal.encode(record, self.node_id, lazy=True))
            if not self.active_bytes:  # a fresh log's init: it opens the segment as a checkpoint does, with the
                self._head = len(line)  # app's state; counted, a state over segment_bytes sealed at the first step
            if type(record) in _HURRIED:
                self._hurry()
        self.active_bytes += len(line)
        if self.failure is None:  # _add, inline (the per-record path)
            self._buffer.append(line)
            if not self._pending.is_set():
                self._pending.set()
        return lsn

    def seal(self, first_lsn: int, checkpoint: wal.Checkpoint) -> int:
        """Close the active segment (it began at `first_lsn`) and open the next with `checkpoint`."""
        if checkpoint.lsn != self._lsn + 1:
            raise ValueError(f"{self.path}: checkpoint lsn {checkpoint.lsn}, expected {self._lsn + 1}")
        self._lsn = checkpoint.lsn
        sealed = self.path.with_name(wal.sealed_name(self.node_id, first_lsn))
        line = _line(wal.encode(checkpoint, self.node_id, lazy=True))
        self.active_bytes = self._head = len(line)  # the next segment holds the checkpoint only
        return self._add(_Seal(sealed, line))

    def before_records(self, action: Callable[[], Sequence[Path] | None], nbytes: int = 0) -> None:
        """Carry out `action` in the next round, before it writes any record
        buffered now or later (see the module doc); `nbytes`: what it writes.
        The files it returns (written unsynced) the round makes durable with its records."""
        if self.failure is not None:
            return
        self._hurry()  # a report's save: a snapshot's hop (commitgather.py)
        self._before.append(_Action(action, nbytes))
        self._pending.set()

    def _hurry(self) -> None:
        """The next round holds a snapshot's hop: it waits for nobody, and one already waiting
        for callers (`_gather`) goes now. Told only the flag, a waiting round asked again when
        its timer ran out: up to CommitGather's MAX_S (20 ms) added to the hop."""
        self._callers.hurry()
        if self._gathered is not None:
            self._gathered.set()

    # ------------------------------------------------------------ durability

    def start(self) -> None:
        """Start the flusher task (needs a running loop)."""
        self._flusher = asyncio.get_running_loop().create_task(self._flush_forever(), name=f"translog-{self.node_id}")

    async def wait_durable(self, lsn: int) -> None:
        """Return once every record up to `lsn` is on disk."""
        if self.durable_lsn < lsn:  # a caller of the next round: counted once, however many rounds it waits
            if self._callers.caller(time.monotonic()) and self._gathered is not None:
                self._gathered.set()
        while self.durable_lsn < lsn:
            if self.failure is not None:
                raise LogFailedError(
                    f"{self.path}: a write failed ({self.failure}); nothing after lsn {self.durable_lsn} is written"
                )
            if self._closed:
                raise LogClosedError(f"{self.path} is closed")
            if self._round is None:
                self._round = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._round)

    @contextlib.contextmanager
    def writer_pending(self) -> Iterator[None]:
        """Around a writer's await that ends in more appends (one loop turn):
        a round that starts meanwhile yields the loop once so they join it."""
        self._siblings += 1
        try:
            yield
        finally:
            self._siblings -= 1

    async def _flush_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            await self._pending.wait()
            if self._siblings:  # a sibling writer is on its way: one loop turn, and its records join
                await asyncio.sleep(0)
            if not self._closing and self._callers.wait_s(time.monotonic(), time.monotonic()) is not None:
                await self._gather()
            await self._flush_once(loop)

    async def _gather(self) -> None:
        """Wait while the round's callers keep coming (CommitGather decides how long)."""
        started = time.monotonic()
        self._gathered = asyncio.Event()
        try:
            while (wait := self._callers.wait_s(time.monotonic(), started)) is not None and not self._closing:
                try:
                    await asyncio.wait_for(self._gathered.wait(), wait)
                except asyncio.TimeoutError:
                    pass  # asked again: a caller may have come meanwhile, or the round goes
        finally:
            self._gathered = None

    async def _flush_once(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending.clear()
        if not self._buffer and not self._before:
            return
        items, self._buffer = self._buffer, []
        before, self._before = self._before, []
        upto = self._lsn
        self._callers.round_started()
        # A large round syncs off the loop, so the node keeps applying (into the
        # next buffer) while the disk works; a small one on it (sync_inline).
        try:
            for data, seal in _chunks(items):
                nbytes = _size(data) + sum(a.nbytes for a in before)
                if data or before:
                    started = time.perf_counter()
                    last_s = self._last_files_sync_s if before else self._last_sync_s
                    if sync_inline(nbytes, last_s, self._callers.concurrent):
                        took = self._write_round(before, data)
                    else:
                        took = await loop.run_in_executor(None, self._write_round, before, data)
                    if took[2]:
                        self._last_files_sync_s = took[1]
                    elif data:
                        self._last_sync_s = took[1]
                    if data:
                        if self._observe_fsync is not None:
                            self._observe_fsync(time.perf_counter() - started - took[0], _size(data))
                    before = []
                if seal is not None:
                    await loop.run_in_executor(None, self._seal_files, seal)
        except OSError as exc:
            self._fail(exc)
            raise
        if self._observe_round is not None and upto > self.durable_lsn:
            self._observe_round(upto - self.durable_lsn)
        self.durable_lsn = upto
        # Wake everyone waiting, including those who came during the write;
        # each re-checks its own lsn and waits for the next round if needed.
        waiters, self._round = self._round, None
        if waiters is not None and not waiters.done():
            waiters.set_result(None)
        if self._on_durable is not None:
            self._on_durable(upto)

    def _write_round(self, before: list[_Action], data: _Text) -> tuple[float, float, bool]:
        """The actions, then `data` appended and synced; returns the seconds each took, and
        whether the sync took files with the records (sync_with_log)."""
        started = time.perf_counter()
        unsynced: list[Path] = []
        for action in before:
            try:
                unsynced += action.run() or ()
            except Exception:  # an action never fails the log (see the module doc)
                log.exception("%s: work queued before lsn %d failed; the log goes on", self.path, self.durable_lsn + 1)
        actions_s = time.perf_counter() - started
        if not unsynced:
            return actions_s, (_write_all_and_sync(self._fd, data) if data else 0.0), False
        started = time.perf_counter()
        _write_all(self._fd, data)
        sync_with_log(self._fd, self.path.parent, unsynced)  # the files' and the records' one sync
        return actions_s, time.perf_counter() - started, True

    def _seal_files(self, seal: _Seal) -> None:
        """The active segment is synced: rename it sealed, the next one in (see the module doc)."""
        pending = next_path(self.path)
        fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all_and_sync(fd, _pieces(seal.checkpoint))
        finally:
            os.close(fd)
        os.replace(self.path, seal.sealed)
        os.replace(pending, self.path)
        fsync_dir(self.path.parent)
        old, self._fd = self._fd, os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o644)
        os.close(old)
        log.info("%s: sealed as %s", self.path, seal.sealed.name)

    def _fail(self, exc: OSError) -> None:
        """No more writes, ever; wake every waiter so it sees the failure."""
        self.failure = exc
        self._buffer = []
        self._before = []
        log.error("%s: write or fdatasync failed (%s); writing nothing more after lsn %d", self.path, exc, self.durable_lsn)
        waiters, self._round = self._round, None
        if waiters is not None and not waiters.done():
            waiters.set_result(None)

    def flush_sync(self) -> None:
        """Write and sync whatever is buffered, blocking (start-up and shutdown).
        Writes nothing once the log failed; raises OSError if this write fails."""
        if self.failure is not None:
            return
        if self._buffer or self._before:
            items, self._buffer = self._buffer, []
            before, self._before = self._before, []
            try:
                for data, seal in _chunks(items):
                    if data or before:
                        self._write_round(before, data)
                        before = []
                    if seal is not None:
                        self._seal_files(seal)
            except OSError as exc:
                self._fail(exc)
                raise
        self.durable_lsn = self._lsn
        if self._round is not None and not self._round.done():
            self._round.set_result(None)
            self._round = None

    async def close(self) -> None:
        """Stop the flusher, flush the rest, close the file."""
        if self._closed:
            return
        # Let the flusher finish the round it is in (never cancel a write half
        # way: the next one would race it), then write the rest here.
        self._closing = True
        self._pending.set()
        if self._gathered is not None:  # a round waiting for callers goes now
            self._gathered.set()
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait([self._flusher])
        try:
            self.flush_sync()  # nothing, if the log failed
        finally:
            self._closed = True
            if self._round is not None and not self._round.done():
                self._round.set_result(None)  # waiters wake, see _closed and raise
            os.close(self._fd)

    @property
    def flusher(self) -> asyncio.Task[None] | None:
        return self._flusher


def _first_line_bytes(path: Path) -> int:
    """The length of the file's first line (a restart's active segment: its checkpoint or init)."""
    with open(path, "rb") as file:
        return len(file.readline())


def _write_all_and_sync(fd: int, data: _Text) -> float:
    """Append `data` and fdatasync; returns the seconds it took."""
    started = time.perf_counter()
    _write_all(fd, data)
    os.fdatasync(fd)
    return time.perf_counter() - started
