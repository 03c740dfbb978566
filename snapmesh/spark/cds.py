"""A class-data-sharing archive for the driver JVM: Spark's classes mapped from one file.

A small reconcile spends more of its time loading, parsing and verifying the ~16,000
classes Spark needs than checking the logs. ``snapmesh reconcile prepare`` runs a small
reconcile on synthetic data with the JVM's ``-XX:ArchiveClassesAtExit`` (a dynamic CDS
archive, JDK 13+), and every later local session maps the classes from that archive
instead (``-XX:SharedArchiveFile``). It is a cache: a run without it gives the same
verdicts, only slower to start. ``make install`` prepares it.

The archive only matches the JVM, Spark jars and Spark home it was dumped with, so its
file name carries a fingerprint of them (``spark-<fingerprint>.jsa``); a new pyspark or
JDK simply finds no archive. It is written to a temporary name and renamed once the
dumping JVM has exited and the file checks out (a truncated archive crashes JDK 17 when
mapped), with its size in ``spark-<fingerprint>.json`` beside it: an archive whose size
differs is not used.

Where: ``$SNAPMESH_SPARK_CDS_DIR``, else ``<virtualenv>/share/snapmesh`` (removed with the
environment it belongs to); ``SNAPMESH_SPARK_CDS=off`` disables it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DYNAMIC_MAGIC = bytes.fromhex("a8ab0bf0")  # 0xf00baba8, little-endian: a JDK dynamic archive
DUMP_TIMEOUT_S = 600


def archive_dir() -> Path:
    return Path(os.environ.get("SNAPMESH_SPARK_CDS_DIR") or Path(sys.prefix) / "share" / "snapmesh")


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(w) if (w := shutil.which("java")) else None)
    return found.resolve() if found and found.exists() else None


def fingerprint() -> str | None:
    """What the archive depends on: the java binary, pyspark's version and jars. None: no java."""
    import pyspark

    java = _java()
    if java is None:
        return None
    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    digest = hashlib.sha256()
    for part in (str(java), str(java.stat().st_size), str(java.stat().st_mtime_ns), pyspark.__version__, str(spark_home)):
        digest.update(part.encode() + b"\0")
    jars = spark_home / "jars"
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else []:
        digest.update(f"{jar.name}:{jar.stat().st_size}\0".encode())
    return digest.hexdigest()[:16]


def paths(key: str) -> tuple[Path, Path]:
    """The archive and its size record."""
    return archive_dir() / f"spark-{key}.jsa", archive_dir() / f"spark-{key}.json"


def _intact(archive: Path, record: Path) -> bool:
    try:
        expected = json.loads(record.read_text())["size"]
        with archive.open("rb") as f:
            magic = f.read(4)
        return magic == DYNAMIC_MAGIC and archive.stat().st_size == expected
    except (OSError, ValueError, KeyError, TypeError):
        return False


def java_options() -> str:
    """The driver JVM options that map the archive, or "" (none prepared, or disabled)."""
    if os.environ.get("SNAPMESH_SPARK_CDS", "").lower() in ("off", "0", "false", "no"):
        return ""
    key = fingerprint()
    if key is None:
        return ""
    archive, record = paths(key)
    # -Xlog:cds=off: a mismatch (another classpath) falls back to loading from the jars
    # without a warning on the job's output; `prepare --check` says whether it maps.
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off" if _intact(archive, record) else ""


# ------------------------------------------------------------------ preparing it


def prepare() -> Path:
    """Dump a fresh archive for this JVM and pyspark; return its path. RuntimeError if it fails."""
    key = fingerprint()
    if key is None:
        raise RuntimeError("no java found (JAVA_HOME or PATH): nothing to archive")
    archive, record = paths(key)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="snapmesh-cds-") as scratch:
        tmp = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "snapmesh.spark.warmup", str(tmp), scratch],
                capture_output=True, text=True, timeout=DUMP_TIMEOUT_S,
                env=dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")),
            )
            if proc.returncode != 0:
                raise RuntimeError(f"the dumping run exited {proc.returncode}:\n{proc.stderr[-2000:]}")
            with tmp.open("rb") as f:
                if f.read(4) != DYNAMIC_MAGIC:
                    raise RuntimeError(f"{tmp}: the JVM wrote no dynamic archive")
            record.write_text(json.dumps({"size": tmp.stat().st_size, "fingerprint": key}) + "\n")
            os.replace(tmp, archive)
        except FileNotFoundError as e:
            raise RuntimeError(f"the JVM wrote no archive ({e.filename})") from e
        finally:
            tmp.unlink(missing_ok=True)
    return archive


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="snapmesh reconcile prepare",
        description="Dump the driver JVM's classes to a CDS archive once, so that every later "
        "local `snapmesh reconcile` starts in about half the time (see docs/reconcile.md).",
    )
    p.add_argument("--check", action="store_true", help="only say whether an archive for this JVM and pyspark is ready")
    args = p.parse_args(argv)
    if args.check:
        opts = java_options()
        print(f"ready: {opts.split()[0].split('=', 1)[1]}" if opts else f"no archive in {archive_dir()}")
        return 0 if opts else 1
    started = time.monotonic()
    try:
        archive = prepare()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"snapmesh reconcile prepare: {e}", file=sys.stderr)
        return 1
    size_mb = archive.stat().st_size / (1 << 20)
    print(f"CDS archive {archive} ({size_mb:.0f} MB) in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
