"""Channel streams: glue between gRPC bidi streams and the node machine's links.

Each directed channel i->j is one long-lived `Node.Channel` bidi stream that i
opens on j. Frame 1 is `open{src, dst}`; j answers with its resume point (the
last seq it holds durably), i resends every message after it, then streams
`batch` frames; j applies each batch in order and acks cumulatively once the
batch is on disk. A batch carries an app's messages as payload runs (frames.py,
`encode_frame`) once j's first ack on the stream said it reads them
(`accepts_payload_runs`), as one message each otherwise; a message is its bytes
and nothing else (the packed runs of native numbers that nodes from before apps
sent, ChannelBatch.runs, are neither sent nor read: a node that hosts an app has
always refused them). When the stream breaks, i reconnects with jittered
exponential backoff. Every rule of the channel itself (seq, outbox, resend,
duplicate drop, gaps, connection numbers, flow control) lives in `snapmesh.protocol.node.link`, inside
`snapmesh.protocol.node.machine.Node`; this module only moves frames and reports what the
stream did.

`OutgoingChannel` is the sending side (one task per channel, explicit states);
`IncomingChannel` decides which of several streams for one channel is the live
one (the newest) and numbers them (`conn_no`: not the cluster epoch).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections import deque
from collections.abc import Callable

import grpc

from snapmesh.services.node.frames import add_payload_runs
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.settings import security
from snapmesh.serving import credentials
from snapmesh.protocol.node.core import RemoteProtocolError
from snapmesh.protocol.node.link import Entry
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MAX_BATCH = 500  # messages per frame: batching is where the throughput is
# A write merges the frames queued meanwhile (smart batching), up to these.
MAX_MERGED = 2_000  # messages: the receiver applies a frame in one step, so this bounds its stall (a few ms)
# Bytes of an app's payloads in a frame: a larger pushed frame is cut in frames of at most this
# (one message is at most snapmesh.app.MAX_MESSAGE_BYTES), so every frame fits the peer's
# receive limit (services/node/process.py: receive_limit).
MAX_MERGED_PAYLOAD = 4 * 1024 * 1024
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
    """The stream side of src->dst: keeps one `Node.Channel` stream open to dst
    and writes the frames the node machine hands it (`push`). The channel's
    rules (seq, outbox, acks, resume, bound) are `snapmesh.protocol.node.link.Sender`'s,
    inside the node; this task only tells the node what the stream did:
    `on_open(dst, conn_no, resume)`, `on_ack(dst, conn_no, seq)`, `on_lost(dst)`.
    """

    def __init__(
        self,
        *,
        src: str,
        dst: str,
        address: str,
        metrics: NodeMetrics,
        on_open: Callable[[str, int, int], None],
        on_ack: Callable[[str, int, int], None],
        on_lost: Callable[[str], None],
        rng: random.Random | None = None,
        channel_options: list | None = None,
        identity: security.Identity | None = None,  # None: plaintext
        epoch_of: Callable[[], int] = lambda: 0,  # the node's epoch, sent in `open` (0: not said, read as 1)
    ) -> None:
        self.src = src
        self._epoch_of = epoch_of
        self.dst = dst
        self.address = address
        self._on_open = on_open
        self._on_ack = on_ack
        self._on_lost = on_lost
        self._rng = rng or random.Random()
        self._options = channel_options or []
        self._identity = identity
        self.state = SenderState.IDLE
        self.conn_no = 0  # of the current stream
        self._frames: deque[tuple[int, tuple[Entry, ...]]] = deque()
        self._wake = asyncio.Event()
        self.room = asyncio.Event()  # set when the node says the outbox went below its low mark
        self._task: asyncio.Task[None] | None = None
        self._reconnects = metrics.reconnects(dst)
        self._errors = metrics.stream_errors(dst, "sender")
        self._frames_sent = metrics.frames_sent(dst)

    def _set(self, new: SenderState) -> None:
        if new not in _SENDER_TRANSITIONS[self.state]:
            raise RuntimeError(f"channel {self.src}->{self.dst}: {self.state.value} -> {new.value} is not a transition")
        self.state = new

    def push(self, conn_no: int, entries: tuple[Entry, ...]) -> None:
        """Frames the node wants on the stream of `conn_no` (dropped if that stream is gone)."""
        if self.state is SenderState.CLOSED:
            raise ChannelClosedError(f"channel {self.src}->{self.dst} is closed")
        if conn_no == self.conn_no:
            if _payload_bytes(entries) > MAX_MERGED_PAYLOAD:  # an app's: a frame must fit the peer's receive limit
                self._frames += ((conn_no, part) for part in _split_by_payload(entries))
            else:
                self._frames.append((conn_no, entries))
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

    def restart(self) -> None:
        """The node restored into a new epoch: end the stream of the old one (no
        callback of it reaches the node after this) and open a new stream."""
        if self.state is SenderState.CLOSED or self._task is None:
            return
        old = self._task
        old.cancel()
        self._frames.clear()

        async def again() -> None:
            await asyncio.gather(old, return_exceptions=True)
            self.state = SenderState.IDLE
            await self._run()

        self._task = asyncio.get_running_loop().create_task(again(), name=f"channel {self.src}->{self.dst}")

    async def _run(self) -> None:
        attempt = 0
        async with credentials.open_channel(self.address, self._identity, options=self._options, aio=True) as channel:
            stub = pb_grpc.NodeStub(channel)
            while True:
                self._set(SenderState.CONNECTING)
                try:
                    await self._stream(stub)
                except (
                    grpc.aio.AioRpcError, StreamBrokenError, RemoteProtocolError, asyncio.TimeoutError,
                    asyncio.InvalidStateError,
                ) as exc:
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
                self._on_lost(self.dst)
                self._frames.clear()
                if self.state is SenderState.OPEN:
                    attempt = 0
                self._set(SenderState.BACKOFF)
                await asyncio.sleep(backoff_delay(attempt, self._rng))
                attempt += 1

    async def _stream(self, stub: pb_grpc.NodeStub) -> None:
        """One stream, until it breaks (it always ends by raising)."""
        call = stub.Channel()
        try:
            opening = pb.ChannelOpen(src=self.src, dst=self.dst, epoch=self._epoch_of())
            await call.write(pb.ChannelFrame(open=opening))
            first = await asyncio.wait_for(call.read(), RESUME_TIMEOUT_S)
            if first is grpc.aio.EOF:
                raise StreamBrokenError("the peer closed the stream before its resume point")
            self.conn_no += 1
            self._frames.clear()
            # Resend from the receiver's position; a resume point the sender
            # cannot accept (never sent, or below an earlier ack) raises.
            self._on_open(self.dst, self.conn_no, first.acked_seq)
            self._set(SenderState.OPEN)
            self._reconnects.inc()
            log.info("channel %s->%s open (peer holds seq %d)", self.src, self.dst, first.acked_seq)
            # Payload runs only to a receiver that said on this stream that it reads them:
            # an older one would drop their field without a word.
            reader = asyncio.ensure_future(self._read_acks(call, self.conn_no))
            writer = asyncio.ensure_future(self._write_frames(call, self.conn_no, first.accepts_payload_runs))
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

    async def _read_acks(self, call: grpc.aio.StreamStreamCall, conn_no: int) -> None:
        while True:
            ack = await call.read()
            if ack is grpc.aio.EOF:
                return
            self._on_ack(self.dst, conn_no, ack.acked_seq)

    async def _write_frames(self, call: grpc.aio.StreamStreamCall, conn_no: int, payload_runs: bool = False) -> None:
        """Smart batching, with no timer: whenever the stream takes more (the last
        write returned), everything queued for this connection leaves as ONE frame,
        in the order pushed (markers where they were among the transfers). A frame
        pushed while a write is blocked waits only for that write; a marker goes
        out with whatever is queued before it, at once."""
        while True:
            if not self._frames:
                self._wake.clear()
                await self._wake.wait()
                continue
            entries = self._take(conn_no)
            if not entries:
                continue
            await call.write(encode_frame(entries, payload_runs=payload_runs))
            self._frames_sent.inc()  # frames written: fewer than pushed while writes block

    def _take(self, conn_no: int) -> tuple[Entry, ...]:
        """The queued frames of `conn_no`, merged in order into one (those of
        another connection dropped), up to MAX_MERGED messages or
        MAX_MERGED_PAYLOAD bytes of an app's payloads (a larger one alone)."""
        frames = self._frames
        merged: list[Entry] = []
        payload = 0
        while frames:
            frame_conn_no, entries = frames[0]
            if frame_conn_no != conn_no:
                frames.popleft()
                continue
            if not merged and len(frames) == 1:
                frames.popleft()
                return entries  # the common case when the stream keeps up: the frame as pushed
            size = _payload_bytes(entries)
            if merged and (len(merged) + len(entries) > MAX_MERGED or payload + size > MAX_MERGED_PAYLOAD):
                break
            frames.popleft()
            merged += entries
            payload += size
        return tuple(merged)


