"""snapmesh/serving/startup.py: what the node and the controller share before they run,
a usage error and a refused cluster file or app in one line, exit 2, nothing started."""

from __future__ import annotations

import pytest

from snapmesh.app import AppError
from snapmesh.serving import startup


def _parser() -> startup.OneLineParser:
    parser = startup.OneLineParser(prog="snapmesh thing")
    parser.add_argument("--config")
    parser.add_argument("--app")
    return parser


def _never(args, cfg):
    raise AssertionError("prepared after a usage error")


def test_a_usage_error_is_one_line_naming_the_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert startup.server_main(_parser(), ["--nonsense"], _never) == 2
    assert capsys.readouterr().err == "snapmesh thing: unrecognized arguments: --nonsense\n"


def test_what_prepare_refuses_is_one_line_and_nothing_runs(capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(args, cfg):
        assert cfg.nodes  # the shipped cluster file, read before
        raise AppError("app 'x': no such module")

    assert startup.server_main(_parser(), [], refuse) == 2
    assert capsys.readouterr().err == "snapmesh thing: app 'x': no such module\n"


def test_a_missing_cluster_file_is_refused_before_prepare(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert startup.server_main(_parser(), ["--config", str(tmp_path / "none.toml")], _never) == 2
    err = capsys.readouterr().err
    assert err.startswith("snapmesh thing: ") and err.count("\n") == 1
