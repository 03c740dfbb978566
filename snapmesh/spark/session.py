"""The Spark session of a reconcile run: how it is built and stopped, a standalone
master waited for, and the exit statuses. Shared by ``main`` (`snapmesh reconcile`),
``ingest``, ``warmup`` and ``jobs/reconcile_job.py``; it imports none of them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from snapmesh.spark import cds
from snapmesh.reconcile.common import InputError

EXIT_OK, EXIT_INCONSISTENT, EXIT_BAD_INPUT = 0, 1, 2
DRIVER_MEMORY_ENV = "SNAPMESH_SPARK_DRIVER_MEMORY"
_JVM_OOM_EXIT = 52  # SparkExitCode.OOM: a local JVM's uncaught OutOfMemoryError ends it with this

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def _master_addresses(master: str) -> list[tuple[str, int]]:
    """host:port pairs of a ``spark://h1:p1[,h2:p2]`` URL (default port 7077)."""
    out = []
    for part in master.removeprefix("spark://").split(","):
        host, _, port = part.partition(":")
        out.append((host, int(port or 7077)))
    return out


def wait_for_master(master: str, timeout_s: float) -> None:
    """Return once a standalone master accepts connections; InputError after ``timeout_s``.

    Spark's own client retries for about a minute before it gives up, and a job
    without executors waits for ever: both are bounded here instead.
    """
    try:
        addresses = _master_addresses(master)
    except ValueError as e:
        raise InputError(f"--master {master}: not a spark://host:port URL") from e
    deadline = time.monotonic() + timeout_s
    while True:
        for address in addresses:
            try:
                socket.create_connection(address, timeout=min(2.0, timeout_s)).close()
                return
            except OSError:
                pass
        if time.monotonic() >= deadline:
            raise InputError(f"Spark master {master} unreachable: nothing answered within {timeout_s:g}s")
        time.sleep(0.2)


def wait_for_executors(spark: SparkSession, master: str, timeout_s: float) -> None:
    """Return once the application has an executor; InputError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 2:  # the driver counts as one
        if time.monotonic() >= deadline:
            raise InputError(
                f"Spark master {master} gave no executor within {timeout_s:g}s "
                "(no live worker, or none with the cores and memory asked for)"
            )
        time.sleep(0.2)


SMALL_INPUT_BYTES = 32 << 20  # below this a run is over in seconds: tune for start-up


def input_bytes(data_dir: str) -> int | None:
    """Bytes of a local data dir's logs, sealed segments included (None when it is not local: unknown)."""
    url = urlparse(data_dir)
    if url.scheme not in ("", "file"):
        return None
    local = url.path if url.scheme == "file" else data_dir
    if not os.path.isdir(local):
        return None
    with os.scandir(local) as entries:
        return sum(e.stat().st_size for e in entries if e.is_file() and ".log." in e.name)


def session_for(master: str | None, data_dir: str) -> SparkSession:
    """``build_session`` with the small-input settings when ``data_dir``'s logs are known
    to be under SMALL_INPUT_BYTES: the choice of `snapmesh reconcile` and of its ``ingest``."""
    size = input_bytes(data_dir)
    return build_session(master, small=size is not None and size < SMALL_INPUT_BYTES)


def build_session(master: str | None, app_name: str = "snapmesh-reconcile", *, small: bool = False) -> SparkSession:
    """A session for ``master``; None leaves the master to spark-submit.

    Local masters get settings for one small machine: no UI, shuffle partitions near
    the core count, a driver heap (the executors live in it) from
    SNAPMESH_SPARK_DRIVER_MEMORY (default 2g; it only applies when this process starts
    the JVM, not under spark-submit). ``small`` (input of a few MB) trades peak speed
    for start-up: the JVM's quick compiler only (C1: the JIT's optimizing tier costs
    more than a small run saves), interpreted expressions instead of generated code
    (compiling each query's Java takes longer than running it), one shuffle partition.
    Every local driver maps the class archive of ``snapmesh reconcile prepare`` when
    there is one (``cds``), and SNAPMESH_SPARK_JAVA_OPTIONS adds JVM options.
    """
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    if master and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        java_options = f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}"
        if small:
            java_options += " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"
        java_options = " ".join(
            o for o in (java_options, cds.java_options(), os.environ.get("SNAPMESH_SPARK_JAVA_OPTIONS", "")) if o
        )
        builder = (
            builder.config("spark.driver.memory", os.environ.get("SNAPMESH_SPARK_DRIVER_MEMORY", "512m" if small else "2g"))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1" if small else str(2 * (os.cpu_count() or 2)))
            .config("spark.sql.adaptive.enabled", "true")
            .config("spark.driver.extraJavaOptions", java_options)
        )
        if small:
            builder = builder.config("spark.sql.codegen.wholeStage", "false").config(
                "spark.sql.codegen.factoryMode", "NO_CODEGEN"
            )
        else:
            # Files are split so that each core gets several tasks: with one split per
            # node's segment, a 6-node log gave 3 tasks to 2 cores, one running alone.
            builder = builder.config("spark.sql.files.minPartitionNum", str(4 * (os.cpu_count() or 2)))
    if master and master.startswith("spark://"):
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.memory", os.environ.get("SNAPMESH_SPARK_EXECUTOR_MEMORY", "768m"))
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}")
        )
    # Off: pyspark's capture of each column function's Python call site costs four JVM
    # round trips per call, a quarter of a small run's time on the driver.
    builder = builder.config("spark.python.sql.dataFrameDebugging.enabled", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def out_of_memory(spark: SparkSession | None, error: BaseException) -> str | None:
    """One line for the user when ``error`` (from py4j) is Spark running out of heap,
    naming what to raise; None for any other error.

    A task's OutOfMemoryError ends a local JVM (Spark's uncaught-exception handler,
    exit 52): py4j then reports a lost connection, or an error it cannot print.
    """
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 (py4j's str() asks the JVM, which may be gone)
        text = ""
    proc = getattr(getattr(getattr(spark, "sparkContext", None), "_gateway", None), "proc", None)
    dying = not text or isinstance(error, ConnectionError) or any(
        m in text for m in ("stopped SparkContext", "SparkContext was shut down", "dagScheduler()", "Connection refused"))
    try:  # a JVM on its way out (its shutdown hooks stop the context first): its exit status tells
        dead = proc is not None and (proc.wait(timeout=10) if dying else proc.poll()) == _JVM_OOM_EXIT
    except subprocess.TimeoutExpired:
        dead = False
    if "OutOfMemoryError" not in text and not dead:
        return None
    now = os.environ.get(DRIVER_MEMORY_ENV, "2g")
    return (f"out of memory: Spark's heap ({DRIVER_MEMORY_ENV}={now}) ran out (java.lang.OutOfMemoryError); "
            f"raise {DRIVER_MEMORY_ENV} (e.g. 4g) and run again")


def stop_session(spark: SparkSession) -> None:
    """``spark.stop()``, without waiting for pyspark's accumulator server to notice.

    That server's handler polls its connection once a second, and ``stop()`` waits
    for it: 0.9 s of a small run's 9 s, spent after the verdicts are out. The JVM side
    stops as before; the server is shut down on a daemon thread (it is Python's own
    socket server, and this job uses no Python accumulators).
    """
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        spark.sparkContext._accumulatorServer = None
        threading.Thread(target=server.shutdown, name="accumulator-server-shutdown", daemon=True).start()
    try:
        spark.stop()
    except (Py4JError, ConnectionError):  # the JVM is gone already (out_of_memory): nothing to stop
        pass