def encode_frame(entries: tuple[Entry, ...], *, payload_runs: bool = False) -> pb.ChannelFrame:
    """The `batch` frame of `entries` (in channel order: early markers, then
    seqs ascending): an app's messages in payload runs with `payload_runs`
    (frames.py, markers in `messages`; the receiver merges them back by seq),
    one message each without."""
    frame = pb.ChannelFrame()
    batch = frame.batch
    if payload_runs and add_payload_runs(batch, entries):
        return frame
    add = batch.messages.add
    for entry in entries:
        _add_message(add, entry)
    return frame


def _payload_bytes(entries: tuple[Entry, ...]) -> int:
    """The bytes of an app's payloads in a frame."""
    return sum(len(e.payload) for e in entries if e.payload is not None)


def _split_by_payload(entries: tuple[Entry, ...]) -> list[tuple[Entry, ...]]:
    """`entries` in order, as frames of at most MAX_MERGED_PAYLOAD bytes of payloads (one larger message alone)."""
    parts: list[tuple[Entry, ...]] = []
    part: list[Entry] = []
    size = 0
    for entry in entries:
        grows = len(entry.payload) if entry.payload is not None else 0
        if part and size + grows > MAX_MERGED_PAYLOAD:
            parts.append(tuple(part))
            part, size = [], 0
        part.append(entry)
        size += grows
    return [*parts, tuple(part)] if part else parts


