"""An app's views and figures are computed on the executors (`appviews`), not the driver.

On a synth app's logs and export (one snapshot doctored: a message left out), an
app whose views, SQL invariants and describe read every node of a snapshot gives
the same verdict rows (the app checks, the figures, the invariants) whether the
export holds its states inline or as manifests of blocks, while every way the
driver had of reading a block or assembling a View raises if called. With one
block corrupt, and with one gone, the run does not crash: that snapshot's row names
(snapshot, node, hash), and the invariants and figures cover the other snapshots,
as they did when the driver made the Views.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from pyspark import cloudpickle

from snapmesh.app import App, View
from snapmesh.reconcile import appviews, blockstates, figures, invariants
from snapmesh.reconcile import job as reconcile_main
from snapmesh.reconcile.job import read_snapshots
from snapmesh.reconcile.schema import APP_SNAPSHOT
from snapmesh.synth import apps as synth_apps
from support.spark_fixtures import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

# The executors cannot import this test module (pytest puts tests/ on the driver's path
# only): its functions travel by value, as an --app module's would by addPyFile.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _states(view: View) -> dict[str, dict]:
    return {node: json.loads(state) for node, state in view.states.items()}


def node_rows(view: View) -> list[dict]:
    """A row per node, each naming how many nodes its snapshot has (a whole-snapshot view)."""
    return [{"snapshot_id": view.snapshot_id, "node": node, "sent": s["sent"], "received": s["received"],
             "nodes": len(view.states)} for node, s in sorted(_states(view).items())]


def moving_rows(view: View) -> list[dict]:
    return [{"snapshot_id": view.snapshot_id, "src": src, "dst": dst, "seq": seq, "size": len(p)}
            for src, dst, seq, p in view.in_flight]


def describe(view: View) -> dict:
    states = _states(view)
    return {"total": sum(s["sent"] for s in states.values()),
            "expected_total": sum(s["received"] for s in states.values()) + len(view.in_flight),
            "in_flight": len(view.in_flight)}


COUNTED = """
SELECT n.snapshot_id, n.sent, n.received, COALESCE(m.moving, 0) AS moving
FROM (SELECT snapshot_id, SUM(sent) AS sent, SUM(received) AS received FROM counts GROUP BY snapshot_id) n
LEFT JOIN (SELECT snapshot_id, COUNT(*) AS moving FROM moving GROUP BY snapshot_id) m ON m.snapshot_id = n.snapshot_id
WHERE n.sent <> n.received + COALESCE(m.moving, 0)
"""
BUSY = "SELECT snapshot_id, node, sent FROM counts WHERE sent > 10 AND nodes = 3"

APP = App(name="counting", new=lambda info: None, views={"counts": node_rows, "moving": moving_rows},
          sql_invariants={"every send counted": COUNTED, "none busy": BUSY}, describe=describe)


def inline_data(root: Path) -> Path:
    data = root / "inline"
    synth_apps.generate_app(str(data), nodes=3, messages=200, snapshots=4, seed=7, doctor=("lost-inflight",))
    for path in (data / "snapshots").glob("*.json"):  # the synth's claimed zeros are not this app's figures (F2)
        document = json.loads(path.read_text())
        del document["total"], document["expected_total"]
        path.write_text(json.dumps(document, indent=2))
    return data


def as_manifests(inline: Path, root: Path) -> tuple[Path, dict[str, dict[str, list[str]]]]:
    """A copy of `inline` with every node's state a manifest of 16-byte blocks (several per
    state, one shared by whoever has the same bytes); snapshot -> node -> its block names (hex)."""
    data = root / "manifests"
    shutil.copytree(inline, data)
    blocks = data / "controller" / "blocks"
    blocks.mkdir(parents=True)
    names: dict[str, dict[str, list[str]]] = {}
    for path in sorted((data / "snapshots").glob("*.json")):
        document = json.loads(path.read_text())
        for node in document["nodes"]:
            state = base64.b64decode(node.pop("state"))
            hashes = []
            for at in range(0, len(state), 16):
                block = state[at:at + 16]
                name = hashlib.sha256(block).digest()
                (blocks / name.hex()).write_bytes(block)
                hashes.append(base64.b64encode(name).decode())
                names.setdefault(document["snapshot_id"], {}).setdefault(node["node_id"], []).append(name.hex())
            node["state_blocks"] = {"hashes": hashes}
        path.write_text(json.dumps(document, indent=2))
    return data, names


def run(spark, data: Path) -> list[dict]:  # noqa: F811
    outcome = reconcile_main.reconcile(spark, str(data), app=APP, app_spec=synth_apps.APP_SPEC)
    assert not outcome.bad_input, outcome.bad_input
    return outcome.verdicts


def no_driver_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("a state was read on the driver")

    for name in ("reader", "local_reader", "hadoop_reader", "assemble"):
        monkeypatch.setattr(blockstates, name, no)
    for name in ("assemble", "app_views", "view_of"):
        monkeypatch.setattr(invariants, name, no)


def test_manifest_states_give_the_inline_states_verdicts_with_no_state_on_the_driver(spark, tmp_path, monkeypatch):  # noqa: F811
    inline = inline_data(tmp_path)
    manifests, _ = as_manifests(inline, tmp_path)
    expected = run(spark, inline)
    snapshots = [r for r in expected if r["scope"] == "snapshot"]
    assert [(r["snapshot_id"], r["consistent"], r["observed_total"] is not None) for r in snapshots] == [
        ("a-1", False, True), ("a-2", True, True), ("a-3", True, True), ("a-4", True, True)]
    invariant_rows = [(r["snapshot_id"], r["consistent"]) for r in expected if r["scope"] == "invariant"]
    assert ("a-1", False) in invariant_rows  # the message left out: a send not counted
    assert any(c is False and s not in ("a-1", None) for s, c in invariant_rows)  # a busy node: rows across nodes

    no_driver_reads(monkeypatch)
    assert run(spark, manifests) == expected
    assert run(spark, inline) == expected  # the inline path needs no block reader either


def test_a_corrupt_or_missing_block_names_snapshot_node_and_hash_and_the_rest_is_checked(spark, tmp_path, monkeypatch):  # noqa: F811
    inline = inline_data(tmp_path)
    manifests, names = as_manifests(inline, tmp_path)
    no_driver_reads(monkeypatch)
    whole = run(spark, manifests)
    target = manifests / "controller" / "blocks" / names["a-3"]["p2"][1]
    assert all(target.name not in node for sid, nodes in names.items() if sid != "a-3" for node in nodes.values())
    content = target.read_bytes()

    def a3(rows: list[dict]) -> dict:
        return next(r for r in rows if r["scope"] == "snapshot" and r["snapshot_id"] == "a-3")

    for broken, why in ((b"\xff" + content[1:], "corrupt: its content hashes to sha256:"),
                        (None, f"missing from {manifests}/controller/blocks")):
        if broken is None:
            target.unlink()
        else:
            target.write_bytes(broken)
        got = run(spark, manifests)
        row = a3(got)
        assert row["consistent"] is False
        assert row["first_discrepancy"].startswith(f"snapshot a-3, node p2, block sha256:{target.name}: {why}")
        assert row["observed_total"] is None  # no View, so no figures, as on the driver
        others = [r for r in got if r["snapshot_id"] != "a-3" and r["scope"] != "invariant"]
        assert others == [r for r in whole if r["snapshot_id"] != "a-3" and r["scope"] != "invariant"]
        invariant_rows = [r for r in got if r["scope"] == "invariant"]  # a-3 has no View, so no violation
        assert any(r["snapshot_id"] == "a-3" for r in whole if r["scope"] == "invariant")
        assert invariant_rows == [r for r in whole if r["scope"] == "invariant" and r["snapshot_id"] != "a-3"]


def test_spark_s_binary_file_source_gives_the_executors_python_reads(spark, tmp_path, monkeypatch):  # noqa: F811
    """hdfs://, s3a://: the blocks joined to their rows by name, as `through_blocks` reads them."""
    inline = inline_data(tmp_path)
    manifests, _ = as_manifests(inline, tmp_path)
    no_driver_reads(monkeypatch)

    def computed(data: Path, **how: object) -> list[appviews.Computed]:
        raw = read_snapshots(spark, str(data), APP_SNAPSHOT)
        job = appviews.Job(app=APP, figured=figures.apps_of(figures.claims(raw), APP, synth_apps.APP_SPEC), params={})
        return appviews.computed(spark, str(data), raw, job, **how)

    expected = computed(inline)
    assert [c.snapshot_id for c in expected] == ["a-1", "a-2", "a-3", "a-4"]
    assert all(c.rows["counts"] and c.figures is not None and not c.errors for c in expected)
    assert computed(manifests, hadoop=True) == expected
