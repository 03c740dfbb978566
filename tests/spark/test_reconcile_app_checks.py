"""The app checks of `snapmesh reconcile` as DataFrame transforms, on tiny inline tables.

`apps.app_discrepancies`: an app snapshot's in-flight payloads against the sends
logged in the sender's epoch before its cut, and each node's state against its cut
record's digest. `invariants.invariant_verdicts`: the app's SQL over its views,
one verdict per violated invariant and snapshot, and a view with no rows skipped.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual

from snapmesh.app import App, View
from snapmesh.reconcile import apps, invariants
from snapmesh.synth import writer as synth
from snapmesh.reconcile import job as reconcile_main
from support.spark_fixtures import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import token_ring  # noqa: E402

S = "s1"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


LOG_COLUMNS = "node string, lsn long, kind string, src string, dst string, seq long, snapshot_id string, " \
              "digest string, payload string"


def tables(spark, log, nodes, in_flight):  # noqa: F811
    return (
        spark.createDataFrame(log, LOG_COLUMNS),
        spark.createDataFrame(nodes, "snapshot_id string, node string, state_sha string, state_digest string"),
        spark.createDataFrame(in_flight, "snapshot_id string, src string, dst string, seq long, payload_sha string"),
    )


# p1 sent seq 1 ("token") in epoch 1, was restored at lsn 4, sent seq 1 ("new") again, then cut at lsn 6.
LOG = [
    ("p1", 2, "send", "p1", "p2", 1, None, None, b64(b"token")),
    ("p1", 4, "restore", None, None, None, "s0", None, None),
    ("p1", 5, "send", "p1", "p2", 1, None, None, b64(b"new")),
    ("p1", 6, "cut", None, None, None, S, sha(b"0"), None),
    ("p1", 7, "send", "p1", "p2", 2, None, None, b64(b"later")),
    ("p2", 3, "cut", None, None, None, S, sha(b"1"), None),
]


def test_a_clean_app_snapshot_has_no_discrepancy(spark):  # noqa: F811
    nodes = [(S, "p1", sha(b"0"), "sha256:" + sha(b"0")), (S, "p2", sha(b"1"), "sha256:" + sha(b"1"))]
    found = apps.app_discrepancies(*tables(spark, LOG, nodes, [(S, "p1", "p2", 1, sha(b"new"))]))
    assert found.count() == 0


def test_the_payload_is_the_one_of_the_senders_epoch(spark):  # noqa: F811
    nodes = [(S, "p1", sha(b"0"), "sha256:" + sha(b"0")), (S, "p2", sha(b"1"), "sha256:" + sha(b"1"))]
    # the epoch before the restore sent "token" as seq 1: not what this snapshot's epoch sent
    found = apps.per_snapshot(apps.app_discrepancies(*tables(spark, LOG, nodes, [(S, "p1", "p2", 1, sha(b"token"))])))
    expected = spark.createDataFrame(
        [(S, 1, f"channel p1->p2: in-flight seq 1 payload sha256:{sha(b'token')[:12]}, p1 logged sha256:{sha(b'new')[:12]}")],
        "snapshot_id string, discrepancies long, first string",
    )
    assertDataFrameEqual(found, expected)


def test_a_state_digest_or_state_bytes_not_the_cut_records_are_found(spark):  # noqa: F811
    nodes = [(S, "p1", sha(b"0"), "sha256:" + "0" * 64), (S, "p2", sha(b"2"), "sha256:" + sha(b"1")), (S, "p3", None, "")]
    found = apps.app_discrepancies(*tables(spark, LOG, nodes, [(S, "p1", "p2", 1, None)]))
    texts = sorted(r["d"]["text"] for r in found.collect())
    assert texts == sorted([
        f"node p1: state digest sha256:000000000000, its cut record says sha256:{sha(b'0')[:12]}",
        f"node p2: recorded state hashes to sha256:{sha(b'2')[:12]}, its cut record says sha256:{sha(b'1')[:12]}",
        "node p3: no state recorded",
        "channel p1->p2: in-flight seq 1 has no payload",
    ])


def test_fold_marks_a_consistent_snapshot_and_counts_onto_an_inconsistent_one():
    rows = [
        {"scope": "logs", "snapshot_id": None, "consistent": True, "discrepancies": 0, "first_discrepancy": None},
        {"scope": "snapshot", "snapshot_id": "a", "consistent": True, "discrepancies": 0, "first_discrepancy": None},
        {"scope": "snapshot", "snapshot_id": "b", "consistent": False, "discrepancies": 2, "first_discrepancy": "x"},
    ]
    got = apps.fold(rows, {"a": (1, "payload"), "b": (3, "digest")})
    assert [(r["consistent"], r["discrepancies"], r["first_discrepancy"]) for r in got] == [
        (True, 0, None), (False, 1, "payload"), (False, 5, "x")]


def ring_view(sid: str, states: dict[str, bytes], in_flight=()) -> View:
    return View(snapshot_id=sid, states=states, in_flight=list(in_flight))


def test_the_apps_sql_gives_one_verdict_per_violated_snapshot_and_skips_an_empty_view(spark):  # noqa: F811
    views = [
        ring_view("a", {"p1": b"1", "p2": b"0"}),
        ring_view("b", {"p1": b"0", "p2": b"1"}, [("p1", "p2", 3, b"token")]),  # two tokens
    ]
    rows = invariants.invariant_verdicts(spark, token_ring.app, views)
    assert [(r["scope"], r["snapshot_id"], r["consistent"]) for r in rows] == [("invariant", "b", False)]
    assert "'one token'" in rows[0]["first_discrepancy"] and '"tokens": 2' in rows[0]["first_discrepancy"]
    assert rows[0]["discrepancies"] == 1

    holds = invariants.invariant_verdicts(spark, token_ring.app, views[:1])
    assert [(r["consistent"], r["first_discrepancy"]) for r in holds] == [(True, "invariant 'one token' holds in 1 snapshot(s)")]

    moving = App(name="moving", new=token_ring.TokenRing, views={"moving": lambda v: []},
                 sql_invariants={"nothing moves": "SELECT snapshot_id FROM moving"})
    skipped = invariants.invariant_verdicts(spark, moving, views)
    assert [(r["consistent"], r["first_discrepancy"]) for r in skipped] == [
        (None, "invariant 'nothing moves' skipped: view(s) moving had no rows in any snapshot (no schema to give them)")]

    wrong = App(name="wrong", new=token_ring.TokenRing, views={"tokens": token_ring.token_rows},
                sql_invariants={"typo": "SELECT snapshot_id, nope FROM tokens"})
    failed = invariants.invariant_verdicts(spark, wrong, views)
    assert [(r["consistent"], r["snapshot_id"]) for r in failed] == [(False, None)]
    assert failed[0]["first_discrepancy"].startswith("invariant 'typo': the query failed: ")


def test_a_bad_app_is_one_line_and_exit_2_before_spark_starts(capsys, tmp_path):
    assert reconcile_main.main(["--data-dir", str(tmp_path), "--app", "no_such_module_anywhere:app"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_module_anywhere" in err[0], err


def test_a_bank_export_is_untouched_and_an_app_given_for_it_is_a_skipped_row(spark, tmp_path):  # noqa: F811
    synth.generate(str(tmp_path), nodes=3, transfers=300, snapshots=3, seed=11)
    plain = reconcile_main.reconcile(spark, str(tmp_path))
    with_app = reconcile_main.reconcile(spark, str(tmp_path), app=token_ring.app, app_module="token_ring")
    assert plain.exit_status == with_app.exit_status == 0
    assert with_app.verdicts[:-1] == plain.verdicts
    assert (with_app.verdicts[-1]["scope"], with_app.verdicts[-1]["consistent"]) == ("invariant", None)


def test_a_built_in_app_is_not_shipped_and_a_users_module_is(spark, tmp_path):  # noqa: F811
    # kvshard's top-level package is snapmesh, which the executors run already; zipping it
    # would miss snapmesh/services (a link). A user's module is shipped as its own file.
    assert invariants.ship_module(spark, "snapmesh.services.app.kvshard") is None
    assert invariants.ship_module(spark, "token_ring") == token_ring.__file__


def test_a_state_in_the_blocks_form_is_checked_in_that_form(spark):  # noqa: F811
    from snapmesh.protocol import statedigest

    big, other = b"a" * 70_000, b"b" * 70_000
    said = statedigest.blocks_form(big)
    log = [("p1", 6, "cut", None, None, None, S, said, None), ("p2", 3, "cut", None, None, None, S, sha(b"1"), None)]
    raw_nodes = spark.createDataFrame(
        [(S, "p1", b64(big), said), (S, "p2", b64(b"1"), "sha256:" + sha(b"1"))],
        "snapshot_id string, node string, state string, state_digest string")
    nodes = raw_nodes.select("snapshot_id", "node", apps.state_hex("state", "state_digest").alias("state_sha"),
                             "state_digest")
    assert {r["node"]: r["state_sha"] for r in nodes.collect()} == {"p1": said.split(":")[1], "p2": sha(b"1")}
    found = apps.app_discrepancies(*tables(spark, log, nodes.collect(), []))
    assert found.count() == 0
    changed = [(S, "p1", statedigest.blocks_form(other).split(":")[1], said), (S, "p2", sha(b"1"), "sha256:" + sha(b"1"))]
    texts = [r["d"]["text"] for r in apps.app_discrepancies(*tables(spark, log, changed, [])).collect()]
    assert texts == [f"node p1: recorded state hashes to sha256:{changed[0][2][:12]}, its cut record says "
                     f"sha256:{said.split(':')[1][:12]}"]
    whole = [(S, "p1", sha(big), "sha256:" + sha(big)), (S, "p2", sha(b"1"), "sha256:" + sha(b"1"))]
    texts = [r["d"]["text"] for r in apps.app_discrepancies(*tables(spark, log, whole, [])).collect()]
    assert len(texts) == 2 and texts[0].startswith("node p1: ")  # a digest in the other form is not this one