def _add_message(add: Callable[..., pb.ChannelMessage], entry: Entry) -> None:
    if entry.snapshot_id:
        # seq 0: an early marker, the entry's second field its last seq (link L8)
        add(seq=entry.seq, marker=pb.MarkerMessage(snapshot_id=entry.snapshot_id, last_seq=entry[1] if entry.seq == 0 else 0))
    elif entry.payload is not None:  # an app's message: its bytes
        add(seq=entry.seq).transfer.payload = entry.payload
    else:  # pragma: no cover  (every message a node sends is an app's)
        raise ValueError(f"message {entry.seq} has no payload: a channel carries an app's messages only")


class IncomingChannel:
    """The receiving side of src->dst: which of several streams for the channel is
    the live one (the newest), its number (`conn_no`), and its ack writer. A newer stream
    supersedes the older one: the older is told to end (its `ending` future gets
    a reason); the node fences its frames by conn_no (`snapmesh.protocol.node.link`, L6)."""

    def __init__(self, *, src: str, dst: str) -> None:
        self.src = src
        self.dst = dst
        self.conn_no = 0
        self._owner: asyncio.Future[str] | None = None
        self._acks: AckWriter | None = None

    def claim(self) -> asyncio.Future[str]:
        """A new stream takes the channel; returns its `ending` future."""
        ending: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if self._owner is not None and not self._owner.done():
            log.info("channel %s->%s: a new stream supersedes the old one", self.src, self.dst)
            self._owner.set_result("superseded by a newer stream for the same channel")
        self._owner = ending
        self._acks = None
        self.conn_no += 1
        return ending

    def attach(self, acks: AckWriter) -> None:
        """The live stream's ack writer: acks of its connection go there."""
        self._acks = acks

    def post(self, conn_no: int, seq: int) -> None:
        """The node acknowledges `seq` on the stream of `conn_no` (if it is still live)."""
        if conn_no == self.conn_no and self._acks is not None:
            self._acks.post(seq)

    def owned_by(self, ending: asyncio.Future[str]) -> bool:
        return self._owner is ending

    def release(self, ending: asyncio.Future[str]) -> None:
        if self._owner is ending:
            self._owner = None
            self._acks = None

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
    """Writes cumulative acks on one stream; the node posts them only once the
    log holds what they acknowledge, and the newest posted wins (acks coalesce
    while the stream is busy)."""

    def __init__(
        self, context: grpc.aio.ServicerContext, *, accepts_payload_runs: bool = True
    ) -> None:
        self._context = context
        # Said on every ack: the sender reads it from the first. (`accepts_runs`, the native
        # runs', is never said: this node reads none.)
        self._accepts_payload_runs = accepts_payload_runs
        self._posted: int | None = None
        self._event = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def post(self, seq: int) -> None:
        self._posted = seq
        self._event.set()

    async def _run(self) -> None:
        while True:
            await self._event.wait()
            self._event.clear()
            if self._posted is None:
                continue
            seq, self._posted = self._posted, None
            await self._context.write(pb.ChannelAck(acked_seq=seq, accepts_payload_runs=self._accepts_payload_runs))

    @property
    def failed(self) -> bool:
        return self._task.done()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
