"""Log lines longer than the read bound (reconcile.longlines): Spark keeps at most the bound
of a line, each such line's record is recovered with its state left out, in its place; the
verdicts and bad lines are those of a bound that holds every line whole. A line of a few
hundred MB is read within a small heap, and a heap that does run out is one clear line."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from snapmesh.reconcile.longlines import LINE_BYTES_ENV
from snapmesh.reconcile.segments import list_logs, read_logs, read_text_logs
from snapmesh.reconcile.statecut import STATE_KEPT
from support.spark_fixtures import spark  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SMALL = 16 << 10  # the bound of these tests: every state line is over it
COLUMNS = ["file", "line", "pos", "node", "lsn", "kind", "problem"]


def line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"  # as wal.encode writes it


def big() -> str:
    return base64.b64encode(os.urandom(STATE_KEPT)).decode()  # cut by without_state too: over STATE_KEPT


@pytest.fixture
def split_size(spark):  # noqa: F811 (the fixture)
    """A small bound lowers the session's split size: put it back for the other tests."""
    key = "spark.sql.files.maxPartitionBytes"
    before = spark.conf.get(key)
    yield
    spark.conf.set(key, before)


def write_logs(d: Path) -> dict[str, int]:
    """Two nodes' logs with state lines among ordinary ones (a segment, an active file); the
    line numbers of the bad long lines."""
    state = big()
    seg = [
        line({"node": "p1", "lsn": 1, "kind": "init", "app": "blob", "version": 1, "state": state}),
        *(line({"node": "p1", "lsn": i, "kind": "noop"}) for i in range(2, 40)),
        line({"node": "p1", "lsn": 40, "kind": "checkpoint", "state": state, "epoch": 2}),
    ]
    (d / "p1.log.000000000001.jsonl").write_text("".join(seg))
    torn = line({"node": "p1", "lsn": 42, "kind": "checkpoint", "state": state})[:-1000] + "\n"
    flipped = line({"node": "p1", "lsn": 43, "kind": "checkpoint", "state": state}).replace(
        state, state[:100] + '"' + state[101:])
    active = [
        line({"node": "p1", "lsn": 41, "kind": "restore", "snapshot_id": "s1", "epoch": 2, "deliveries": 0,
              "state": state}),
        torn,  # torn inside its state, a line of its own: bad
        flipped,  # a byte of its state turned into a quote: bad
        line({"node": "p2", "lsn": 44, "kind": "noop"}),  # a short bad line after them
        *(line({"node": "p1", "lsn": i, "kind": "noop"}) for i in range(45, 60)),
    ]
    (d / "p1.log.jsonl").write_text("".join(active))
    (d / "p2.log.jsonl").write_text(
        line({"node": "p2", "lsn": 1, "kind": "init", "app": "blob", "version": 1, "state": state})
        + "".join(line({"node": "p2", "lsn": i, "kind": "noop"}) for i in range(2, 30)))
    return {"torn": 2, "flipped": 3, "other node": 4}


def located(spark, d: Path) -> list[tuple]:  # noqa: F811
    logs = read_logs(spark, str(d), summed=False)
    try:
        rows = logs.located.select(*COLUMNS).orderBy("file", "line").collect()
    finally:
        logs.release()
    return [tuple(r) for r in rows]


