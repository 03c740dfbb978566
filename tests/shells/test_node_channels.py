"""The channel glue's own rules, without a network: the sender's state table and
the reconnect backoff."""

from __future__ import annotations

import asyncio
import random

import pytest

from snapmesh.services.node.channels import (
    encode_frame,
    BACKOFF_CAP_S,
    ChannelClosedError,
    IncomingChannel,
    OutgoingChannel,
    SenderState,
    backoff_delay,
)
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.protocol.node.link import Entry

pytestmark = pytest.mark.timeout(30)


def test_backoff_doubles_from_100ms_to_a_2s_cap_with_jitter() -> None:
    rng = random.Random(7)
    for attempt in range(12):
        ceiling = min(BACKOFF_CAP_S, 0.1 * 2**attempt)
        delays = [backoff_delay(attempt, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1


def test_sender_states_follow_the_table_and_closed_refuses_frames() -> None:
    async def go() -> None:
        calls: list[tuple] = []
        channel = OutgoingChannel(
            src="p1", dst="p2", address="127.0.0.1:1", metrics=NodeMetrics("p1"),
            on_open=lambda *a: calls.append(("open", *a)), on_ack=lambda *a: calls.append(("ack", *a)),
            on_lost=lambda *a: calls.append(("lost", *a)),
        )
        assert channel.state is SenderState.IDLE
        with pytest.raises(RuntimeError, match="idle -> open is not a transition"):
            channel._set(SenderState.OPEN)
        channel.push(0, (Entry(1, 5, ""),))  # the current stream's frames are queued
        channel.push(7, (Entry(2, 5, ""),))  # another stream's are dropped
        assert len(channel._frames) == 1
        await channel.close()
        assert channel.state is SenderState.CLOSED
        with pytest.raises(ChannelClosedError):
            channel.push(0, (Entry(3, 0, "s2"),))
        with pytest.raises(RuntimeError, match="closed -> connecting"):
            channel._set(SenderState.CONNECTING)
        assert calls == []

    asyncio.run(go())


def test_a_newer_stream_supersedes_the_older_one() -> None:
    async def go() -> None:
        rx = IncomingChannel(src="p2", dst="p1")
        first = rx.claim()
        second = rx.claim()
        assert rx.conn_no == 2  # each stream is a new connection; the node fences older ones
        assert first.done() and "superseded" in first.result()
        assert rx.owned_by(second) and not rx.owned_by(first)
        rx.release(first)  # the old stream ending does not release the new one
        assert rx.owned_by(second)
        rx.end_stream("the node is stopping")
        assert second.result() == "the node is stopping"

    asyncio.run(go())


# ------------------------------------------------------------ smart batching


class _BlockingCall:
    """A stream whose writes block until the test lets each one through."""

    def __init__(self) -> None:
        self.frames: list = []
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()

    async def write(self, frame) -> None:
        self.frames.append(frame)
        self.writing.set()
        await self.gate.wait()
        self.gate.clear()


def _channel() -> OutgoingChannel:
    return OutgoingChannel(
        src="p1", dst="p2", address="127.0.0.1:1", metrics=NodeMetrics("p1"),
        on_open=lambda *a: None, on_ack=lambda *a: None, on_lost=lambda *a: None,
    )


def _decoded(frame) -> list[tuple]:
    """A written frame in its wire order: (seq, the number its payload says) or (seq, "marker", id, last_seq)."""
    from snapmesh.services.node.servicer import _decode, _decode_merged

    batch = frame.batch
    out: list[tuple] = []
    for seq, body in _decode_merged("p1", "p2", batch) if batch.payload_runs else _decode("p1", "p2", batch.messages):
        if hasattr(body, "snapshot_id"):
            out.append((seq, "marker", body.snapshot_id, body.last_seq))
        else:
            out.append((seq, int(body.payload)))
    return out


async def _written_while_blocked(channel: OutgoingChannel, conn_no: int, first, later, *, payload_runs: bool = True) -> list:
    """Push `first`, let the writer block on it, push `later` (conn_no, entries)
    pairs, then let every write through; returns the frames written."""
    call = _BlockingCall()
    channel.push(conn_no, first)
    writer = asyncio.ensure_future(channel._write_frames(call, conn_no, payload_runs))  # type: ignore[arg-type]
    await call.writing.wait()
    for frame_conn_no, entries in later:
        if frame_conn_no == channel.conn_no:
            channel.push(frame_conn_no, entries)
        else:  # a frame left over from an older stream
            channel._frames.append((frame_conn_no, entries))
            channel._wake.set()
    while channel._frames or len(call.frames) < 2:
        call.gate.set()
        await asyncio.sleep(0)
    call.gate.set()
    await asyncio.sleep(0)
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    return call.frames


def _t(*seqs: int) -> tuple[Entry, ...]:
    """An app's messages at `seqs`, each's payload 10 x its seq."""
    return tuple(Entry(s, 0, "", 0, b"%d" % (10 * s)) for s in seqs)


def test_pushes_while_a_write_is_blocked_leave_as_one_frame_in_order() -> None:
    async def go() -> None:
        channel = _channel()
        frames = await _written_while_blocked(channel, 0, _t(1, 2), [(0, _t(3, 4)), (0, _t(5)), (0, _t(6, 7, 8))])
        assert len(frames) == 2
        assert _decoded(frames[0]) == [(1, 10), (2, 20)]
        assert _decoded(frames[1]) == [(s, 10 * s) for s in range(3, 9)]
        assert len(frames[1].batch.payload_runs) == 1 and not frames[1].batch.messages  # still one packed run
        assert channel._frames_sent._value.get() == 2  # frames written, not frames pushed

    asyncio.run(go())


def test_a_stale_connections_frames_are_not_merged_in() -> None:
    async def go() -> None:
        channel = _channel()
        channel.conn_no = 3
        frames = await _written_while_blocked(
            channel, 3, _t(1), [(3, _t(2)), (2, _t(90, 91)), (3, _t(3)), (2, _t(92))]
        )
        assert [_decoded(f) for f in frames] == [[(1, 10)], [(2, 20), (3, 30)]]

    asyncio.run(go())


def test_markers_keep_their_place_among_the_merged_transfers() -> None:
    async def go() -> None:
        for payload_runs in (True, False):
            channel = _channel()
            classic = Entry(4, 0, "s1")  # a FIFO marker: a seq of its own
            early = Entry(0, 6, "s2")  # an overtaking marker: seq 0, its last seq in the second field
            frames = await _written_while_blocked(
                channel, 0, _t(1), [(0, _t(2, 3)), (0, (classic,) + _t(5, 6)), (0, (early,) + _t(7)), (0, _t(8))],
                payload_runs=payload_runs,
            )
            assert len(frames) == 2
            assert _decoded(frames[1]) == [
                (2, 20), (3, 30), (4, "marker", "s1", 0), (5, 50), (6, 60), (0, "marker", "s2", 6), (7, 70), (8, 80),
            ]

    asyncio.run(go())


def test_a_frame_alone_in_the_queue_is_written_as_pushed() -> None:
    async def go() -> None:
        channel = _channel()
        call = _BlockingCall()
        call.gate.set()
        entries = (Entry(0, 3, "s1"),) + _t(4, 5)
        channel.push(0, entries)
        assert channel._take(0) is entries
        assert not channel._frames and call.frames == []

    asyncio.run(go())


# ------------------------------------------- receive-side marker priority


class _Recorder:
    """An engine that only notes what `_receive` hands it, in order."""

    def __init__(self) -> None:
        self.applied: list[tuple] = []

    def receive_batch(self, src, conn_no, messages) -> None:
        for seq, body in messages:
            self.applied.append((seq, "marker", body.snapshot_id) if hasattr(body, "snapshot_id") else (seq,))

    def receive_payload_runs(self, src, conn_no, runs) -> None:
        for first, payloads in runs:
            self.applied += [(seq,) for seq in range(first, first + len(list(payloads)))]


def _applied(entries: tuple[Entry, ...], *, runs: bool) -> list[tuple]:
    from snapmesh.services.node.servicer import _receive

    engine = _Recorder()
    _receive(engine, "p1", "p2", 1, encode_frame(entries, payload_runs=runs).batch)  # type: ignore[arg-type]
    return engine.applied


def test_an_early_marker_behind_transfers_in_a_frame_is_applied_first_a_fifo_marker_in_its_place() -> None:
    early, fifo = Entry(0, 3, "s2"), Entry(4, 0, "s1")
    merged = _t(1, 2, 3) + (fifo,) + _t(5) + (early,) + _t(6)  # a merged frame: the early copy behind transfers
    for runs in (True, False):
        assert _applied(merged, runs=runs) == [
            (0, "marker", "s2"), (1,), (2,), (3,), (4, "marker", "s1"), (5,), (6,),
        ]
        # A frame as the outbox gives it (early markers first) and a classic one are applied as sent.
        assert _applied((early,) + _t(1, 2), runs=runs) == [(0, "marker", "s2"), (1,), (2,)]
        assert _applied(_t(1, 2, 3) + (fifo,) + _t(5), runs=runs) == [(1,), (2,), (3,), (4, "marker", "s1"), (5,)]


def test_a_merged_frame_stops_at_max_merged_messages_and_the_rest_follows() -> None:
    from snapmesh.services.node.channels import MAX_MERGED

    async def go() -> None:
        channel = _channel()
        size = MAX_MERGED // 4
        later = [(0, _t(*range(2 + i * size, 2 + (i + 1) * size))) for i in range(5)]
        frames = await _written_while_blocked(channel, 0, _t(1), later)
        assert [len(f.batch.payload_runs[0].lengths) for f in frames] == [1, MAX_MERGED, size]
        assert [f.batch.payload_runs[0].first_seq for f in frames] == [1, 2, 2 + MAX_MERGED]

    asyncio.run(go())
