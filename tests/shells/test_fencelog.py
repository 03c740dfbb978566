"""snapmesh.processes.fencelog: a node with no log gets an init and a stop; one with a log keeps it; bad input is one line."""

from __future__ import annotations

import json

from snapmesh.processes import fencelog
from snapmesh.settings import config


def test_a_node_with_no_log_gets_a_fenced_one_and_a_log_is_kept(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SNAPMESH_APP", "kvshard")
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3, data_dir=tmp_path)
    assert fencelog.main(["--config", str(path), "--id", "p3", "--snapshot", "S1"]) == 0
    log = config.load(path).log_path("p3")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["init", "stop"] and records[1]["snapshot_id"] == "S1"
    before = log.read_text()
    assert fencelog.main(["--config", str(path), "--id", "p3", "--snapshot", "S2"]) == 0
    assert log.read_text() == before, "a node with a log keeps it"
    assert capsys.readouterr().err.splitlines() == ["snapmesh fencelog: p3: fenced for S1",
                                                     "snapmesh fencelog: p3: has a log: kept"]


def test_a_node_the_file_does_not_name_and_a_missing_file_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SNAPMESH_APP", "kvshard")
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3, data_dir=tmp_path)
    assert fencelog.main(["--config", str(path), "--id", "p9", "--snapshot", "S"]) == 2
    assert fencelog.main(["--config", str(tmp_path / "none.toml"), "--id", "p1", "--snapshot", "S"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"snapmesh fencelog: {path} names no node 'p9'",
                     f"snapmesh fencelog: {tmp_path / 'none.toml'}: no such file"], lines
    assert not list(tmp_path.glob("*.log*")), "nothing written"
