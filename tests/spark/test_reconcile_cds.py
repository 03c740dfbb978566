"""The driver JVM's class archive (snapmesh/spark/cds.py).

Unit: which archives are mapped (intact, keyed by the JVM and pyspark) and which are
not (truncated, not an archive, disabled). End to end, in real processes: `snapmesh
reconcile prepare` makes one, `snapmesh reconcile` then loads Spark's classes from it
(the JVM's own class-load log says so) with the same verdicts as a run without it, and
a damaged archive is ignored, never a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.spark import cds
from snapmesh.synth import writer as synth

pytestmark = pytest.mark.spark


@pytest.fixture
def archive_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SNAPMESH_SPARK_CDS_DIR", str(tmp_path / "cds"))
    monkeypatch.delenv("SNAPMESH_SPARK_CDS", raising=False)
    (tmp_path / "cds").mkdir()
    return tmp_path / "cds"


def fake_archive(size: int = 4096, magic: bytes = cds.DYNAMIC_MAGIC, recorded: int | None = None) -> Path:
    archive, record = cds.paths(cds.fingerprint())
    archive.write_bytes(magic + b"\0" * (size - len(magic)))
    record.write_text(json.dumps({"size": size if recorded is None else recorded}))
    return archive


def test_no_archive_maps_nothing(archive_dir):
    assert cds.java_options() == ""


def test_an_intact_archive_is_mapped(archive_dir):
    archive = fake_archive()
    assert f"-XX:SharedArchiveFile={archive}" in cds.java_options().split()


@pytest.mark.parametrize(
    "damage",
    [
        dict(recorded=8192),  # truncated: smaller than when it was dumped
        dict(magic=b"PK\x03\x04"),  # not a dynamic archive
    ],
    ids=["truncated", "not-an-archive"],
)
def test_a_damaged_archive_is_not_mapped(archive_dir, damage):
    fake_archive(**damage)
    assert cds.java_options() == ""


def test_missing_size_record_is_not_mapped(archive_dir):
    fake_archive()
    cds.paths(cds.fingerprint())[1].unlink()
    assert cds.java_options() == ""


def test_disabled_by_environment(archive_dir, monkeypatch):
    fake_archive()
    monkeypatch.setenv("SNAPMESH_SPARK_CDS", "off")
    assert cds.java_options() == ""


def test_the_key_changes_with_the_jars(archive_dir, tmp_path, monkeypatch):
    import pyspark

    home = tmp_path / "spark-home"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "a.jar").write_bytes(b"x")
    monkeypatch.setenv("SPARK_HOME", str(home))
    before = cds.fingerprint()
    (home / "jars" / "a.jar").write_bytes(b"xy")
    assert cds.fingerprint() != before
    monkeypatch.setenv("SPARK_HOME", str(Path(pyspark.__file__).parent))
    assert cds.fingerprint() != before


# ------------------------------------------------------------------ real processes


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "reconcile", *args], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, str]:
    """An archive made by `snapmesh reconcile prepare` in a directory of its own."""
    where = tmp_path_factory.mktemp("cds")
    env = dict(os.environ, SNAPMESH_SPARK_CDS_DIR=str(where), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SNAPMESH_SPARK_CDS", None)
    made = cli("prepare", env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    assert "CDS archive" in made.stdout
    check = cli("prepare", "--check", env=env)
    assert check.returncode == 0 and check.stdout.startswith("ready: "), check.stdout + check.stderr
    return env


def shared_classes(log: Path) -> int:
    return sum("source: shared objects file" in line for line in log.read_text().splitlines())


def test_prepared_archive_is_used_and_changes_no_verdict(prepared, tmp_path):
    data = tmp_path / "data"
    synth.generate(str(data), nodes=3, transfers=150, snapshots=3, seed=11, corrupt="balance")
    runs = {}
    for mode in ("on", "off"):
        log = tmp_path / f"classes-{mode}.log"
        env = dict(prepared, SNAPMESH_SPARK_CDS=mode, SNAPMESH_SPARK_JAVA_OPTIONS=f"-Xlog:class+load=info:file={log}")
        done = cli("--data-dir", str(data), "--out", str(tmp_path / f"out-{mode}"), env=env)
        assert done.returncode == 1, done.stderr[-3000:]  # the corrupted balance is found either way
        runs[mode] = (json.loads((tmp_path / f"out-{mode}" / "summary.json").read_text())["verdicts"], shared_classes(log))
    (with_archive, mapped), (without, not_mapped) = runs["on"], runs["off"]
    assert with_archive == without
    # Without the archive only the JDK's own base archive is mapped (a few thousand
    # classes); with it, Spark's too.
    assert mapped > not_mapped + 5_000, (mapped, not_mapped)


def test_a_damaged_archive_is_ignored_not_a_crash(prepared, tmp_path):
    env = dict(prepared)
    archive, record = (Path(env["SNAPMESH_SPARK_CDS_DIR"]) / p.name for p in cds_paths(env))
    broken = tmp_path / "cds"
    broken.mkdir()
    # Same name, half the bytes, the old size record: what a disk-full copy leaves.
    (broken / archive.name).write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    (broken / record.name).write_text(record.read_text())
    env["SNAPMESH_SPARK_CDS_DIR"] = str(broken)
    data = tmp_path / "data"
    synth.generate(str(data), nodes=3, transfers=100, snapshots=2, seed=3)
    done = cli("--data-dir", str(data), "--out", str(tmp_path / "out"), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert cli("prepare", "--check", env=env).returncode == 1


def cds_paths(env: dict[str, str]) -> tuple[Path, Path]:
    found = sorted(Path(env["SNAPMESH_SPARK_CDS_DIR"]).glob("spark-*.jsa"))
    assert len(found) == 1, found
    return found[0], found[0].with_suffix(".json")
