"""spark-submit entry point of the reconciliation job (same arguments as `snapmesh reconcile`).

    cd /work/main && rm -f snapmesh.zip && zip -qr snapmesh.zip snapmesh -i '*.py'
    spark-submit --master spark://host:7077 --py-files snapmesh.zip \
        jobs/reconcile_job.py --data-dir s3a://bucket/run-1 --out s3a://bucket/run-1/reconcile

The zip carries the `snapmesh` package (only `snapmesh.reconcile` is imported on the
cluster; no UDFs, so executors run no Python of ours). `--master` may be given here
or to spark-submit; without it the master spark-submit configured is used.
Exit status: 0 all consistent, 1 a discrepancy, 2 bad input.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from snapmesh.reconcile.main import build_session, parser, run_job


def main(argv: list[str]) -> int:
    p = parser(prog="reconcile_job.py")
    p.set_defaults(master=None)  # spark-submit decides unless --master is given
    args = p.parse_args(argv)
    spark = build_session(args.master) if args.master else SparkSession.builder.appName("snapmesh-reconcile").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        return run_job(spark, args.data_dir, args.out, exact=args.exact)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
