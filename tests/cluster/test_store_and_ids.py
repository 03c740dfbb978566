"""Bounds on the store and on ids (issue 34, "The store and ids").

- Every RPC taking a snapshot id checks it against the tracker's id format first
  (INVALID_ARGUMENT), so a `../` id never names a file outside the store: the
  controller service runs in this process behind a real gRPC server on loopback.
- A snapshot file this version writes must carry its checksum: one cut at a field
  boundary (it parses, the checksum is gone) is damaged, not "OK".
- `load` checks that the file holds the snapshot its name says.
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
from snapmesh.checking import snapshot_file
from snapmesh.protocol.controller.snapshot_ids import new_snapshot_id, snapshot_id_problem
from snapmesh.protocol.controller.machine import Controller
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank
from support.cluster_helpers import served_in_process

pytestmark = [pytest.mark.timeout(60)]

A = new_snapshot_id(1_767_225_600, b"\x1a\x2b\x3c\x4d")
B = new_snapshot_id(1_767_225_601, b"\x1a\x2b\x3c\x4d")


def snapshot(sid: str) -> pb.Snapshot:
    s = pb.Snapshot(snapshot_id=sid, initiator="p1", status=pb.Snapshot.COMPLETE, total=20, expected_total=20,
                    conserved=True)
    s.nodes.add(node_id="p1", balance=10)
    s.nodes.add(node_id="p2", balance=10)
    s.channels.add(src="p1", dst="p2")
    s.channels.add(src="p2", dst="p1")
    return s


def written(tmp_path, *sids: str) -> SnapshotStore:
    store = SnapshotStore(tmp_path / "data" / "snapshots", tmp_path / "data" / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    for sid in sids:
        writer.submit(snapshot(sid))
    writer.close()
    return store


# ------------------------------------------------------------------ ids at every RPC


def test_the_id_format_is_what_the_tracker_makes():
    assert snapshot_id_problem(A) == ""
    for bad in ("", "s1", "../x", f"{A}/..", f"../{A}", A.upper(), A + "\n", A + "x" * 40, f"{A[:-1]}G"):
        assert snapshot_id_problem(bad), bad


def test_every_rpc_taking_a_snapshot_id_refuses_a_path_before_it_reads_a_file(tmp_path):
    asyncio.run(_ids_at_rpcs(tmp_path))


async def _ids_at_rpcs(tmp_path) -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    tracker = bank.tracker(cfg.topology, expected_total=20, deadline_s=5)
    store = written(tmp_path, A)
    writer = StoreWriter(store, on_filed=lambda sid: None)
    service = ControllerService(ControllerEngine(config=cfg, machine=Controller(tracker), journal=None, writer=writer,  # type: ignore[arg-type]
                                metrics=ControllerMetrics(CollectorRegistry())))
    # Files outside the store that a `../` id would reach: a damaged one (its parse
    # error would come back in DATA_LOSS) and a readable one (it would be served).
    (tmp_path / "data" / "probe.pb").write_bytes(b"\xff\xff\xff not a snapshot")
    (tmp_path / "data" / "controller" / "copy.pb").write_bytes(snapshot_file.sealed_bytes(snapshot("copy"))[0])
    try:
        async with served_in_process(service) as stub:
            assert (await stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=A), timeout=10)).snapshot_id == A
            for bad in ("../../probe", "../copy", "/etc/passwd", "s1"):
                calls = {
                    "GetSnapshot": stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=bad), timeout=10),
                    "RestoreSnapshot": stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=bad), timeout=10),
                    "ReportState": stub.ReportState(pb.FullState(snapshot_id=bad, node_id="p1"), timeout=10),
                }
                for name, call in calls.items():
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await call
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, bad, refused.value)
                    assert "is not a snapshot id" in refused.value.details() and repr(bad) in refused.value.details()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in stub.GetSnapshotChunks(pb.GetSnapshotRequest(snapshot_id=bad), timeout=10):
                        pass
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, refused.value)
            assert store.damaged == {}  # nothing outside the store was read, so nothing was found damaged
    finally:
        writer.close()


# ------------------------------------------------------------------ checksum: mandatory for marked files


def test_a_compact_file_cut_before_its_checksum_is_damaged_not_ok(tmp_path):
    store = written(tmp_path, A, B)
    path = store.compact_path(A)
    data = path.read_bytes()
    assert data.startswith(snapshot_file.FORMAT_MARK)
    trailer = pb.Snapshot(checksum=snapshot_file.checksum(snapshot(A))).SerializeToString()
    assert data.endswith(trailer)
    path.write_bytes(data[: -len(trailer)])  # cut at a field boundary: it still parses
    assert snapshot_file.read(path) == snapshot(A)

    verdict = snapshot_file.check(path)
    assert not verdict.ok and "has no checksum" in verdict.failed()[0].detail
    assert str(path) in store.damage(A) and "has no checksum" in store.damage(A)
    loaded, warnings = store.load_all()
    assert [s.snapshot_id for s in loaded] == [A, B]  # A's JSON file is intact
    assert any(str(path) in w and "has no checksum" in w for w in warnings)
    assert store.load(A) is None and "has no checksum" in store.damaged[A]


def test_a_json_file_with_an_empty_checksum_is_damaged_and_one_without_the_key_is_older(tmp_path):
    store = written(tmp_path, A)
    path = store.path(A)
    text = path.read_text()
    path.write_text(text.replace(f'"checksum": "{snapshot_file.checksum(snapshot(A))}"', '"checksum": ""'))
    assert "has no checksum" in snapshot_file.damage(path)
    path.write_text(text.replace(f',\n  "checksum": "{snapshot_file.checksum(snapshot(A))}"', ""))
    assert "checksum" not in path.read_text()
    assert snapshot_file.damage(path) == "" and snapshot_file.check(path).ok  # marked older: accepted


def test_an_unmarked_compact_file_without_a_checksum_is_older_and_loads(tmp_path):
    store = written(tmp_path, A)
    store.compact_path(A).write_bytes(snapshot(A).SerializeToString())  # as written before checksums
    assert store.load(A) == snapshot(A) and store.damage(A) == ""
    assert snapshot_file.check(store.compact_path(A)).checks[0].detail == snapshot_file.NO_CHECKSUM


def test_load_checks_the_file_holds_the_snapshot_its_name_says(tmp_path):
    store = written(tmp_path, A, B)
    store.compact_path(A).write_bytes(store.compact_path(B).read_bytes())  # B's intact file under A's name
    assert store.load(A) is None
    assert str(store.compact_path(A)) in store.damaged[A] and repr(B) in store.damaged[A]
    assert store.load(B) == snapshot(B)
