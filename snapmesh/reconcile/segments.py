"""Which files hold a node's log, and reading them as one located table.

A node's log is its sealed segments ``<node>.log.<first lsn, 12 digits>.jsonl`` in
lsn order, then the active ``<node>.log.jsonl``. Files are listed once on the driver
through Hadoop's FileSystem (local, hdfs://, s3a://), so Spark is handed explicit
paths and runs no listing job.

Sealed segments converted by ``snapmesh reconcile ingest`` are read from Parquet:

    <data_dir>/columnar/manifest.json            what was converted, from what
    <data_dir>/columnar/segments/file=<segment name>/part-*.parquet
    <data_dir>/columnar/markers/file=<segment name>/part-*.parquet   its marker records
    <data_dir>/columnar/sums/file=<segment name>/part-*.parquet      its interval sums

A converted segment whose manifest entry says it has no bad line is *indexed*: its
marker records (cuts, restores, replays) are read from ``markers`` (checked against
the count in the manifest) instead of scanning the segment for them and for bad lines.
It is also *summed* when the manifest counts its interval sums and the records
before it number its first lsn minus one (what ingest assumed): the checksums read
its sums instead of its rows (``checksums.Presummed``). Its rows stay in ``located``
for the exact checks, which run only when a checksum differs.

The JSONL stays the source of truth: a segment is read from Parquet only while its
JSONL origin still has the size and modification time it had when it was converted
(otherwise: bad input, exit 2), and only for a prefix of a node's segments (a
segment after one not converted is read as JSONL). Everything else, the active file
included, is parsed from JSONL (and cached: parsed once per run).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from snapmesh.checking.node_logs import LeftOut

from snapmesh.reconcile.checksums import MARKER_COLUMNS, SEGMENT_SUMS
from snapmesh.reconcile.common import InputError
from snapmesh.reconcile.longlines import HELPERS, MAX_LENGTH_KEY, flags, line_bound, prepare, replace_long
from snapmesh.reconcile.parse import locate_lines, parse_log_lines, without_state
from snapmesh.reconcile.schema import INGESTED, LOG_FILE_PATTERN

COLUMNAR_DIR = "columnar"
MANIFEST = "manifest.json"
SEGMENTS_DIR = "segments"
MARKERS_DIR = "markers"
SUMS_DIR = "sums"


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


def read_text_logs(spark: SparkSession, files: list[LogFile], bound: int | None = None) -> DataFrame:
    """(file, block, mid, value, longlines.HELPERS): every line of ``files``, located
    (see ``parse.locate_lines``). A line of ``bound`` bytes or more (default:
    ``longlines.line_bound()``) is a placeholder, its text empty: ``longlines.replace_long``
    recovers its record once the log is located."""
    bound = bound or line_bound()
    prepare(spark, bound)
    text = spark.read.option(MAX_LENGTH_KEY, str(bound)).text([f.uri for f in files])
    value = F.col("value")
    return text.select(
        F.input_file_name().alias("file"),
        F.input_file_block_start().alias("block"),
        F.monotonically_increasing_id().alias("mid"),
        F.when(F.octet_length(value) >= bound, F.lit("")).otherwise(without_state(value)).alias("value"),
        *flags(value, bound),
    )


def torn_tails(spark: SparkSession, files: list[LogFile]) -> list[LeftOut]:
    """The active files (``<node>.log.jsonl``) that end in a torn line: bytes
    after their last newline, a write cut short, each with where those bytes
    start and how many there are. This is ``snapmesh.protocol.wal.split_lines``'
    reading, which the node's recovery (it cuts the line off) and ``snapmesh
    trace`` share: such a line is not in the log, whether or not it parses. Read
    on the driver, backwards from the end of each active file."""
    torn = []
    for f in files:
        if f.first_lsn is not None or f.size == 0:
            continue
        start = _last_line_start(spark, f)
        if start < f.size:
            torn.append(LeftOut(file=f.uri, offset=start, size=f.size - start))
    return torn


def _last_line_start(spark: SparkSession, f: LogFile) -> int:
    """Where the bytes after the last newline of ``f`` start (``f.size``: none)."""
    target, fs = _fs(spark, f.uri)
    stream = fs.open(target)
    try:
        stream.seek(f.size - 1)
        if stream.read() == ord("\n"):
            return f.size
        io = spark.sparkContext._jvm.org.apache.commons.io.IOUtils  # Spark ships commons-io
        end = f.size
        while end > 0:  # a torn line is short: one block back, usually
            begin = max(0, end - 4096)
            stream.seek(begin)
            data = bytes(io.toByteArray(stream, end - begin))  # py4j hands a byte[] over as bytes
            newline = data.rfind(b"\n")
            if newline >= 0:
                return begin + newline + 1
            end = begin
        return 0
    finally:
        stream.close()


def without_last_lines(located: DataFrame, names: list[str]) -> DataFrame:
    """``located`` without the last line of each file named in ``names`` (their
    torn lines). Matched by name: Spark's ``file`` spells the scheme its own way."""
    path = F.url_decode(F.col("file"))
    mine = F.lit(False)
    for name in names:
        mine = mine | path.endswith("/" + name)
    last = located.filter(mine).groupBy("file").agg(F.max("line").alias("last")).collect()
    keep = F.lit(True)
    for row in last:
        keep = keep & ~((F.col("file") == row["file"]) & (F.col("line") == row["last"]))
    return located.filter(keep)


