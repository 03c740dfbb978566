"""The checksum a snapshot is filed with (services/controller/filingsum.py): the stored
form's when both files hold manifests (over EXPORT_INLINE_BYTES of states), hashed with
no block read for it; the whole form's below that. Either way `snapshot verify` and a
load read every block and check it against its name, and each listed state's digest
is checked against its bytes when filed (FS1)."""

from __future__ import annotations

import hashlib
import logging
import random

import pytest

from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks
from snapmesh.services.controller import filingsum, servicer
from snapmesh.services.controller.store import EXPORT_INLINE_BYTES
from snapmesh.v1 import snapmesh_pb2 as pb
from support.report_service import report_service

B = blocks.BLOCK_BYTES
LARGE = EXPORT_INLINE_BYTES // B + 8  # blocks: the files hold manifests
SMALL = 16


def sha(state: bytes) -> str:
    return "sha256:" + hashlib.sha256(state).hexdigest()


def filed(tmp_path, count: int, said: str | None = None, before=lambda store, report: None, kept: int = 0):
    """A node's second report (as blocks, one block changed) of a state of `count` blocks, filed
    as the tracker hands its snapshot over (listed) and exported; the store and the state."""
    c = report_service(tmp_path)
    service, forms, store, writer = c.service, c.forms, c.store, c.writer
    if kept:
        service._known.max_bytes = kept  # the kept blocks' bound (knownblocks.py)
    state = bytearray(random.Random(count).randbytes(count * B))
    node = c.first_report(bytes(state), sha(bytes(state)))
    state[3 * B] ^= 1
    sent, _ = node.form(pb.FullState(snapshot_id="s2", node_id="p1", state=bytes(state), app_name="blob",
                                     app_version=1, state_digest=said or sha(bytes(state))))
    report = service._whole_report(sent, 2)
    snapshot = pb.Snapshot(snapshot_id="s2", status=pb.Snapshot.COMPLETE, initiator="p1")
    forms.fill(snapshot.nodes.add(node_id="p1", app_name="blob", app_version=1), forms.of(report))
    before(store, report)
    writer.submit(snapshot)
    writer.close()
    return store, bytes(state)


def test_a_large_snapshot_is_filed_with_its_manifests_checksum_and_verify_reads_every_block(tmp_path, monkeypatch):
    def no_whole(snapshot, read):
        raise AssertionError("the whole form was hashed")

    monkeypatch.setattr(filingsum, "whole_digest", no_whole)
    store, state = filed(tmp_path, LARGE)
    for path in (store.compact_path("s2"), store.path("s2")):
        kept, marked = snapshot_file.read_stored(path)
        assert marked and blocks.is_stored_form(kept)  # the export holds the manifests too
        assert kept.checksum == snapshot_file.checksum(kept)  # of what the file holds
        verdict = snapshot_file.check(path)
        assert verdict.ok, verdict.as_dict()
        assert any(c.name == "blocks" and f"{LARGE} blocks" in c.detail for c in verdict.checks)
    loaded = store.load("s2")
    assert loaded is not None and loaded.nodes[0].state == state and loaded.nodes[0].state_digest == sha(state)


def test_a_changed_block_or_manifest_of_a_large_snapshot_fails_verify_and_load(tmp_path):
    store, _ = filed(tmp_path, LARGE)
    path = store.compact_path("s2")
    kept, _ = snapshot_file.read_stored(path)
    hashes = kept.nodes[0].state_blocks.hashes
    block = store.blocks.path(hashes[5])
    good = block.read_bytes()
    block.write_bytes(b"x" + good[1:])  # a block changed: its name no longer matches it
    verdict = snapshot_file.check(path)
    assert not verdict.ok and verdict.failed()[0].name == "blocks", verdict.as_dict()
    assert store.load("s2") is None
    block.write_bytes(good)
    assert store.load("s2") is not None
    hashes[5], hashes[6] = hashes[6], hashes[5]  # every block as named, the manifest not as filed
    path.write_bytes(snapshot_file.FORMAT_MARK + kept.SerializeToString(deterministic=True))
    verdict = snapshot_file.check(path)
    assert "checksum" in [c.name for c in verdict.failed()], verdict.as_dict()
    assert store.load("s2") is None and "does not match its checksum" in store.damaged["s2"]


def test_a_small_snapshot_keeps_the_whole_forms_checksum(tmp_path):
    store, state = filed(tmp_path, SMALL)
    whole, _ = snapshot_file.read_marked(store.compact_path("s2"))
    kept, _ = snapshot_file.read_stored(store.compact_path("s2"))
    assert whole.checksum == snapshot_file.checksum(whole) != snapshot_file.checksum(kept)
    assert whole.nodes[0].state == state
    exported, _ = snapshot_file.read_stored(store.path("s2"))
    assert exported.nodes[0].state == state and exported.checksum == whole.checksum
    assert snapshot_file.check(store.path("s2")).ok


