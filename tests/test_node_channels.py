"""The channel glue's own rules, without a network: the sender's state table and
the reconnect backoff."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from services.node.channels import (
    BACKOFF_CAP_S,
    ChannelClosedError,
    IncomingChannel,
    OutgoingChannel,
    SenderState,
    backoff_delay,
)
from services.node.metrics import NodeMetrics
from services.node.recovery import OutboxEntry
from services.node.translog import TransferLog

pytestmark = pytest.mark.timeout(30)


def test_backoff_doubles_from_100ms_to_a_2s_cap_with_jitter() -> None:
    rng = random.Random(7)
    for attempt in range(12):
        ceiling = min(BACKOFF_CAP_S, 0.1 * 2**attempt)
        delays = [backoff_delay(attempt, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1


def test_sender_states_follow_the_table_and_closed_refuses_messages(tmp_path: Path) -> None:
    async def go() -> None:
        log = TransferLog(tmp_path / "p1.log.jsonl", "p1", last_lsn=0)
        channel = OutgoingChannel(
            src="p1", dst="p2", address="127.0.0.1:1", log_=log, metrics=NodeMetrics("p1"),
            next_seq=4, outbox=[OutboxEntry(seq=2, amount=5, snapshot_id=""), OutboxEntry(seq=3, amount=0, snapshot_id="s")],
        )
        assert channel.state is SenderState.IDLE
        assert channel.acked_seq == 1 and channel.unacked == 2
        with pytest.raises(RuntimeError, match="idle -> open is not a transition"):
            channel._set(SenderState.OPEN)
        channel.enqueue_transfer(4, 1, 9)
        assert channel.next_seq == 5 and channel.unacked == 3
        await channel.close()
        assert channel.state is SenderState.CLOSED
        with pytest.raises(ChannelClosedError):
            channel.enqueue_marker(5, 2, "s2")
        with pytest.raises(RuntimeError, match="closed -> connecting"):
            channel._set(SenderState.CONNECTING)
        await log.close()

    asyncio.run(go())


def test_a_newer_stream_supersedes_the_older_one() -> None:
    async def go() -> None:
        rx = IncomingChannel(src="p2", dst="p1", last_seq=0)
        first = rx.claim()
        second = rx.claim()
        assert first.done() and "superseded" in first.result()
        assert rx.owned_by(second) and not rx.owned_by(first)
        rx.release(first)  # the old stream ending does not release the new one
        assert rx.owned_by(second)
        rx.end_stream("the node is stopping")
        assert second.result() == "the node is stopping"

    asyncio.run(go())