@dataclass(frozen=True, kw_only=True)
class Logs:
    """The located log (parse.locate_lines' columns) and how to let go of its cache.

    ``scanned``: the part to scan for bad lines and marker records (None: nothing);
    ``markers``: the marker records of the indexed segments (MARKER_COLUMNS plus
    ``segment``, its name; None: none indexed), of which ``expected_markers`` says
    how many each segment has. ``sums``: the interval sums of the summed segments
    (``checksums.SEGMENT_SUMS``; None: none summed), ``expected_sums`` their counts,
    and ``unsummed`` the located rows they do not cover (None: none).
    """

    located: DataFrame
    scanned: DataFrame | None = None
    markers: DataFrame | None = None
    expected_markers: dict[str, int] = field(default_factory=dict)
    sums: DataFrame | None = None
    expected_sums: dict[str, int] = field(default_factory=dict)
    unsummed: DataFrame | None = None
    columnar_root: str = ""
    release: Callable[[], None] = field(default=lambda: None)
    left_out: list[LeftOut] = field(default_factory=list)  # the torn last lines left out, one per file

    def check_markers(self, found: dict[str, int]) -> None:
        """InputError unless ``found`` (segment -> marker records read) matches the manifest."""
        _check_index("marker index", f"{self.columnar_root}/{MARKERS_DIR}", self.expected_markers, found)

    def check_sums(self, found: dict[str, int]) -> None:
        """InputError unless ``found`` (segment -> interval sum rows read) matches the manifest."""
        _check_index("interval sums", f"{self.columnar_root}/{SUMS_DIR}", self.expected_sums, found)


def _check_index(what: str, root: str, expected: dict[str, int], found: dict[str, int]) -> None:
    for name, count in expected.items():
        if found.get(name, 0) != count:
            raise InputError(
                f"{what} {root}/file={name} holds {found.get(name, 0)} records, "
                f"the manifest says {count}; run `snapmesh reconcile ingest` again"
            )


def _read_text_file(spark: SparkSession, path: str) -> str | None:
    target, fs = _fs(spark, path)
    if not fs.exists(target):
        return None
    stream = fs.open(target)
    try:
        io = spark.sparkContext._jvm.java.io
        reader = io.BufferedReader(io.InputStreamReader(stream, "UTF-8"))
        return "\n".join(iter(reader.readLine, None))
    except Py4JJavaError as e:
        if "ChecksumException" not in str(e.java_exception.getClass().getName()):
            raise
        crc = f"{path.rsplit('/', 1)[0]}/.{path.rsplit('/', 1)[-1]}.crc"
        raise InputError(
            f"{path} does not match its checksum file {crc}: it changed after it was written "
            f"(if that change was meant, delete {crc})"
        ) from e
    finally:
        stream.close()


