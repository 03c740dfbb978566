"""spark-submit entry point of the reconciliation job (same arguments as `snapmesh reconcile`).

    cd /work/main && rm -f snapmesh.zip && zip -qr snapmesh.zip snapmesh -i '*.py'
    spark-submit --master spark://host:7077 --py-files snapmesh.zip \
        jobs/reconcile_job.py --data-dir s3a://bucket/run-1 --out s3a://bucket/run-1/reconcile

In compose (profile `spark`) the image has the package installed and this file is
mounted at /opt/snapmesh-jobs. With a spark:// master the wait for it and for an
executor is bounded by --master-timeout (exit 2), as in `snapmesh reconcile`.

The zip carries the `snapmesh` package (only `snapmesh.reconcile` is imported on the
cluster). The executors import it too when an export holds states as manifests:
each one reads and hashes its nodes' blocks (`snapmesh.reconcile.blockstates`), so
the zip must reach them (--py-files does). `--master` may be given here or to
spark-submit; without it the master spark-submit configured is used.
Exit status: 0 all consistent, 1 a discrepancy, 2 bad input.
"""

from __future__ import annotations

import sys

from py4j.protocol import Py4JError
from pyspark import SparkConf
from pyspark.sql import SparkSession

from snapmesh.reconcile.common import InputError
from snapmesh.app import AppError
from snapmesh.reconcile.job import app_of, parser, run_job
from snapmesh.spark.session import (EXIT_BAD_INPUT, build_session, out_of_memory, stop_session, wait_for_executors,
                                    wait_for_master)


def main(argv: list[str]) -> int:
    p = parser(prog="reconcile_job.py")
    p.set_defaults(master=None)  # spark-submit decides unless --master is given
    args = p.parse_args(argv)
    try:
        app, app_module = app_of(args.app)  # --app: its module on the driver's path (--py-files ships it too)
    except AppError as e:
        print(f"reconcile_job.py: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    master = args.master or SparkConf().get("spark.master", "")
    standalone = master.startswith("spark://")
    try:
        if standalone:  # bounded: Spark's own client would retry for a minute, a job wait for ever
            wait_for_master(master, args.master_timeout)
        spark = build_session(args.master) if args.master else SparkSession.builder.appName("snapmesh-reconcile").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    except InputError as e:
        print(f"reconcile_job.py: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if standalone:
            wait_for_executors(spark, master, args.master_timeout)
        return run_job(spark, args.data_dir, args.out, exact=args.exact, app=app, app_module=app_module)
    except InputError as e:
        print(f"reconcile_job.py: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (Py4JError, ConnectionError) as e:
        if (why := out_of_memory(spark, e)) is None:
            raise
        print(f"reconcile_job.py: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        stop_session(spark)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