@pytest.mark.parametrize("count", [LARGE, SMALL])
def test_a_wrong_digest_the_node_said_is_filed_as_the_bytes_hash_either_way(tmp_path, caplog, count):
    with caplog.at_level(logging.ERROR):
        store, state = filed(tmp_path, count, said="sha256:" + "00" * 32)
    assert "hashes to " + sha(state) in caplog.text
    for path in (store.compact_path("s2"), store.path("s2")):
        verdict = snapshot_file.check(path)
        assert verdict.ok, verdict.as_dict()
    assert store.load("s2").nodes[0].state_digest == sha(state)


def test_a_large_state_as_its_report_said_is_hashed_once_and_a_spoilt_block_is_not_filed(tmp_path, monkeypatch):
    """FS3: read unchecked, a state whose bytes hash to its report's digest has every block as
    named (no block hashed for its name); a block spoilt on disk before filing gives another
    digest, the state is read again checked, and the snapshot is not filed (FS2). The states
    are not kept in memory (over the kept blocks' bound, lowered: as at 64 MiB a node)."""
    monkeypatch.setattr(servicer, "JOINED_MAX_BYTES", 1024 * 1024)
    hashed = []
    real = blocks.block_hash

    def counting(store, report):
        monkeypatch.setattr(blocks, "block_hash", lambda block: hashed.append(1) or real(block))

    store, _ = filed(tmp_path / "as said", LARGE, before=counting, kept=1024 * 1024)
    assert hashed == [] and store.compact_path("s2").exists() and store.path("s2").exists()
    monkeypatch.setattr(blocks, "block_hash", real)

    def spoil(store, report):
        store.blocks.path(report.state_blocks.hashes[7]).write_bytes(b"y" * B)

    store, _ = filed(tmp_path / "spoilt", LARGE, before=spoil, kept=1024 * 1024)
    assert not store.compact_path("s2").exists() and not store.path("s2").exists()


@pytest.mark.parametrize("count", [LARGE, SMALL])
def test_a_digest_in_the_blocks_form_is_checked_and_filed_in_that_form(tmp_path, caplog, count):
    from snapmesh.protocol import statedigest

    state = bytearray(random.Random(count).randbytes(count * B))
    state[3 * B] ^= 1  # the second report's state (`filed`)
    said = statedigest.blocks_form(bytes(state))
    with caplog.at_level(logging.ERROR):
        store, got = filed(tmp_path / "right", count, said=said)
    assert got == bytes(state) and "hashes to" not in caplog.text
    assert store.load("s2").nodes[0].state_digest == said
    for path in (store.compact_path("s2"), store.path("s2")):
        verdict = snapshot_file.check(path)
        assert verdict.ok, verdict.as_dict()
    wrong = statedigest.blocks_form(b"other")
    with caplog.at_level(logging.ERROR):
        store, _ = filed(tmp_path / "wrong", count, said=wrong)
    assert f"hashes to {said}, not to the {wrong}" in caplog.text
    assert store.load("s2").nodes[0].state_digest == said


def test_a_blocks_form_digest_of_a_state_on_the_grid_is_checked_from_its_manifest(tmp_path, monkeypatch, caplog):
    """FS5: a state listed unjoined (its blocks' sizes known, each read checked) on the grid,
    its digest in the blocks form: filed with no block read; a wrong digest is still found."""
    from snapmesh.protocol import statedigest

    monkeypatch.setattr(servicer, "JOINED_MAX_BYTES", 1024 * 1024)
    state = bytearray(random.Random(LARGE).randbytes(LARGE * B))
    state[3 * B] ^= 1  # the second report's state (`filed`)
    said = statedigest.blocks_form(bytes(state))
    read = []

    def counting(store, report):
        real = store.blocks.read
        monkeypatch.setattr(store.blocks, "read", lambda name: read.append(name) or real(name))

    store, _ = filed(tmp_path / "right", LARGE, said=said, before=counting, kept=1024 * 1024)
    assert read == [] and store.compact_path("s2").exists()
    assert store.load("s2").nodes[0].state_digest == said
    wrong = statedigest.blocks_form(b"other")
    with caplog.at_level(logging.ERROR):
        store, _ = filed(tmp_path / "wrong", LARGE, said=wrong, before=counting, kept=1024 * 1024)
    assert f"hashes to {said}, not to the {wrong}" in caplog.text and len(read) >= LARGE
    assert store.load("s2").nodes[0].state_digest == said
