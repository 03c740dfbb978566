"""Which files hold a node's log, and reading them as one located table.

A node's log is its sealed segments ``<node>.log.<first lsn, 12 digits>.jsonl`` in
lsn order, then the active ``<node>.log.jsonl``. Files are listed once on the driver
through Hadoop's FileSystem (local, hdfs://, s3a://), so Spark is handed explicit
paths and runs no listing job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .common import InputError
from .parse import locate_lines, parse_log_lines
from .schema import LOG_FILE_PATTERN


@dataclass(frozen=True, kw_only=True)
class LogFile:
    uri: str  # as Spark names it (input_file_name)
    name: str  # base name
    stem: str  # the node, as written in the file name
    first_lsn: int | None  # None: the active file
    size: int
    mtime_ms: int


def _fs(spark: SparkSession, path: str):  # noqa: ANN202 (a py4j object)
    jvm = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    return target, target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def list_logs(spark: SparkSession, data_dir: str) -> list[LogFile]:
    """Every log file of ``data_dir`` (not recursive), by node then lsn, active last."""
    target, fs = _fs(spark, data_dir)
    if not fs.exists(target):
        raise InputError(f"data dir {data_dir} does not exist")
    found = []
    for status in fs.listStatus(target):
        if not status.isFile():
            continue
        name = status.getPath().getName()
        m = re.match(LOG_FILE_PATTERN, name)
        if m:
            found.append(
                LogFile(
                    uri=status.getPath().toString(),
                    name=name,
                    stem=m.group(1),
                    first_lsn=int(m.group(2)) if m.group(2) else None,
                    size=status.getLen(),
                    mtime_ms=status.getModificationTime(),
                )
            )
    return sorted(found, key=lambda f: (f.stem, f.first_lsn is None, f.first_lsn or 0))


def read_text_logs(spark: SparkSession, files: list[LogFile]) -> DataFrame:
    """(file, block, mid, value): every line of ``files``, located (see ``parse.locate_lines``)."""
    text = spark.read.text([f.uri for f in files])
    return text.select(
        F.input_file_name().alias("file"),
        F.input_file_block_start().alias("block"),
        F.monotonically_increasing_id().alias("mid"),
        "value",
    )


@dataclass(frozen=True, kw_only=True)
class Logs:
    """The located log (parse.locate_lines' columns) and how to let go of its cache."""

    located: DataFrame
    release: Callable[[], None] = field(default=lambda: None)


def read_logs(spark: SparkSession, data_dir: str) -> Logs:
    """The whole log of every node, parsed and located; the JSONL part cached (parsed once)."""
    files = list_logs(spark, data_dir)
    if not files:
        raise InputError(f"no transfer logs: nothing matches {data_dir.rstrip('/')}/*.log.jsonl")
    # cache(): MEMORY_AND_DISK_DESER. (pyspark's StorageLevel.MEMORY_AND_DISK is the
    # serialized level: every scan would deserialize the whole table again.)
    located = locate_lines(parse_log_lines(read_text_logs(spark, files))).cache()
    return Logs(located=located, release=located.unpersist)
