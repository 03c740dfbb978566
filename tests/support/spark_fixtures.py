"""One SparkSession for every Spark test in the run (import `spark` from here).

Starting a session costs seconds, so it is session-scoped: local[2], a 512m driver
heap, two shuffle partitions, no UI, and the small-input settings of `snapmesh
reconcile` (quick JIT only, interpreted expressions: compiling generated code for
each query costs more than running it on test-sized data), and, as `build_session`
sets it, no capture of each column function's Python call site (four JVM round trips
a call). Modules import the fixture:
`from spark_fixtures import spark  # noqa: F401`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("snapmesh-tests")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m")
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
