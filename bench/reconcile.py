"""Benchmark: the Spark reconciliation vs a single-process plain-Python baseline.

For each size (log records, 100 snapshots, 6 nodes) it writes synthetic data with
`snapmesh synth`, then in the same run times the Spark job on local[*] and the
baseline on the same data, checks that both produced the same verdict rows, and
prints records/s and the ratio. Then it times the Spark job on local[1] and local[2]
(scaling with cores). Each Spark measurement runs in a fresh process (a master is
fixed per JVM); the time is the job alone (reading, checking, collecting the
verdicts), not the ~5-10 s JVM start, which is reported separately.

`python -m bench reconcile` (or `python -m bench.reconcile [--sizes 1000000,...]`).
Environment: BENCH_RECONCILE_SIZES (comma-separated record counts),
BENCH_RECONCILE_DIR (scratch dir, default a temp dir), BENCH_DRIVER_MEMORY (6g).
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

NODES = 6
SNAPSHOTS = 100
DEFAULT_SIZES = (1_000_000, 10_000_000)


def _worker(data_dir: str, master: str) -> None:
    """In a fresh process: start a session, time one reconcile, print JSON."""
    from snapmesh.reconcile import main as job

    started = time.perf_counter()
    spark = job.build_session(master, app_name="snapmesh-bench")
    session_s = time.perf_counter() - started
    started = time.perf_counter()
    outcome = job.reconcile(spark, data_dir)
    job_s = time.perf_counter() - started
    spark.stop()
    print(json.dumps({"session_s": session_s, "job_s": job_s, "verdicts": outcome.verdicts, "bad": outcome.bad_input}))


def spark_run(data_dir: str, master: str) -> dict:
    env = dict(os.environ)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["SNAPMESH_SPARK_DRIVER_MEMORY"] = os.environ.get("BENCH_DRIVER_MEMORY", "6g")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.reconcile", "--worker", data_dir, master],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"spark worker failed ({master}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def baseline_run(data_dir: str) -> tuple[float, list[dict]]:
    from snapmesh.reconcile import baseline

    started = time.perf_counter()
    rows = baseline.reconcile(data_dir)
    return time.perf_counter() - started, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench reconcile")
    p.add_argument("--worker", nargs=2, metavar=("DATA_DIR", "MASTER"), help=argparse.SUPPRESS)
    p.add_argument("--sizes", default=os.environ.get("BENCH_RECONCILE_SIZES", ",".join(map(str, DEFAULT_SIZES))))
    p.add_argument("--no-scaling", action="store_true", help="skip the local[1] vs local[2] runs")
    args = p.parse_args(sys.argv[2:] if argv is None and sys.argv[1:2] == ["reconcile"] else argv)
    if args.worker:
        _worker(*args.worker)
        return 0
    from snapmesh.reconcile import synth

    sizes = [int(s) for s in args.sizes.split(",") if s]
    scratch = os.environ.get("BENCH_RECONCILE_DIR") or tempfile.mkdtemp(prefix="snapmesh-bench-")
    cores = os.cpu_count()
    print(f"reconcile benchmark: {NODES} nodes, {SNAPSHOTS} snapshots, {cores} cores, seed 1, scratch {scratch}")
    results = []
    try:
        for size in sizes:
            data = os.path.join(scratch, f"r{size}")
            shutil.rmtree(data, ignore_errors=True)
            overhead = NODES + SNAPSHOTS * NODES * (1 + 2 * (NODES - 1))  # init, cuts, markers
            started = time.perf_counter()
            made = synth.generate(data, nodes=NODES, transfers=max(1, (size - overhead) // 2), snapshots=SNAPSHOTS, seed=1)
            synth_s = time.perf_counter() - started
            print(f"  synth {made.records:,} records in {synth_s:.1f}s", flush=True)
            star = spark_run(data, "local[*]")
            print(f"  spark local[*]: job {star['job_s']:.1f}s (+ session start {star['session_s']:.1f}s)", flush=True)
            base_s, base_rows = baseline_run(data)
            print(f"  baseline: {base_s:.1f}s", flush=True)
            agree = base_rows == star["verdicts"]
            consistent = all(v["consistent"] for v in star["verdicts"])
            row = {"records": made.records, "spark_s": star["job_s"], "base_s": base_s, "agree": agree, "consistent": consistent}
            if not args.no_scaling:
                for n in (1, 2):
                    r = spark_run(data, f"local[{n}]")
                    row[f"local{n}_s"] = r["job_s"]
                    print(f"  spark local[{n}]: job {r['job_s']:.1f}s", flush=True)
            results.append(row)
            shutil.rmtree(data, ignore_errors=True)
    finally:
        if not os.environ.get("BENCH_RECONCILE_DIR"):
            shutil.rmtree(scratch, ignore_errors=True)

    print()
    head = f"{'records':>12}  {'spark s':>8}  {'spark rec/s':>12}  {'baseline s':>10}  {'base rec/s':>11}  {'ratio':>6}  verdicts"
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['records']:>12,}  {r['spark_s']:>8.1f}  {r['records'] / r['spark_s']:>12,.0f}  {r['base_s']:>10.1f}  "
            f"{r['records'] / r['base_s']:>11,.0f}  {r['base_s'] / r['spark_s']:>5.2f}x  "
            f"{'same' if r['agree'] else 'DIFFER'}{'' if r['consistent'] else ' (inconsistent!)'}"
        )
    print("ratio = baseline time / Spark time (above 1: Spark is faster). Spark: local[*], job only.")
    if not args.no_scaling:
        print(f"\n{'records':>12}  {'local[1] s':>10}  {'local[2] s':>10}  {'speedup':>7}")
        for r in results:
            print(f"{r['records']:>12,}  {r['local1_s']:>10.1f}  {r['local2_s']:>10.1f}  {r['local1_s'] / r['local2_s']:>6.2f}x")
    return 0 if all(r["agree"] and r["consistent"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
