"""Checksummed snapshot files (snapmesh/checking/snapshot_file.py) as the controller's
store writes and loads them: intact ones load, damaged ones are named and
remembered, files from before checksums load as before."""

from __future__ import annotations

from snapmesh.services.controller.export import snapshot_json
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
import snapmesh.bank.snapshot as bank_rules
from snapmesh.checking import snapshot_file
from snapmesh.v1 import snapmesh_pb2 as pb


def snapshot(sid: str) -> pb.Snapshot:
    s = pb.Snapshot(snapshot_id=sid, initiator="p1", status=pb.Snapshot.COMPLETE, total=30, expected_total=30,
                    conserved=True)
    s.nodes.add(node_id="p1", balance=10)
    s.nodes.add(node_id="p2", balance=10)
    s.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", amount=10, seq=1)
    s.channels.add(src="p2", dst="p1")
    s.stats.end_to_end_duration_ms = 1.25
    return s


def written(tmp_path, *sids: str) -> SnapshotStore:
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    for sid in sids:
        writer.submit(snapshot(sid))
    writer.close()
    return store


def test_both_files_carry_one_checksum_and_load_back_without_it(tmp_path):
    store = written(tmp_path, "a")
    compact, exported = snapshot_file.read(store.compact_path("a")), snapshot_file.read(store.path("a"))
    assert compact.checksum == exported.checksum == snapshot_file.checksum(snapshot("a"))
    assert compact == exported
    assert snapshot_file.check(store.compact_path("a")).ok and snapshot_file.check(store.path("a")).ok
    loaded, warnings = store.load_all()
    assert loaded == [snapshot("a")] and warnings == [] and store.damaged == {}


def test_sealing_leaves_the_controllers_copy_alone():
    original = snapshot("a")
    data, digest = snapshot_file.sealed_bytes(original)
    assert original == snapshot("a") and not original.checksum
    assert pb.Snapshot.FromString(data).checksum == digest == snapshot_file.checksum(original)


def test_a_changed_file_is_skipped_named_and_remembered_unless_its_other_file_is_intact(tmp_path):
    store = written(tmp_path, "a", "b")
    for path in (store.compact_path("a"), store.path("a")):  # both files of a changed
        path.write_bytes(path.read_bytes().replace(b"p1:p2:1", b"p1:p2:7"))
    changed_b = pb.Snapshot.FromString(store.compact_path("b").read_bytes())
    changed_b.nodes[0].balance = 11
    store.compact_path("b").write_bytes(changed_b.SerializeToString())  # b's JSON still intact
    loaded, warnings = store.load_all()
    assert [s.snapshot_id for s in loaded] == ["b"] and loaded[0] == snapshot("b")
    assert set(store.damaged) == {"a"} and str(store.compact_path("a")) in store.damaged["a"]
    assert any(str(store.compact_path("b")) in w and "checksum" in w for w in warnings)
    assert "checksum" in store.damage("b") and str(store.compact_path("b")) in store.damage("b")
    assert store.damage("unknown") == ""


def test_a_file_from_before_checksums_loads_and_verifies_with_a_note(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "compact")
    store.directory.mkdir(parents=True)
    store.compact_directory.mkdir(parents=True)
    store.compact_path("old").write_bytes(snapshot("old").SerializeToString())
    store.path("legacy").write_text(snapshot_json(snapshot("legacy")).replace('\n  "checksum": "",', ""))
    loaded, warnings = store.load_all()
    assert loaded == [snapshot("legacy"), snapshot("old")] and warnings == []
    assert store.damage("old") == "" and store.damage("legacy") == ""
    verdict = snapshot_file.check(store.compact_path("old"))
    assert verdict.ok and verdict.checks[0].detail == snapshot_file.NO_CHECKSUM


def test_self_consistency_names_each_contradiction():
    odd = snapshot("a")
    odd.nodes.add(node_id="p1", balance=0)
    odd.channels.add(src="p1", dst="p9")
    odd.channels[0].in_flight.add(msg_id="p1:p2:1", amount=-1, seq=1)
    problems = "; ".join(snapshot_file.inconsistencies(odd, rules=bank_rules))
    for expected in ("recorded twice: p1", "p1->p9 joins a node", "amount -1", "seq 1 after 1",
                     "msg_id p1:p2:1 recorded twice", "total 30 is not balances 20 + in flight 9"):
        assert expected in problems, (expected, problems)
    assert snapshot_file.inconsistencies(snapshot("a"), rules=bank_rules) == []


def test_without_the_apps_rules_only_what_every_snapshot_has_is_checked(tmp_path):
    # The file checker knows no app: the bank's arithmetic is checked only when its rules are handed in.
    odd = snapshot("a")
    odd.channels.add(src="p1", dst="p9")
    odd.channels[0].in_flight.add(msg_id="p1:p2:9", amount=-1, seq=9)
    problems = "; ".join(snapshot_file.inconsistencies(odd))
    assert "p1->p9 joins a node" in problems and "amount" not in problems and "total" not in problems, problems
    store = written(tmp_path, "a")
    generic, bank = snapshot_file.check(store.path("a")), snapshot_file.check(store.path("a"), rules=bank_rules)
    assert generic.ok and bank.ok
    assert "conserved" not in [c.name for c in generic.checks] and "conserved" in [c.name for c in bank.checks]
