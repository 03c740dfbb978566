"""The run `snapmesh reconcile prepare` dumps the driver JVM's classes from (``cds``).

``python -m snapmesh.spark.warmup ARCHIVE SCRATCH``, in a child process: a small
reconcile on synthetic data whose JVM writes its class archive to ARCHIVE as it
exits. Apart from ``cds`` because it runs the job (``main``), which maps the archive
``cds`` names: so neither imports the other's importer.
"""

from __future__ import annotations

import os
import sys

from pyspark import SparkContext

from snapmesh.synth import writer as synth
from snapmesh.spark.cds import DUMP_TIMEOUT_S
from snapmesh.reconcile.job import run_job
from snapmesh.spark.session import EXIT_OK, build_session


def dump(archive_tmp: str, scratch: str) -> None:
    """A small reconcile whose driver JVM dumps its classes at exit."""
    data = os.path.join(scratch, "data")
    synth.generate(data, nodes=3, transfers=200, snapshots=3, seed=1)
    os.environ["SNAPMESH_SPARK_CDS"] = "off"  # not mapping an older archive while dumping a new one
    os.environ["SNAPMESH_SPARK_JAVA_OPTIONS"] = (
        f"{os.environ.get('SNAPMESH_SPARK_JAVA_OPTIONS', '')} -XX:ArchiveClassesAtExit={archive_tmp} -Xlog:cds=off"
    )
    spark = build_session("local[*]", app_name="snapmesh-cds", small=True)
    status = run_job(spark, data, os.path.join(scratch, "out"), quiet=True)
    if status != EXIT_OK:
        raise SystemExit(f"the warm-up reconcile exited {status}")
    spark.stop()
    # pyspark keeps the JVM for a later session; it writes the archive as it exits.
    gateway = SparkContext._gateway
    proc = gateway.proc
    gateway.shutdown()
    proc.stdin.close()
    proc.wait(timeout=DUMP_TIMEOUT_S)


if __name__ == "__main__":
    archive, scratch = sys.argv[1:3]
    dump(archive, scratch)
