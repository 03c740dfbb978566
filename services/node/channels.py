"""Channel streams: the transport under the algorithm, FIFO and lossless across failures.

Each directed channel i->j is one long-lived `Node.Channel` bidi stream that i
opens on j. Frame 1 is `open{src, dst}`; j answers with its resume point (the
last seq it holds durably), i sends every message after it, then streams
`batch` frames; j applies each batch in order, logs it, and acks cumulatively
once the batch is on disk. When the stream breaks, i reconnects with jittered
exponential backoff and resends from the new resume point; j drops duplicates
(seq <= last) and refuses gaps (DATA_LOSS).

`OutgoingChannel` is the sending side (one task per channel, explicit states);
`IncomingChannel` holds the receiving side's position and decides which of
several streams for one channel is the live one (the newest).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random

import grpc

from services.node.metrics import NodeMetrics
from services.node.recovery import OutboxEntry
from services.node.translog import TransferLog
from snapmesh import security
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MAX_BATCH = 500  # messages per frame: batching is where the throughput is
# Flow control. A marker waits behind everything already queued on its channel, so
# a deep outbox is snapshot latency: at saturation 20,000 gave multi-second snapshots
# (some past their deadline), 2,000 keeps them well under a second (bench/cluster.py).
HIGH_WATER = 2_000  # unacknowledged messages above which new transfers wait
LOW_WATER = 1_000  # ... until the outbox is back below this
BACKOFF_FIRST_S = 0.1
BACKOFF_CAP_S = 2.0
RESUME_TIMEOUT_S = 10.0  # a peer that opens the stream but never answers `open`


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Delay before reconnect number `attempt` (0-based): 100 ms doubling to a 2 s
    cap, jittered down to half so restarted peers are not hit in lockstep."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_FIRST_S * (2**attempt))
    return ceiling * rng.uniform(0.5, 1.0)


class ChannelClosedError(RuntimeError):
    """The channel was closed (the node is stopping)."""


class StreamBrokenError(RuntimeError):
    """The stream ended or the peer broke the channel protocol; reconnect."""


# ------------------------------------------------------------------ sending


class SenderState(enum.Enum):
    IDLE = "idle"  # created, not started
    CONNECTING = "connecting"  # stream opened, waiting for the resume point
    OPEN = "open"  # streaming batches, reading acks
    BACKOFF = "backoff"  # the stream broke; waiting to reconnect
    CLOSED = "closed"  # the node is stopping; terminal


_SENDER_TRANSITIONS: dict[SenderState, frozenset[SenderState]] = {
    SenderState.IDLE: frozenset({SenderState.CONNECTING, SenderState.CLOSED}),
    SenderState.CONNECTING: frozenset({SenderState.OPEN, SenderState.BACKOFF, SenderState.CLOSED}),
    SenderState.OPEN: frozenset({SenderState.BACKOFF, SenderState.CLOSED}),
    SenderState.BACKOFF: frozenset({SenderState.CONNECTING, SenderState.CLOSED}),
    SenderState.CLOSED: frozenset(),
}


class OutgoingChannel:
    """The sending side of src->dst: seq allocation, the outbox of unacknowledged
    messages, and the task that keeps a stream open and feeds it.

    Invariants: outbox seqs are contiguous from `acked_seq + 1` to `next_seq - 1`;
    nothing is transmitted before its log record is durable (`lsn <= durable`).
    """

    def __init__(
        self,
        *,
        src: str,
        dst: str,
        address: str,
        log_: TransferLog,
        metrics: NodeMetrics,
        next_seq: int = 1,
        outbox: list[OutboxEntry] = (),  # type: ignore[assignment]
        rng: random.Random | None = None,
        channel_options: list | None = None,
        identity: security.Identity | None = None,  # None: plaintext
    ) -> None:
        self.src = src
        self.dst = dst
        self.address = address
        self._log = log_
        self._rng = rng or random.Random()
        self._options = channel_options or []
        self._identity = identity
        self.state = SenderState.IDLE
        self.next_seq = next_seq
        # Outbox: (seq, lsn, amount, snapshot_id); recovered entries are on disk (lsn 0).
        self._items: list[tuple[int, int, int, str]] = [(e.seq, 0, e.amount, e.snapshot_id) for e in outbox]
        self._head = 0  # index of the first unacknowledged entry
        self.acked_seq = self._items[0][0] - 1 if self._items else next_seq - 1
        self._sent_seq = self.acked_seq  # highest seq written on the current stream
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._msg_prefix = f"{src}:{dst}:"
        self._unacked = metrics.unacked(dst)
        self._reconnects = metrics.reconnects(dst)
        self._resent = metrics.resent(dst)
        self._errors = metrics.stream_errors(dst, "sender")
        self._unacked.set(self.unacked)

    def _set(self, new: SenderState) -> None:
        if new not in _SENDER_TRANSITIONS[self.state]:
            raise RuntimeError(f"channel {self.src}->{self.dst}: {self.state.value} -> {new.value} is not a transition")
        self.state = new

    @property
    def unacked(self) -> int:
        return self.next_seq - 1 - self.acked_seq

    @property
    def over_high_water(self) -> bool:
        return self.next_seq - 1 - self.acked_seq > HIGH_WATER

    async def wait_for_room(self) -> None:
        while self.unacked > LOW_WATER:
            self._room.clear()
            await self._room.wait()

    # -- enqueueing (synchronous, called in the same step that logs the message)

    def enqueue_transfer(self, seq: int, lsn: int, amount: int) -> None:
        if self.state is SenderState.CLOSED:
            raise ChannelClosedError(f"channel {self.src}->{self.dst} is closed")
        assert seq == self.next_seq, (seq, self.next_seq)
        self._items.append((seq, lsn, amount, ""))
        self.next_seq = seq + 1

    def enqueue_marker(self, seq: int, lsn: int, snapshot_id: str) -> None:
        if self.state is SenderState.CLOSED:
            raise ChannelClosedError(f"channel {self.src}->{self.dst} is closed")
        assert seq == self.next_seq, (seq, self.next_seq)
        self._items.append((seq, lsn, 0, snapshot_id))
        self.next_seq = seq + 1

    def durable(self) -> None:
        """The log made more records durable: there may be something to transmit."""
        if self._sent_seq < self.next_seq - 1:
            self._wake.set()

    # -- the stream task

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"channel {self.src}->{self.dst}")

    async def close(self) -> None:
        if self.state is not SenderState.CLOSED:
            self._set(SenderState.CLOSED)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        attempt = 0
        async with security.open_channel(self.address, self._identity, options=self._options, aio=True) as channel:
            stub = pb_grpc.NodeStub(channel)
            while True:
                self._set(SenderState.CONNECTING)
                try:
                    await self._stream(stub)
                except (grpc.aio.AioRpcError, StreamBrokenError, asyncio.TimeoutError, asyncio.InvalidStateError) as exc:
                    # InvalidStateError: a write raced the call's end ("RPC already finished").
                    detail = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                    # The first failure of a streak is news; the retries that follow it are not.
                    log.log(
                        logging.WARNING if attempt == 0 or self.state is SenderState.OPEN else logging.DEBUG,
                        "channel %s->%s broke (%s); reconnecting",
                        self.src,
                        self.dst,
                        detail or type(exc).__name__,
                    )
                except Exception:  # a bug here must not silently end the channel
                    log.exception("channel %s->%s failed; reconnecting", self.src, self.dst)
                self._errors.inc()
                if self.state is SenderState.OPEN:
                    attempt = 0
                self._set(SenderState.BACKOFF)
                await asyncio.sleep(backoff_delay(attempt, self._rng))
                attempt += 1

    async def _stream(self, stub: pb_grpc.NodeStub) -> None:
        """One stream, until it breaks (it always ends by raising)."""
        call = stub.Channel()
        try:
            await call.write(pb.ChannelFrame(open=pb.ChannelOpen(src=self.src, dst=self.dst)))
            first = await asyncio.wait_for(call.read(), RESUME_TIMEOUT_S)
            if first is grpc.aio.EOF:
                raise StreamBrokenError("the peer closed the stream before its resume point")
            resume = first.acked_seq
            if resume > self.next_seq - 1:
                raise StreamBrokenError(f"resume point {resume} is beyond the last seq sent ({self.next_seq - 1})")
            if resume < self.acked_seq:
                # The peer lost what it had acknowledged: the messages are gone from here.
                raise StreamBrokenError(
                    f"DATA LOSS: the peer resumes at {resume} but acknowledged {self.acked_seq} before"
                )
            self._ack(resume)
            resend = self._sent_seq - resume
            if resend > 0:
                self._resent.inc(resend)
            self._sent_seq = resume
            self._set(SenderState.OPEN)
            self._reconnects.inc()
            log.info("channel %s->%s open (peer holds seq %d, %d to send)", self.src, self.dst, resume, self.unacked)
            reader = asyncio.ensure_future(self._read_acks(call))
            writer = asyncio.ensure_future(self._write_batches(call))
            try:
                done, _ = await asyncio.wait((reader, writer), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (reader, writer):
                    task.cancel()
                await asyncio.gather(reader, writer, return_exceptions=True)
            for task in done:
                task.result()  # raises what broke the stream
            raise StreamBrokenError("the peer closed the stream")
        finally:
            call.cancel()

    async def _read_acks(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            ack = await call.read()
            if ack is grpc.aio.EOF:
                return
            if ack.acked_seq > self._sent_seq:
                raise StreamBrokenError(f"ack {ack.acked_seq} for a seq not sent yet (sent up to {self._sent_seq})")
            self._ack(ack.acked_seq)

    def _ack(self, seq: int) -> None:
        if seq <= self.acked_seq:
            return
        self._head += seq - self.acked_seq
        self.acked_seq = seq
        if self.next_seq - 1 - seq <= LOW_WATER:
            self._room.set()
        if self._head > 4096 and self._head * 2 > len(self._items):
            del self._items[: self._head]
            self._head = 0
        self._unacked.set(self.unacked)

    async def _write_batches(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            frame = self._next_frame()
            if frame is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await call.write(frame)

    def _next_frame(self) -> pb.ChannelFrame | None:
        """Up to MAX_BATCH durable messages after the last one sent, as one frame."""
        durable = self._log.durable_lsn
        start = self._head + (self._sent_seq - self.acked_seq)
        items = self._items
        end = min(len(items), start + MAX_BATCH)
        if start >= end or items[start][1] > durable:
            return None
        frame = pb.ChannelFrame()
        add = frame.batch.messages.add
        prefix = self._msg_prefix
        last = self._sent_seq
        for index in range(start, end):
            seq, lsn, amount, snapshot_id = items[index]
            if lsn > durable:
                break
            if snapshot_id:
                add(seq=seq, marker=pb.MarkerMessage(snapshot_id=snapshot_id))
            else:
                add(seq=seq, transfer=pb.TransferMessage(msg_id=f"{prefix}{seq}", amount=amount))
            last = seq
        self._sent_seq = last
        self._unacked.set(self.unacked)
        return frame


# ---------------------------------------------------------------- receiving


class IncomingChannel:
    """The receiving side of src->dst: the last seq applied, and which stream owns
    the channel. A newer stream for the same channel supersedes the older one:
    the older is told to end (its `ending` future gets a reason) and never
    applies another frame."""

    def __init__(self, *, src: str, dst: str, last_seq: int) -> None:
        self.src = src
        self.dst = dst
        self.last_seq = last_seq
        self._owner: asyncio.Future[str] | None = None
        self.duplicates = 0

    def claim(self) -> asyncio.Future[str]:
        """A new stream takes the channel; returns its `ending` future."""
        ending: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if self._owner is not None and not self._owner.done():
            log.info("channel %s->%s: a new stream supersedes the old one", self.src, self.dst)
            self._owner.set_result("superseded by a newer stream for the same channel")
        self._owner = ending
        return ending

    def owned_by(self, ending: asyncio.Future[str]) -> bool:
        return self._owner is ending

    def release(self, ending: asyncio.Future[str]) -> None:
        if self._owner is ending:
            self._owner = None

    def end_stream(self, reason: str) -> None:
        if self._owner is not None and not self._owner.done():
            self._owner.set_result(reason)


async def read_or_end(context: grpc.aio.ServicerContext, ending: asyncio.Future[str]):
    """The next frame, or None once `ending` is set (the read is cancelled)."""
    read = asyncio.ensure_future(context.read())
    await asyncio.wait((read, ending), return_when=asyncio.FIRST_COMPLETED)
    if read.done():
        return read.result()
    read.cancel()
    return None


class AckWriter:
    """Writes cumulative acks on one stream, each only once the log holds it:
    the newest (seq, lsn) posted wins, so acks coalesce while the disk works."""

    def __init__(self, context: grpc.aio.ServicerContext, log_: TransferLog) -> None:
        self._context = context
        self._log = log_
        self._posted: tuple[int, int] | None = None
        self._event = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def post(self, seq: int, lsn: int) -> None:
        self._posted = (seq, lsn)
        self._event.set()

    async def _run(self) -> None:
        while True:
            await self._event.wait()
            self._event.clear()
            if self._posted is None:
                continue
            seq, lsn = self._posted
            self._posted = None
            await self._log.wait_durable(lsn)
            await self._context.write(pb.ChannelAck(acked_seq=seq))

    @property
    def failed(self) -> bool:
        return self._task.done()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

