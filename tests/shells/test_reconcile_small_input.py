"""`snapmesh reconcile` and `snapmesh reconcile ingest` choose the small-input Spark
settings (quick JIT, interpreted expressions, one shuffle partition) from the size of
the data dir's logs, sealed segments included. No JVM starts here: the session
builder is replaced by one that records what it was asked for.
"""

from __future__ import annotations

import pytest

from snapmesh.reconcile import ingest
from snapmesh.spark import session


class _Session:
    """Stands for a SparkSession: `stop_session` is replaced too."""


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    calls: list[dict] = []

    def build(master, app_name="snapmesh-reconcile", *, small=False):
        calls.append({"master": master, "small": small})
        return _Session()

    monkeypatch.setattr(session, "build_session", build)
    monkeypatch.setattr(ingest, "stop_session", lambda spark: None)
    monkeypatch.setattr(ingest, "ingest", lambda spark, data_dir: [])
    monkeypatch.setattr(ingest.SparkSession, "getActiveSession", staticmethod(lambda: None))
    return calls


def _segments(data_dir, size: int) -> None:
    """A sealed segment and the active log of ``size`` bytes in all (sparse: no disk)."""
    data_dir.mkdir()
    (data_dir / "n1.log.1.jsonl").write_text('{"lsn": 1}\n')
    with open(data_dir / "n1.log.jsonl", "wb") as active:
        active.truncate(size - len('{"lsn": 1}\n'))


def test_ingest_of_a_small_input_gets_the_small_input_settings(asked, tmp_path, capsys):
    _segments(tmp_path / "data", 96 << 10)
    assert ingest.main(["--data-dir", str(tmp_path / "data")]) == 0
    assert asked == [{"master": "local[*]", "small": True}]
    assert "converted 0 segment(s)" in capsys.readouterr().out


def test_ingest_of_a_large_or_unknown_input_keeps_the_full_settings(asked, tmp_path):
    _segments(tmp_path / "data", session.SMALL_INPUT_BYTES + 1)
    assert ingest.main(["--data-dir", str(tmp_path / "data")]) == 0
    assert ingest.main(["--data-dir", "hdfs://namenode/logs"]) == 0  # size unknown: not assumed small
    assert [c["small"] for c in asked] == [False, False]


def test_input_bytes_counts_sealed_segments_and_the_active_log_only(tmp_path):
    _segments(tmp_path / "data", 1000)
    (tmp_path / "data" / "notes.txt").write_text("x" * 5000)
    (tmp_path / "data" / "snapshots").mkdir()
    assert session.input_bytes(str(tmp_path / "data")) == 1000
    assert session.input_bytes((tmp_path / "data").as_uri()) == 1000
    assert session.input_bytes(str(tmp_path / "missing")) is None
