"""The controller's store keeps app states as blocks (services/controller/store.py,
blockdir.py): each block once under controller/blocks, a manifest per node in the
`.pb`, the blocks' reference counts rebuilt at start, and what a crash in a
deletion or a filing leaves behind removed without touching a stored snapshot's
blocks. `snapshot verify` and the restore path name a missing or corrupt block."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks
from snapmesh.protocol.controller.blockforms import BlockForms
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb
from support.report_service import report_service

B = blocks.BLOCK_BYTES


def app_snapshot(sid: str, states: dict[str, bytes]) -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id=sid, status=pb.Snapshot.COMPLETE, initiator="p1")
    for node, state in states.items():
        snapshot.nodes.add(node_id=node, state=state, state_digest=snapshot_file.PREFIX + hashlib.sha256(
            state).hexdigest(), app_name="blob", app_version=1)
    snapshot.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", seq=1, payload=b"m")
    snapshot.channels.add(src="p2", dst="p1")
    snapshot.app.status = pb.AppCheck.UNCHECKED
    return snapshot


def new_store(root: Path) -> SnapshotStore:
    return SnapshotStore(root / "snapshots", root / "controller" / "snapshots")


def block_files(root: Path) -> dict[str, int]:
    directory = root / "controller" / "blocks"
    return {p.name: p.stat().st_size for p in directory.iterdir()} if directory.is_dir() else {}


def states(seed: int, nodes: int = 2, size: int = 16 * B) -> dict[str, bytes]:
    return {f"p{i + 1}": random.Random(f"{seed}-{i}").randbytes(size) for i in range(nodes)}


def test_two_snapshots_of_mostly_unchanged_states_store_the_unchanged_blocks_once(tmp_path):
    store = new_store(tmp_path)
    first = states(1)
    store.save_compact(app_snapshot("s1", first))
    assert len(block_files(tmp_path)) == 32 and sum(block_files(tmp_path).values()) == 32 * B
    second = dict(first, p1=first["p1"][:5 * B] + bytes(1024) + first["p1"][5 * B + 1024:])
    store.save_compact(app_snapshot("s2", second))
    assert len(block_files(tmp_path)) == 33  # the one block the change touched
    assert store.compact_path("s2").stat().st_size < 4 * 1024  # a manifest, not the states
    loaded, warnings = new_store(tmp_path).load_all()
    assert warnings == [] and loaded == [app_snapshot("s1", first), app_snapshot("s2", second)]
    assert store.load("s2") == app_snapshot("s2", second)
    for sid in ("s1", "s2"):  # the JSON export is the whole snapshot, under the same checksum
        store.export_json(app_snapshot(sid, first if sid == "s1" else second))
        verdicts = [snapshot_file.check(p) for p in (store.compact_path(sid), store.path(sid))]
        assert all(v.ok for v in verdicts), [v.as_dict() for v in verdicts]
        assert snapshot_file.read_marked(store.compact_path(sid))[0].checksum == \
            snapshot_file.read_marked(store.path(sid))[0].checksum


def test_retention_deletes_a_block_only_once_no_stored_snapshot_holds_it(tmp_path):
    store = new_store(tmp_path)
    writer = StoreWriter(store, on_filed=lambda sid: None)
    shared = states(1)
    writer.submit(app_snapshot("s1", shared))
    writer.submit(app_snapshot("s2", dict(shared, p2=states(2)["p2"])))
    writer.submit(app_snapshot("s3", states(3)))
    writer.discard("s1")  # its p1 blocks are s2's too; its p2 blocks go
    writer.close()
    assert len(block_files(tmp_path)) == 16 + 16 + 32
    store.delete("s2")
    assert len(block_files(tmp_path)) == 32
    assert snapshot_file.check(store.compact_path("s3")).ok


def test_what_a_crash_in_a_deletion_or_a_filing_leaves_is_removed_at_start_and_kept_snapshots_verify(tmp_path):
    store = new_store(tmp_path)
    for sid, seed in (("s1", 1), ("s2", 2), ("s3", 3)):
        store.save_compact(app_snapshot(sid, states(seed)))
    kept = {n.hex() for sid in ("s2", "s3") for n in blocks.hashes(snapshot_file.read_stored(store.compact_path(sid))[0])}
    gone = set(block_files(tmp_path)) - kept
    # a deletion of s1 cut short: its file gone, half its blocks still there
    store.compact_path("s1").unlink()
    for name in sorted(gone)[: len(gone) // 2]:
        (tmp_path / "controller" / "blocks" / name).unlink()
    # a filing cut short: a new block written, and a temporary one, its manifest never
    (tmp_path / "controller" / "blocks" / ("ab" * 32)).write_bytes(b"orphan")
    (tmp_path / "controller" / "blocks" / f".{'cd' * 32}.tmp").write_bytes(b"half")
    restarted = new_store(tmp_path)
    loaded, warnings = restarted.load_all()
    assert [s.snapshot_id for s in loaded] == ["s2", "s3"] and warnings == []
    assert set(block_files(tmp_path)) > kept, "loading alone removes nothing (a reader's load_all)"
    assert "no stored snapshot names" in restarted.sweep()
    assert set(block_files(tmp_path)) == kept, "every kept block stays, nothing else"
    assert restarted.sweep() == ""
    for sid in ("s2", "s3"):
        assert snapshot_file.check(restarted.compact_path(sid)).ok
    restarted.delete("s2")  # the counts were rebuilt: s3's blocks stay
    assert snapshot_file.check(restarted.compact_path("s3")).ok


def test_a_missing_or_corrupt_block_is_named_by_verify_load_and_the_restore_check(tmp_path):
    store = new_store(tmp_path)
    store.save_compact(app_snapshot("s1", states(1)))
    stored = snapshot_file.read_stored(store.compact_path("s1"))[0]
    missing, corrupt = stored.nodes[0].state_blocks.hashes[3], stored.nodes[1].state_blocks.hashes[7]
    store.blocks.path(missing).unlink()
    store.blocks.path(corrupt).write_bytes(b"\x00" * B)
    verdict = snapshot_file.check(store.compact_path("s1"))
    assert not verdict.ok and [c.name for c in verdict.failed()] == ["blocks"]
    detail = verdict.failed()[0].detail
    assert f"snapshot s1, node p1, block sha256:{missing.hex()}: missing" in detail
    assert f"snapshot s1, node p2, block sha256:{corrupt.hex()}: corrupt" in detail
    assert f"node p1, block sha256:{missing.hex()}" in store.damage("s1")  # the restore's check (DATA_LOSS)
    restarted = new_store(tmp_path)
    loaded, warnings = restarted.load_all()
    assert loaded == [] and "s1" in restarted.damaged and missing.hex() in restarted.damaged["s1"]
    assert restarted.load("s1") is None
    assert store.blocks.path(stored.nodes[0].state_blocks.hashes[0]).exists(), "a damaged snapshot's blocks stay"


def test_a_pb_file_with_its_states_inline_still_loads_and_verifies(tmp_path):
    old = app_snapshot("old", states(1, size=3 * B))
    data, _ = snapshot_file.sealed_bytes(old)  # no stored form: as written before blocks
    path = tmp_path / "controller" / "snapshots" / "old.pb"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    store = new_store(tmp_path)
    loaded, warnings = store.load_all()
    assert loaded == [old] and warnings == [] and block_files(tmp_path) == {}
    assert snapshot_file.check(path).ok


def test_large_states_are_exported_as_manifests_and_held_blocks_are_not_looked_at_again(tmp_path, monkeypatch):
    """States over EXPORT_INLINE_BYTES in all: the JSON export names the blocks under
    controller/blocks (the same checksum, verified and loaded through them); a
    second filing writes, and looks at the files of, only the blocks no stored
    snapshot holds."""
    from snapmesh.services.controller import store as store_module

    monkeypatch.setattr(store_module, "EXPORT_INLINE_BYTES", 8 * B)
    store = new_store(tmp_path)
    writer = StoreWriter(store, on_filed=lambda sid: None)
    first = states(11)  # 2 nodes x 16 blocks: over the limit
    writer.submit(app_snapshot("s1", first))
    writer.close()
    seen: list[int] = []
    real = store.blocks.write
    monkeypatch.setattr(store.blocks, "write", lambda new: seen.append(len(new)) or real(new))
    second = dict(first, p2=first["p2"][:7 * B] + b"!" + first["p2"][7 * B + 1:])
    writer = StoreWriter(store, on_filed=lambda sid: None)
    writer.submit(app_snapshot("s2", second))
    writer.submit(app_snapshot("small", {"p1": b"tiny", "p2": b"too"}))
    writer.close()
    assert seen == [1, 2]  # the changed block; then the small states, one block each
    for sid, whole in (("s1", first), ("s2", second)):
        text = store.path(sid).read_text()
        assert '"state_blocks"' in text and '"state":' not in text and len(text) < 8 * 1024
        verdict = snapshot_file.check(store.path(sid))
        assert verdict.ok, verdict.as_dict()
        assert snapshot_file.read(store.path(sid)) == snapshot_file.read(store.compact_path(sid))
        assert [n.state for n in snapshot_file.read(store.path(sid)).nodes] == list(whole.values())
    assert '"state": "dGlueQ=="' in store.path("small").read_text()
    store.compact_path("s2").unlink()  # the export stands in for a lost `.pb`, its blocks and all
    loaded, warnings = new_store(tmp_path).load_all()
    assert warnings == [] and [s.snapshot_id for s in loaded] == ["s1", "s2", "small"]
    assert [n.state for n in loaded[1].nodes] == list(second.values())


def test_a_state_is_stored_cut_as_its_node_cut_it_when_the_report_said_how(tmp_path):
    store = new_store(tmp_path)
    parts = (3 * B + 10, 100, 2 * B)
    state = random.Random(12).randbytes(sum(parts))
    store.note_parts("s1", "p1", parts)
    store.save_compact(app_snapshot("s1", {"p1": state}))
    node_side, _ = blocks.names(state, parts)
    assert list(store.load("s1").nodes[0].state) == list(state)
    stored, _ = snapshot_file.read_stored(store.compact_path("s1"))
    assert list(stored.nodes[0].state_blocks.hashes) == node_side.names and len(node_side.names) == 7
    store.save_compact(app_snapshot("s2", {"p1": state}))  # not told: the plain grid
    stored, _ = snapshot_file.read_stored(store.compact_path("s2"))
    assert list(stored.nodes[0].state_blocks.hashes) == blocks.names(state)[0].names


def test_a_held_block_found_lacking_by_a_report_is_written_again_at_the_next_filing(tmp_path):
    store = new_store(tmp_path)
    first = states(13)
    store.save_compact(app_snapshot("s1", first))
    gone = blocks.block_hash(first["p1"][:B])
    (tmp_path / "controller" / "blocks" / gone.hex()).unlink()
    store.save_compact(app_snapshot("s2", first))
    assert gone.hex() not in block_files(tmp_path)  # held by s1: its file is not looked at
    store.lacks([gone])
    store.save_compact(app_snapshot("s3", first))
    assert block_files(tmp_path)[gone.hex()] == B


def test_a_block_a_journaled_report_pins_outlives_retention_and_the_sweep_until_unpinned(tmp_path):
    """journalblocks.py JB1, JB2: a report journaled as blocks names blocks of a stored
    snapshot; retiring that snapshot, or a restart's sweep, leaves them until the
    report's snapshot is filed or retired (its pins go); then they go with it."""
    store = new_store(tmp_path)
    store.save_compact(app_snapshot("s1", states(1)))
    held = blocks.hashes(snapshot_file.read_stored(store.compact_path("s1"))[0])
    assert store.pin("s2", {bytes(32)}, call=1) == [bytes(32)]  # on disk by no reference: refused, nothing pinned
    assert store.pin("s2", held, call=2) == []
    store.delete("s1")  # retention: its blocks have no reference left, and stay
    assert len(block_files(tmp_path)) == 32
    restarted = new_store(tmp_path)
    restarted.load_all()
    restarted.pins.pin("s2", held)  # at start, as the journal's records say, once read back whole (J3)
    restarted.sweep()
    assert len(block_files(tmp_path)) == 32
    writer = StoreWriter(restarted, on_filed=lambda sid: None)
    writer.unpin("s2")
    writer.close()
    assert block_files(tmp_path) == {}, "unpinned and unreferenced: they go"


