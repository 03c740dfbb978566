"""Log lines longer than the read bound: read past by Spark, their records recovered.

An app's init, checkpoint and restore records hold its whole state as base64 (at
1 GiB a node, a line of 1.4 GB): Spark's text reader would make each such line one
row, and the heap runs out. So the reader is bounded: Hadoop's LineRecordReader
keeps at most ``bound`` bytes of a line (``mapreduce.input.linerecordreader.line.maxlength``)
and reads through the rest with its small buffer. With every file split shorter
than the bound (``prepare`` sees to it), a line of ``bound`` bytes or more still
gives exactly one row, in its place, holding its first ``bound`` bytes (the first
line of a file up to three more); any shorter row is the whole line. (With a split
longer than the bound the reader would give pieces of a long line as rows: LL1.)

Such a row is a *placeholder*: its text is dropped at the scan, and after the log is
located (``line``, ``pos``) its record is recovered on the driver by one streaming
pass over its file (``statecut.StateCut``: the line with its state left out, what
``parse.without_state`` makes of it) and parsed in its place, with its line and
position (LL2). The pass counts lines as the reader does (``\\n``, ``\\r\\n`` or a lone
``\\r`` ends one) and checks each recovered line against the placeholder's length
and CRC-32 of its first bytes: a file that changed under the run is bad input (LL3).
A line that cannot be read within the bound is a bad line, named, never dropped (LL4).
Local files are read with Python's own I/O, others through Hadoop's FileSystem.

The bound is ``SNAPMESH_RECONCILE_LINE_BYTES`` (default 16 MiB; at least 4 KiB).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from snapmesh.reconcile.common import InputError
from snapmesh.reconcile.statecut import StateCut

MAX_LENGTH_KEY = "mapreduce.input.linerecordreader.line.maxlength"
LINE_BYTES_ENV = "SNAPMESH_RECONCILE_LINE_BYTES"
DEFAULT_LINE_BYTES = 16 << 20
MIN_LINE_BYTES = 4 << 10
HELPERS = ("_long", "_head_len", "_head_crc")
_CHUNK = 8 << 20
_BOM = b"\xef\xbb\xbf"


def line_bound() -> int:
    """The read bound from the environment (InputError when it is not a number)."""
    text = os.environ.get(LINE_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_LINE_BYTES
    try:
        value = int(text)
    except ValueError as e:
        raise InputError(f"{LINE_BYTES_ENV}={text!r}: not a number of bytes") from e
    return max(value, MIN_LINE_BYTES)


def prepare(spark: SparkSession, bound: int) -> None:
    """Make Spark split files shorter than ``bound`` (LL1): the session's split size
    (``spark.sql.files.maxPartitionBytes``) is lowered when it is not already."""
    conf = spark._jsparkSession.sessionState().conf()
    if conf.filesMaxPartitionBytes() >= bound:
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(bound // 2))


def flags(value: Column, bound: int) -> list[Column]:
    """A placeholder's mark, and the length and CRC-32 of the bytes the reader kept."""
    long = F.octet_length(value) >= bound
    return [
        long.alias("_long"),
        F.when(long, F.octet_length(value)).cast("long").alias("_head_len"),
        F.when(long, F.crc32(value.cast("binary"))).alias("_head_crc"),
    ]


def _path(spark: SparkSession, uri: str):  # noqa: ANN202 (a py4j object)
    """Hadoop's Path of a file as Spark names it (``input_file_name``: a URI, escaped)."""
    jvm = spark.sparkContext._jvm
    return jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))


def _is_local(spark: SparkSession, uri: str) -> str | None:
    path = _path(spark, uri).toUri()
    return path.getPath() if path.getScheme() in (None, "file") else None


