"""Reports finished snapshots to the controller (`Controller.ReportState`).

The node machine hands a finished part out once (`keep`, at its Finished
effect) and says when everything it rests on is durable (`send`, at its
Report effect). Then, in the background, one task per snapshot calls the
controller, retrying with backoff until it succeeds, the controller says it
will never accept it, or the snapshot is aborted. The controller answers a report
that does not complete its snapshot only at the snapshot's end (its machine's
held.py H1-H4: one log round per snapshot), so a call may wait up to the
snapshot's deadline (`held_s`) on top of its own timeout; a call that times out
all the same is sent again and joins the held ones. The channel path never waits for any of this. A state too
large for one gRPC message goes by `ReportStateChunks` (see snapmesh.protocol.chunking).

A finished part survives a crash. A small one (the node's way: its machine's
`log_reports`, `keep(in_log=True)`) is a `report` record of the transfer log right
before the marker_recv it rests on, filled in by `logged`: the round's one
fdatasync makes both durable, no file, no syncfs; a seal carries it into the next
checkpoint until the controller has it (`carried`), and a restart reads it back
(loggedreports.py; docs/transfer-log.md). Otherwise (a large state, whose blocks
stay on this path) `keep` has the FullState written to
`<data_dir>/<node_id>.reports/` (`PendingReports`, renamed into place) by the
transfer log, as work carried out before the records buffered with it
(`TransferLog.before_records`): the log round that writes the record that
completed the snapshot (the last `marker_recv`) first writes the file, on
that round's path, unsynced, then its records, and makes both durable with
one sync (a syncfs of the data directory's file system; translog.py); a large
state's file is synced by its save, before the records, with no syncfs (below). The
report's path pays that one sync, where it paid three one after another (the
file, its directory, the log). The file is written before that record is,
so a process that dies anywhere keeps the file whenever it keeps the record;
both are durable before that marker is acknowledged (it can never be resent)
and before the report is sent. A machine that loses power during that one
sync may keep the record and lose the file (or keep its name, not its
bytes: `load` drops such a file with a warning): the part is lost, nothing
wrong is shown, and the controller aborts that snapshot at its deadline. A
save that fails is logged and the state is reported all the same, only not
crash-safe; it never fails the log. The file goes once the controller
accepted the state, refused it for good, or the snapshot was aborted (an
abort's removal also goes through the log, so it follows the save). A restarted node reports what it finds there
(`resume`), except a state resting on records that never reached the log: the
snapshot then runs again here when its markers are resent.

A state of more than reportblocks.INLINE_BYTES is saved as blocks, each once
(services/node/reportblocks.py RK1-RK6): the file holds its manifest and carries
the blocks not durable on disk yet (those that changed: snapmesh/protocol/savedblocks.py
SV1-SV3), hashed only where they changed. The save makes that one file durable itself
(its fdatasync, its directory's fsync) before the round writes the records, and returns
nothing for the round to sync: the round's own fdatasync follows, and no syncfs waits
for the other processes' writes. The blocks go to their directory after the report
is sent (`_collect`, off its path).

The blocks a report carries (all of them at a first report of a large state) are
kept apart from its message, as the state's own blocks (`_formed`), and streamed
after its encoding (chunking.stream_state `carried`): in the message, each would
be a copy, the whole state's at a first report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
from pathlib import Path
import time

import grpc

from snapmesh.services.node.channels import backoff_delay
from snapmesh.services.node.hops import ReportHops
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.pendingreports import PendingReports
from snapmesh.services.node.reportblocks import INLINE_BYTES
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.services.node.translog import TransferLog
from snapmesh.protocol import blocks, chunking, manifestdelta, wal
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node import core
from snapmesh.protocol.reports import report_message
from snapmesh.settings import security
from snapmesh.serving import credentials
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 5.0
# A chunked report gets this much more per chunk (about 1 MiB each).
REPORT_TIMEOUT_PER_CHUNK_S = 1.0
# A state up to this size is cut into blocks and hashed on the event loop (tens of
# microseconds), not in a thread: the hand-off would be a hop on the report's path.
INLINE_FORM_BYTES = 64 * 1024
# A report up to this size (its encoding, channels' recorded messages included) is a record of the
# log (wal.Report): larger, it would make the log's round and a restart's read pay for it; it is a file.
LOG_REPORT_BYTES = 64 * 1024
# The controller refused for good (unknown or already finished snapshot): retrying cannot help.
_FINAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def full_state_message(state: core.FullState, node_id: str, cut_at_ns: int = 0) -> pb.FullState:
    """Built when the last marker is in (stamped now); `cut_at_ns` is the local
    cut's wall-clock time (0: unknown). Both feed the controller's statistics."""
    return report_message(state, cut_at_ns=cut_at_ns, done_at_ns=time.time_ns())


def _with_state(message: pb.FullState, state: bytes | BlockState) -> pb.FullState:
    """A copy of `message` with its state set (a small one: the copy costs little)."""
    out = pb.FullState()
    out.CopyFrom(message)
    out.state = _joined(state)
    return out


def _joined(state: bytes | BlockState) -> bytes:
    """`state` as bytes: a state the cut kept as its blocks (apphost.H8) is joined where it
    goes whole (blockstate.BST3), never before."""
    return bytes(state) if type(state) is BlockState else state


class StateReporter:
    def __init__(
        self,
        *,
        address: str,
        log_: TransferLog,
        metrics: NodeMetrics,
        options: list,
        pending: PendingReports | None = None,
        identity: security.Identity | None = None,  # None: plaintext
        held_s: float = 0.0,  # how long the controller may hold a report (its snapshot deadline): added to the timeout
    ) -> None:
        self._identity = identity
        self._held_s = held_s
        self._address = address
        self._log = log_
        self._metrics = metrics
        self._options = options
        self._channel: grpc.aio.Channel | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._collecting: asyncio.Future[int] | None = None  # the saves' blocks being deleted or written (`_collect`)
        self._rng = random.Random()
        self._pending = pending
        self._kept: dict[str, tuple[pb.FullState, int]] = {}  # finished, not yet durable: sent at `send`
        # A kept report's state not set in its message (`keep`), until the report is done with:
        # set in it only if it is sent whole (`form`), never for a large state sent as blocks.
        self._aside: dict[str, bytes | BlockState] = {}  # a BlockState: the cut's parts, never joined (apphost.H8)
        # A small report kept in the log (wal.Report, loggedreports.py): snapshot id -> its record's
        # fullstate, until the controller has it; a seal carries these into its checkpoint (`carried`).
        self._logged: dict[str, str] = {}
        self._hops = ReportHops(metrics)  # the path after the cut, timed (services/node/hops.py)
        # what of the state the controller holds: a report sends only the rest
        self._blocks = SentBlocks(chunking.WRITE_WINDOW_BYTES)

    def keep(self, message: pb.FullState, lsn: int, state: bytes | BlockState | None = None, named: blocks.Named | None = None,
             *, in_log: bool = False) -> None:
        """Keep `message` until `send`, and for a report after a crash. Call it in
        the same synchronous step that logged the records the state rests on (up
        to `lsn`): the log writes the file before any of them that is still buffered.
        `state`: the app's state when `message` was made without it (reports.py
        `with_state`): setting it, and reading it back, would each copy it whole. `named`:
        the state's blocks as the node's cut named them (cutnames.py), for its save. `in_log`: a
        `report` record follows (`logged`): a small state goes in it, with no file and no sync of its own."""
        self._kept[message.snapshot_id] = (message, lsn)
        self._hops.finished(message)
        saved = message
        if state is not None and not message.HasField("state"):
            self._aside[message.snapshot_id] = state
            if len(state) <= INLINE_BYTES:  # its file holds the state (a small one: the copy costs little)
                saved = _with_state(message, state)
        if in_log and len(state if state is not None else message.state) <= INLINE_BYTES and \
                saved.ByteSize() <= LOG_REPORT_BYTES:
            self._logged[message.snapshot_id] = wal.pack(saved.SerializeToString())
        elif self._pending is not None:
            if state is None:
                state = message.state if message.HasField("state") else b""  # read once: each read is a copy
            save = functools.partial(self._save, saved, lsn, state, named)
            self._log.before_records(save, len(state) + 1024)  # its size picks the round's path (translog.py)

    def logged(self, record: wal.Report) -> wal.Report:
        """The `report` record with the part `keep` kept in it ("": a large state's, in its file)."""
        return dataclasses.replace(record, fullstate=self._logged.get(record.snapshot_id, ""))

    def carried(self, checkpoint: wal.Checkpoint) -> wal.Checkpoint:
        """A seal's checkpoint with the logged reports the controller has not taken yet."""
        return dataclasses.replace(checkpoint, reports=dict(self._logged)) if self._logged else checkpoint

    def _save(self, message: pb.FullState, lsn: int, state: bytes | BlockState, named: blocks.Named | None = None) -> list[Path]:
        """Run by the log's round (on the event loop or its worker thread); the
        files it wrote, which the round syncs with its records. The report is
        not sent before the round is durable, so nothing changes it meanwhile."""
        assert self._pending is not None
        try:
            return self._pending.save_unsynced(message, lsn, state, named)
        except OSError as exc:  # reported all the same, only not crash-safe
            log.error("snapshot %s: cannot keep the state for a report after a crash: %s", message.snapshot_id, exc)
            return []

    def send(self, snapshot_id: str) -> None:
        """Report the state kept for `snapshot_id`: the node says it is durable."""
        self._hops.durable(snapshot_id)
        self._start(*self._kept.pop(snapshot_id))
        self._collect()

    def _collect(self) -> None:
        """The saves' unused blocks deleted in a thread, off the log's round (reportblocks.py
        RK2), and the blocks its file carried written there (RK1, SV2), one collection at a time:
        one under way leaves the rest to the next report."""
        pending = self._pending
        if pending is None or not pending.blocks.unsettled:
            return
        if self._collecting is not None and not self._collecting.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test's direct call): at once
            pending.blocks.collect()
            return
        self._collecting = loop.run_in_executor(None, pending.blocks.collect)

    def resume(self, found: list[tuple[pb.FullState, int]], last_lsn: int,
               logged: list[tuple[pb.FullState, int, str]] | None = None) -> None:
        """After a restart: report the pending states whose records are all in the
        recovered log (the others rest on records a crash took back); `logged`: the
        log's own (loggedreports.py), with their records' fullstate."""
        files = {message.snapshot_id for message, _ in found}
        for message, lsn, text in logged or ():
            if lsn <= last_lsn and message.snapshot_id not in files:
                log.info("snapshot %s: reporting the state finished before the restart (from the log)",
                         message.snapshot_id)
                self._logged[message.snapshot_id] = text
                self._start(message, lsn)
        for message, lsn in found:
            if lsn <= last_lsn:
                log.info("snapshot %s: reporting the state finished before the restart", message.snapshot_id)
                self._start(message, lsn)
            else:
                log.info("snapshot %s: the state finished before the crash rests on lsn %d, the log ends at %d; "
                         "dropping it", message.snapshot_id, lsn, last_lsn)
                self._forget(message.snapshot_id)

    def _forget(self, snapshot_id: str) -> None:
        self._aside.pop(snapshot_id, None)
        if self._logged.pop(snapshot_id, None) is not None:
            return  # no file: the next seal leaves it out of the log
        if self._pending is not None:
            try:
                self._pending.remove(snapshot_id)
            except OSError as exc:
                log.warning("snapshot %s: cannot remove its pending report: %s", snapshot_id, exc)

    def _start(self, message: pb.FullState, lsn: int) -> None:
        if self._channel is None:
            self._channel = credentials.open_channel(self._address, self._identity, options=self._options, aio=True)
        sid = message.snapshot_id
        task = asyncio.get_running_loop().create_task(self._report(message, lsn), name=f"report {sid}")
        self._tasks[sid] = task
        task.add_done_callback(lambda t, sid=sid: self._tasks.get(sid) is t and self._tasks.pop(sid))

    def cancel(self, snapshot_id: str) -> None:
        self._kept.pop(snapshot_id, None)
        self._aside.pop(snapshot_id, None)
        self._hops.forget(snapshot_id)
        task = self._tasks.pop(snapshot_id, None)
        if task is not None:
            task.cancel()
        if self._pending is None or snapshot_id in self._logged:  # a logged one: its abort record drops it
            self._forget(snapshot_id)
            return
        if self._log.failure is None:  # after its save, which may still be queued in the log
            self._log.before_records(functools.partial(self._forget, snapshot_id))
        else:  # no round runs any more, so no save can follow
            self._forget(snapshot_id)

    async def _report(self, message: pb.FullState, lsn: int) -> None:
        # No wait for the log here: the node sends (and `resume` keeps) only states durable up to `lsn`.
        assert self._channel is not None
        stub = pb_grpc.ControllerStub(self._channel)
        attempt, refused = 0, False
        sent, names, carried, extra = await self._formed(message)
        while True:
            try:
                left_at = self._hops.leaving(sent)
                # its size read once an attempt: upb's ByteSize encodes the message (the manifest of
                # 8192 hashes at 64 MiB); read three times it cost more than sending it
                encoded = sent.ByteSize()
                if carried or encoded > chunking.CHUNK_BYTES:
                    chunks = chunking.chunks_of(encoded + extra)  # made as they go (stream_state): never whole
                    timeout = REPORT_TIMEOUT_S + self._held_s + REPORT_TIMEOUT_PER_CHUNK_S * chunks
                    answer = await stub.ReportStateChunks(chunking.stream_state(sent, carried=carried), timeout=timeout)
                else:
                    answer = await stub.ReportState(sent, timeout=REPORT_TIMEOUT_S + self._held_s)
                self._hops.answered(left_at)
                self._blocks.accepted(answer, names, message.snapshot_id)
                size = encoded + extra
                self._metrics.report_bytes.inc(size)
                log.info("snapshot %s: reported state to the controller (%d bytes)", message.snapshot_id, size)
                self._forget(message.snapshot_id)
                return
            except grpc.aio.AioRpcError as exc:
                if not refused and sent is not message and exc.code() == grpc.StatusCode.FAILED_PRECONDITION and \
                        self._blocks.refused(exc.details() or ""):  # a block it lacks: whole now
                    log.info("snapshot %s: %s; sending it whole", message.snapshot_id, exc.details())
                    # formed again with nothing held (whole, or every block carried); a base refused
                    # (manifestdelta.py MD3) with its full manifest, which may be refused in turn
                    refused = not (exc.details() or "").startswith(manifestdelta.MISSING_BASE)
                    sent, names, carried, extra = await self._formed(message)
                    continue
                self._metrics.report_failures.inc()
                if exc.code() in _FINAL_CODES:
                    log.warning(
                        "snapshot %s: the controller refused the state (%s: %s); not retrying",
                        message.snapshot_id,
                        exc.code().name,
                        exc.details(),
                    )
                    self._forget(message.snapshot_id)
                    return
                delay = backoff_delay(attempt, self._rng)
                log.warning(
                    "snapshot %s: ReportState failed (%s); retrying in %.2fs",
                    message.snapshot_id,
                    exc.code().name,
                    delay,
                )
            await asyncio.sleep(delay)
            attempt += 1

    async def _formed(self, message: pb.FullState) -> tuple[pb.FullState, set[bytes], list[bytes], int]:
        """`form`, its carried blocks apart from the message (a protobuf holds a copy of each:
        at a first report, of the whole state) and the bytes they add to its encoding; those
        of a report within one chunk put in it (it goes unary)."""
        carried: list[bytes] = []
        sent, names = await self.form(message, carried)
        extra = chunking.carried_bytes(carried)
        if carried and not chunking.needs_chunks(sent, extra=extra):
            sent.blocks.extend(carried)
            carried, extra = [], 0
        return sent, names, carried, extra

    async def form(self, message: pb.FullState, carried: list[bytes] | None = None) -> tuple[pb.FullState, set[bytes]]:
        """What to send for `message` (SentBlocks.form): a state up to INLINE_FORM_BYTES is
        hashed on the loop (microseconds; a thread hand-off would cost more, on the
        report's path), a larger one in a thread. `carried`: SentBlocks.form's."""
        # SentBlocks keeps its state's blocks: a restore may come as blocks (heldblocks.py); set
        # before forming, so the state sent whole after a refusal says so too
        message.holds_blocks = True
        # its save cut and named the state already (reportblocks.py RK4): named once
        named = self._pending.named.pop(message.snapshot_id, None) if self._pending is not None else None
        state = self._aside.get(message.snapshot_id)
        if state is not None and not message.HasField("state") and (named is None or not self._blocks.carries(named)):
            message.state = _joined(state)  # it may go whole (or be cut here): in the message after all (a copy)
        if named is None and len(message.state) <= INLINE_FORM_BYTES:
            return self._blocks.form(message, None, carried)
        return await asyncio.to_thread(self._blocks.form, message, named, carried)

    @property
    def blocks(self) -> SentBlocks:
        return self._blocks

    @property
    def pending_blocks(self) -> Path | None:
        """Where a large pending report's blocks are written (reportblocks.py; None: no pending reports)."""
        return None if self._pending is None else self._pending.blocks.directory

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._collecting is not None:  # its deletes finished: no unlink after the node stopped
            await asyncio.gather(self._collecting, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