def test_long_lines_read_as_with_a_bound_that_holds_them(spark, tmp_path, monkeypatch, split_size) -> None:  # noqa: F811
    bad = write_logs(tmp_path)
    files = list_logs(spark, str(tmp_path))
    # the reader keeps at most the bound: each state line is one placeholder row, in its place
    text = read_text_logs(spark, files, SMALL)
    assert text.agg(F.max(F.octet_length("value"))).first()[0] < SMALL
    assert text.filter("_long").count() == 6
    monkeypatch.setenv(LINE_BYTES_ENV, str(SMALL))
    small = located(spark, tmp_path)
    monkeypatch.setenv(LINE_BYTES_ENV, str(64 << 20))
    whole = located(spark, tmp_path)
    assert small == whole
    rows = {(Path(r[0]).name, r[1]): r for r in small}
    assert len(rows) == 40 + 19 + 29
    # positions: every good record where its lsn says, the segment's and the active file's lines
    good = [r for r in small if r[6] is None]
    assert all(r[2] == r[4] for r in good if r[3] == "p1") and len(good) == 40 + 15 + 1 + 29
    assert rows[("p1.log.000000000001.jsonl", 40)][5] == "checkpoint"
    assert rows[("p1.log.jsonl", 1)][2:6] == (41, "p1", 41, "restore")
    # the bad long lines named by file and line, as a bound that holds them names them
    assert rows[("p1.log.jsonl", bad["torn"])][6] == "not valid JSON (truncated line?)"
    assert rows[("p1.log.jsonl", bad["flipped"])][6] == "not valid JSON (truncated line?)"
    assert rows[("p1.log.jsonl", bad["other node"])][6] == "record of node p2 in the log of p1"


def test_a_line_with_no_state_to_leave_out_is_named_not_dropped(spark, tmp_path, monkeypatch, split_size) -> None:  # noqa: F811
    (tmp_path / "p1.log.jsonl").write_text(
        line({"node": "p1", "lsn": 1, "kind": "noop"})
        + line({"node": "p1", "lsn": 2, "kind": "command", "command": big()})
        + line({"node": "p1", "lsn": 3, "kind": "noop"}))
    monkeypatch.setenv(LINE_BYTES_ENV, str(SMALL))
    rows = located(spark, tmp_path)
    assert [(r[1], r[2], r[4]) for r in rows] == [(1, 1, 1), (2, 2, None), (3, 3, 3)]
    assert rows[1][6].startswith(f"a line longer than the read bound ({SMALL} bytes)")
    assert LINE_BYTES_ENV in rows[1][6]


@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> Path:
    """One node whose init line carries a 200 MiB state (267 MB of text)."""
    d = tmp_path_factory.mktemp("huge")
    chunk = base64.b64encode(os.urandom(3 << 20))  # 4 MiB of text
    with open(d / "n1.log.jsonl", "wb") as f:
        f.write(b'{"node":"n1","lsn":1,"kind":"init","app":"blob","version":1,"state":"')
        for _ in range(64):
            f.write(chunk)
        f.write(b'"}\n')
        f.writelines(line({"node": "n1", "lsn": i, "kind": "noop"}).encode() for i in range(2, 50))
    (d / "snapshots").mkdir()
    (d / "snapshots" / "s1.json").write_text(json.dumps({"snapshot_id": "s1", "status": "COMPLETE", "nodes": []}))
    return d


def run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=600)


def test_a_line_of_hundreds_of_mb_is_read_within_a_small_heap(huge: Path) -> None:
    """Before the bound, the line became one row: OutOfMemoryError in a 512m heap."""
    done = run(f"""
        from snapmesh.spark.session import build_session
        from snapmesh.reconcile.segments import read_logs
        spark = build_session("local[2]")
        rows = read_logs(spark, {str(huge)!r}).located.orderBy("line").collect()
        print("rows", len(rows), rows[0]["kind"], rows[0]["problem"], rows[0]["pos"])
        spark.stop()
    """, {"SNAPMESH_SPARK_DRIVER_MEMORY": "512m"})
    assert "OutOfMemoryError" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rows 49 init None 1" in done.stdout


def test_a_heap_that_runs_out_is_one_line_naming_what_to_raise(huge: Path, tmp_path: Path) -> None:
    """A bound above the heap (the old reading): exit 2 and one line, not a py4j traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "reconcile", "--data-dir", str(huge), "--verdicts-dir", str(tmp_path / "v")],
        env={**os.environ, "PYTHONPATH": str(ROOT), "SNAPMESH_SPARK_DRIVER_MEMORY": "512m",
             LINE_BYTES_ENV: str(1 << 30)},
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("snapmesh reconcile: out of memory") and "SNAPMESH_SPARK_DRIVER_MEMORY" in last