def write_text_file(spark: SparkSession, path: str, text: str) -> None:
    """Write a small file through Hadoop's FileSystem (local, hdfs://, s3a://, ...)."""
    target, fs = _fs(spark, path)
    stream = fs.create(target, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def manifest_path(data_dir: str) -> str:
    return f"{data_dir.rstrip('/')}/{COLUMNAR_DIR}/{MANIFEST}"


def segment_dir(data_dir: str, name: str) -> str:
    return _index_dir(data_dir, SEGMENTS_DIR, name)


def _index_dir(data_dir: str, directory: str, name: str) -> str:
    """A segment's partition of one of ingest's directories (its rows, markers or sums)."""
    return f"{data_dir.rstrip('/')}/{COLUMNAR_DIR}/{directory}/file={name}"


def read_manifest(spark: SparkSession, data_dir: str) -> dict[str, dict]:
    """Segment name -> its entry (origin size, mtime_ms, records); {} when nothing was ingested."""
    text = _read_text_file(spark, manifest_path(data_dir))
    if text is None:
        return {}
    try:
        entries = json.loads(text)["segments"]
        return {e["name"]: e for e in entries}
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{manifest_path(data_dir)}: not a segment manifest ({e})") from e


def _check_parquet(spark: SparkSession, directory: str, what: str = "Parquet segment", *, missing_ok: bool = False) -> None:
    """``directory`` holds Parquet files (magic bytes at both ends, when local).

    ``missing_ok``: a missing directory passes (an index's count check names it).
    """
    target, fs = _fs(spark, directory)
    if not fs.exists(target):
        if missing_ok:
            return
        raise InputError(f"missing {what} {directory}")
    parts = [s for s in fs.listStatus(target) if s.getPath().getName().endswith(".parquet")]
    if not parts:
        raise InputError(f"unreadable {what} {directory}: no Parquet files in it")
    for status in parts:
        uri = status.getPath().toUri()
        if uri.getScheme() not in (None, "file"):
            continue  # remote: a bad file fails the read itself
        try:
            with open(uri.getPath(), "rb") as part:
                head = part.read(4)
                part.seek(max(0, status.getLen() - 4))
                ok = status.getLen() >= 12 and head == b"PAR1" and part.read(4) == b"PAR1"
        except OSError:
            ok = False
        if not ok:
            raise InputError(f"unreadable {what} {status.getPath().toString()}: not a Parquet file")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Which files are read from Parquet (with the records before each) and which as JSONL."""

    parquet: list[tuple[LogFile, int]]  # (segment, records of the node's log before it)
    jsonl: list[LogFile]
    jsonl_base: dict[str, int]  # node stem -> records read from Parquet before its JSONL files
    indexed: dict[str, int] = field(default_factory=dict)  # segment name -> its marker records
    summed: dict[str, int] = field(default_factory=dict)  # segment name -> its interval sum rows


def plan(spark: SparkSession, data_dir: str, files: list[LogFile]) -> Plan:
    """Split ``files`` into Parquet segments and JSONL, checking each segment against its origin."""
    manifest = read_manifest(spark, data_dir)
    by_name = {f.name: f for f in files}
    for name in manifest:
        if name not in by_name:
            raise InputError(
                f"Parquet segment {segment_dir(data_dir, name)}: its JSONL origin "
                f"{data_dir.rstrip('/')}/{name} is gone (the JSONL is the source of truth)"
            )
    parquet, jsonl, base, indexed, summed = [], [], {}, {}, {}
    stems: dict[str, list[LogFile]] = {}
    for f in files:
        stems.setdefault(f.stem, []).append(f)
    for stem, node_files in stems.items():
        before, converted = 0, True
        for f in node_files:
            entry = manifest.get(f.name)
            converted = converted and f.first_lsn is not None and entry is not None
            if not converted:
                jsonl.append(f)
                continue
            if (entry.get("size"), entry.get("mtime_ms")) != (f.size, f.mtime_ms):
                raise InputError(
                    f"Parquet segment {segment_dir(data_dir, f.name)} disagrees with its JSONL origin {f.uri}: "
                    f"converted from {entry.get('size')} bytes (mtime {entry.get('mtime_ms')}), "
                    f"the file now has {f.size} bytes (mtime {f.mtime_ms}); run `snapmesh reconcile ingest` again"
                )
            _check_parquet(spark, segment_dir(data_dir, f.name))
            parquet.append((f, before))
            if entry.get("bad") == 0 and isinstance(entry.get("markers"), int):  # older manifests: scanned
                indexed[f.name] = entry["markers"]
                if entry["markers"]:
                    _check_parquet(spark, _index_dir(data_dir, MARKERS_DIR, f.name), "marker index", missing_ok=True)
                # The sums assume the lsns in the segment's name; if earlier records are
                # missing or extra, its rows are aggregated (and the lsn check names it).
                if isinstance(entry.get("sums"), int) and before == f.first_lsn - 1:
                    summed[f.name] = entry["sums"]
                    _check_parquet(spark, _index_dir(data_dir, SUMS_DIR, f.name), "interval sums", missing_ok=True)
            before += int(entry["records"])
        base[stem] = before
    return Plan(parquet=parquet, jsonl=jsonl, jsonl_base=base, indexed=indexed, summed=summed)


def _map_of(pairs: dict[str, int], key: str) -> F.Column:
    if not pairs:
        return F.lit(0).cast("long")
    literal = F.create_map(*(x for k, v in pairs.items() for x in (F.lit(k), F.lit(v).cast("long"))))
    return F.coalesce(literal[F.col(key)], F.lit(0).cast("long"))


def read_parquet_segments(spark: SparkSession, data_dir: str, segments: list[tuple[LogFile, int]]) -> DataFrame:
    """Converted segments as located rows (the columns of ``parse.locate_lines``)."""
    root = f"{data_dir.rstrip('/')}/{COLUMNAR_DIR}/{SEGMENTS_DIR}"
    rows = (
        spark.read.schema(INGESTED)
        .option("basePath", root)
        .parquet(*(segment_dir(data_dir, f.name) for f, _ in segments))
    )
    uri_of = {f.name: f.uri for f, _ in segments}
    uri = F.create_map(*(x for k, v in uri_of.items() for x in (F.lit(k), F.lit(v))))[F.col("file")]
    pos = _map_of({f.name: before for f, before in segments}, "file") + F.col("line")
    return rows.select(uri.alias("file"), *(c for c in INGESTED.fieldNames() if c not in ("file",)), pos.alias("pos"))


def _read_index(spark: SparkSession, data_dir: str, directory: str, schema: T.StructType, names: list[str]) -> DataFrame:
    """The rows of ``names`` (segments) in one of ingest's per-segment indexes; ``file``: the segment."""
    root = f"{data_dir.rstrip('/')}/{COLUMNAR_DIR}/{directory}"
    target, fs = _fs(spark, root)
    if not fs.exists(target):
        return spark.createDataFrame([], schema)
    rows = spark.read.schema(schema).parquet(root)  # one partition per segment
    return rows.filter(F.col("file").isin(*names))


def read_markers(spark: SparkSession, data_dir: str, names: list[str]) -> DataFrame:
    """The indexed segments' marker records: MARKER_COLUMNS plus ``segment`` (its name)."""
    rows = _read_index(spark, data_dir, MARKERS_DIR, INGESTED, names)
    return rows.select(F.col("file").alias("segment"), *MARKER_COLUMNS)


def read_logs(spark: SparkSession, data_dir: str, *, summed: bool = True) -> Logs:
    """The whole log of every node, parsed and located; the JSONL part cached (parsed once).

    ``summed=False`` ignores the segments' interval sums (their rows are aggregated).
    """
    files = list_logs(spark, data_dir)
    if not files:
        raise InputError(f"no transfer logs: nothing matches {data_dir.rstrip('/')}/*.log.jsonl")
    chosen = plan(spark, data_dir, files)
    sums = chosen.summed if summed else {}
    parquet = read_parquet_segments(spark, data_dir, chosen.parquet) if chosen.parquet else None
    scanned = _part(spark, data_dir, chosen.parquet, parquet, lambda f: f.name not in chosen.indexed)
    unsummed = _part(spark, data_dir, chosen.parquet, parquet, lambda f: f.name not in sums)
    release: Callable[[], None] = lambda: None  # noqa: E731
    left_out: list[LeftOut] = []
    located = parquet
    jsonl = [f for f in chosen.jsonl if f.size > 0]  # an empty file has no record to read
    if jsonl:
        base = _map_of(chosen.jsonl_base, "file_node") if chosen.parquet else None
        # cache(): MEMORY_AND_DISK_DESER. (pyspark's StorageLevel.MEMORY_AND_DISK is the
        # serialized level: every scan would deserialize the whole table again.)
        bound = line_bound()
        cached = locate_lines(parse_log_lines(read_text_logs(spark, jsonl, bound)), base).cache()
        left_out = torn_tails(spark, jsonl)
        whole = replace_long(spark, cached, jsonl, bound)  # a state's long line, its state left out
        # rare (a node still writing, or killed mid-write): one pass over the cache
        torn = [f.name for f in jsonl if any(t.file == f.uri for t in left_out)]
        kept = without_last_lines(whole, torn) if torn else whole
        text = kept if parquet is None else kept.select(*parquet.columns)
        located = text if parquet is None else parquet.unionByName(text)
        scanned = text if scanned is None else scanned.unionByName(text)
        unsummed = text if unsummed is None else unsummed.unionByName(text)
        release = cached.unpersist
    if located is None:  # every file empty: the table of no records
        located = locate_lines(parse_log_lines(read_text_logs(spark, files[:1]))).drop(*HELPERS)
        scanned = unsummed = located
    return Logs(
        located=located,
        scanned=scanned,
        markers=read_markers(spark, data_dir, sorted(chosen.indexed)) if chosen.indexed else None,
        expected_markers=dict(chosen.indexed),
        sums=_read_index(spark, data_dir, SUMS_DIR, SEGMENT_SUMS, sorted(sums)) if sums else None,
        expected_sums=dict(sums),
        unsummed=unsummed,
        columnar_root=f"{data_dir.rstrip('/')}/{COLUMNAR_DIR}",
        release=release,
        left_out=left_out,
    )


def _part(
    spark: SparkSession,
    data_dir: str,
    segments: list[tuple[LogFile, int]],
    whole: DataFrame | None,
    keep: Callable[[LogFile], bool],
) -> DataFrame | None:
    """The Parquet segments ``keep`` picks, as located rows (``whole`` when it picks all; None: none)."""
    picked = [(f, before) for f, before in segments if keep(f)]
    if not picked:
        return None
    return whole if len(picked) == len(segments) else read_parquet_segments(spark, data_dir, picked)