def _chunks(spark: SparkSession, uri: str) -> Iterator[bytes]:
    local = _is_local(spark, uri)
    if local is not None:
        with open(local, "rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk
        return
    jvm = spark.sparkContext._jvm
    target = _path(spark, uri)
    fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    left = fs.getFileStatus(target).getLen()
    stream = fs.open(target)
    try:
        io = jvm.org.apache.commons.io.IOUtils  # Spark ships commons-io
        while left > 0:
            n = min(_CHUNK, left)
            yield bytes(io.toByteArray(stream, n))
            left -= n
    finally:
        stream.close()


def recover(chunks: Iterator[bytes], targets: dict[int, tuple[int, int]], bound: int) -> dict[int, tuple[bytes, str | None]]:
    """Line number -> (its text with the state left out, a problem or None), for the
    lines ``targets`` names (line -> (head_len, head_crc): what the reader kept of it),
    in one pass over ``chunks``; ValueError when a line is not what the reader saw."""
    out: dict[int, tuple[bytes, str | None]] = {}
    want = sorted(targets)
    line, seen, pending_cr, first = 1, False, False, True  # seen: the current line has a byte
    cut = _start(targets, line, bound)
    for chunk in chunks:
        i, n = 0, len(chunk)
        if first and chunk.startswith(_BOM):
            i = 3  # the reader drops it from the first line
        first = False
        if pending_cr:
            pending_cr = False
            i = 1 if chunk[:1] == b"\n" else i
        has_cr = b"\r" in chunk
        nxt = next((w for w in want if w >= line), None)
        if cut is None and nxt is None:
            break
        if cut is None and not has_cr:
            ends = chunk.count(b"\n", i)
            if line + ends < nxt:  # no wanted line starts in this chunk: count it
                line += ends
                seen = (seen or n > i) if ends == 0 else not chunk.endswith(b"\n")
                continue
        lf = cr = -1
        while i < n:
            if lf < i:
                lf = chunk.find(b"\n", i)
                lf = n if lf < 0 else lf
            if cr < i:
                cr = chunk.find(b"\r", i) if has_cr else n
                cr = n if cr < 0 else cr
            j = min(lf, cr)
            if cut is not None:
                cut.feed(memoryview(chunk)[i:j])
            seen = seen or j > i
            if j == n:
                break
            if cut is not None:
                out[line] = _end(cut, targets[line])
            line, seen = line + 1, False
            cut = _start(targets, line, bound)
            if chunk[j : j + 1] == b"\r":
                if j + 1 < n:
                    i = j + 2 if chunk[j + 1 : j + 2] == b"\n" else j + 1
                else:
                    pending_cr, i = True, n
            else:
                i = j + 1
    if cut is not None and seen:
        out[line] = _end(cut, targets[line])
    return out


def _start(targets: dict[int, tuple[int, int]], line: int, bound: int) -> StateCut | None:
    return StateCut(bound, head_len=targets[line][0]) if line in targets else None


def _end(cut: StateCut, target: tuple[int, int]) -> tuple[bytes, str | None]:
    head_len, head_crc = target
    if cut.size < head_len or cut.head_crc != head_crc:
        raise ValueError("not the line Spark's reader saw")
    return cut.end()


def replace_long(spark: SparkSession, located: DataFrame, files: list, bound: int) -> DataFrame:
    """``located`` with each placeholder's record recovered in its place (LL2)."""
    plain = located.drop(*HELPERS)
    if all(f.size < bound for f in files):
        return plain  # no line can be that long
    rows = located.filter(F.col("_long")).select("file", "line", "pos", *HELPERS[1:]).collect()
    if not rows:
        return plain
    by_file: dict[str, dict[int, tuple[int, int]]] = {}
    for r in rows:
        by_file.setdefault(r["file"], {})[r["line"]] = (r["_head_len"], r["_head_crc"])
    pos = {(r["file"], r["line"]): r["pos"] for r in rows}
    records = []
    for uri, targets in by_file.items():
        try:
            found = recover(_chunks(spark, uri), targets, bound)
        except ValueError as e:
            raise InputError(f"{uri} changed while it was read: {e}") from e
        for line in targets:
            if line not in found:
                raise InputError(f"{uri} changed while it was read: line {line} is gone")
            text, problem = found[line]
            if problem is not None:
                problem = (f"a line longer than the read bound ({bound} bytes) with {problem}: "
                           f"not read (raise {LINE_BYTES_ENV})")
            records.append((uri, line, pos[(uri, line)], text.decode("utf-8", "replace"), problem))
    kept = located.filter(~F.col("_long")).drop(*HELPERS)
    return kept.unionByName(_located(spark, records).select(*plain.columns))


_REPLACED = T.StructType([
    T.StructField("file", T.StringType()), T.StructField("line", T.LongType()), T.StructField("pos", T.LongType()),
    T.StructField("value", T.StringType()), T.StructField("_problem", T.StringType()),
])


def _located(spark: SparkSession, records: list[tuple]) -> DataFrame:
    from snapmesh.reconcile.parse import finish_problem, parse_log_lines

    lines = spark.createDataFrame(records, _REPLACED).select(
        "file", F.lit(0).cast("long").alias("block"), F.lit(0).cast("long").alias("mid"), "value", "line", "pos", "_problem")
    parsed = parse_log_lines(lines)
    return finish_problem(parsed.withColumn("problem", F.coalesce("_problem", "problem")).drop("_problem"))
