"""The shell around the node machine: feed `snapmesh.protocol.node.machine.Node` events, carry out its effects.

Every input (a client command, a frame from a channel, a snapshot start or
abort, the log becoming durable, a timer) is one synchronous call on the
`Node`, followed by draining its effects here and nowhere else:

    Append(record)        -> the transfer log's buffer (group-committed)
    Seal(first, cp)       -> the log seals its segment, cp opens the next;
                             after the effects the node is told the active
                             segment's bytes after its checkpoint
                             (`log_size`: segment_bytes, N7)
    Transmit(dst, ...)    -> that channel's stream
    Ack(src, ...)         -> that channel's live stream
    Finished(state, ...)  -> the reporter keeps it: a small one for the `report`
                             record that follows (Append fills it in), a large
                             one saved by the log ahead of the marker_recv
    Report(sid)           -> the reporter sends what it kept (already durable)
    ReportCancelled(sid)  -> the reporter drops it
    Reply / ReplyBatch    -> the waiting client call's future
    RestoreReply          -> the waiting RestoreState call's future
    EndStreams(...)       -> those outgoing streams reopen, those incoming ones end

Nothing here awaits except flow control and a client's answer: durability is
the log's business, and it calls `durable(lsn)` back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from snapmesh.services.node.channels import IncomingChannel, OutgoingChannel
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.reporter import StateReporter
from snapmesh.services.node.translog import LogClosedError, TransferLog
from snapmesh.protocol.node import core, link
from snapmesh.protocol import wal
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node import effects as fx
from snapmesh.protocol.node.fence import STOPPED, Fence
from snapmesh.protocol.node.machine import Node
from snapmesh.protocol.reports import report_message
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)


class AppMessage(NamedTuple):
    """An app's message of a frame, as the servicer decodes it (snapmesh.app): its bytes."""

    payload: bytes
    msg_id: str = ""


