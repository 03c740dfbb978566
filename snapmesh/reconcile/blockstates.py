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
R2. The sha256 of the whole state is computed as the blocks are read, one
    block at a time: the state is never held to check it.

The blocks are read on the driver, through Hadoop's FileSystem for a data dir
that is not local (hdfs://, s3a://): executors run no project code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

Reader = Callable[[bytes], "bytes | None"]


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


def reader(spark, data_dir: str) -> Reader:  # noqa: ANN001 (a SparkSession)
    """The reader of the data dir's blocks: plain files for a local dir."""
    url = urlparse(data_dir)
    if url.scheme in ("", "file"):
        return local_reader(blocks_dir(url.path if url.scheme else data_dir))
    return hadoop_reader(spark, blocks_dir(data_dir))


def _names(hashes: Iterable[str | None]) -> Iterator[tuple[bytes | None, str]]:
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
    digest = hashlib.sha256()
    parts: list[bytes] = []
    problems: list[str] = []
    for name, text in _names(hashes):
        if name is None:
            problems.append(f"snapshot {snapshot_id}, node {node_id}, block {text!r}: not a sha256 hash")
            continue
        block = read(name)
        if block is None:
            why = "missing" + (f" from {where}" if where else "")
        elif (got := hashlib.sha256(block).digest()) != name:
            why = f"corrupt: its content hashes to sha256:{got.hex()}"
        else:
            if not problems:
                digest.update(block)
                if keep:
                    parts.append(block)
            continue
        problems.append(f"snapshot {snapshot_id}, node {node_id}, block sha256:{name.hex()}: {why}")
    if problems:
        return Assembled(problems=tuple(problems))
    return Assembled(sha256=digest.hexdigest(), state=b"".join(parts) if keep else None)
