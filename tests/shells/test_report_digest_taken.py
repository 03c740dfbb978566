"""The controller takes the digest a report as blocks says for its state (the node hashed it at
its cut) rather than hashing the state again (servicer.py `_whole_report`); an old node's
report says none and the state is hashed. The store checks every listed state's digest
against its bytes when it files the snapshot (store.py), and files the bytes' digest."""

from __future__ import annotations

import hashlib
import logging
import random

from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks
from snapmesh.services.controller import servicer as servicer_module
from snapmesh.v1 import snapmesh_pb2 as pb
from support.report_service import report_service

B = blocks.BLOCK_BYTES


def sha(state: bytes) -> str:
    return "sha256:" + hashlib.sha256(state).hexdigest()


def listed(tmp_path, said: str | None):
    """A node's second report of a 16-block state, as blocks, saying `said` (None: no digest, an
    old node; the first, whole, says its right digest or none); the service, its forms, the
    store, the listed report and the state."""
    c = report_service(tmp_path)
    service, forms, store, writer = c.service, c.forms, c.store, c.writer
    state = bytearray(random.Random(8).randbytes(16 * B))
    node = c.first_report(bytes(state), "" if said is None else sha(bytes(state)))
    state[3 * B] ^= 1
    report = pb.FullState(snapshot_id="s2", node_id="p1", state=bytes(state), app_name="blob", app_version=1)
    if said is not None:
        report.state_digest = said
    sent, _ = node.form(report)
    assert sent.HasField("state_blocks") and sent.state_digest == (said or "")
    return service, forms, store, writer, service._whole_report(sent, 2), bytes(state)


def test_a_report_as_blocks_that_says_its_digest_is_not_hashed_again(tmp_path, monkeypatch):
    hashed = []
    monkeypatch.setattr(servicer_module, "digest", lambda state: hashed.append(len(state)) or "sha256:x")
    state = bytes(random.Random(8).randbytes(16 * B))
    state = state[:3 * B] + bytes([state[3 * B] ^ 1]) + state[3 * B + 1:]
    _, forms, _, writer, report, _ = listed(tmp_path, sha(state))
    writer.close()
    assert forms.of(report).digest == sha(state) and hashed == []


def test_an_old_nodes_report_says_no_digest_and_its_state_is_hashed(tmp_path):
    _, forms, _, writer, report, state = listed(tmp_path, None)
    writer.close()
    assert forms.of(report).digest == sha(state)


def test_a_listed_state_whose_report_said_a_wrong_digest_is_filed_with_its_bytes_digest(tmp_path, caplog):
    service, forms, store, writer, report, state = listed(tmp_path, "sha256:" + "00" * 32)
    snapshot = pb.Snapshot(snapshot_id="s2", status=pb.Snapshot.COMPLETE, initiator="p1")
    entry = snapshot.nodes.add(node_id="p1", app_name="blob", app_version=1)
    forms.fill(entry, forms.of(report))
    with caplog.at_level(logging.ERROR):
        store.save_compact(snapshot)
    writer.close()
    assert "hashes to " + sha(state) in caplog.text
    verdict = snapshot_file.check(store.compact_path("s2"))
    assert verdict.ok, verdict.as_dict()
    assert store.load("s2").nodes[0].state_digest == sha(state)
