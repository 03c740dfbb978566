"""The channel glue's own rules, without a network: the sender's state table and
the reconnect backoff."""

from __future__ import annotations

import asyncio
import random

import pytest

from snapmesh.services.node.channels import (
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
