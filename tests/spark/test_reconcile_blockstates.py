"""A state exported as a manifest, read by the reconciliation through its blocks
(snapmesh/reconcile/blockstates.py), on a hand-built export and blocks dir: a whole
manifest gives the state's sha256 (and bytes, for the views) as its inline form
would; a missing block and a corrupt one are each named (snapshot, node, hash),
and then nothing is assembled. The Spark side (`apps.through_blocks`) turns a
manifest into the same state_sha an inline state has, and a bad block into a
discrepancy row that names it."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

from support.spark_fixtures import spark  # noqa: F401

from snapmesh.protocol import blocks
from snapmesh.reconcile import apps, blockstates
from snapmesh.reconcile.invariants import view_of
from snapmesh.reconcile.job import read_snapshots
from snapmesh.reconcile.schema import APP_SNAPSHOT

STATE = random.Random(3).randbytes(5 * blocks.BLOCK_BYTES + 100)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hand_built(root: Path) -> tuple[Path, list[bytes]]:
    """A data dir with one app snapshot "s1": p1's state as a manifest over
    controller/blocks, p2's inline; and p1's block hashes."""
    (root / "controller" / "blocks").mkdir(parents=True)
    (root / "snapshots").mkdir()
    names = []
    for block in blocks.split(STATE):
        names.append(blocks.block_hash(block))
        (root / "controller" / "blocks" / names[-1].hex()).write_bytes(block)
    digest = "sha256:" + hashlib.sha256(STATE).hexdigest()
    export = {"snapshot_id": "s1", "status": "COMPLETE", "app": {"spec": "m:app", "name": "m"},
              "nodes": [{"node_id": "p1", "state_digest": digest, "state_blocks": {"hashes": [b64(n) for n in names]}},
                        {"node_id": "p2", "state": b64(b"small"),
                         "state_digest": "sha256:" + hashlib.sha256(b"small").hexdigest()}],
              "channels": []}
    (root / "snapshots" / "s1.json").write_text(json.dumps(export, indent=2))
    return root, names


def test_a_whole_manifest_reads_as_its_state_and_a_bad_block_is_named(tmp_path) -> None:
    data, names = hand_built(tmp_path)
    read = blockstates.local_reader(str(data / "controller" / "blocks"))
    hashes = [b64(n) for n in names]
    got = blockstates.assemble(read, "s1", "p1", hashes, keep=True)
    assert got.problems == () and got.sha256 == hashlib.sha256(STATE).hexdigest() and got.state == STATE
    assert blockstates.assemble(read, "s1", "p1", hashes).state is None  # the digest alone: no state held

    (data / "controller" / "blocks" / names[2].hex()).unlink()
    bad = data / "controller" / "blocks" / names[4].hex()
    bad.write_bytes(b"\x00" + bad.read_bytes()[1:])
    got = blockstates.assemble(read, "s1", "p1", hashes, keep=True, where="D")
    assert got.sha256 is None and got.state is None
    assert got.problems == tuple(str(blocks.BlockProblem(snapshot_id="s1", node_id="p1", hash=name, why=why)) for name, why in (
        (names[2], "missing from D"),
        (names[4], f"corrupt: its content hashes to sha256:{blocks.block_hash(bad.read_bytes()).hex()}"),
    ))  # as `snapshot verify` words them
    assert blockstates.assemble(read, "s1", "p1", ["bm90IGEgaGFzaA=="]).problems == (
        "snapshot s1, node p1, block 'bm90IGEgaGFzaA==': not a sha256 hash",)


def test_spark_reads_a_manifest_state_as_an_inline_one_and_names_a_bad_block(spark, tmp_path):  # noqa: F811
    data, names = hand_built(tmp_path)
    raw = read_snapshots(spark, str(data), APP_SNAPSHOT)

    def nodes() -> dict[str, tuple]:
        rows = apps.through_blocks(spark, str(data), apps.app_nodes(raw)).collect()
        return {r["node"]: (r["state_sha"], r["block_problem"]) for r in rows}

    assert nodes() == {"p1": (hashlib.sha256(STATE).hexdigest(), None),
                       "p2": (hashlib.sha256(b"small").hexdigest(), None)}
    view = view_of(raw.collect()[0].asDict(recursive=True), {}, blockstates.reader(spark, str(data)))
    assert view is not None and view.states == {"p1": STATE, "p2": b"small"}

    bad = data / "controller" / "blocks" / names[1].hex()
    bad.write_bytes(bad.read_bytes()[:-1])
    found = nodes()
    assert found["p1"][0] is None and found["p1"][1].startswith(
        f"snapshot s1, node p1, block sha256:{names[1].hex()}: corrupt")
    assert view_of(raw.collect()[0].asDict(recursive=True), {}, blockstates.reader(spark, str(data))) is None
    bad.unlink()
    assert nodes()["p1"] == (None, f"snapshot s1, node p1, block sha256:{names[1].hex()}: missing from "
                                   f"{data}/controller/blocks")


def test_a_manifest_whose_digest_is_in_the_blocks_form_reads_in_that_form(spark, tmp_path):  # noqa: F811
    from snapmesh.protocol import statedigest

    data, names = hand_built(tmp_path)
    read = blockstates.local_reader(str(data / "controller" / "blocks"))
    got = blockstates.assemble_read(((n, b64(n), read(n)) for n in names), "s1", "p1", blocks=True)
    assert got.sha256 == statedigest.blocks_form(STATE).split(":")[1]
    path = data / "snapshots" / "s1.json"
    export = json.loads(path.read_text())
    export["nodes"][0]["state_digest"] = statedigest.blocks_form(STATE)
    path.write_text(json.dumps(export))
    raw = read_snapshots(spark, str(data), APP_SNAPSHOT)
    rows = {r["node"]: r["state_sha"] for r in apps.through_blocks(spark, str(data), apps.app_nodes(raw)).collect()}
    assert rows == {"p1": statedigest.blocks_form(STATE).split(":")[1], "p2": hashlib.sha256(b"small").hexdigest()}
