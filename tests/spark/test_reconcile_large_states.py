"""Log lines that carry a whole state (an app's init, checkpoint and restore records):
the text is cut at the scan, every check reads the line as before, and a log of
several such lines is read within a small heap."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from snapmesh.reconcile.parse import STATE_KEPT, parse_log_lines
from snapmesh.reconcile.segments import list_logs, read_text_logs
from support.spark_fixtures import spark  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"  # as wal.encode writes it


def state_text(size: int) -> str:
    return base64.b64encode(os.urandom(size)).decode()


def test_state_text_is_cut_and_records_read_as_before(spark, tmp_path: Path) -> None:  # noqa: F811
    big = state_text(3 * STATE_KEPT)
    lines = [
        line({"node": "p1", "lsn": 1, "kind": "init", "balance": 0, "app": "blob", "state": big}),
        # an app's restore leaves its tally out: its state key is its mark, and stays
        line({"node": "p1", "lsn": 2, "kind": "restore", "snapshot_id": "s1", "epoch": 2, "deliveries": 0, "state": big}),
        line({"node": "p1", "lsn": 3, "kind": "checkpoint", "state": big, "epoch": 2}),
        # not base64 (an escape in it): left whole
        line({"node": "p1", "lsn": 4, "kind": "checkpoint", "state": 'a"b' + big}),
        # torn inside its state: left whole, and still bad
        line({"node": "p1", "lsn": 5, "kind": "init", "balance": 0, "app": "blob", "state": big})[: STATE_KEPT * 2] + "\n",
        line({"node": "p1", "lsn": 6, "kind": "init", "balance": 0, "app": "blob", "state": "c21hbGw="}),
    ]
    (tmp_path / "p1.log.jsonl").write_text("".join(lines))
    text = read_text_logs(spark, list_logs(spark, str(tmp_path)))
    lengths = [r["n"] for r in text.selectExpr("length(value) AS n").orderBy("mid").collect()]
    assert lengths[:3] == [len(lines[i].strip().replace(big, "")) for i in range(3)]
    assert lengths[3] == len(lines[3].strip()) and lengths[4] == len(lines[4].strip())
    assert lengths[5] == len(lines[5].strip())  # short: as it is
    rows = {r["lsn"]: r for r in parse_log_lines(text).collect() if r["lsn"] is not None}
    assert rows[2]["problem"] is None and rows[2]["balance"] == 0  # still an app's restore
    assert all(rows[i]["problem"] is None for i in (1, 2, 3, 4, 6))
    problems = [r["problem"] for r in parse_log_lines(text).collect() if r["lsn"] is None]
    assert problems == ["not valid JSON (truncated line?)"]


def test_several_large_states_read_within_a_small_heap(tmp_path: Path) -> None:
    """Four nodes whose logs open with a 16 MiB state (22 MB of text): in a 512m heap the
    log was not read (OutOfMemoryError while it was cached) before the text was cut."""
    for i in range(4):
        with open(tmp_path / f"n{i}.log.jsonl", "w") as f:
            f.write(line({"node": f"n{i}", "lsn": 1, "kind": "init", "balance": 0, "app": "blob",
                          "state": state_text(16 << 20)}))
            f.writelines(line({"node": f"n{i}", "lsn": lsn, "kind": "noop"}) for lsn in range(2, 50))
    script = textwrap.dedent(f"""
        from snapmesh.spark.session import build_session
        from snapmesh.reconcile.segments import read_logs
        spark = build_session("local[2]")
        print("rows", read_logs(spark, {str(tmp_path)!r}).located.count())
        spark.stop()
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SNAPMESH_SPARK_DRIVER_MEMORY": "512m"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "OutOfMemoryError" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rows 196" in done.stdout


def test_only_the_records_own_state_is_cut_not_a_nested_one(spark, tmp_path: Path) -> None:  # noqa: F811
    """A line may hold a "state" key in a nested object (an app's record of an older format keeps
    whatever fields it had; a newer kind's too), or a key that ends in "state" after an escaped
    quote: that text is the record's data and stays; the record's own state is cut, wherever it is."""
    big = state_text(3 * STATE_KEPT)
    kept = ['"was":{"state":"bmVzdGVk"}', '"x\\"state":"c21hbGw="', '"all":[{"state":"YQ=="},[{"state":"Yg=="}]]',
            '"after":{"state":"Yw=="}']
    lines = [
        # a nested state before the record's own
        '{"node":"p1","lsn":1,"kind":"restore","snapshot_id":"s1","epoch":2,"deliveries":0,'
        f'{kept[0]},"state":"{big}"}}\n',
        # a key that ends in "state" (an escaped quote before it), then the record's own
        f'{{"node":"p1","lsn":2,"kind":"checkpoint",{kept[1]},"state":"{big}","epoch":2}}\n',
        # nested in arrays, objects closed again before the record's own
        f'{{"node":"p1","lsn":3,"kind":"init","balance":0,"app":"blob",{kept[2]},"state":"{big}"}}\n',
        # the record's own first, a nested one after it
        f'{{"node":"p1","lsn":4,"kind":"init","balance":0,"app":"blob","state":"{big}",{kept[3]}}}\n',
        # only a nested state, a long one: the record's data, left whole
        f'{{"node":"p1","lsn":5,"kind":"restore","snapshot_id":"s1","epoch":2,"deliveries":0,"old":{{"state":"{big}"}}}}\n',
    ]
    for text in lines:
        json.loads(text)  # each a valid line
    (tmp_path / "p1.log.jsonl").write_text("".join(lines))
    values = [r["value"] for r in read_text_logs(spark, list_logs(spark, str(tmp_path))).orderBy("mid").collect()]
    for i in range(4):
        assert values[i] == lines[i].strip().replace(f'"state":"{big}"', '"state":""'), f"line {i + 1}"
        assert kept[i] in values[i]
    assert values[4] == lines[4].strip()
