"""The bounded working set, the tracker half: the controller keeps a bounded working set of
finished snapshots in memory and reads older ones from its store.

The tracker (pure) drops filed snapshots past `kept`, oldest first, never one
not yet in its file. The controller service then answers GetSnapshot and
ListSnapshots for those from the store: it runs in this process behind a real
gRPC server on loopback, with a real store and file writer on disk.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.protocol.controller.machine import Controller
from snapmesh.protocol.controller.tracker import FINISHED_KEPT, Tracker, UnknownSnapshot, new_snapshot_id
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank
from support.cluster_helpers import served_in_process

pytestmark = [pytest.mark.timeout(60)]


def sid(i: int) -> str:
    """The i-th snapshot id, in the tracker's format (ids sort in start order)."""
    return new_snapshot_id(1_767_225_600 + i, b"\0\0\0\0")


def finished(i: int) -> pb.Snapshot:
    return pb.Snapshot(snapshot_id=sid(i), initiator="p1", status=pb.Snapshot.COMPLETE, total=10,
                       expected_total=10, conserved=True)


def new_tracker(kept: int) -> Tracker:
    cfg = config.load(config.DEFAULT_CONFIG)
    return bank.tracker(cfg.topology, expected_total=10, deadline_s=5, kept=kept)


def test_the_tracker_keeps_the_newest_and_every_unfiled_one() -> None:
    assert FINISHED_KEPT == 1_000
    tracker = new_tracker(kept=2)
    for i in range(5):
        tracker.restore(finished(i))
    tracker._filed.discard(sid(1))  # as if snapshot 1's file were not written yet
    tracker.filed(sid(4))
    # Two kept: the newest, and snapshot 1, which must stay until it is in its file.
    assert [s.snapshot_id for s in tracker.all()] == [sid(1), sid(4)]
    with pytest.raises(UnknownSnapshot):
        tracker.get(sid(0))
    tracker.restore(finished(5))
    tracker.filed(sid(1))
    assert [s.snapshot_id for s in tracker.all()] == [sid(4), sid(5)]


def test_older_snapshots_are_read_from_the_store(tmp_path) -> None:
    asyncio.run(_served_from_the_store(tmp_path))


async def _served_from_the_store(tmp_path) -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    tracker = new_tracker(kept=2)
    store = SnapshotStore(tmp_path / "json", tmp_path / "compact")
    filed: list[str] = []
    writer = StoreWriter(store, on_filed=filed.append)
    service = ControllerService(ControllerEngine(config=cfg, machine=Controller(tracker), journal=None, writer=writer,  # type: ignore[arg-type]
                                metrics=ControllerMetrics(CollectorRegistry())))
    for i in range(5):
        tracker.restore(finished(i))
        tracker._filed.discard(sid(i))
        writer.submit(finished(i))
    await asyncio.to_thread(writer.close)
    for filed_id in filed:
        tracker.filed(filed_id)
    assert len(tracker.all()) == 2
    async with served_in_process(service) as stub:
        old = await stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid(0)), timeout=10)
        assert old == finished(0)
        listed = await stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10)
        assert [s.snapshot_id for s in listed.snapshots] == [sid(i) for i in range(5)]
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid(9)), timeout=10)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
