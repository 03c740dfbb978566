"""An app node's state that its export holds as a manifest, read through its blocks.

The controller exports states of more than its inline limit in all as manifests
(services/controller/store.py): the node's `state_blocks.hashes` (base64 in the
JSON, in order) name blocks under `<data_dir>/controller/blocks/<hex>`
(snapmesh/protocol/blocks.py). The app checks hold such a state to the node's cut
record exactly as an inline one, so they need its sha256; the views need its bytes.

R1. A block is read through its hash only (blocks.py B3): each block's content
    must hash to its name (its SHA-256). A block with no file, or whose content
    hashes to something else, is a problem named (snapshot, node, hash) in
    `blocks.BlockProblem`'s words, as `snapmesh snapshot verify` names it; the
    state is then not assembled (no sha256, no bytes), never assembled from what
    was found. (The words are written here, not imported: blocks.py needs
    protobuf, which a Spark host running the job need not have.)
R2. The state's digest is computed as the blocks are read, one block at a
    time, in the form of the export's `state_digest` (the sha256 of the bytes,
    or of a large state's grid blocks' hashes: snapmesh/protocol/statedigest.py,
    which needs no protobuf either): the state is never held to check it.
R3. In Spark (`through_blocks`) the driver holds no state, nor even the hash
    list: the (snapshot, node, index, hash) rows are spread by (snapshot, node),
    sorted by index within each task, and each task folds its nodes' blocks one
    at a time (R2) into the same rows `assemble` gives on the driver (`_fold`).
    A local data dir's blocks are opened by the executors' Python (the cluster
    shares the directory, as it shares the logs); another scheme's (hdfs://,
    s3a://) are read by the executors' JVM (Spark's binaryFile source) and joined
    to the hash list by name. So the executors run this module: jobs/reconcile_job.py
    ships the package (--py-files).

`reader`/`assemble` read blocks on the driver, through Hadoop's FileSystem for a
data dir that is not local; the reconciliation does not: the app's views get their
states' bytes on the executors (`appviews`, through `assemble_read`, `names` and
`block_files`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from snapmesh.protocol import statedigest

Reader = Callable[[bytes], "bytes | None"]
S = "snapshot_id"
# What `through_blocks` reads of each manifest, per node: its sha256 or one row per problem.
READ = "snapshot_id string, node string, block_sha string, problem string"


@dataclass(frozen=True, kw_only=True)
class Assembled:
    """One manifest's outcome: the state's sha256 (hex) and bytes when every block
    was whole (bytes only when asked for), else the problems (R1)."""

    sha256: str | None = None
    state: bytes | None = None
    problems: tuple[str, ...] = ()


def blocks_dir(data_dir: str) -> str:
    return f"{data_dir.rstrip('/')}/controller/blocks"


def local_reader(directory: str) -> Reader:
    """Block hash -> its file's content under `directory` (None: no such file)."""
    def read(name: bytes) -> bytes | None:
        try:
            with open(f"{directory}/{name.hex()}", "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
    return read


def hadoop_reader(spark, directory: str) -> Reader:  # noqa: ANN001 (a SparkSession)
    """`local_reader` through Hadoop's FileSystem (any scheme Spark reads)."""
    from snapmesh.reconcile.segments import _fs

    io = spark.sparkContext._jvm.org.apache.commons.io.IOUtils  # Spark ships commons-io

    def read(name: bytes) -> bytes | None:
        target, fs = _fs(spark, f"{directory}/{name.hex()}")
        if not fs.exists(target):
            return None
        stream = fs.open(target)
        try:
            return bytes(io.toByteArray(stream))
        finally:
            stream.close()
    return read


def local_dir(data_dir: str) -> str | None:
    """The blocks' directory as a plain path when the data dir is local, else None."""
    url = urlparse(data_dir)
    return blocks_dir(url.path if url.scheme else data_dir) if url.scheme in ("", "file") else None


def reader(spark, data_dir: str) -> Reader:  # noqa: ANN001 (a SparkSession)
    """The reader of the data dir's blocks: plain files for a local dir."""
    local = local_dir(data_dir)
    return local_reader(local) if local is not None else hadoop_reader(spark, blocks_dir(data_dir))


def names(hashes: Iterable[str | None]) -> Iterator[tuple[bytes | None, str]]:
    for text in hashes:
        try:
            name = base64.b64decode(text or "", validate=True)
        except binascii.Error:
            name = None
        yield (name if name is not None and len(name) == 32 else None), text or ""


def assemble(read: Reader, snapshot_id: str, node_id: str, hashes: Iterable[str | None], *,
             keep: bool = False, where: str = "") -> Assembled:
    """The state a manifest names (its hashes as the export has them, base64),
    read block by block (R1, R2); `keep`: its bytes too. `where`: the blocks'
    directory, said of a missing block."""
    found = ((name, text, None if name is None else read(name)) for name, text in names(hashes))
    return assemble_read(found, snapshot_id, node_id, keep=keep, where=where)


def assemble_read(found: Iterable[tuple[bytes | None, str, bytes | None]], snapshot_id: str, node_id: str, *,
                  keep: bool = False, where: str = "", blocks: bool = False) -> Assembled:
    """`assemble` over blocks already read, in order: (name, hash as given, content or
    None: no such block) each, a name None when the hash given is not one."""
    digest = statedigest.Hasher(blocks=blocks)
    parts: list[bytes] = []
    problems: list[str] = []
    for name, text, block in found:
        if name is None:
            problems.append(f"snapshot {snapshot_id}, node {node_id}, block {text!r}: not a sha256 hash")
            continue
        if block is None:
            why = "missing" + (f" from {where}" if where else "")
        elif (got := hashlib.sha256(block).digest()) != name:
            why = f"corrupt: its content hashes to sha256:{got.hex()}"
        else:
            if not problems:
                digest.update(block, name)
                if keep:
                    parts.append(block)
            continue
        problems.append(f"snapshot {snapshot_id}, node {node_id}, block sha256:{name.hex()}: {why}")
    if problems:
        return Assembled(problems=tuple(problems))
    return Assembled(sha256=digest.text().split(":", 1)[1], state=b"".join(parts) if keep else None)


# ------------------------------------------------------------------ in Spark (R3)


def through_blocks(spark, data_dir: str, nodes, *, hadoop: bool | None = None):  # noqa: ANN001, ANN201 (Spark's)
    """``apps.app_nodes`` rows (snapshot_id, node, state_sha, state_digest, hashes,
    block_problem) with each manifest's state read through the data dir's blocks on
    the executors (R3): its sha256 in state_sha, or a row per bad block naming it in
    block_problem, as `assemble` words it. ``hadoop``: read the blocks through Spark's
    binaryFile source (default: only when the data dir is not local)."""
    from pyspark.sql import functions as F

    manifests = nodes.filter(F.col("hashes").isNotNull())
    if manifests.isEmpty():  # inline states only: no Python task to start
        return nodes
    # A manifest of no hash still gets its row (idx null): its state is b"" (R2).
    listed = manifests.select(S, "node", F.coalesce(F.col("state_digest"), F.lit("")).startswith(statedigest.BLOCKS)
                              .alias("blocks"), F.posexplode_outer("hashes").alias("idx", "text"))
    where, local = blocks_dir(data_dir), local_dir(data_dir)
    if hadoop or local is None:
        # The file's name is the hash in hex; a text that is not base64 names no file.
        name = F.lower(F.hex(F.try_to_binary("text", F.lit("base64"))))
        listed = listed.withColumn("name", name).join(block_files(spark, where), "name", "left").drop("name")
        fold = functools.partial(_fold, None, where)
    else:
        listed = listed.withColumn("content", F.lit(None).cast("binary"))
        fold = functools.partial(_fold, local, where)
    ordered = listed.repartition(S, "node").sortWithinPartitions(S, "node", "idx")
    rows = ordered.select(S, "node", "idx", "text", "content", "blocks").rdd.mapPartitions(fold)
    read_ = spark.createDataFrame(rows, READ)
    return (
        nodes.drop("block_problem").join(read_, [S, "node"], "left")
        .select(S, "node", F.coalesce("state_sha", "block_sha").alias("state_sha"), "state_digest", "hashes",
                F.col("problem").alias("block_problem"))
    )


def block_files(spark, directory: str):  # noqa: ANN001, ANN202 (Spark's)
    """(name, content) of every block file under ``directory``, read by the executors
    (none when there is no such directory: every block is then missing)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    empty = spark.createDataFrame([], "name string, content binary")
    try:
        files = spark.read.format("binaryFile").load(directory)
    except AnalysisException as e:
        if "PATH_NOT_FOUND" in str(e) or "does not exist" in str(e):
            return empty
        raise
    return files.select(F.regexp_extract("path", r"([^/]*)$", 1).alias("name"), "content")


def _fold(directory: str | None, where: str, rows: Iterable[Any]) -> Iterator[tuple[str, str, str | None, str | None]]:
    """On an executor: rows (snapshot_id, node, idx, text, content) sorted by
    (snapshot_id, node, idx) -> READ rows, one node's blocks at a time (R2). A block
    is opened under ``directory``, or is the row's content (None: missing) when
    ``directory`` is None."""
    read = local_reader(directory) if directory is not None else None
    for (snapshot_id, node_id), group in itertools.groupby(rows, key=lambda r: (r[0], r[1])):
        first = next(group)
        in_blocks = bool(first[5])  # its digest's form (statedigest.py SD2)
        found = (
            (name, text, None if name is None else read(name) if read is not None else row[4])
            for row in itertools.chain([first], group) if row[2] is not None
            for name, text in names([row[3]])
        )
        got = assemble_read(found, snapshot_id, node_id, where=where, blocks=in_blocks)
        for problem in got.problems or (None,):
            yield snapshot_id, node_id, got.sha256, problem
