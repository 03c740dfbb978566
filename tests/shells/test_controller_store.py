"""Finished-snapshot files: the compact store of record, the proto JSON export, and
what loading does with files from before the compact store or damaged ones."""

from __future__ import annotations

import json

from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.v1 import snapmesh_pb2 as pb


def snapshot(sid: str, status=pb.Snapshot.COMPLETE) -> pb.Snapshot:
    s = pb.Snapshot(snapshot_id=sid, initiator="p1", status=status, total=10, expected_total=10, conserved=True)
    s.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", amount=10, seq=1)
    s.stats.nodes.add(node_id="p2", start_delay_ms=1.5, in_flight_messages=1)
    return s


def test_the_writer_files_both_forms_in_the_background_and_loading_reads_them_back(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    filed: list[str] = []
    writer = StoreWriter(store, on_filed=filed.append)
    for sid in ("a", "b"):
        writer.submit(snapshot(sid))
    writer.close()  # drains what was submitted
    assert filed == ["a", "b"]
    assert json.loads(store.path("a").read_text())["channels"][0]["in_flight"][0]["msg_id"] == "p1:p2:1"
    assert store.missing_files("a") == (False, False)
    loaded, warnings = store.load_all()
    assert loaded == [snapshot("a"), snapshot("b")] and warnings == []


def test_loading_takes_json_only_snapshots_and_skips_damaged_files_naming_them(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "compact")
    store.export_json(snapshot("legacy"))  # a data dir from before the compact store
    store.save_compact(snapshot("new"))
    (tmp_path / "compact" / "torn.pb").write_bytes(b"\xff\xff\xff")
    store.save_compact(snapshot("other"))
    (tmp_path / "compact" / "other.pb").rename(tmp_path / "compact" / "renamed.pb")
    store.save_compact(snapshot("running", status=pb.Snapshot.IN_PROGRESS))
    loaded, warnings = store.load_all()
    assert [s.snapshot_id for s in loaded] == ["legacy", "new"]
    assert store.missing_files("legacy") == (True, False) and store.missing_files("new") == (False, True)
    text = "\n".join(warnings)
    for name, why in (("torn.pb", "cannot parse"), ("renamed.pb", "'other'"), ("running.pb", "IN_PROGRESS")):
        assert name in text and why in text, (name, text)


def test_a_discard_deletes_both_files_after_what_was_submitted_before(tmp_path):
    failed = pb.Snapshot.FAILED
    snaps = [snapshot("a"), snapshot("b", failed), snapshot("c"), snapshot("d"), snapshot("e", failed), snapshot("f")]
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    for s in snaps:
        writer.submit(s)
    for sid in ("a", "b"):  # what the machine's Retire effects name (its rule K1: tests/protocol/test_controller_machine.py)
        writer.discard(sid)
    writer.close()
    loaded, _ = store.load_all()
    assert [s.snapshot_id for s in loaded] == ["c", "d", "e", "f"]
    assert not store.path("a").exists() and not store.compact_path("b").exists()


def test_bench_store_measures_files_that_are_the_printers_text_sealed() -> None:
    from bench import controller_store

    figures = controller_store.measure(entries=300, rounds=1)  # its own checks: the export's bytes, the compact file
    assert figures["store_us_per_entry_protojson"] > 0 and figures["store_us_per_entry_compact"] > 0
