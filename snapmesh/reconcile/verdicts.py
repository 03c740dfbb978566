"""Step 4, verdicts: one row per snapshot plus the "logs" row.

``reconciled`` is the job: the checksums of ``checksums`` settle what they can, and
``verdicts`` (exact: it joins the discrepancies of ``log_checks`` and
``snapshot_checks`` and names every one, at the price of joins over the whole log)
checks the rest. A consistent run never pays for the joins.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from snapmesh.reconcile import checksums
from snapmesh.reconcile import messages as M
from snapmesh.reconcile.common import BUCKET, COMPLETE, shared
from snapmesh.reconcile.epochs import Epochs, merge_logs_rows, restore_row
from snapmesh.reconcile.log_checks import log_discrepancies, summarize_logs
from snapmesh.reconcile.schema import SCOPE_LOGS, SCOPE_SNAPSHOT, VERDICT
from snapmesh.reconcile.snapshot_checks import observed_total, snapshot_discrepancies


def _as_dict(row: Any) -> dict[str, Any]:
    return row.asDict(recursive=True)


def reconciled(
    evs: DataFrame,
    snaps: DataFrame,
    *,
    cut_records: list[dict[str, Any]] | None = None,
    snaps_summed: list[dict[str, Any]] | None = None,
    presummed: checksums.Presummed | None = None,
    bucket: int = BUCKET,
    exact: bool = False,
) -> list[dict[str, Any]]:
    """Events (EVENT) and typed snapshots -> the verdict rows (VERDICT fields), logs row first.

    Jobs: the cut records and the snapshot sums (unless given: ``main`` collects them
    with the bad input), the interval sums (of the rows ``presummed`` does not cover,
    when given; a log with restores is summed by epoch from its rows), the sends up to
    each lagging receiver (only if one lags), and the exact ``verdicts`` for what the
    checksums did not settle.
    """
    if cut_records is None:
        cut_records = [_as_dict(r) for r in checksums.cut_rows(evs).collect()]
    if snaps_summed is None:
        snaps_summed = [_as_dict(r) for r in checksums.snapshot_sums(snaps).collect()]
    if any(c["kind"] == "restore" for c in cut_records):
        return _by_epoch(evs, snaps, cut_records, snaps_summed, bucket=bucket, exact=exact)
    cuts = [c for c in cut_records if c["kind"] == "cut"]
    return _one_epoch(evs, snaps, cuts, snaps_summed, bucket, exact, presummed)


def _by_epoch(
    evs: DataFrame,
    snaps: DataFrame,
    markers: list[dict[str, Any]],
    snaps_summed: list[dict[str, Any]],
    *,
    bucket: int,
    exact: bool,
) -> list[dict[str, Any]]:
    """A log with restores: every epoch checked on its own (``epochs``), and every restore."""
    nodes = {r["node"] for r in evs.select("node").distinct().collect()}
    cut = Epochs.of(markers, nodes)
    restored = {p.restore["snapshot_id"] for e, parts in cut.by_epoch.items() if e > 1
                for p in parts.values() if p.restore is not None}
    typed = {r["snapshot_id"]: _as_dict(r) for r in snaps.filter(F.col("snapshot_id").isin(*restored)).collect()}
    logs_rows, rows = [], []
    for epoch in cut.complete(nodes):
        if epoch > 1:
            parts = cut.by_epoch[epoch]
            sid = next(iter(parts.values())).restore["snapshot_id"]  # type: ignore[index]
            rows.append(restore_row(epoch, parts, typed.get(sid)))
        taken = [s for s in snaps_summed if s["epoch"] == epoch]
        got = _one_epoch(
            cut.events(evs, epoch), snaps.filter(F.col("epoch") == epoch), cut.cuts(markers, epoch), taken, bucket, exact
        )
        logs_rows.append((epoch, got[0]))
        rows += got[1:]
    return [merge_logs_rows(logs_rows), *rows]


def _one_epoch(
    evs: DataFrame,
    snaps: DataFrame,
    cut_records: list[dict[str, Any]],
    snaps_summed: list[dict[str, Any]],
    bucket: int,
    exact: bool,
    presummed: checksums.Presummed | None = None,
) -> list[dict[str, Any]]:
    spark = evs.sparkSession
    if exact:
        return [r.asDict() for r in verdicts(evs, snaps, bucket).collect()]
    cuts = [(c["node"], c["lsn"]) for c in cut_records]
    summed, rest = ([], evs) if presummed is None else (presummed.at(cuts), presummed.rest)
    if rest is not None:
        intervals = checksums.interval_table(spark, cuts, bucket)
        summed += [_as_dict(r) for r in checksums.interval_sums(rest, intervals, bucket).collect()]
    facts = checksums.LogFacts.of(summed)
    sent_upto: dict[tuple[str, str], dict[str, Any]] = {}
    bounds = facts.receiver_bounds()
    if bounds and facts.node_ok:
        table = spark.createDataFrame(bounds, checksums.BOUNDS)
        sent_upto = {(r["src"], r["dst"]): _as_dict(r) for r in checksums.sends_upto(evs, table).collect()}
    settled = checksums.certify(facts, sent_upto, cut_records, snaps_summed)
    if not settled.logs_settled:
        return [r.asDict() for r in verdicts(evs, snaps, bucket).collect()]
    rows = settled.rows
    if settled.unsettled:
        unsettled = snaps.filter(F.col("snapshot_id").isin(settled.unsettled))
        named = [r.asDict() for r in verdicts(evs, unsettled, bucket).collect() if r["scope"] == SCOPE_SNAPSHOT]
        started = {s["snapshot_id"]: s["started_at"] for s in snaps_summed}
        order = lambda r: (started[r["snapshot_id"]] is None, started[r["snapshot_id"]] or "", r["snapshot_id"])  # noqa: E731
        rows = [rows[0], *sorted([r for r in rows[1:] + named], key=order)]
    return rows


def verdicts(evs: DataFrame, snaps: DataFrame, bucket: int = BUCKET) -> DataFrame:
    """Events (EVENT) and typed snapshots -> verdict rows (VERDICT), logs row first.

    One row per snapshot; COMPLETE snapshots are checked (consistent true/false),
    others are skipped (consistent null, first_discrepancy says why). One more row,
    scope "logs", carries the whole-log checks.
    """
    S = "snapshot_id"
    snaps = shared(snaps)
    complete = snaps.filter(F.col("status") == COMPLETE)
    summary = summarize_logs(evs)
    first = lambda found: found.agg(  # noqa: E731
        F.count(F.lit(1)).alias("discrepancies"), F.min("d").alias("first")
    )
    found = first(snapshot_discrepancies(evs, complete, summary, bucket).groupBy(S))
    is_complete = F.col("status") == COMPLETE
    skipped = F.format_string(
        M.SKIPPED, "status", F.when(F.col("reason") != "", F.concat(F.lit(": "), "reason")).otherwise(F.lit(""))
    )
    snapshot_rows = (
        snaps.select("*", observed_total().alias("observed_total"))
        .join(found, [S], "left")
        .crossJoin(summary.facts)
        .select(
            F.lit(SCOPE_SNAPSHOT).alias("scope"),
            S,
            "status",
            F.when(is_complete, F.col("discrepancies").isNull()).alias("consistent"),
            F.when(is_complete, F.size("nodes")).otherwise(0).cast("long").alias("nodes_checked"),
            F.when(is_complete, F.size("channels")).otherwise(0).cast("long").alias("channels_checked"),
            F.col("initial_total").alias("expected_total"),
            F.when(is_complete, F.col("observed_total")).alias("observed_total"),
            F.when(is_complete, F.coalesce("discrepancies", F.lit(0))).otherwise(0).cast("long").alias("discrepancies"),
            F.when(is_complete, F.col("first.text")).otherwise(skipped).alias("first_discrepancy"),
            F.lit(1).alias("_order"),
            "started_at",
        )
    )
    logs_row = first(log_discrepancies(evs, summary)).crossJoin(summary.facts).select(
        F.lit(SCOPE_LOGS).alias("scope"),
        F.lit(None).cast("string").alias(S),
        F.lit("-").alias("status"),
        (F.col("discrepancies") == 0).alias("consistent"),
        F.col("log_nodes").cast("long").alias("nodes_checked"),
        F.col("log_channels").cast("long").alias("channels_checked"),
        F.col("initial_total").alias("expected_total"),
        F.lit(None).cast("long").alias("observed_total"),
        F.col("discrepancies").cast("long"),
        F.col("first.text").alias("first_discrepancy"),
        F.lit(0).alias("_order"),
        F.lit(None).cast("string").alias("started_at"),
    )
    return (
        logs_row.unionByName(snapshot_rows)
        .coalesce(1)  # one row per snapshot: sorting in one partition needs no sampling job
        .sortWithinPartitions("_order", F.col("started_at").asc_nulls_last(), S)
        .select(*VERDICT.fieldNames())
    )