def test_back_to_back_reports_as_blocks_are_taken_before_the_first_snapshot_is_filed(tmp_path):
    """journalblocks.py JB1: the blocks a taken report carried (every block of one that
    came whole) are on disk and pinned at once, so the node's next report, naming them
    as held, is taken though no snapshot is filed yet (it was refused as MISSING and
    sent whole again); they stay through a restart's sweep while pinned, and go with
    the pins of snapshots retired unfiled, or of a report refused."""
    c = report_service(tmp_path)  # forms: the tracker's, the listed reports' sizes and digests (blockforms.py)
    service, forms, store, writer = c.service, c.forms, c.store, c.writer
    node = SentBlocks()
    state = bytearray(random.Random(7).randbytes(16 * B))
    for call, sid in enumerate(["s1", "s2", "s3"], start=1):
        state[call * B] ^= 1  # one block changed a snapshot
        sent, names = node.form(pb.FullState(snapshot_id=sid, node_id="p1", state=bytes(state), app_name="blob",
                                             app_version=1))
        assert sent.HasField("state_blocks") == (call > 1)  # the first is whole: nothing taken yet
        if call == 1:
            service._know(sent, call)  # what ReportState does for a report that came whole
        else:
            assert len(sent.blocks) == 1  # the changed block only: the others are held
            listed = service._whole_report(sent, call)  # no MissingBlocks though s1 is not filed
            assert not listed.HasField("state") and not listed.blocks  # 128 KiB: its block list (BF2)
            noted = forms.of(listed)
            assert noted is not None and noted.size == len(state)
            assert noted.digest == "sha256:" + hashlib.sha256(bytes(state)).hexdigest()
            entry = pb.NodeBalance(node_id="p1")
            forms.fill(entry, noted)
            assert forms.state(entry, sid) == bytes(state)  # read back by block, kept or on disk
        node.accepted(pb.ReportStateResponse(takes_blocks=True), names)
    store.blocks.settle()  # blockdir.py D12: the carried blocks' files are written after their reports
    written = block_files(tmp_path)
    assert len(written) == 18 and store.sweep() == ""  # 16 and the 2 changed ones, each pinned
    store.unpin("s3", call=3)  # refused after all: its one new block goes, the held ones stay
    assert len(block_files(tmp_path)) == 17
    for sid in ("s1", "s2"):  # retired unfiled: nothing else holds them
        writer.unpin(sid)
    writer.close()
    assert block_files(tmp_path) == {}


