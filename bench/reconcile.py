"""Benchmark: the Spark reconciliation at two sizes, beside DuckDB and Spark's own scan floor.

All in one run, on data written by `snapmesh synth` (6 nodes, 100 snapshots, seed 1):

* small (``make demo``'s size, ~1k records): wall time of ``snapmesh reconcile``
  as a user runs it, JVM start included (``reconcile_small_wall_s``); its verdicts
  must equal the plain-Python baseline's.
* large (default 10M records):
  - ``snapmesh reconcile ingest`` (the one-off conversion of sealed segments to
    Parquet; every log here is one sealed segment plus an empty active file);
  - the job on ``local[2]`` reading that Parquet (``reconcile_10m_records_per_s``:
    records / job time, from reading the files to the verdicts; the JVM start is
    reported beside it): ingest stored each segment's interval sums, so the job reads
    those and the segments' marker index, not the rows;
  - the same job aggregating the Parquet rows instead of reading the sums
    (``reconcile_10m_rows_records_per_s``), and reading the JSONL directly;
  - ingest's own rate (``reconcile_10m_ingest_records_per_s``): the one-off cost
    the summed job builds on;
  - Spark's scan floor in the same session: the JSONL read with the schema plus a
    group-by, and the same on the Parquet;
  - DuckDB (2 threads) on the same JSONL: parse, send/recv matching by msg_id, and
    each node's balance before each cut compared with the snapshots
    (``duckdb_10m_records_per_s``), and the same on the Parquet;
  - the job on a Spark standalone cluster (master + 2 workers, 1 core, 1g each)
    started from the pip pyspark (``reconcile_10m_standalone_records_per_s``); its
    verdicts must equal local mode's.

Each Spark measurement runs in a fresh process (a master is fixed per JVM). The
figures are merged into ``bench/results.json`` (other benchmarks write it too).
The machine is shared: read the ratios, measured side by side, not the absolutes.

``python -m bench reconcile [--size N] [--skip-standalone]``; environment:
BENCH_RECONCILE_SIZE (records, default 10000000), BENCH_RECONCILE_DIR (scratch dir),
BENCH_DRIVER_MEMORY (local driver heap, default 4g). A smoke run (bench/smoke.py):
5,000 records over 10 snapshots and one JVM: the four local steps in it, their
verdicts checked against the plain-Python baseline's (the small run's check); no
small run, no floor and no standalone cluster, each a JVM of its own (tests/spark
starts Spark every way, the standalone cluster and `snapmesh reconcile` included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import results, smoke

NODES = 6
SNAPSHOTS = 100
SMALL_TRANSFERS = 400  # ~1k records with 4 nodes and 4 snapshots, like `make demo`
DEFAULT_SIZE = 10_000_000
ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env["SNAPMESH_SPARK_DRIVER_MEMORY"] = os.environ.get("BENCH_DRIVER_MEMORY", "4g")
    return env


# ------------------------------------------------------------- in a fresh process


def _worker(data_dir: str, master: str, whats: str) -> None:
    """Start a session, time the named work (comma-separated, in order), print one JSON
    line: by what, its figures."""
    from snapmesh.spark.session import build_session, wait_for_executors

    started = time.perf_counter()
    spark = build_session(master, app_name="snapmesh-bench")
    if master.startswith("spark://"):
        wait_for_executors(spark, master, 60)
    session_s = time.perf_counter() - started
    outs = {what: {"session_s": session_s, **_work(spark, data_dir, what)} for what in whats.split(",")}
    spark.stop()
    print(json.dumps(outs))


def _work(spark, data_dir: str, what: str) -> dict:  # noqa: ANN001 (a SparkSession)
    from snapmesh.reconcile import ingest
    from snapmesh.reconcile import job

    out: dict = {}
    started = time.perf_counter()
    if what == "ingest":
        out["converted"] = len(ingest.ingest(spark, data_dir))
    elif what == "reconcile-jsonl":  # hide the Parquet: the job parses the JSONL
        columnar = Path(data_dir) / "columnar"
        columnar.rename(columnar.with_name("columnar.hidden"))
        try:
            outcome = job.reconcile(spark, data_dir)
        finally:
            columnar.with_name("columnar.hidden").rename(columnar)
        out.update(verdicts=outcome.verdicts, bad=outcome.bad_input)
    else:  # "reconcile-rows": the ingested segments' rows aggregated, not their sums read
        outcome = job.reconcile(spark, data_dir, summed=what != "reconcile-rows")
        out.update(verdicts=outcome.verdicts, bad=outcome.bad_input)
    out["job_s"] = time.perf_counter() - started
    if what == "reconcile":
        out.update(_scan_floors(spark, data_dir))
    return out


def _scan_floors(spark, data_dir: str) -> dict:  # noqa: ANN001 (a SparkSession)
    """Spark alone: read with the schema + a group-by, JSONL then Parquet."""
    from pyspark.sql import functions as F

    from snapmesh.reconcile.schema import INGESTED, LOG_RECORD
    from snapmesh.reconcile.segments import COLUMNAR_DIR, SEGMENTS_DIR

    floors = {}
    for name, frame in (
        ("scan_jsonl_s", lambda: spark.read.schema(LOG_RECORD).json(f"{data_dir}/*.log.*.jsonl")),
        ("scan_parquet_s", lambda: spark.read.schema(INGESTED).parquet(f"{data_dir}/{COLUMNAR_DIR}/{SEGMENTS_DIR}")),
    ):
        started = time.perf_counter()
        frame().groupBy("kind").agg(F.count(F.lit(1)), F.sum("amount")).collect()
        floors[name] = time.perf_counter() - started
    return floors


def _spark(data_dir: str, master: str, what: str) -> dict:
    return _sparks(data_dir, master, (what,))[what]


def _sparks(data_dir: str, master: str, whats: tuple[str, ...]) -> dict[str, dict]:
    """The named work, in order, in one fresh process (one JVM)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.reconcile", "--worker", data_dir, master, ",".join(whats)],
        capture_output=True, text=True, env=_env(), cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"spark worker failed ({whats}, {master}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ DuckDB


