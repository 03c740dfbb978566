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

from services.controller.metrics import ControllerMetrics
from services.controller.servicer import ControllerService
from services.controller.store import SnapshotStore, StoreWriter
from snapmesh.protocol.tracker import FINISHED_KEPT, Tracker, UnknownSnapshot
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.timeout(60)]


def finished(i: int) -> pb.Snapshot:
    return pb.Snapshot(snapshot_id=f"s{i:03d}", initiator="p1", status=pb.Snapshot.COMPLETE, total=10,
                       expected_total=10, conserved=True)


def new_tracker(kept: int) -> Tracker:
    cfg = config.load(config.DEFAULT_CONFIG)
    return Tracker(topology=cfg.topology, expected_total=10, deadline_s=5, kept=kept)


def test_the_tracker_keeps_the_newest_and_every_unfiled_one() -> None:
    assert FINISHED_KEPT == 1_000
    tracker = new_tracker(kept=2)
    for i in range(5):
        tracker.restore(finished(i))
    tracker._filed.discard("s001")  # as if s001's file were not written yet
    tracker.filed("s004")
    # Two kept: the newest, and s001, which must stay until it is in its file.
    assert [s.snapshot_id for s in tracker.all()] == ["s001", "s004"]
    with pytest.raises(UnknownSnapshot):
        tracker.get("s000")
    tracker.restore(finished(5))
    tracker.filed("s001")
    assert [s.snapshot_id for s in tracker.all()] == ["s004", "s005"]


def test_older_snapshots_are_read_from_the_store(tmp_path) -> None:
    asyncio.run(_served_from_the_store(tmp_path))


async def _served_from_the_store(tmp_path) -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    tracker = new_tracker(kept=2)
    store = SnapshotStore(tmp_path / "json", tmp_path / "compact")
    filed: list[str] = []
    writer = StoreWriter(store, on_filed=filed.append)
    service = ControllerService(config=cfg, tracker=tracker, journal=None, writer=writer,  # type: ignore[arg-type]
                                metrics=ControllerMetrics(CollectorRegistry()))
    for i in range(5):
        tracker.restore(finished(i))
        tracker._filed.discard(f"s{i:03d}")
        writer.submit(finished(i))
    await asyncio.to_thread(writer.close)
    for sid in filed:
        tracker.filed(sid)
    assert len(tracker.all()) == 2
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ControllerStub(channel)
            old = await stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id="s000"), timeout=10)
            assert old == finished(0)
            listed = await stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10)
            assert [s.snapshot_id for s in listed.snapshots] == [f"s{i:03d}" for i in range(5)]
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id="../nope"), timeout=10)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(0)
