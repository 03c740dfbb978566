"""The node's one synchronous step: feed the core, log what happened, route the effects.

Every input (a local transfer, a batch from a channel, a snapshot start or
abort) is applied to the `core.Process` and appended to the transfer log in
the same synchronous call, with no await in between, so the log order is the
order the core saw. Effects are drained here and nowhere else:

    MessageSent(transfer)  -> `send` record, into the channel's outbox
    MessageSent(marker)    -> `marker_sent` record, into the channel's outbox
    LocalStateRecorded     -> `cut` record
    ChannelRecorded        -> metrics
    SnapshotCompleted      -> FullState handed to the reporter (sent once durable)
    StaleMarkerDropped     -> a log line

Nothing here awaits: durability is the caller's business (`log.wait_durable`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from services.node.channels import IncomingChannel, OutgoingChannel
from services.node.metrics import NodeMetrics
from services.node.reporter import StateReporter, full_state_message
from services.node.translog import TransferLog
from snapmesh import core

log = logging.getLogger(__name__)


class GapError(Exception):
    """A channel message skipped a seq: something was lost below the algorithm."""


class Engine:
    def __init__(
        self,
        *,
        process: core.Process,
        log_: TransferLog,
        outgoing: dict[str, OutgoingChannel],
        incoming: dict[str, IncomingChannel],
        metrics: NodeMetrics,
        reporter: StateReporter,
        recording_ttl_s: float | None = None,
    ) -> None:
        self.node_id = process.node_id
        self.process = process
        self.log = log_
        self.outgoing = outgoing
        self.incoming = incoming
        self.metrics = metrics
        self.reporter = reporter
        # A recording the controller's abort never reached (this node was cut off
        # then) would wait forever for markers that abandoned peers will not send,
        # recording every transfer on its open channels. Past this age the
        # controller has failed the snapshot anyway, so the node drops it itself.
        self.recording_ttl_s = recording_ttl_s
        self._cut_at_ns: dict[str, int] = {}  # snapshot id -> wall-clock ns of the cut (for stats)
        metrics.balance.set(process.balance)

    # -- local inputs

    def transfer(self, dst: str, amount: int) -> str:
        """Pay `amount` to `dst`; returns the msg_id. Raises core.LocalProtocolError
        (nothing changed) when the core refuses."""
        channel = self.outgoing.get(dst)
        seq = channel.next_seq if channel is not None else 0
        msg_id = f"{self.node_id}:{dst}:{seq}"
        self._drain(self.process.send_transfer(dst=dst, msg_id=msg_id, amount=amount, seq=seq))
        return msg_id

    def transfers_done(self, count: int) -> None:
        """Metrics for `count` accepted transfers, once per RPC instead of per transfer."""
        if count:
            self.metrics.transfers_sent.inc(count)
        self.metrics.balance.set(self.process.balance)

    async def wait_for_room(self, destinations: set[str], timeout: float) -> None:
        """Flow control: wait (at most `timeout`) while an outbox to one of
        `destinations` is over its high-water mark, so a client cannot queue
        transfers faster than the channels deliver them."""
        full = [self.outgoing[d] for d in destinations if self.outgoing[d].over_high_water]
        if full:
            try:
                await asyncio.wait_for(asyncio.gather(*(c.wait_for_room() for c in full)), timeout)
            except asyncio.TimeoutError:
                pass

    def start_snapshot(self, snapshot_id: str) -> None:
        self._drain(self.process.start_snapshot(snapshot_id))

    def abort_snapshot(self, snapshot_id: str, reason: str) -> None:
        effects = self.process.abort_snapshot(snapshot_id)
        self.log.append_abort(snapshot_id, reason)
        self._drain(effects)
        self.reporter.cancel(snapshot_id)
        self._cut_at_ns.pop(snapshot_id, None)

    def _expire(self, snapshot_id: str) -> None:
        if self.process.phase(snapshot_id) is core.Phase.RECORDING:
            reason = f"not finished here within {self.recording_ttl_s:g}s of recording"
            log.warning("snapshot %s: %s; dropping it", snapshot_id, reason)
            self.abort_snapshot(snapshot_id, reason)

    # -- a batch from channel src->this node

    def receive_batch(self, src: str, messages: Iterable) -> int:
        """Apply the messages of one frame in order; returns the channel's last seq.
        Duplicates (seq <= last) are dropped. Raises GapError or
        core.RemoteProtocolError; what was applied before the bad message stays
        applied and logged."""
        rx = self.incoming[src]
        process, log_, me = self.process, self.log, self.node_id
        last = rx.last_seq
        received = 0
        try:
            for message in messages:
                seq = message.seq
                if seq <= last:
                    rx.duplicates += 1
                    continue
                if seq != last + 1:
                    raise GapError(f"channel {src}->{me}: got seq {seq} after {last}")
                body = message.WhichOneof("body")
                if body == "transfer":
                    t = message.transfer
                    effects = process.receive(
                        src=src, message=core.Transfer(msg_id=t.msg_id, amount=t.amount, seq=seq)
                    )
                    log_.append_recv(src, me, seq, t.msg_id, t.amount)
                    received += 1
                elif body == "marker":
                    sid = message.marker.snapshot_id
                    effects = process.receive(src=src, message=core.Marker(snapshot_id=sid))
                    log_.append_marker("marker_recv", sid, src, me, seq)
                    self.metrics.markers_received.inc()
                else:
                    raise core.RemoteProtocolError(f"channel {src}->{me}: message {seq} has no body")
                last = rx.last_seq = seq
                if effects:
                    self._drain(effects)
        finally:
            if received:
                self.metrics.transfers_received.inc(received)
                self.metrics.balance.set(process.balance)
        return last

    # -- effects

    def _drain(self, effects: list[core.Effect]) -> None:
        for effect in effects:
            if isinstance(effect, core.MessageSent):
                channel = self.outgoing[effect.dst]
                seq = channel.next_seq
                message = effect.message
                if isinstance(message, core.Transfer):
                    lsn = self.log.append_send(self.node_id, effect.dst, seq, message.amount)
                    channel.enqueue_transfer(seq, lsn, message.amount)
                else:
                    lsn = self.log.append_marker("marker_sent", message.snapshot_id, self.node_id, effect.dst, seq)
                    channel.enqueue_marker(seq, lsn, message.snapshot_id)
                    self.metrics.markers_sent.inc()
            elif isinstance(effect, core.LocalStateRecorded):
                self.log.append_cut(effect.snapshot_id, effect.balance)
                self._cut_at_ns[effect.snapshot_id] = time.time_ns()
                log.info("snapshot %s: recorded local state (balance %d)", effect.snapshot_id, effect.balance)
                if self.recording_ttl_s is not None:
                    asyncio.get_running_loop().call_later(self.recording_ttl_s, self._expire, effect.snapshot_id)
            elif isinstance(effect, core.ChannelRecorded):
                self.metrics.recorded_messages.inc(len(effect.transfers))
            elif isinstance(effect, core.SnapshotCompleted):
                self.metrics.snapshots_completed.inc()
                log.info("snapshot %s: done here", effect.state.snapshot_id)
                sid = effect.state.snapshot_id
                message = full_state_message(effect.state, self.node_id, self._cut_at_ns.pop(sid, 0))
                self.reporter.submit(message, self.log.last_lsn)
            elif isinstance(effect, core.StaleMarkerDropped):
                log.info("snapshot %s: dropped a marker from %s (snapshot abandoned here)", effect.snapshot_id, effect.src)
            else:  # pragma: no cover  (a new effect type must be routed here)
                raise TypeError(f"unrouted effect {effect!r}")