def duckdb_checks(data_dir: str, source: str) -> tuple[float, dict]:
    """Parse, match sends to receipts by msg_id, balances before each cut vs the snapshots."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    columns = (
        "{node: 'VARCHAR', lsn: 'BIGINT', kind: 'VARCHAR', balance: 'BIGINT', msg_id: 'VARCHAR', "
        "src: 'VARCHAR', dst: 'VARCHAR', seq: 'BIGINT', amount: 'BIGINT', snapshot_id: 'VARCHAR'}"
    )
    if source == "jsonl":
        scan = f"read_json('{data_dir}/*.log*.jsonl', format = 'newline_delimited', columns = {columns})"
    else:
        scan = f"read_parquet('{data_dir}/columnar/segments/*/*.parquet')"
    started = time.perf_counter()
    con.execute(f"CREATE TABLE ev AS SELECT node, lsn, kind, balance, msg_id, src, dst, seq, amount, snapshot_id FROM {scan}")
    unmatched = con.execute(
        """SELECT count(*) FROM (SELECT * FROM ev WHERE kind = 'recv') r
           LEFT JOIN (SELECT * FROM ev WHERE kind = 'send') s USING (msg_id)
           WHERE s.msg_id IS NULL OR (s.src, s.dst, s.seq, s.amount) != (r.src, r.dst, r.seq, r.amount)"""
    ).fetchone()[0]
    wrong = con.execute(
        f"""WITH running AS (
              SELECT node, kind, snapshot_id, balance,
                     coalesce(sum(CASE kind WHEN 'init' THEN balance WHEN 'recv' THEN amount
                                  WHEN 'send' THEN -amount ELSE 0 END)
                              OVER (PARTITION BY node ORDER BY lsn ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                       AS before
              FROM ev),
            recorded AS (
              SELECT snapshot_id, n.node_id AS node, CAST(n.balance AS BIGINT) AS balance
              FROM (SELECT snapshot_id, unnest(nodes) AS n FROM read_json('{data_dir}/snapshots/*.json')
                    WHERE status = 'COMPLETE'))
           SELECT count(*) FROM running c JOIN recorded r USING (snapshot_id, node)
           WHERE c.kind = 'cut' AND (c.before != r.balance OR c.balance != c.before)"""
    ).fetchone()[0]
    records = con.execute("SELECT count(*) FROM ev").fetchone()[0]
    elapsed = time.perf_counter() - started
    con.close()
    return elapsed, {"records": records, "unmatched": unmatched, "wrong_balances": wrong}


# ---------------------------------------------------------------------- the run


def seal(data_dir: str) -> None:
    """Make every log one sealed segment (from lsn 1) and an empty active file."""
    from snapmesh.reconcile.schema import segment_file_name

    for log in Path(data_dir).glob("*.log.jsonl"):
        log.rename(log.with_name(segment_file_name(log.name.removesuffix(".log.jsonl"), 1)))
        log.touch()


FLOOR_JOB = (
    "from snapmesh.spark.session import build_session\n"
    "spark = build_session('local[*]', small=True)\n"
    "spark.range(10).count()\n"
    "spark.stop()\n"
)


def _wall(argv: list[str], **env: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(_env(), **env), cwd=ROOT)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[2:4]} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall


def small_wall(scratch: str) -> tuple[dict[str, float], bool]:
    """The small run as a user runs it, and beside it (interleaved, twice each, the best
    kept): the same without the class archive, and Spark's own floor, a fresh process
    that starts a session the same way and runs a trivial job."""
    from snapmesh.reconcile import baseline
    from snapmesh.synth import writer as synth

    data = os.path.join(scratch, "small")
    synth.generate(data, nodes=4, transfers=SMALL_TRANSFERS, snapshots=4, seed=1)
    job = [sys.executable, "-m", "snapmesh.cli", "reconcile", "--data-dir", data, "--out", f"{data}/out"]
    runs: dict[str, list[float]] = {"small": [], "small_no_archive": [], "floor": []}
    for _ in range(smoke.size(2, 1)):
        runs["small"].append(_wall(job))
        if not smoke.on():  # the same command with one variable more: a smoke run saves its JVM
            runs["small_no_archive"].append(_wall(job, SNAPMESH_SPARK_CDS="off"))
        runs["floor"].append(_wall([sys.executable, "-c", FLOOR_JOB]))
    verdicts = json.loads(Path(data, "out", "summary.json").read_text())["verdicts"]
    return {k: min(v, default=float("nan")) for k, v in runs.items()}, verdicts == baseline.reconcile(data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench reconcile")
    p.add_argument("--worker", nargs=3, metavar=("DATA_DIR", "MASTER", "WHAT"), help=argparse.SUPPRESS)
    p.add_argument("--size", type=int,
                   default=int(os.environ.get("BENCH_RECONCILE_SIZE", smoke.size(DEFAULT_SIZE, 5_000))))
    p.add_argument("--skip-standalone", action="store_true", help="no Spark standalone cluster run")
    args = p.parse_args(sys.argv[2:] if argv is None and sys.argv[1:2] == ["reconcile"] else argv)
    if args.worker:
        _worker(*args.worker)
        return 0
    from snapmesh.reconcile import baseline
    from snapmesh.synth import writer as synth
    from snapmesh.spark.standalone import StandaloneCluster

    scratch = os.environ.get("BENCH_RECONCILE_DIR") or tempfile.mkdtemp(prefix="snapmesh-bench-")
    load = os.getloadavg()[0]
    print(f"reconcile benchmark: {os.cpu_count()} cores, load {load:.1f} at start, scratch {scratch}", flush=True)
    ok = True
    try:
        from snapmesh.spark import cds

        archived = "with" if cds.java_options() else "WITHOUT (run `snapmesh reconcile prepare`)"
        if smoke.on():  # one JVM in all (the four steps'): the small run's check is made on the smoke's data below
            small = dict.fromkeys(("small", "small_no_archive", "floor"), float("nan"))
        else:
            small, agree = small_wall(scratch)
            ok &= agree
            print(f"  small (~1k records): {small['small']:.1f}s wall, JVM start included, {archived} the class "
                  f"archive; baseline {'agrees' if agree else 'DIFFERS'}")
            print(f"    beside it: {small['small_no_archive']:.1f}s without the archive, {small['floor']:.1f}s for "
                  f"Spark's floor (a fresh session and a trivial job); best of 2, interleaved")
        small_s = small["small"]
        data = os.path.join(scratch, "large")
        snapshots = smoke.size(SNAPSHOTS, 10)
        overhead = NODES + snapshots * NODES * (1 + 2 * (NODES - 1))  # init, cuts, markers
        started = time.perf_counter()
        made = synth.generate(data, nodes=NODES, transfers=max(1, (args.size - overhead) // 2), snapshots=snapshots, seed=1)
        n = made.records
        # A smoke run's stand-in for the small run's check: the plain-Python baseline's verdicts (it reads
        # active segments only, so before the seal) must be the job's.
        expected = baseline.reconcile(data) if smoke.on() else None
        seal(data)
        print(f"  synth {n:,} records in {time.perf_counter() - started:.0f}s", flush=True)
        steps = ("ingest", "reconcile", "reconcile-rows", "reconcile-jsonl")
        if smoke.on():  # one JVM for the four: a smoke run proves the steps, it times nothing
            done = _sparks(data, "local[2]", steps)
        else:  # each in a fresh process, so none runs in a JVM the one before warmed
            done = {what: _spark(data, "local[2]", what) for what in steps}
        ingested, parquet, parquet_rows, jsonl = (done[what] for what in steps)
        print(f"  ingest to Parquet: {ingested['job_s']:.1f}s ({n / ingested['job_s']:,.0f} records/s)", flush=True)
        ok &= parquet["verdicts"] == jsonl["verdicts"] == parquet_rows["verdicts"]
        ok &= all(v["consistent"] is not False for v in parquet["verdicts"])
        if expected is not None:
            agree = parquet["verdicts"] == expected
            ok &= agree
            print(f"  smoke: the job's verdicts {'equal' if agree else 'DIFFER from'} the plain-Python baseline's")
        duck_s, duck = duckdb_checks(data, "jsonl")
        duck_pq_s, duck_pq = duckdb_checks(data, "parquet")
        ok &= duck["records"] == n and duck["unmatched"] == 0 and duck["wrong_balances"] == 0 and duck_pq == duck
        figures = {
            "reconcile_small_wall_s": small_s,
            "reconcile_small_no_archive_wall_s": small["small_no_archive"],
            "spark_trivial_job_wall_s": small["floor"],
            "reconcile_10m_records_per_s": n / parquet["job_s"],
            "reconcile_10m_rows_records_per_s": n / parquet_rows["job_s"],
            "reconcile_10m_ingest_records_per_s": n / ingested["job_s"],
            "duckdb_10m_records_per_s": n / duck_s,
        }
        rows = [
            ("spark local[2], ingested sums + JSONL tail (the job)", parquet["job_s"]),
            ("spark local[2], Parquet rows + JSONL tail (summed=False)", parquet_rows["job_s"]),
            ("spark local[2], JSONL only (the job)", jsonl["job_s"]),
            ("spark scan floor: JSONL read + group-by", parquet["scan_jsonl_s"]),
            ("spark scan floor: Parquet read + group-by", parquet["scan_parquet_s"]),
            ("duckdb (2 threads): JSONL parse + match + per-cut sums", duck_s),
            ("duckdb (2 threads): Parquet + match + per-cut sums", duck_pq_s),
        ]
        if not (args.skip_standalone or smoke.on()):
            with StandaloneCluster(workers=2, cores=1, memory="1g") as cluster:
                standalone = _spark(data, cluster.url, "reconcile-standalone")
            ok &= standalone["verdicts"] == parquet["verdicts"]
            figures["reconcile_10m_standalone_records_per_s"] = n / standalone["job_s"]
            rows.append(("spark standalone, 2 workers x 1 core, Parquet (the job)", standalone["job_s"]))
        print(f"\n{n:,} records (JVM start, not counted: {parquet['session_s']:.1f}s)")
        print(f"{'what':<58} {'s':>7} {'records/s':>12} {'vs duckdb':>9}")
        for what, seconds in rows:
            print(f"{what:<58} {seconds:>7.1f} {n / seconds:>12,.0f} {duck_s / seconds:>8.2f}x")
        print(f"(vs duckdb = DuckDB JSONL time / this time; load {load:.1f} at start, {os.getloadavg()[0]:.1f} at end)")
        if args.size != DEFAULT_SIZE:
            figures = {k: v for k, v in figures.items() if "10m" not in k}  # the keys name 10M records
            print(f"size {n:,} is not 10M: only the small-run keys go to {results.RESULTS.name}")
        results.merge(figures)
        print("verdicts agree (local JSONL = Parquet rows = ingested sums = standalone; DuckDB finds no mismatch)"
              if ok else "MISMATCH")
    finally:
        if not os.environ.get("BENCH_RECONCILE_DIR"):
            shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
