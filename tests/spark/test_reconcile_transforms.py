"""The reconciliation checks on tiny inline DataFrames, with one corruption each.

One hand-written Chandy-Lamport run of three nodes (p1 initiates; p3 records first,
p2 records on p3's marker while p1's transfer p1:p2:1 is still on the wire, so it is
in flight). Every node logs five cut records in a row, one per snapshot id, so the
five snapshots share the same cut and differ only in what they claim: one is right,
the others each carry one corruption. One verdict computation checks all of them.
"""

from __future__ import annotations

import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from snapmesh.reconcile import checksums, log_checks, parse
from snapmesh.reconcile import verdicts as V
from snapmesh.reconcile.schema import EVENT, SNAPSHOT, VERDICT
from support.spark_fixtures import spark  # noqa: F401
from support.spark_data import LOGS, recv, send, snapshot_doc, two_epochs

pytestmark = pytest.mark.spark













def event_rows(logs: dict[str, list[dict]]) -> list[tuple]:
    rows = []
    for node, records in logs.items():
        for lsn, r in enumerate(records, 1):
            full = dict(file=f"{node}.log.jsonl", line=lsn, node=node, lsn=lsn, **r)
            rows.append(tuple(full.get(name) for name in EVENT.fieldNames()))
    return rows




SNAPSHOTS = [
    snapshot_doc("ok", 0),
    snapshot_doc("bal", 1, balances={"p1": 90, "p2": 101, "p3": 100}),
    snapshot_doc("miss", 2, p1_p2=[]),
    snapshot_doc("extra", 3, p1_p2=[("p1:p2:1", 10, 1), ("p1:p2:3", 5, 3)]),
    snapshot_doc("node", 4, balances={"p1": 90, "p2": 100}),
    snapshot_doc("f", 5, status="FAILED", reason="timeout"),
]


@pytest.fixture(scope="module")
def inputs(spark):  # noqa: F811
    evs = spark.createDataFrame(event_rows(LOGS), EVENT)
    return evs, parse.typed_snapshots(spark.createDataFrame(SNAPSHOTS, SNAPSHOT))


@pytest.fixture(scope="module", params=["exact", "checksums"])
def verdicts(request, inputs):
    """The same rows whether the checksums settle a snapshot or the exact joins name its discrepancies."""
    evs, snaps = inputs
    rows = V.reconciled(evs, snaps, exact=request.param == "exact")
    return {r["snapshot_id"]: tuple(r[name] for name in VERDICT.fieldNames()) for r in rows}


def test_checksums_settle_the_consistent_snapshots_and_only_those(inputs):
    evs, snaps = inputs
    facts = checksums.LogFacts.of(r.asDict() for r in checksums.interval_sums(evs, checksums.interval_table(
        evs.sparkSession, [(r.node, r.lsn) for r in checksums.cut_rows(evs).collect()])).collect())
    settled = checksums.certify(
        facts,
        {},
        [r.asDict() for r in checksums.cut_rows(evs).collect()],
        [r.asDict(recursive=True) for r in checksums.snapshot_sums(snaps).collect()],
    )
    assert settled.logs_settled
    assert [r["snapshot_id"] for r in settled.rows] == [None, "ok", "f"]
    assert settled.unsettled == ["bal", "miss", "extra", "node"]


def test_verdict_rows_have_the_verdict_schema_and_order(verdicts):
    assert list(verdicts) == [None, "ok", "bal", "miss", "extra", "node", "f"]
    assert len(next(iter(verdicts.values()))) == len(VERDICT.fields)


def test_consistent_snapshot_and_clean_logs(verdicts):
    assert verdicts[None] == ("logs", None, "-", True, 3, 6, 300, None, 0, None)
    assert verdicts["ok"] == ("snapshot", "ok", "COMPLETE", True, 3, 6, 300, 300, 0, None)


def test_balance_off_by_one(verdicts):
    # Also breaks conservation and the snapshot's own total: 3 discrepancies, the node first.
    assert verdicts["bal"] == (
        "snapshot", "bal", "COMPLETE", False, 3, 6, 300, 301, 3, "node p2: recorded 101, logs say 100 before cut",
    )


def test_missing_in_flight_transfer(verdicts):
    assert verdicts["miss"] == (
        "snapshot", "miss", "COMPLETE", False, 3, 6, 300, 290, 3, "channel p1->p2: missing in-flight p1:p2:1",
    )


def test_extra_in_flight_sent_after_the_senders_cut(verdicts):
    assert verdicts["extra"] == (
        "snapshot", "extra", "COMPLETE", False, 3, 6, 300, 305, 3,
        "channel p1->p2: in-flight p1:p2:3 was sent after p1's cut",
    )


def test_snapshot_missing_a_node(verdicts):
    assert verdicts["node"] == (
        "snapshot", "node", "COMPLETE", False, 2, 6, 300, 200, 3, "snapshot missing node p3",
    )


