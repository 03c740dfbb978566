"""The bounded fan-out behind WatchSnapshots (snapmesh/serving/fanout.py): every reader gets
every update in order; one that falls `limit` behind is dropped with FellBehind in place of
what it had not read; `end` ends every stream; leaving a reader unsubscribes it."""

from __future__ import annotations

import asyncio

import pytest

from snapmesh.serving.fanout import FanOut, FellBehind


async def _read(reader) -> list:
    return [update async for update in reader]


def test_every_reader_gets_every_update_until_the_end() -> None:
    async def run() -> None:
        fanout: FanOut[int] = FanOut(4, "reader")
        first, second = fanout.subscribe(), fanout.subscribe()
        for update in (1, 2, 3):
            fanout.publish(update)
        fanout.end()
        assert await _read(first) == await _read(second) == [1, 2, 3]

    asyncio.run(run())


def test_a_reader_that_falls_behind_is_dropped_and_the_others_are_not(caplog) -> None:
    async def run() -> None:
        fanout: FanOut[int] = FanOut(2, "slow reader")
        slow, fast = fanout.subscribe(), fanout.subscribe()
        fanout.publish(1)
        assert await fast.__anext__() == 1
        fanout.publish(2)
        fanout.publish(3)  # the slow one has 2 waiting: dropped
        assert len(fanout) == 1
        with pytest.raises(FellBehind, match="fell 2 updates behind"):
            await slow.__anext__()
        assert [await fast.__anext__(), await fast.__anext__()] == [2, 3]

    asyncio.run(run())
    assert "a slow reader fell 2 updates behind: dropped" in caplog.text


def test_leaving_a_reader_unsubscribes_it() -> None:
    async def run() -> None:
        fanout: FanOut[int] = FanOut(2, "reader")
        with fanout.subscribe():
            assert len(fanout) == 1
        assert len(fanout) == 0
        fanout.publish(1)  # no reader: nothing queued anywhere

    asyncio.run(run())