class Engine:
    def __init__(
        self,
        *,
        node: Node,
        log_: TransferLog,
        outgoing: dict[str, OutgoingChannel],
        incoming: dict[str, IncomingChannel],
        metrics: NodeMetrics,
        reporter: StateReporter,
        app_spec: str = "",  # the app's module:attr ("": the default app, named by its own names)
    ) -> None:
        self.node = node
        self.app_spec = app_spec
        self._app_failed: asyncio.Future[str] | None = None
        self._stopped: asyncio.Future[str] | None = None
        self.node_id = node.node_id
        self.fence = Fence(node.node_id, stopped=node.stopped)  # stop with a snapshot (fence.py F1-F5)
        self.log = log_
        self.outgoing = outgoing
        self.incoming = incoming
        self.metrics = metrics
        self.reporter = reporter
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._counted = (0, 0, 0, 0, 0, 0)
        # Gauges of plain numbers are read when scraped, not set on every step: a step is
        # the hot path, a scrape comes every few seconds (the reads are of ints, safe from
        # the metrics server's thread).
        for dst in node.senders:
            metrics.unacked(dst).set_function(lambda dst=dst: self._unacked_now(dst))
        metrics.segment_bytes.set_function(lambda: self.log.active_bytes)  # the checkpoint included: what the disk holds
        metrics.request_window_bytes.set_function(lambda: self.node.request_window_bytes)
        # Called once the node's metrics are brought up to date: an app's extra edge keeps its own
        # series there (extra_edge.py).
        self.metric_hooks: list[Callable[[], None]] = []
        # What a log line says this node holds, when its app's extra edge says it in its own words
        # (extra_edge.py: a v1 adapter keeps the wording operators grep); None: `held`'s.
        self.held_text: Callable[[], str] | None = None
        metrics.epoch.set(node.epoch)
        self._run()

    # -- local inputs

    def submit(
        self, command: bytes, request_id: str = "", first_sent_unix_ms: int = 0
    ) -> tuple[fx.Submitted, asyncio.Future[fx.Reply]]:
        """A client's command to the app: raises core.LocalProtocolError
        (core.AppRefusal when the app refused or raised) and changes nothing then;
        core.AppFailed when the app could not be put back (the node stops)."""
        waiting = asyncio.get_running_loop().create_future()
        try:
            wall = time.time() if request_id else None
            answer = self.node.submit(
                command, request_id, wall=wall, first_sent_unix_ms=first_sent_unix_ms, reply_to=waiting
            )
        except core.AppFailed as exc:
            self.fail_app(str(exc))
            raise
        finally:
            self._run()
        return answer, waiting

    def submit_batch(
        self, items: Iterable[tuple[str, bytes, int]]
    ) -> list[fx.Submitted | core.LocalProtocolError]:
        """A batch's commands (request_id, command, first_sent_unix_ms), in order, as one
        step for the shell (effects carried out once, not per command): each runs through
        the app as `submit` would, and the effects are carried out once for the
        chunk. Each result is the answer or the refusal (nothing changed for it);
        `reply_batch` then waits for the answers together. Raises core.AppFailed
        as `submit` does (the node stops)."""
        wall = time.time()  # one reading for the chunk: the request-id window's clock
        try:
            return self.node.submit_many(items, wall)  # each item as node.submit takes it
        except core.AppFailed as exc:  # as `submit`: the node stops, and the rest of the chunk does not run
            self.fail_app(str(exc))
            raise
        finally:
            self._run()

    def query(self, query: bytes) -> tuple[bytes, int, int]:
        """A client's read of the app (the node's `query`): (reply, lsn, epoch), nothing
        logged; the caller answers once `lsn` is durable. Raises as `submit`."""
        try:
            return self.node.query(query)
        except core.AppFailed as exc:
            self.fail_app(str(exc))
            raise
        finally:
            self._run(metrics=False)

    def reply_batch(self, answers: list[fx.Submitted]) -> asyncio.Future[fx.ReplyBatch]:
        """The future the node's `ReplyBatch` for `answers` (a batch's paid ones) resolves."""
        waiting = asyncio.get_running_loop().create_future()
        self.node.reply_batch(waiting, answers)
        self._run(metrics=False)
        return waiting

    async def replied(self, waiting: asyncio.Future) -> fx.Reply | fx.ReplyBatch | fx.RestoreReply:
        """The node's answer to a call (a client's, a restore), once the log made it durable.
        Raises LogClosedError when the log never will (it failed or closed)."""
        if not waiting.done():
            await self.log.wait_durable(self.log.last_lsn)  # the answer's lsn is at most this
            if not waiting.done():  # durable by a flush that calls nobody back (start-up, close)
                self.durable(self.log.durable_lsn)
        if not waiting.done():  # pragma: no cover  (the node answers every call durable up to durable_lsn)
            raise LogClosedError(f"{self.log.path}: no answer for a call the log holds")
        return waiting.result()

    async def wait_for_room(self, destinations: set[str], timeout: float) -> None:
        """Flow control: wait (at most `timeout`) while a channel to one of
        `destinations` is over its mark, so a client cannot queue messages
        faster than the channels deliver them."""
        full = [self.outgoing[d] for d in destinations if self.node.senders[d].over_mark]
        if full:
            for channel in full:
                channel.room.clear()
            try:
                await asyncio.wait_for(asyncio.gather(*(c.room.wait() for c in full)), timeout)
            except asyncio.TimeoutError:
                pass

    def start_snapshot(self, snapshot_id: str, epoch: int = 0) -> None:
        """Raises EpochFenced (protocol/node/machine.py), changing nothing, when the node refuses `epoch`."""
        self.node.tick(self._now(), time.time())
        try:
            self.node.start_snapshot(snapshot_id, epoch=epoch)
        finally:
            self._run()

    def abort_snapshot(self, snapshot_id: str, reason: str) -> None:
        self.node.abort_snapshot(snapshot_id, reason)
        self.fence.lift(snapshot_id)  # F2: a stop snapshot that failed
        self._run()

    def fence_step(self, snapshot_id: str, step: int, lift_after: float = 0.0) -> None:
        """The Fence call's step (fence.py F1-F3; raises FenceRefused, changing nothing). STOP
        logs the `stop` record; once it is durable the shell sets `stopped`."""
        if step == pb.FenceRequest.FENCE:
            self.fence.close(snapshot_id, now=self._now(), lift_after=lift_after)
        elif step == pb.FenceRequest.LIFT:
            self.fence.lift(snapshot_id)
        elif self.fence.stop(snapshot_id, now=self._now(), quiet=self.node.quiet_since_cut(snapshot_id)):  # F3, F7
            self.node.stop(snapshot_id)
            self._run()

    def refusal(self, rpc: str) -> str:
        """Why the fence refuses `rpc` now ("": it does not; fence.py F1, F4, F6)."""
        return self.fence.refusal(rpc, self._now())

    @property
    def stopped(self) -> asyncio.Future[str]:
        """Set (to the snapshot's id) once the log ends, durably, in a stop snapshot: the node stops."""
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
        return self._stopped

    def takes_blocks(self) -> bool:
        """Whether the hosted app restores from blocks (snapmesh.app A9): a restore as blocks is rebuilt unjoined."""
        return self.node.host.takes_blocks()

    def restore(
        self, snapshot_id: str, epoch: int, in_flight: list[tuple], state: bytes | BlockState | None = None
    ) -> asyncio.Future[fx.RestoreReply]:
        """Restore (node rule N8); the node's `EndStreams` says which streams
        of the older epoch end. Returns the future the node's `RestoreReply`
        resolves (`replied`). `state`: the app's bytes, each in-flight
        (src, msg_id, seq, 0, payload)."""
        waiting = asyncio.get_running_loop().create_future()
        try:
            self.node.restore(
                snapshot_id=snapshot_id, epoch=epoch, in_flight=in_flight, state=state, reply_to=waiting
            )
            self.fence.restored()  # F5
        except core.AppFailed as exc:
            self.fail_app(str(exc))
            raise
        finally:
            self._run()
            self.metrics.epoch.set(self.node.epoch)
        return waiting

    # -- the channels

    def receive_batch(self, src: str, conn_no: int, messages: Iterable[tuple[int, object]]) -> None:
        """Apply the (seq, message) pairs of one frame, decoded by the servicer
        (a core.Marker or an AppMessage; anything else, a native transfer, is a
        protocol violation), in order.
        Duplicates and stale frames are dropped; raises link.GapError or
        core.RemoteProtocolError, and what was applied before the bad message
        stays applied and logged."""
        if self.fence.state == STOPPED:  # F4: the log ends in the stop; the sender keeps them
            return
        node = self.node
        node.tick(self._now(), time.time())
        received = node.received
        try:
            for seq, message in messages:
                if isinstance(message, core.Marker):
                    received(src, conn_no, seq, snapshot_id=message.snapshot_id, last_seq=message.last_seq)
                elif type(message) is AppMessage:
                    received(src, conn_no, seq, payload=message.payload, msg_id=message.msg_id)
                else:  # a native transfer: the node refuses a message without a payload
                    received(src, conn_no, seq, msg_id=message.msg_id)
        except core.AppFailed as exc:
            self.fail_app(str(exc))
            raise
        finally:
            node.end_frame()
            self._run()

    def receive_payload_runs(self, src: str, conn_no: int, runs: Iterable[tuple[int, Iterable[bytes]]]) -> None:
        """Apply the payload runs of one frame with no markers, in order: each
        (first_seq, payloads) is an app's messages first_seq, first_seq + 1, ...
        Exactly `receive_batch` of the same messages, without an object per
        message: the same drops, the same errors, what was applied stays."""
        node = self.node
        node.tick(self._now(), time.time())
        try:
            for first_seq, payloads in runs:
                node.received_payloads(src, conn_no, first_seq, payloads)
        except core.AppFailed as exc:
            self.fail_app(str(exc))
            raise
        finally:
            node.end_frame()
            self._run()

    @property
    def app_failed(self) -> asyncio.Future[str]:
        """Set (to the app's text) when the app raised on a peer's message: the node must stop (process.py)."""
        if self._app_failed is None:
            self._app_failed = asyncio.get_running_loop().create_future()
        return self._app_failed

    def fail_app(self, text: str) -> None:
        if not self.app_failed.done():
            self.app_failed.set_result(text)

    def opened(self, src: str, epoch: int, acks: object = None) -> asyncio.Future[str]:
        """A stream from `src`, opened in `epoch`, takes the channel (its acks go
        to `acks`); returns its `ending` future. Raises EpochFenced (protocol/node/machine.py) when
        the node refuses `epoch`: then nothing changed, the live stream stays."""
        rx = self.incoming[src]
        self.node.opened(src, rx.conn_no + 1, epoch=epoch)  # the number `claim` gives it, just below
        ending = rx.claim()
        rx.attach(acks)  # type: ignore[arg-type]
        self._run()  # the node's answer (the resume point) goes to the new stream
        return ending

    def link_open(self, dst: str, conn_no: int, resume: int) -> None:
        sent_before = self.node.senders[dst].sent  # the highest seq the broken stream carried
        try:
            self.node.connect(dst, conn_no, resume)
        finally:
            self._run()
        if sent_before > resume:
            self.metrics.resent(dst).inc(sent_before - resume)

    def link_ack(self, dst: str, conn_no: int, seq: int) -> None:
        try:
            self.node.acked(dst, conn_no, seq)
        finally:
            self._run()

    def link_lost(self, dst: str) -> None:
        self.node.disconnect(dst)

    def durable(self, lsn: int) -> None:
        self.node.durable(lsn)
        self._run()

    # -- effects

    def _run(self, *, metrics: bool = True) -> None:
        node = self.node
        append, Append, Cut, Abort = self.log.append_record, fx.Append, wal.Cut, wal.Abort  # locals: ~3 records a command
        for effect in node.drain():
            kind = type(effect)
            if kind is Append:
                record = effect.record
                kind = type(record)
                if kind is wal.Report:  # the part its Finished kept, in the record (one fdatasync makes it durable)
                    record = self.reporter.logged(record)
                append(record)
                if kind is Cut:
                    held = self.held(record.digest)
                    log.info("snapshot %s: recorded local state (%s)", record.snapshot_id, held)
                elif kind is Abort:
                    log.warning("snapshot %s: dropped here (%s)", record.snapshot_id, record.reason or "no reason given")
            elif kind is fx.Transmit:
                self.outgoing[effect.dst].push(effect.conn_no, effect.entries)
            elif kind is fx.Ack:
                self.incoming[effect.src].post(effect.conn_no, effect.seq)
            elif kind is fx.Reply or kind is fx.ReplyBatch or kind is fx.RestoreReply:
                if not effect.to.done():  # a client that went away (cancelled) needs no answer
                    effect.to.set_result(effect)
            elif kind is fx.Seal:
                self.log.seal(effect.first_lsn, self.reporter.carried(effect.checkpoint))  # its reports not yet taken
                self.metrics.segments_sealed.inc()
            elif kind is fx.Finished:
                log.info("snapshot %s: done here", effect.state.snapshot_id)
                message = report_message(
                    effect.state, epoch=effect.epoch, cut_at_ns=effect.cut_at_ns, done_at_ns=effect.done_at_ns,
                    digest=effect.digest, with_state=False,
                )
                # The log's next round saves it before writing the records buffered now (the marker_recv).
                # The state's bytes apart: set in the message only if it is sent whole (a copy of the state).
                self.reporter.keep(message, effect.lsn, effect.state.state, effect.state.named, in_log=node.log_reports)
            elif kind is fx.Report:
                self.reporter.send(effect.snapshot_id)
            elif kind is fx.ReportCancelled:
                self.reporter.cancel(effect.snapshot_id)
            elif kind is fx.EndStreams:
                log.warning("%s (%s): ending the older epoch's streams", effect.reason, self.held())
                for dst in effect.outgoing:
                    self.outgoing[dst].restart()
                for src in effect.incoming:
                    self.incoming[src].end_stream(effect.reason)
            else:  # pragma: no cover  (a new effect type must be routed here)
                raise TypeError(f"unrouted effect {effect!r}")
        node.log_size(self.log.appended_bytes)  # what segment_bytes is held to (N7): the next step boundary seals past it
        if metrics:
            self._metrics()
        self._arm_timer()

    def held(self, digest: str = "") -> str:
        """What a log line says this node holds: its app's words for it (`held_text`), else
        its app's state (its digest when known)."""
        if self.held_text is not None:
            return self.held_text()
        return f"app state sha256:{digest[:16]}" if digest else "app state"

    def _metrics(self) -> None:
        node, m = self.node, self.metrics
        counted = (
            node.markers_sent, node.markers_received, node.recorded_messages, node.snapshots_completed,
            node.messages_received, node.messages_sent,
        )
        if counted != self._counted:
            before = self._counted
            m.markers_sent.inc(counted[0] - before[0])
            m.markers_received.inc(counted[1] - before[1])
            m.recorded_messages.inc(counted[2] - before[2])
            m.snapshots_completed.inc(counted[3] - before[3])
            m.messages_received.inc(counted[4] - before[4])
            m.messages_sent.inc(counted[5] - before[5])
            self._counted = counted
        for dst, sender in node.senders.items():
            if sender.unacked <= link.LOW_MARK:
                self.outgoing[dst].room.set()
        for hook in self.metric_hooks:
            hook()

    def _unacked_now(self, dst: str) -> int:
        sender = self.node.senders.get(dst)  # a new epoch's links replace the dict
        return 0 if sender is None else sender.unacked

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _arm_timer(self) -> None:
        at = self.node.next_timer()
        if at is None or at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self.node.tick(self._now(), time.time())
        self._run()