def test_failed_snapshot_is_skipped_not_consistent(verdicts):
    assert verdicts["f"] == ("snapshot", "f", "FAILED", None, 0, 0, 300, None, 0, "skipped: status FAILED: timeout")


def test_transfer_received_twice_and_sequence_gap(spark):  # noqa: F811
    logs = {node: list(records) for node, records in LOGS.items()}
    logs["p2"].append(recv("p1:p2:3", "p1", "p2", 3, 5))  # received twice
    logs["p3"].append(send("p3:p1:3", "p3", "p1", 3, 7))  # seq 2 skipped on p3->p1
    logs["p1"].append(recv("p3:p1:3", "p3", "p1", 3, 7))
    found = log_checks.log_discrepancies(spark.createDataFrame(event_rows(logs), EVENT)).collect()
    assert sorted(tuple(r.d) for r in found) == [
        (3, "msg_id p1:p2:3: received 2 times"),
        (4, "channel p1->p2: seq 3 logged 2 times by receiver p2"),
        (4, "channel p3->p1: seq 2 missing from receiver p1's log"),
        (4, "channel p3->p1: seq 2 missing from sender p3's log"),
    ]


def test_truncated_and_malformed_lines_named_with_file_and_line(spark):  # noqa: F811
    f = "file:///data/p1.log.jsonl"
    second_split = 1 << 33  # monotonically_increasing_id of the next partition
    lines = [
        (f, 0, 0, '{"node":"p1","lsn":1,"kind":"init","balance":100}'),
        (f, 0, 1, '{"node":"p1","lsn":2,"kind":"send","msg_id":"a","src":"p1","dst":"p2","seq":1,"amount":1}'),
        (f, 4096, second_split, '{"node":"p1","lsn":3,"kind":"restart"}'),
        (f, 4096, second_split + 1, '{"node":"p1","lsn":4,"kind":"se'),
        (f, 4096, second_split + 2, '{"node":"p1","lsn":"5","kind":"init","balance":1}'),
        (f, 4096, second_split + 3, '{"node":"p1","lsn":6,"kind":"send","msg_id":"b","src":"p1","dst":"p2","seq":2}'),
        (f, 4096, second_split + 4, '{"node":"p2","lsn":7,"kind":"restart"}'),
    ]
    raw = spark.createDataFrame(lines, "file string, block long, mid long, value string")
    bad = parse.bad_lines(parse.locate_lines(parse.parse_log_lines(raw)))
    assertDataFrameEqual(
        bad,
        [
            Row(file=f, line=4, problem="not valid JSON (truncated line?)"),
            Row(file=f, line=5, problem="a field has the wrong type, or the line is not a JSON object"),
            Row(file=f, line=6, problem="send record without 'amount'"),
            Row(file=f, line=7, problem="record of node p2 in the log of p1"),
        ],
    )


# ------------------------------------------------------------------ two epochs
# Epoch 1 is the run above with only snapshot "ok"; then the cluster is restored to
# "ok" (epoch 2): p2 replays the transfer "ok" holds in flight, channels start again
# at seq 1, so p1 sends "p1:p2:1" again (the same msg_id and seq as in epoch 1).
# Snapshot "e2" is taken right after the restore.








def epoch_verdicts(spark, logs) -> dict:  # noqa: F811
    snaps = [snapshot_doc("ok", 0), snapshot_doc("e2", 1, balances={"p1": 90, "p2": 110, "p3": 100}, p1_p2=[], epoch="2")]
    evs = spark.createDataFrame(event_rows(logs), EVENT)
    rows = V.reconciled(evs, parse.typed_snapshots(spark.createDataFrame(snaps, SNAPSHOT)))
    return {(r["scope"], r["snapshot_id"]): r for r in rows}


def test_two_epochs_are_checked_each_on_its_own(spark):  # noqa: F811
    got = epoch_verdicts(spark, two_epochs())
    assert list(got) == [("logs", None), ("snapshot", "ok"), ("restore", "ok"), ("snapshot", "e2")]
    assert all(r["consistent"] for r in got.values()), got
    assert got[("restore", "ok")]["observed_total"] == 300
    assert got[("snapshot", "e2")]["observed_total"] == 300


def test_a_wrong_restore_balance_and_a_missing_replay_are_caught(spark):  # noqa: F811
    wrong = epoch_verdicts(spark, two_epochs(p3_restored_to=101))[("restore", "ok")]
    assert wrong["consistent"] is False
    assert wrong["first_discrepancy"] == "epoch 2: p3 restored ok to 101, expected ok at 100"
    missing = epoch_verdicts(spark, two_epochs(replay=False))[("restore", "ok")]
    assert missing["consistent"] is False
    assert missing["first_discrepancy"] == "epoch 2: p1->p2 replayed [], the snapshot holds [('p1:p2:1', 10, 1)]"
