"""`snapmesh reconcile ingest`: convert sealed log segments to Parquet, once.

Each node's sealed segments (``<node>.log.<first lsn>.jsonl``) not converted yet are
parsed (the same parse as the job: typed columns, line in the file, ``problem``) and
written, all in one Spark job, to ``<data_dir>/columnar/segments/file=<name>/``; the
manifest ``<data_dir>/columnar/manifest.json`` then records each one's origin size,
modification time and record count. Running it again converts only what is new.
Conversion goes in lsn order: a node's segments after the first one that cannot be
converted (missing from the listing) stay JSONL. The active ``<node>.log.jsonl`` is
never converted: the node is still writing it. The JSONL stays the source of truth:
the job re-checks each segment against its origin (see ``segments``).

Each converted segment is also indexed, so the job need not scan it for what is
rare: the manifest records its bad lines (``bad``) and its marker records (cuts,
restores, replays: ``markers``), which are written to
``<data_dir>/columnar/markers/file=<name>/``. The job reads a segment's markers from
there when it has no bad line; otherwise it scans the segment as before.

Each segment's interval sums (``checksums.interval_sums``, split at every marker
record in it) are written to ``<data_dir>/columnar/sums/file=<name>/`` and counted
in the manifest (``sums``): the job reads them instead of aggregating the segment's
rows again, so reconciling again reads only what is new (see ``checksums.Presummed``).
They assume the segment's first lsn is the one in its name; the job checks that
against the records before it and aggregates the rows when it is not.

Exit 0 (converted, or nothing new), 2 bad input (no data dir, a bad manifest).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from snapmesh.reconcile.checksums import MARKER_KINDS, SEGMENT_SUMS, cut_rows, interval_sums, interval_table
from snapmesh.reconcile.common import InputError
from snapmesh.reconcile.longlines import line_bound, replace_long
from snapmesh.reconcile.parse import file_first_lsn, locate_lines, parse_log_lines
from snapmesh.reconcile.schema import INGESTED
from snapmesh.spark.session import EXIT_BAD_INPUT, out_of_memory, session_for, stop_session
from snapmesh.reconcile.segments import (
    COLUMNAR_DIR,
    MARKERS_DIR,
    SEGMENTS_DIR,
    SUMS_DIR,
    LogFile,
    list_logs,
    manifest_path,
    read_manifest,
    read_text_logs,
    segment_dir,
    write_text_file,
)

# Row groups small enough that even one node's segment splits into a task per core
# (a reader splits a file only between row groups); Parquet's default is 128 MB.
ROW_GROUP_BYTES = 8 << 20


def pending(spark: SparkSession, data_dir: str) -> tuple[dict[str, dict], list[LogFile]]:
    """The manifest and the sealed segments to convert (those new or changed since)."""
    manifest = read_manifest(spark, data_dir)
    todo = []
    for f in list_logs(spark, data_dir):
        entry = manifest.get(f.name)
        if f.first_lsn is not None and (entry is None or (entry["size"], entry["mtime_ms"]) != (f.size, f.mtime_ms)):
            todo.append(f)
    return manifest, todo


def ingest(spark: SparkSession, data_dir: str) -> list[str]:
    """Convert the pending segments; return their names."""
    manifest, todo = pending(spark, data_dir)
    if not todo:
        return []
    # One pass: parse, locate, write (each task writes the segments it read; no shuffle).
    bound = line_bound()
    located = replace_long(spark, locate_lines(parse_log_lines(read_text_logs(spark, todo, bound))), todo, bound)
    named = located.withColumn("file", F.regexp_extract("file", r"([^/]*)$", 1))  # the segment's name
    root = f"{data_dir.rstrip('/')}/{COLUMNAR_DIR}/{SEGMENTS_DIR}"
    (
        named.select(*INGESTED.fieldNames())
        .write.mode("overwrite")
        .option("parquet.block.size", ROW_GROUP_BYTES)
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("file")
        .parquet(root)
    )
    # The index, from what was just written: counts, then the (few) marker records.
    written = spark.read.schema(INGESTED).option("basePath", root).parquet(*(segment_dir(data_dir, f.name) for f in todo))
    bad = F.col("problem").isNotNull()
    counts = {
        r["file"]: r
        for r in written.groupBy("file")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.count(F.when(bad, 1)).alias("bad"),
            F.count(F.when(~bad & F.col("kind").isin(*MARKER_KINDS), 1)).alias("markers"),
        )
        .collect()
    }
    good = written.filter(~bad)
    markers = cut_rows(good, "file").cache()
    try:
        _write_partitioned(markers, data_dir, MARKERS_DIR)
        bounds = [(r["node"], r["lsn"]) for r in markers.select("node", "lsn").collect()]
    finally:
        markers.unpersist()
    sums = segment_sums(spark, good, bounds)
    # one part file per segment, whatever order the sums were collected in
    _write_partitioned(spark.createDataFrame(sums, SEGMENT_SUMS).repartition("file"), data_dir, SUMS_DIR)
    sum_rows = Counter(r["file"] for r in sums)
    for f in todo:
        got = counts.get(f.name)
        manifest[f.name] = {
            "name": f.name,
            "size": f.size,
            "mtime_ms": f.mtime_ms,
            "records": got["n"] if got else 0,
            "bad": got["bad"] if got else 0,
            "markers": got["markers"] if got else 0,
            "sums": sum_rows.get(f.name, 0),
            "parquet": segment_dir(data_dir, f.name),
        }
    document = {"segments": sorted(manifest.values(), key=lambda e: e["name"])}
    write_text_file(spark, manifest_path(data_dir), json.dumps(document, indent=2) + "\n")
    return [f.name for f in todo]


def segment_sums(spark: SparkSession, good: DataFrame, bounds: list[tuple[str, int]]) -> list[dict]:
    """Each segment's interval sums, split at ``bounds`` (its markers' (node, lsn)), as rows.

    ``line`` becomes the position the record would have if the segment starts at the
    lsn in its name, which the job checks before it uses these sums.
    """
    evs = good.withColumn("line", file_first_lsn(F.col("file")) - 1 + F.col("line"))
    table = interval_sums(evs, interval_table(spark, bounds), by=("file",), extent=True)
    return [r.asDict() for r in table.select(*SEGMENT_SUMS.fieldNames()).collect()]


def _write_partitioned(frame: DataFrame, data_dir: str, directory: str) -> None:
    (
        frame.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy("file")
        .parquet(f"{data_dir.rstrip('/')}/{COLUMNAR_DIR}/{directory}")
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="snapmesh reconcile ingest",
        description="Convert sealed log segments (<node>.log.<first lsn>.jsonl) to Parquet once, "
        "for `snapmesh reconcile` to read. Re-running converts only new segments.",
    )
    p.add_argument("--data-dir", required=True, metavar="DIR", help="the logs (local, hdfs://, s3a://)")
    p.add_argument("--master", metavar="URL", default="local[*]", help="Spark master (default: local[*])")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    existing = SparkSession.getActiveSession()
    # a small input gets the small-input settings, as `snapmesh reconcile` does: the
    # optimizing JIT and generated code cost a few-MB conversion more than they save
    spark = existing or session_for(args.master, args.data_dir)
    try:
        converted = ingest(spark, args.data_dir)
    except InputError as e:
        print(f"snapmesh reconcile ingest: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (Py4JError, ConnectionError) as e:
        if (why := out_of_memory(spark, e)) is None:
            raise
        print(f"snapmesh reconcile ingest: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        if existing is None:
            stop_session(spark)
    print(f"converted {len(converted)} segment(s) to Parquet" + (f": {', '.join(converted)}" if converted else ""))
    return 0
