"""One reading of a torn last line: `snapmesh trace` and `snapmesh
reconcile` agree with the node's own recovery (`wal.split_lines`). A torn line is
the bytes after the last newline of a node's active file, a write cut short: left
out whether or not it parses. A complete line (newline-terminated) that is not a
record is damage: both refuse it naming file and line. Data from `snapmesh synth`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from snapmesh.reconcile import job as reconcile
from snapmesh.synth import writer as synth
from snapmesh.commands import trace
from support.spark_fixtures import spark  # noqa: F401

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("torn") / "data"
    synth.generate(str(data), nodes=3, transfers=60, snapshots=2, seed=3)
    return data


def variant(clean: Path, tmp_path: Path, tail: bytes) -> tuple[Path, Path]:
    data = tmp_path / "data"
    shutil.copytree(clean, data)
    active = data / "p1.log.jsonl"
    assert active.read_bytes().endswith(b"\n")
    with active.open("ab") as f:
        f.write(tail)
    return data, active


def phantom_recv(active: Path) -> bytes:
    """A receive of a transfer nobody sent: counted, it makes the log inconsistent."""
    last = json.loads(active.read_bytes().splitlines()[-1])
    record = {"node": "p1", "lsn": last["lsn"] + 1, "kind": "recv", "src": "p2", "dst": "p1",
              "msg_id": "p2:p1:999999", "amount": 5, "seq": 999999}
    return json.dumps(record).encode()


def run_trace(data: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = trace.main(["--data-dir", str(data), "--format", "shiviz", "--out", str(tmp_path / "t.shiviz")])
    return code, capsys.readouterr().err


def run_reconcile(data: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = reconcile.main(["--data-dir", str(data), "--verdicts-dir", str(tmp_path / "verdicts")])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def notices(said: str, command: str) -> list[str]:
    return [line for line in said.splitlines() if line.startswith(f"snapmesh {command}: notice: ")]


def left_out_says(active: Path, size: int) -> str:
    return f"{active}: left out its last {size} bytes (from byte {active.stat().st_size - size})"


def test_a_cut_short_line_is_left_out_by_both_and_each_says_so(spark, clean, tmp_path, capsys):  # noqa: F811
    tail = b'{"node": "p1", "lsn": 9'
    data, active = variant(clean, tmp_path, tail)
    code, said = run_trace(data, tmp_path, capsys)
    assert code == 0
    assert len(notices(said, "trace")) == 1 and left_out_says(active, len(tail)) in said, said
    code, said = run_reconcile(data, tmp_path, capsys)
    assert code == 0, said  # not bad input: the node is still writing it, or cuts it off on restart
    assert len(notices(said, "reconcile")) == 1 and left_out_says(active, len(tail)) in said, said
    summary = json.loads((tmp_path / "verdicts" / "summary.json").read_text())
    rows = [v for v in summary["verdicts"] if v["scope"] == "left_out"]
    assert len(rows) == 1 and left_out_says(active, len(tail)) in rows[0]["first_discrepancy"], summary["verdicts"]
    assert summary["left_out"] == [{"file": str(active), "offset": active.stat().st_size - len(tail),
                                    "bytes": len(tail), "notice": rows[0]["first_discrepancy"]}]
    assert "(left out)" in said and "notice" in said  # the row in the printed table


def test_a_clean_log_has_no_notice(spark, clean, tmp_path, capsys):  # noqa: F811
    data, _ = variant(clean, tmp_path, b"")
    code, said = run_trace(data, tmp_path, capsys)
    assert code == 0 and notices(said, "trace") == [], said
    code, said = run_reconcile(data, tmp_path, capsys)
    assert code == 0 and notices(said, "reconcile") == [] and "(left out)" not in said, said


def test_a_whole_record_without_its_newline_is_torn_too_and_left_out_by_both(spark, clean, tmp_path, capsys):  # noqa: F811
    data, active = variant(clean, tmp_path, b"")
    phantom = phantom_recv(active)
    active.write_bytes(active.read_bytes() + phantom)  # only the newline is missing
    code, said = run_trace(data, tmp_path, capsys)
    assert code == 0
    assert "999999" not in (tmp_path / "t.shiviz").read_text()
    assert left_out_says(active, len(phantom)) in said, said
    code, said = run_reconcile(data, tmp_path, capsys)
    assert code == 0, said  # counted, the phantom receive would be a discrepancy (exit 1)
    assert left_out_says(active, len(phantom)) in said, said


def test_a_complete_line_that_is_no_record_is_refused_by_both_naming_it(spark, clean, tmp_path, capsys):  # noqa: F811
    data, active = variant(clean, tmp_path, b'{"node": "p1", "ls\n')
    line = len(active.read_bytes().splitlines())
    code, said = run_trace(data, tmp_path, capsys)
    assert code == 2 and f"{active}:{line}" in said, said
    code, said = run_reconcile(data, tmp_path, capsys)
    assert code == 2 and "p1.log.jsonl" in said and str(line) in said, said


def test_the_same_phantom_with_its_newline_is_counted_by_reconcile(spark, clean, tmp_path, capsys):  # noqa: F811
    data, active = variant(clean, tmp_path, b"")
    active.write_bytes(active.read_bytes() + phantom_recv(active) + b"\n")
    code, said = run_reconcile(data, tmp_path, capsys)
    assert code == 1, said  # so the test above, where it was left out, could fail
