"""`snapmesh reconcile`: check every exported snapshot against the transfer logs.

The thin main: parse arguments, get a SparkSession, read, run the steps (``parse``,
the checksums of ``checksums``, and the exact ``log_checks``/``snapshot_checks``/
``verdicts`` only for what a checksum did not certify), collect the verdict rows and
small per-cut tables, write them, print them, and turn them into an exit status:
0 every snapshot consistent, 1 a discrepancy, 2 bad input. The torn last line of an
active file (a write cut short) is left out, as the node's recovery does, and said
so: one notice per file on stderr, naming it and the bytes, and a "left_out" row
in the verdicts (``summary.json`` lists them under "left_out" too).

``run_job(spark, data_dir, out_dir)`` runs the same job on an existing session (tests
and ``jobs/reconcile_job.py`` use it); ``main(argv)`` works in-process too and reuses
an active session if there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from snapmesh.reconcile import apps, checksums, figures
from snapmesh.spark import cds
from snapmesh.reconcile import parse as T_parse
from snapmesh.reconcile import verdicts as V
from snapmesh.reconcile.common import BUCKET, InputError
from snapmesh.app import BUILT_IN, App, AppError, load_app
from snapmesh.checking.node_logs import LeftOut

from snapmesh.reconcile.schema import (APP_SNAPSHOT, CORRUPT_COLUMN, EVENT, SCOPE_INVARIANT, SCOPE_LEFT_OUT, SCOPE_LOGS,
                                      SCOPE_RESTORE, SCOPE_SNAPSHOT, SNAPSHOT, VERDICT)
from snapmesh.reconcile.segments import Logs, read_logs, write_text_file
from snapmesh.spark.session import (
    EXIT_BAD_INPUT,
    EXIT_INCONSISTENT,
    EXIT_OK,
    out_of_memory,
    session_for,
    stop_session,
    wait_for_executors,
    wait_for_master,
)

MAX_BAD_INPUT = 20  # bad lines reported (the first ones, by file and line)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    bad_input: list[dict[str, Any]] = field(default_factory=list)
    # snapshot id -> (transfers, amount) recorded in flight, as the snapshot files say: the
    # verdict "ok" on such a snapshot means the logs confirm each of them.
    in_flight: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    # the torn last lines of active files, left out of the log as the node's recovery does
    left_out: list[LeftOut] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        if self.bad_input:
            return EXIT_BAD_INPUT
        if any(v["consistent"] is False for v in self.verdicts):
            return EXIT_INCONSISTENT
        return EXIT_OK


# ------------------------------------------------------------------------ reading


def _is_local(path: str) -> bool:
    return urlparse(path).scheme in ("", "file")


def _local(path: str) -> str:
    return urlparse(path).path if urlparse(path).scheme == "file" else path


def _read(reader: Any, path: str, what: str) -> DataFrame:
    try:
        return reader(path)
    except AnalysisException as e:
        if "PATH_NOT_FOUND" in str(e) or "does not exist" in str(e):
            raise InputError(f"no {what}: nothing matches {path}") from e
        raise


def read_snapshots(spark: SparkSession, data_dir: str, schema: T.StructType = SNAPSHOT) -> DataFrame:
    """Every ``<data_dir>/snapshots/*.json`` (one pretty-printed object each) + file.

    The directory is read with a file-name filter rather than a glob: Spark lists a
    glob's matches with a distributed job once there are more than 32 of them (one
    task per file), a directory with one driver-side listing.
    """
    reader = (
        spark.read.schema(schema)
        .option("multiLine", True)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .option("pathGlobFilter", "*.json")
        .json
    )
    path = f"{data_dir.rstrip('/')}/snapshots"
    snaps = _read(reader, path, "snapshots")
    if not snaps.inputFiles():  # the listing, already made on the driver: no job
        raise InputError(f"no snapshots: nothing matches {path}/*.json")
    return snaps.select(F.input_file_name().alias("file"), *schema.fieldNames())


# ------------------------------------------------------------------------ the job


def _first_bad_and_cuts(logs: Logs) -> DataFrame:
    """The first bad lines (by file, line) and every marker record, in one query.

    What ``logs.scanned`` holds is scanned for both; the indexed segments' markers are
    read from their index, with the segment's name in ``segment`` (null otherwise).
    """
    null = lambda t: F.lit(None).cast(t)  # noqa: E731
    columns = ("file", "line", "problem", "segment", *checksums.MARKER_COLUMNS)
    parts = []
    if logs.scanned is not None:
        parts.append(
            T_parse.bad_lines(logs.scanned)
            .orderBy("file", "line")
            .limit(MAX_BAD_INPUT)
            .select("*", *(null(EVENT[c].dataType).alias(c) for c in checksums.MARKER_COLUMNS))
        )
        parts.append(checksums.cut_rows(T_parse.events(logs.scanned)))
    if logs.markers is not None:
        parts.append(logs.markers)
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part, allowMissingColumns=True)
    return out.select(*(F.col(c) if c in out.columns else null("string").alias(c) for c in columns))


def _bad_snapshots(snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Snapshot rows with a problem, and ids in more than one file (the first ones, by file)."""
    files_of: dict[str, int] = {}
    for s in snaps:
        if s["snapshot_id"] is not None:
            files_of[s["snapshot_id"]] = files_of.get(s["snapshot_id"], 0) + 1
    bad = []
    for s in sorted(snaps, key=lambda s: s["file"]):
        problem = s["problem"]
        if problem is None and files_of.get(s["snapshot_id"], 0) > 1:
            problem = T_parse.DUPLICATE_SNAPSHOT % s["snapshot_id"]
        if problem is not None:
            bad.append({"file": s["file"], "line": None, "problem": problem})
    return bad[:MAX_BAD_INPUT]


def _as_dict(row: Any) -> Any:
    return row.asDict(recursive=True)


def reconcile(
    spark: SparkSession,
    data_dir: str,
    bucket: int = BUCKET,
    *,
    exact: bool = False,
    summed: bool = True,
    app: App | None = None,
    app_module: str = "",
    app_spec: str = "",
) -> Outcome:
    """Run every check; return the verdict rows, or the bad input found first.

    The fast path (see ``checksums``): one query for the first bad lines and the cut
    records while others read the snapshots and the ingested segments' interval sums,
    one aggregation by cut interval of the log those sums do not cover, and one of
    the sends up to each receiver's position when a receiver is behind. The verdicts
    are compared on the driver. Only what the checksums do not certify goes to the
    exact joins of ``verdicts`` (``exact`` sends everything). ``summed=False``
    aggregates the ingested segments' rows instead of reading their sums.

    An app's COMPLETE snapshots (the export names the app) get the checks of ``apps``
    too, and the figures of ``figures`` (its describe's totals: the expected and
    observed columns) when the job has the app: ``app`` (its spec ``app_spec``, else
    its name, must be the snapshot's) or a built-in the export names. With ``app``
    (its module ``app_module``, shipped to the executors), its SQL invariants over its
    views (``invariants``) add their verdict rows.
    """
    if _is_local(data_dir) and not os.path.isdir(_local(data_dir)):
        raise InputError(f"data dir {data_dir} does not exist")
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
    logs = read_logs(spark, data_dir, summed=summed)
    left_out = [replace(t, file=_local(t.file)) for t in logs.left_out]
    located = logs.located
    raw_snaps = read_snapshots(spark, data_dir)
    try:
        checked = raw_snaps.select(
            "file",
            T_parse.snapshot_problem().alias("problem"),
            *T_parse.typed_snapshot_columns(),
            F.coalesce("app.spec", F.lit("")).alias("app"),  # last: the columns before it read the struct
        )
        with ThreadPoolExecutor(max_workers=1) as pool:  # small jobs at once: the snapshots and sums beside the log
            snaps_future = pool.submit(lambda: [_as_dict(r) for r in checksums.snapshot_sums(checked).collect()])
            sums_future = pool.submit(lambda: [] if logs.sums is None else [r.asDict() for r in logs.sums.collect()])
            first = [_as_dict(r) for r in _first_bad_and_cuts(logs).collect()]
            snaps, sums = snaps_future.result(), sums_future.result()
        logs.check_markers(Counter(r["segment"] for r in first if r["segment"] is not None))
        logs.check_sums(Counter(r["file"] for r in sums))
        bad = sorted(
            ({"file": r["file"], "line": r["line"], "problem": r["problem"]} for r in first if r["problem"] is not None),
            key=lambda b: (b["file"], b["line"]),
        ) + _bad_snapshots(snaps)
        if bad:
            return Outcome(bad_input=bad, left_out=left_out)
        evs = T_parse.events(located)
        typed = raw_snaps.transform(T_parse.typed_snapshots)
        presummed = None
        if logs.sums is not None:
            rest = None if logs.unsummed is None else T_parse.events(logs.unsummed)
            presummed = checksums.Presummed(rows=sums, rest=rest)
        rows = V.reconciled(
            evs,
            typed,
            cut_records=[r for r in first if r["problem"] is None],
            snaps_summed=snaps,
            presummed=presummed,
            bucket=bucket,
            exact=exact,
        )
        # An app's snapshot has no tallies (parse.typed_snapshot_columns), nor has its
        # cluster's log: the rows show no totals from them, but the app's figures, and
        # the in-flight column their amount or none.
        unsummed = {s["snapshot_id"] for s in snaps if s["app"]}
        if unsummed:
            rows = [{**r, "expected_total": None, "observed_total": None}
                    if r["scope"] in (SCOPE_LOGS, SCOPE_SNAPSHOT, SCOPE_RESTORE) else r for r in rows]
        shown: dict[str, figures.Figures] = {}
        if any(s["app"] and s["status"] == "COMPLETE" for s in snaps):
            app_snaps = read_snapshots(spark, data_dir, APP_SNAPSHOT)
            rows = apps.fold(rows, apps.checked(spark, data_dir, app_snaps, located))
            from snapmesh.reconcile import appviews, invariants

            claimed = figures.claims(app_snaps)
            figured = figures.apps_of(claimed, app, app_spec)
            computed: list[appviews.Computed] = []  # the views and figures, computed on the executors
            if app is not None or figured:
                if app is not None and app_module:  # before the executors unpickle the app
                    invariants.ship_module(spark, app_module)
                    invariants.check_shipped(spark, app_module)
                job = appviews.Job(app=app, figured=figured, params=invariants.cluster_params(_local(data_dir)))
                computed = appviews.computed(spark, data_dir, app_snaps, job)
            shown = {c.snapshot_id: c.figures for c in computed if c.figures is not None}
            rows = figures.fold(rows, shown)
            if app is not None:
                rows += invariants.verdicts_of(spark, app, [(c.snapshot_id, c.rows, c.errors) for c in computed])
        elif app is not None:
            rows.append({**dict.fromkeys(VERDICT.fieldNames()), "scope": SCOPE_INVARIANT, "status": "-",
                         "first_discrepancy": f"skipped: no COMPLETE snapshot of an app to check {app.name}'s invariants on"})
        in_flight = {
            s["snapshot_id"]: (
                sum(max(c["tn"] or 0, 0) for c in s["channels"] or ()),  # size() of a missing list is -1
                (shown[s["snapshot_id"]].in_flight if s["snapshot_id"] in shown else None)
                if s["snapshot_id"] in unsummed else sum(c["amount"] or 0 for c in s["channels"] or ()),
            )
            for s in snaps
        }
        return Outcome(verdicts=rows + [left_out_row(t) for t in left_out], in_flight=in_flight, left_out=left_out)
    finally:
        logs.release()


def left_out_row(torn: LeftOut) -> dict[str, Any]:
    """A torn last line as a verdict row: a notice (neither consistent nor not)."""
    return {**dict.fromkeys(VERDICT.fieldNames()), "scope": SCOPE_LEFT_OUT, "status": "-",
            "first_discrepancy": torn.notice}


def write_outputs(spark: SparkSession, outcome: Outcome, data_dir: str, out_dir: str) -> None:
    """``verdicts.parquet`` (when there are verdicts) and ``summary.json``."""
    out_dir = out_dir.rstrip("/")
    if outcome.verdicts:
        rows = [tuple(v[name] for name in VERDICT.fieldNames()) for v in outcome.verdicts]
        spark.createDataFrame(rows, VERDICT).coalesce(1).write.mode("overwrite").parquet(
            f"{out_dir}/verdicts.parquet"
        )
    summary = {
        "data_dir": data_dir,
        "exit_status": outcome.exit_status,
        "consistent": outcome.exit_status == EXIT_OK,
        "verdicts": outcome.verdicts,
        "bad_input": outcome.bad_input,
        "left_out": [{"file": t.file, "offset": t.offset, "bytes": t.size, "notice": t.notice} for t in outcome.left_out],
    }
    write_text_file(spark, f"{out_dir}/summary.json", json.dumps(summary, indent=2) + "\n")


def format_bad_input(bad: list[dict[str, Any]]) -> str:
    lines = [f"bad input ({len(bad)}{'+' if len(bad) >= MAX_BAD_INPUT else ''} found):"]
    for b in bad:
        where = f"{_local(b['file'])} line {b['line']}" if b["line"] is not None else _local(b["file"])
        lines.append(f"  {where}: {b['problem']}")
    return "\n".join(lines)


def format_table(verdicts: list[dict[str, Any]], in_flight: dict[str, tuple[int, int | None]] | None = None) -> str:
    """The verdict rows as a fixed-width table; `in_flight` (snapshot id -> messages,
    the bank's amount or None) fills the "in flight" column of COMPLETE snapshots
    ("-" elsewhere)."""
    head = ("snapshot", "status", "verdict", "nodes", "channels", "in flight", "expected", "observed", "issues",
            "first discrepancy")
    in_flight = in_flight or {}

    def flight(v: dict[str, Any]) -> str:
        found = in_flight.get(v["snapshot_id"]) if v["scope"] == "snapshot" and v["status"] == "COMPLETE" else None
        return "-" if found is None else str(found[0]) if found[1] is None else f"{found[0]} ({found[1]})"

    def verdict(v: dict[str, Any]) -> str:
        if v["scope"] == SCOPE_LEFT_OUT:
            return "notice"
        if v["scope"] == SCOPE_INVARIANT:
            return {True: "holds", False: "VIOLATED", None: "skipped"}[v["consistent"]]
        return {True: "ok", False: "INCONSISTENT", None: "skipped"}[v["consistent"]]

    def show(x: Any) -> str:
        return "-" if x is None else str(x)

    body = [
        (
            {"logs": "(whole log)", "restore": f"restore of {v['snapshot_id']}", SCOPE_LEFT_OUT: "(left out)",
             SCOPE_INVARIANT: v["snapshot_id"] or "(app invariant)"}.get(v["scope"], v["snapshot_id"]),
            v["status"],
            verdict(v),
            show(v["nodes_checked"]),
            show(v["channels_checked"]),
            flight(v),
            show(v["expected_total"]),
            show(v["observed_total"]),
            show(v["discrepancies"]),
            v["first_discrepancy"] or "",
        )
        for v in verdicts
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, body)])


def run_job(
    spark: SparkSession,
    data_dir: str,
    out_dir: str | None = None,
    *,
    quiet: bool = False,
    exact: bool = False,
    app: App | None = None,
    app_module: str = "",
    app_spec: str = "",
) -> int:
    """The whole job on an existing session: check, write, print; the exit status."""
    out_dir = out_dir or f"{data_dir.rstrip('/')}/reconcile"
    try:
        outcome = reconcile(spark, data_dir, exact=exact, app=app, app_module=app_module, app_spec=app_spec)
    except InputError as e:
        print(f"snapmesh reconcile: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    write_outputs(spark, outcome, data_dir, out_dir)
    for torn in outcome.left_out:  # one notice per file: nothing is left out silently
        print(f"snapmesh reconcile: notice: {torn.notice}", file=sys.stderr)
    if outcome.bad_input:
        print(format_bad_input(outcome.bad_input), file=sys.stderr)
    elif not quiet:
        print(format_table(outcome.verdicts, outcome.in_flight))
        bad = sum(v["consistent"] is False for v in outcome.verdicts)
        print(f"\n{'all consistent' if not bad else f'{bad} inconsistent'}; verdicts in {out_dir}")
    return outcome.exit_status


# ------------------------------------------------------------------------ session


def parser(prog: str = "snapmesh reconcile") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Check every exported snapshot against the nodes' transfer logs (Spark). "
        "Exit 0: all consistent, 1: a discrepancy, 2: bad input. "
        "`snapmesh reconcile ingest --data-dir DIR` converts sealed log segments to Parquet first; "
        "`snapmesh reconcile prepare` archives the JVM's classes once for a faster start.",
    )
    p.add_argument("--data-dir", required=True, metavar="DIR", help="logs (*.log.jsonl) and snapshots/ (local, hdfs://, s3a://)")
    p.add_argument("--verdicts-dir", "--out", dest="out", metavar="DIR",
                   help="where verdicts.parquet and summary.json go (default: DIR/reconcile); --out is its old name")
    p.add_argument("--master", metavar="URL", default="local[*]", help="Spark master (default: local[*])")
    p.add_argument(
        "--master-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="give a spark:// master S seconds to answer and give an executor (default 30; then exit 2)",
    )
    p.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        default=env_app(),
        help="also run the app's SQL invariants over its views of every COMPLETE snapshot "
        "(module from the working directory or PYTHONPATH, shipped to the executors; or bank, kvshard) "
        "(default: $SNAPMESH_APP, else none: the log checks only)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="skip the checksums: check everything with the exact joins (slower; same verdicts)",
    )
    return p


def env_app() -> str | None:
    """$SNAPMESH_APP, the app a deployment gives every process (None: unset, or the bank's log checks)."""
    spec = os.environ.get("SNAPMESH_APP", "").strip()
    return None if spec in ("", "bank") else spec


def app_of(spec: str | None) -> tuple[App | None, str]:
    """The app of ``--app`` and its module's name ((None, "") without one); AppError: one line."""
    if spec is None:
        return None, ""
    return load_app(spec), BUILT_IN.get(spec.strip(), spec.strip()).partition(":")[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ingest"]:
        from snapmesh.reconcile import ingest

        return ingest.main(argv[1:])
    if argv[:1] == ["prepare"]:
        return cds.main(argv[1:])
    args = parser().parse_args(argv)
    try:
        app, app_module = app_of(args.app)
    except AppError as e:
        print(f"snapmesh reconcile: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    existing = SparkSession.getActiveSession()
    standalone = existing is None and args.master.startswith("spark://")
    try:
        if standalone:
            wait_for_master(args.master, args.master_timeout)
        spark = existing or session_for(args.master, args.data_dir)
    except InputError as e:
        print(f"snapmesh reconcile: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if standalone:
            wait_for_executors(spark, args.master, args.master_timeout)
        return run_job(spark, args.data_dir, args.out, exact=args.exact, app=app, app_module=app_module,
                       app_spec=args.app or "")
    except InputError as e:
        print(f"snapmesh reconcile: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (Py4JError, ConnectionError) as e:
        if (why := out_of_memory(spark, e)) is None:
            raise
        print(f"snapmesh reconcile: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        if existing is None:
            stop_session(spark)


if __name__ == "__main__":
    sys.exit(main())
