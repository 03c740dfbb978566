"""The bounded working set, the watcher half: a WatchSnapshots watcher that does not read is
dropped with RESOURCE_EXHAUSTED once WATCH_QUEUE updates wait for it, instead of
queueing every update forever. The controller service runs in this process
behind a real gRPC server on loopback (its journal, store and nodes are not
needed to publish updates); the watcher is a real gRPC client.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from support.cluster_helpers import served_in_process
from prometheus_client import CollectorRegistry

from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.protocol.controller.machine import Controller
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

pytestmark = [pytest.mark.timeout(60)]


def test_a_slow_watcher_is_dropped_with_a_clear_status() -> None:
    asyncio.run(_slow_watcher())


async def _slow_watcher() -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    tracker = bank.tracker(cfg.topology, expected_total=cfg.expected_total, deadline_s=5)
    service = ControllerService(ControllerEngine(config=cfg, machine=Controller(tracker), journal=None, writer=None,  # type: ignore[arg-type]
                                metrics=ControllerMetrics(CollectorRegistry())))
    service.engine.watchers.limit = 8
    async with served_in_process(service) as stub:
        call = stub.WatchSnapshots(pb.WatchSnapshotsRequest())
        while not len(service.engine.watchers):
            await asyncio.sleep(0.01)
        big = pb.Snapshot(snapshot_id="s", reason="x" * 200_000)  # fills the stream's flow-control window fast
        for _ in range(200):  # the watcher reads none of them
            service.engine.watchers.publish(big)
            await asyncio.sleep(0)
        assert not len(service.engine.watchers), "the slow watcher was not dropped"
        received = 0
        with pytest.raises(grpc.aio.AioRpcError) as dropped:
            async for _ in call:
                received += 1
        assert dropped.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "fell 8 updates behind" in dropped.value.details()
        assert received < 200