def test_the_controller_s_start_loads_large_states_listed_and_reads_each_block_once_checked(tmp_path):
    """load_all(listed=True), the controller's start (process.py): a state over LISTED_BYTES stays
    its manifest with its size and digest, never joined (at 256 MiB a node, two kept snapshots took
    the controller to 6.5 GB as it started); a small one is whole; the whole form is the same."""
    big, small = states(1, size=16 * B), states(2, size=2 * B)  # 128 KiB and 16 KiB a node
    store = new_store(tmp_path)
    store.save_compact(app_snapshot("s1", big))
    store.save_compact(app_snapshot("s2", small))
    read: list[bytes] = []
    restarted = new_store(tmp_path)
    original = restarted.blocks.read
    restarted.blocks.read = lambda name: read.append(name) or original(name)  # type: ignore[method-assign]
    loaded, warnings = restarted.load_all(listed=True)
    assert warnings == [] and [s.snapshot_id for s in loaded] == ["s1", "s2"]
    listed, whole = loaded
    assert all(e.HasField("state_blocks") and not e.HasField("state") for e in listed.nodes)
    assert [e.state_bytes for e in listed.nodes] == [16 * B, 16 * B]
    assert all(e.HasField("state") and not e.HasField("state_blocks") for e in whole.nodes)
    assert whole == app_snapshot("s2", small)
    named = [*blocks.hashes(snapshot_file.read_stored(store.compact_path("s1"))[0]),
             *blocks.hashes(snapshot_file.read_stored(store.compact_path("s2"))[0])]
    assert sorted(read) == sorted(named), "each block read once, to check it against its name"
    forms = BlockForms(reader=lambda: restarted.blocks.read)
    assert forms.whole(listed) == app_snapshot("s1", big)  # BF1: the same snapshot, read by block


def test_a_damaged_block_found_by_a_listed_start_is_judged_as_a_whole_load_judges_it(tmp_path):
    store = new_store(tmp_path)
    store.save_compact(app_snapshot("s1", states(1)))
    stored = snapshot_file.read_stored(store.compact_path("s1"))[0]
    corrupt = stored.nodes[1].state_blocks.hashes[7]
    store.blocks.path(corrupt).write_bytes(b"\x00" * B)
    restarted = new_store(tmp_path)
    loaded, warnings = restarted.load_all(listed=True)
    assert loaded == [] and corrupt.hex() in restarted.damaged["s1"] and any(corrupt.hex() in w for w in warnings)
