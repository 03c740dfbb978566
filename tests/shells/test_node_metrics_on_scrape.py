"""A node's gauges are read when scraped, not set on every step (services/node/engine.py,
snapmesh/bank/edge.py), through the node's servicer (in-process engine, a real transfer log).

- A step takes no snapshot() of the app: the bank's balance gauge used to take one per
  step (and move the app's undo base); the loop publishes the bank's number after each
  step, and a scrape (the metrics server's thread) reads that, never the app.
- What a scrape shows is still the node's state now: the balance, the messages the
  channel holds unacknowledged, the active segment's bytes, the request-id window's bytes.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from support.engine_harness import ServicerContext, held_node, outcome

from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.timeout(60)


async def _steps_then_scrape(tmp_path: Path) -> None:
    engine, log, servicer = await held_node(tmp_path)  # the bank app, initial_balance 100, its v1 edge
    host = engine.node.host
    snapshots: list[int] = []
    real = host.snapshot
    host.snapshot = lambda: (snapshots.append(1), real())[1]  # type: ignore[method-assign]
    sample = engine.metrics.registry.get_sample_value
    try:
        for amount in (10, 20, 30):
            task = asyncio.ensure_future(servicer.Transfer(
                pb.TransferRequest(to="p2", amount=amount, request_id=f"order-{amount}"), ServicerContext()))
            await asyncio.sleep(0.01)
            log.flush_sync()
            answer = await outcome(task)
            assert answer.balance == 100 - sum(range(10, amount + 1, 10)), answer
        assert snapshots == [], f"{len(snapshots)} snapshot() of the app for 3 transfers' steps"
        assert sample("snapmesh_balance", {"node": "p1"}) == 40
        # The channel to p2 never opened: the three transfers wait unacknowledged.
        assert sample("snapmesh_channel_unacked_messages", {"node": "p1", "peer": "p2"}) == 3
        assert sample("snapmesh_log_active_segment_bytes", {"node": "p1"}) == log.active_bytes > 0
        assert sample("snapmesh_request_window_bytes", {"node": "p1"}) == engine.node.request_window_bytes > 0
        assert sample("snapmesh_transfers_received_total", {"node": "p1"}) == 0
    finally:
        await log.close()


def test_steps_take_no_app_snapshot_and_a_scrape_reads_the_state_now(tmp_path: Path) -> None:
    asyncio.run(_steps_then_scrape(tmp_path))


async def _scraped_off_the_loop(tmp_path: Path) -> None:
    engine, log, servicer = await held_node(tmp_path)
    machine = engine.node.host.machine
    loop_thread = threading.get_ident()
    readers: list[int] = []  # the threads that read the app's balance

    class Watched(type(machine)):  # type: ignore[misc]
        @property
        def balance(self) -> int:
            readers.append(threading.get_ident())
            return self.__dict__["balance"]

        @balance.setter
        def balance(self, value: int) -> None:
            self.__dict__["balance"] = value

    machine.__class__ = Watched
    sample = engine.metrics.registry.get_sample_value
    try:
        task = asyncio.ensure_future(servicer.Transfer(
            pb.TransferRequest(to="p2", amount=25, request_id="order-25"), ServicerContext()))
        await asyncio.sleep(0.01)
        log.flush_sync()
        assert (await outcome(task)).balance == 75
        assert readers, "the step did not go through the watched app: the test proves nothing"
        scraped = await asyncio.to_thread(sample, "snapmesh_balance", {"node": "p1"})  # as the metrics server does
        assert scraped == 75
        assert set(readers) == {loop_thread}, "a scrape read the app's state from the metrics server's thread"
    finally:
        await log.close()


def test_a_scrape_reads_the_balance_the_loop_published_not_the_app(tmp_path: Path) -> None:
    asyncio.run(_scraped_off_the_loop(tmp_path))
