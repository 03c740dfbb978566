"""`snapmesh reconcile` end to end on data written by `snapmesh synth`.

In-process (main(argv) reuses the test session): consistent data exits 0; each
corruption exits 1 and names the discrepancy; bad input exits 2 naming file and line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapmesh.reconcile import job as reconcile
from snapmesh.synth import writer as synth
from support.spark_fixtures import spark  # noqa: F401

pytestmark = pytest.mark.spark

SIZE = dict(nodes=3, transfers=300, snapshots=3, seed=7)


def run(data: Path, out: Path) -> tuple[int, dict]:
    status = reconcile.main(["--data-dir", str(data), "--out", str(out)])
    return status, json.loads((out / "summary.json").read_text())


def test_consistent_run_exits_0_and_writes_verdicts(spark, tmp_path, capsys):  # noqa: F811
    made = synth.generate(str(tmp_path / "data"), failed=1, **SIZE)
    status, summary = run(tmp_path / "data", tmp_path / "out")
    assert status == 0
    rows = summary["verdicts"]
    assert [v["snapshot_id"] for v in rows] == [None, *made.snapshots]  # logs row first
    assert [v["consistent"] for v in rows].count(True) == len(made.snapshots)  # logs + 3 complete
    assert [v["status"] for v in rows if v["consistent"] is None] == ["FAILED"]  # skipped
    assert all(v["expected_total"] == 3_000_000 for v in rows)
    assert all(v["observed_total"] == 3_000_000 for v in rows if v["consistent"] and v["scope"] == "snapshot")
    parquet = spark.read.parquet(str(tmp_path / "out" / "verdicts.parquet"))
    assert parquet.count() == len(rows)
    printed = capsys.readouterr().out
    assert "all consistent" in printed and "skipped: status FAILED" in printed


def expected_message(kind: str, d: dict) -> tuple[str | None, str]:
    """(snapshot_id or None for the logs row, the first discrepancy's text or prefix)."""
    return {
        "balance": lambda: (
            d.get("snapshot_id"),
            f"node {d.get('node')}: recorded {d.get('recorded')}, logs say {d.get('actual')} before cut",
        ),
        "missing-node": lambda: (d.get("snapshot_id"), f"snapshot missing node {d.get('node')}"),
        "missing-inflight": lambda: (
            d.get("snapshot_id"),
            f"channel {d.get('src')}->{d.get('dst')}: missing in-flight {d.get('msg_id')}",
        ),
        "extra-inflight": lambda: (
            d.get("snapshot_id"),
            f"channel {d.get('src')}->{d.get('dst')}: in-flight {d.get('msg_id')} was sent after {d.get('src')}'s cut",
        ),
        "duplicate-recv": lambda: (None, f"msg_id {d.get('msg_id')}: received 2 times"),
        "seq-gap": lambda: (None, f"channel {d.get('src')}->{d.get('dst')}: seq {d.get('missing_seq')} missing from"),
    }[kind]()


@pytest.mark.parametrize(
    "kind", ["balance", "missing-inflight", "extra-inflight", "duplicate-recv", "seq-gap", "missing-node"]
)
def test_each_corruption_exits_1_naming_the_discrepancy(spark, tmp_path, capsys, kind):  # noqa: F811
    made = synth.generate(str(tmp_path / "data"), corrupt=kind, **SIZE)
    status, summary = run(tmp_path / "data", tmp_path / "out")
    assert status == 1
    sid, message = expected_message(kind, made.detail)
    row = next(v for v in summary["verdicts"] if v["snapshot_id"] == sid)
    assert row["consistent"] is False
    assert row["first_discrepancy"].startswith(message), row
    assert message in capsys.readouterr().out


def test_truncated_line_exits_2_naming_file_and_line(spark, tmp_path, capsys):  # noqa: F811
    made = synth.generate(str(tmp_path / "data"), corrupt="truncated", **SIZE)
    status, summary = run(tmp_path / "data", tmp_path / "out")
    assert status == 2
    err = capsys.readouterr().err
    where = f"{made.detail['file']} line {made.detail['line']}: not valid JSON (truncated line?)"
    assert where in err, err
    assert summary["exit_status"] == 2 and summary["verdicts"] == []


def test_missing_data_dir_exits_2(spark, tmp_path, capsys):  # noqa: F811
    assert reconcile.main(["--data-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_no_snapshots_exits_2(spark, tmp_path, capsys):  # noqa: F811
    synth.generate(str(tmp_path / "data"), **SIZE)
    for f in (tmp_path / "data" / "snapshots").iterdir():
        f.unlink()
    assert reconcile.main(["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 2
    assert "no snapshots" in capsys.readouterr().err
