"""The controller engine's one loop over the machine's effects: persist, then show or send.

A journal whose records become durable only when the test says so: nothing a
step shows (a watcher's update, the RPC's answer) or sends (StartSnapshot)
goes out before the step's record is durable, and when the record cannot be
made durable the rest of the step never goes out.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from services.controller.engine import ControllerEngine
from services.controller.metrics import ControllerMetrics
from snapmesh.protocol.controller.tracker import Tracker
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.timeout(60)]


class HeldJournal:
    """Each append's future resolves only when the test resolves it."""

    def __init__(self) -> None:
        self.records: list = []
        self.futures: list[asyncio.Future[None]] = []

    def append(self, record) -> asyncio.Future[None]:
        self.records.append(record)
        self.futures.append(asyncio.get_running_loop().create_future())
        return self.futures[-1]

    def barrier(self) -> asyncio.Future[None]:
        return self.append(None)


class Node:
    def __init__(self, sent: list) -> None:
        self.sent = sent

    async def StartSnapshot(self, request, timeout):
        self.sent.append(("StartSnapshot", request.snapshot_id))
        return pb.StartSnapshotResponse()

    async def AbortSnapshot(self, request, timeout):
        self.sent.append(("AbortSnapshot", request.snapshot_id))


def test_a_step_shows_and_sends_nothing_before_its_record_is_durable_and_nothing_at_all_when_it_cannot_be() -> None:
    asyncio.run(_persist_before_show())


async def _persist_before_show() -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    journal = HeldJournal()
    engine = ControllerEngine(
        config=cfg, tracker=Tracker(topology=cfg.topology, expected_total=cfg.expected_total, deadline_s=5),
        journal=journal, writer=None, metrics=ControllerMetrics(CollectorRegistry()),  # type: ignore[arg-type]
    )
    sent: list[tuple[str, str]] = []
    engine.stubs = {n: Node(sent) for n in engine.nodes}  # type: ignore[misc]
    watcher: asyncio.Queue = asyncio.Queue()
    engine.watchers.add(watcher)

    trigger = asyncio.create_task(engine.trigger(engine.nodes[0]))
    await asyncio.sleep(0.05)
    assert len(journal.records) == 1 and not trigger.done()
    assert watcher.empty() and sent == [], "shown or sent before the start was durable"
    journal.futures[0].set_result(None)
    snapshot = await trigger
    await asyncio.sleep(0.05)
    assert watcher.get_nowait().snapshot_id == snapshot.snapshot_id
    assert sent == [("StartSnapshot", snapshot.snapshot_id)]

    second = asyncio.create_task(engine.trigger(engine.nodes[1]))
    await asyncio.sleep(0.05)
    journal.futures[-1].set_exception(OSError("no space left on device"))
    with pytest.raises(OSError, match="no space left"):
        await second
    await asyncio.sleep(0.05)
    assert watcher.empty() and len(sent) == 1, "a step went on past a record that could not be made durable"
    failed = [s for s in engine.machine.all() if s.snapshot_id != snapshot.snapshot_id]
    assert [s.status for s in failed] == [pb.Snapshot.FAILED]  # the machine's start_failed, itself journaled
    assert "cannot journal the start: no space left" in failed[0].reason
    await engine.close()
