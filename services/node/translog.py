"""The transfer log: `<data_dir>/<node_id>.log.jsonl`, the node's source of truth.

One JSON object per line, every record `{"node", "lsn", "kind", ...}`; lsn is
1, 2, 3, ... in the order events were applied to the core at this node. Kinds:

    init        {balance}                          first record of a new log, once
    restart     {}                                 a node restarted on this log
    send        {msg_id, src, dst, seq, amount}    before the transfer leaves
    recv        {msg_id, src, dst, seq, amount}    before it is acknowledged
    cut         {snapshot_id, balance}             where the core recorded its local state
    marker_sent {snapshot_id, src, dst, seq}
    marker_recv {snapshot_id, src, dst, seq}
    abort       {snapshot_id, reason}

Group commit: `append_*` only encodes the record into an in-memory buffer and
returns its lsn, so the caller applies an event and logs it in one synchronous
step (log order == apply order). One flusher task writes the whole buffer with
one write + fdatasync per round; `durable_lsn` says how far the disk holds, and
`wait_durable(lsn)` is what every acknowledgement awaits.

A failed write or fdatasync fails the log for good: the file may now end in a
torn line, and after a failed fdatasync the kernel may have dropped the dirty
pages while marking them clean, so a retry could "succeed" without the data
(retrying fsync is not safe). Nothing more is written, by the flusher or by
`flush_sync`/`close` on the way down; every `wait_durable` raises
`LogFailedError`; the flusher task ends with the error, which stops the node.
The file then holds a prefix of the records (at worst a torn last line, which
recovery cuts off), so a restart recovers from it cleanly.

Records are encoded by hand from precomputed JSON fragments: this is the
per-message hot path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

KINDS = frozenset({"init", "restart", "send", "recv", "cut", "marker_sent", "marker_recv", "abort"})


def _js(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


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
    ) -> None:
        self.path = path
        self.node_id = node_id
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lsn = last_lsn  # last lsn handed out
        self.durable_lsn = last_lsn  # last lsn on disk
        self._buffer: list[str] = []
        self._prefix = '{"node":' + _js(node_id) + ',"lsn":'
        self._on_durable = on_durable
        self._observe_fsync = observe_fsync
        self._pending = asyncio.Event()
        self._round: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self._closing = False
        self.failure: OSError | None = None  # the failed write or fdatasync; the log is dead
        # JSON fragments per channel, built on first use: ',"src":"p1","dst":"p2","msg_id":"p1:p2:'
        self._fragments: dict[tuple[str, str], tuple[str, str]] = {}

    # ------------------------------------------------------------ appending

    @property
    def last_lsn(self) -> int:
        return self._lsn

    def _append(self, body: str) -> int:
        self._lsn += 1
        if self.failure is not None:
            return self._lsn  # never written; whoever waits for it gets LogFailedError
        self._buffer.append(f"{self._prefix}{self._lsn},{body}}}\n")
        self._pending.set()
        return self._lsn

    def _channel(self, src: str, dst: str) -> tuple[str, str]:
        frag = self._fragments.get((src, dst))
        if frag is None:
            ends = f',"src":{_js(src)},"dst":{_js(dst)}'
            frag = (ends + ',"msg_id":' + _js(f"{src}:{dst}:")[:-1], ends)
            self._fragments[(src, dst)] = frag
        return frag

    def append_init(self, balance: int) -> int:
        return self._append(f'"kind":"init","balance":{int(balance)}')

    def append_restart(self) -> int:
        return self._append('"kind":"restart"')

    def append_send(self, src: str, dst: str, seq: int, amount: int) -> int:
        """msg_id is `src:dst:seq`."""
        with_id, _ = self._channel(src, dst)
        return self._append(f'"kind":"send"{with_id}{seq}","seq":{seq},"amount":{amount}')

    def append_recv(self, src: str, dst: str, seq: int, msg_id: str, amount: int) -> int:
        with_id, ends = self._channel(src, dst)
        if msg_id == f"{src}:{dst}:{seq}":
            return self._append(f'"kind":"recv"{with_id}{seq}","seq":{seq},"amount":{amount}')
        return self._append(f'"kind":"recv"{ends},"msg_id":{_js(msg_id)},"seq":{seq},"amount":{amount}')

    def append_cut(self, snapshot_id: str, balance: int) -> int:
        return self._append(f'"kind":"cut","snapshot_id":{_js(snapshot_id)},"balance":{balance}')

    def append_marker(self, kind: str, snapshot_id: str, src: str, dst: str, seq: int) -> int:
        assert kind in ("marker_sent", "marker_recv")
        _, ends = self._channel(src, dst)
        return self._append(f'"kind":"{kind}","snapshot_id":{_js(snapshot_id)}{ends},"seq":{seq}')

    def append_abort(self, snapshot_id: str, reason: str) -> int:
        return self._append(f'"kind":"abort","snapshot_id":{_js(snapshot_id)},"reason":{_js(reason)}')

    # ------------------------------------------------------------ durability

    def start(self) -> None:
        """Start the flusher task (needs a running loop)."""
        self._flusher = asyncio.get_running_loop().create_task(self._flush_forever(), name=f"translog-{self.node_id}")

    async def wait_durable(self, lsn: int) -> None:
        """Return once every record up to `lsn` is on disk."""
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

    async def _flush_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            await self._pending.wait()
            await self._flush_once(loop)

    async def _flush_once(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending.clear()
        if not self._buffer:
            return
        data = "".join(self._buffer).encode()
        self._buffer = []
        upto = self._lsn
        started = time.perf_counter()
        # The write and the fsync run off the loop, so the node keeps applying
        # (into the next buffer) while the disk works.
        try:
            await loop.run_in_executor(None, _write_all_and_sync, self._fd, data)
        except OSError as exc:
            self._fail(exc)
            raise
        if self._observe_fsync is not None:
            self._observe_fsync(time.perf_counter() - started, len(data))
        self.durable_lsn = upto
        # Wake everyone waiting, including those who came during the write;
        # each re-checks its own lsn and waits for the next round if needed.
        waiters, self._round = self._round, None
        if waiters is not None and not waiters.done():
            waiters.set_result(None)
        if self._on_durable is not None:
            self._on_durable(upto)

    def _fail(self, exc: OSError) -> None:
        """No more writes, ever; wake every waiter so it sees the failure."""
        self.failure = exc
        self._buffer = []
        log.error("%s: write or fdatasync failed (%s); writing nothing more after lsn %d", self.path, exc,
                  self.durable_lsn)
        waiters, self._round = self._round, None
        if waiters is not None and not waiters.done():
            waiters.set_result(None)

    def flush_sync(self) -> None:
        """Write and sync whatever is buffered, blocking (start-up and shutdown).
        Writes nothing once the log failed; raises OSError if this write fails."""
        if self.failure is not None:
            return
        if self._buffer:
            try:
                _write_all_and_sync(self._fd, "".join(self._buffer).encode())
            except OSError as exc:
                self._fail(exc)
                raise
            self._buffer = []
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


def _write_all_and_sync(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fdatasync(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
