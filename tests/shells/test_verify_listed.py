"""`snapshot verify` of a snapshot whose files hold its states as manifests reads them a
block at a time (snapmesh/checking/listedfile.py): no state joined, so its peak stays
near one block whatever the states' size, and it still names each missing or corrupt
block, a state that does not match its digest, and a manifest not as filed."""

from __future__ import annotations

import hashlib
import random
import tracemalloc

from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks, statedigest
from snapmesh.services.controller.store import SnapshotStore
from snapmesh.v1 import snapmesh_pb2 as pb

SIZE = 4 * 1024 * 1024
NODES = 4


def app_snapshot(sid: str, states: dict[str, bytes]) -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id=sid, status=pb.Snapshot.COMPLETE, initiator="p1")
    for node, state in states.items():
        snapshot.nodes.add(node_id=node, state=state, state_digest=statedigest.canonical(state), app_name="blob",
                           app_version=1)
    snapshot.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", seq=1, payload=b"m")
    snapshot.app.status = pb.AppCheck.UNCHECKED
    return snapshot


def filed(tmp_path, size: int = SIZE) -> tuple[SnapshotStore, pb.Snapshot]:
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    snapshot = app_snapshot("s1", {f"p{i + 1}": random.Random(i).randbytes(size) for i in range(NODES)})
    store.save_compact(snapshot)
    return store, snapshot


def _no_whole_form(stored, read):
    raise AssertionError(f"snapshot {stored.snapshot_id} was read whole from its file")


def test_verify_of_large_listed_states_holds_about_one_block_not_the_states(tmp_path, monkeypatch):
    store, snapshot = filed(tmp_path)
    monkeypatch.setattr(blocks, "whole_form", _no_whole_form)  # tracemalloc does not see protobuf's own memory
    del snapshot  # the test's own copy of the states is not the check's
    path = store.compact_path("s1")
    assert blocks.is_stored_form(snapshot_file.read_stored(path)[0])
    tracemalloc.start()
    try:
        verdict = snapshot_file.check(path)
        damage = store.damage("s1")  # the restore's check (DATA_LOSS) reads it so too
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert verdict.ok and damage == "", (verdict.as_dict(), damage)
    assert [c.name for c in verdict.checks] == ["blocks", "checksum", "name", "complete", "invariants", "consistent"]
    print(f"tracemalloc peak {peak} verifying {NODES} states of {SIZE}")
    assert peak < 1.5 * SIZE, f"tracemalloc peak {peak} verifying {NODES} states of {SIZE}"


def test_a_state_that_does_not_match_its_digest_is_named_in_either_form(tmp_path):
    for form in ("sha256:", "sha256-blocks:"):
        store, snapshot = filed(tmp_path / form.rstrip(":"), size=16 * blocks.BLOCK_BYTES)
        path = store.compact_path("s1")
        stored, _ = snapshot_file.read_stored(path)
        stored.nodes[1].state_digest = form + hashlib.sha256(b"other").hexdigest()
        stored.checksum = ""
        stored.checksum = snapshot_file.checksum(stored)  # as filed: the stored form's checksum
        path.write_bytes(snapshot_file.FORMAT_MARK + stored.SerializeToString(deterministic=True))
        verdict = snapshot_file.check(path)
        assert [c.name for c in verdict.failed()] == ["consistent"], verdict.as_dict()
        assert f"node p2: its state does not match its digest {form}" in verdict.failed()[0].detail


def test_a_whole_forms_checksum_is_checked_a_block_at_a_time(tmp_path):
    store, snapshot = filed(tmp_path, size=16 * blocks.BLOCK_BYTES)
    path = store.compact_path("s1")
    stored, _ = snapshot_file.read_stored(path)
    stored.checksum = ""
    whole = snapshot_file.checksum(snapshot)
    path.write_bytes(snapshot_file.sealed_with(stored, whole))
    verdict = snapshot_file.check(path)
    assert verdict.ok and any(c.name == "checksum" and c.detail == whole for c in verdict.checks), verdict.as_dict()
    path.write_bytes(snapshot_file.sealed_with(stored, "sha256:" + "00" * 32))
    verdict = snapshot_file.check(path)
    assert [c.name for c in verdict.failed()] == ["checksum"], verdict.as_dict()
    assert f"(computed {whole})" in verdict.failed()[0].detail
