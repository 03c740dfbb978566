"""The reconciliation reads manifest states' blocks on the executors
(`blockstates.through_blocks`), on a hand-built export and blocks dir.

Its rows are the ones the driver's `assemble` gives for every kind of manifest
(whole, with a corrupt block and a missing one, of no hash, with a hash that is
not one, blocks shared by two snapshots), through the executors' Python and
through Spark's binaryFile source alike, while the driver's block readers would
fail if called. A corrupt block file and a deleted one each make the snapshot
inconsistent with a discrepancy naming (snapshot, node, hash), not a crash; a
whole manifest whose state is not the cut record's is the state-bytes
discrepancy.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

import pytest

from snapmesh.protocol import blocks
from snapmesh.reconcile import apps, blockstates
from snapmesh.reconcile.job import read_snapshots
from snapmesh.reconcile.schema import APP_SNAPSHOT
from support.spark_fixtures import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

ONE = random.Random(1).randbytes(3 * blocks.BLOCK_BYTES + 7)
TWO = random.Random(2).randbytes(4 * blocks.BLOCK_BYTES)
NOT_A_HASH = base64.b64encode(b"short").decode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def store(root: Path, state: bytes) -> list[bytes]:
    """`state`'s blocks written under root's blocks dir; their hashes, in order."""
    names = []
    for block in blocks.split(state):
        names.append(blocks.block_hash(block))
        (root / "controller" / "blocks" / names[-1].hex()).write_bytes(block)
    return names


def manifest(node: str, state: bytes, hashes: list[str]) -> dict:
    return {"node_id": node, "state_digest": "sha256:" + sha(state), "state_blocks": {"hashes": hashes}}


def export(root: Path, snapshot_id: str, nodes: list[dict]) -> None:
    document = {"snapshot_id": snapshot_id, "status": "COMPLETE", "app": {"spec": "m:app", "name": "m"},
                "nodes": nodes, "channels": []}
    (root / "snapshots" / f"{snapshot_id}.json").write_text(json.dumps(document, indent=2))


def data_dir(root: Path) -> tuple[Path, list[bytes], list[bytes]]:
    """s1: p1 ONE as a manifest, p2 inline, p3 a manifest of no hash, p4 one with a
    hash that is not one; s2: p1 ONE again (the same blocks), p2 TWO. The hashes of
    ONE and TWO."""
    (root / "controller" / "blocks").mkdir(parents=True)
    (root / "snapshots").mkdir()
    one, two = store(root, ONE), store(root, TWO)
    export(root, "s1", [manifest("p1", ONE, [b64(n) for n in one]),
                        {"node_id": "p2", "state": b64(b"small"), "state_digest": "sha256:" + sha(b"small")},
                        manifest("p3", b"", []),
                        manifest("p4", ONE, [b64(one[0]), NOT_A_HASH])])
    export(root, "s2", [manifest("p1", ONE, [b64(n) for n in one]), manifest("p2", TWO, [b64(n) for n in two])])
    return root, one, two


def on_the_driver(spark, data: Path) -> set[tuple]:  # noqa: F811
    """(snapshot, node, state_sha, block_problem) of every app node, the manifests
    assembled on the driver, as the reconciliation did before."""
    nodes = apps.app_nodes(read_snapshots(spark, str(data), APP_SNAPSHOT)).collect()
    read, where = blockstates.reader(spark, str(data)), blockstates.blocks_dir(str(data))
    out = set()
    for n in nodes:
        if n["hashes"] is None:
            out.add((n["snapshot_id"], n["node"], n["state_sha"], None))
            continue
        got = blockstates.assemble(read, n["snapshot_id"], n["node"], n["hashes"], where=where)
        out |= {(n["snapshot_id"], n["node"], got.sha256, p) for p in got.problems or (None,)}
    return out


def on_the_executors(spark, data: Path, **how) -> set[tuple]:  # noqa: F811
    nodes = apps.app_nodes(read_snapshots(spark, str(data), APP_SNAPSHOT))
    rows = blockstates.through_blocks(spark, str(data), nodes, **how).collect()
    return {(r["snapshot_id"], r["node"], r["state_sha"], r["block_problem"]) for r in rows}


def test_the_executors_give_the_drivers_rows_and_the_driver_reads_no_block(spark, tmp_path, monkeypatch):  # noqa: F811
    data, one, two = data_dir(tmp_path)
    bad = data / "controller" / "blocks" / two[1].hex()
    bad.write_bytes(bad.read_bytes()[::-1])  # s2's p2: a corrupt block, and then a missing one
    (data / "controller" / "blocks" / two[3].hex()).unlink()
    expected = on_the_driver(spark, data)
    assert {(s, n, h) for s, n, h, p in expected if p is None} == {
        ("s1", "p1", sha(ONE)), ("s1", "p2", sha(b"small")), ("s1", "p3", sha(b"")), ("s2", "p1", sha(ONE))}
    assert {p for *_, p in expected if p is not None} == {
        f"snapshot s1, node p4, block {NOT_A_HASH!r}: not a sha256 hash",
        f"snapshot s2, node p2, block sha256:{two[1].hex()}: corrupt: its content hashes to "
        f"sha256:{sha(bad.read_bytes())}",
        f"snapshot s2, node p2, block sha256:{two[3].hex()}: missing from {data}/controller/blocks",
    }

    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("a block was read on the driver")

    for name in ("reader", "local_reader", "hadoop_reader", "assemble"):
        monkeypatch.setattr(blockstates, name, no)
    assert on_the_executors(spark, data) == expected
    assert on_the_executors(spark, data, hadoop=True) == expected  # hdfs://, s3a://: Spark's binaryFile source


def test_without_a_blocks_dir_every_block_is_missing_both_ways(spark, tmp_path):  # noqa: F811
    (tmp_path / "snapshots").mkdir()
    name = blocks.block_hash(b"gone")
    export(tmp_path, "s1", [manifest("p1", b"gone", [b64(name)])])
    missing = {("s1", "p1", None, f"snapshot s1, node p1, block sha256:{name.hex()}: missing from "
                                  f"{tmp_path}/controller/blocks")}
    assert on_the_executors(spark, tmp_path) == missing
    assert on_the_executors(spark, tmp_path, hadoop=True) == missing


LOG_COLUMNS = "node string, lsn long, kind string, src string, dst string, seq long, snapshot_id string, " \
              "digest string, payload string"


def verdicts(spark, data: Path, cut_of_p1: bytes) -> list[tuple[str, str]]:  # noqa: F811
    """(snapshot, discrepancy) of s1 with only p1 (ONE) and p2 (inline), p1's cut
    record holding the digest of `cut_of_p1`."""
    log = spark.createDataFrame([("p1", 3, "cut", None, None, None, "s1", sha(cut_of_p1), None),
                                 ("p2", 4, "cut", None, None, None, "s1", sha(b"small"), None)], LOG_COLUMNS)
    raw = read_snapshots(spark, str(data), APP_SNAPSHOT).filter("snapshot_id = 's1'")
    nodes = apps.through_blocks(spark, str(data), apps.app_nodes(raw).filter("node in ('p1', 'p2')"))
    found = apps.app_discrepancies(log, nodes, apps.app_in_flight(raw))
    return sorted((r["snapshot_id"], r["d"]["text"]) for r in found.collect())


def test_a_corrupt_or_deleted_block_is_a_discrepancy_naming_snapshot_node_and_hash(spark, tmp_path):  # noqa: F811
    data, one, _ = data_dir(tmp_path)
    assert verdicts(spark, data, ONE) == []  # whole: the state the cut record names
    assert verdicts(spark, data, b"other") == [  # the export's digest, and the bytes read through the blocks
        ("s1", f"node p1: recorded state hashes to sha256:{sha(ONE)[:12]}, its cut record says sha256:{sha(b'other')[:12]}"),
        ("s1", f"node p1: state digest sha256:{sha(ONE)[:12]}, its cut record says sha256:{sha(b'other')[:12]}"),
    ]
    bad = data / "controller" / "blocks" / one[2].hex()
    whole = bad.read_bytes()
    bad.write_bytes(b"\xff" + whole[1:])
    assert verdicts(spark, data, ONE) == [("s1", f"snapshot s1, node p1, block sha256:{one[2].hex()}: corrupt: "
                                                 f"its content hashes to sha256:{sha(bad.read_bytes())}")]
    bad.write_bytes(whole)
    (data / "controller" / "blocks" / one[0].hex()).unlink()
    assert verdicts(spark, data, ONE) == [("s1", f"snapshot s1, node p1, block sha256:{one[0].hex()}: missing "
                                                 f"from {data}/controller/blocks")]
