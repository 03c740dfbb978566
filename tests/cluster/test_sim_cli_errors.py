"""Invalid scenarios: `snapmesh sim run` exits 2 with one clear line on stderr.

The line names the file and the place (the step index and the step as written,
or the field), never a traceback, and nothing goes to stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.commands import sim as cli

MESH2 = {"A": 10, "B": 10}
TRIANGLE = [["A", "B"], ["B", "C"], ["C", "A"]]


def scenario(steps, nodes=None, **extra):
    return json.dumps({"nodes": nodes or MESH2, **extra, "steps": steps})


# name -> (file content, fragments the one line must contain)
CASES: dict[str, tuple[str | bytes, list[str]]] = {
    # A name the scenario never declared, at each place a name is used.
    "unknown node": (scenario([["run"], ["send", "A", "Q", 5]]), ['step 1 ["send","A","Q",5]', "unknown node 'Q'"]),
    "unknown node in snapshot": (scenario([["snapshot", "Q", "s"]]), ["step 0", "unknown node 'Q'"]),
    "unknown step": (scenario([["run"], ["run"], ["jump", "A"]]), ['step 2 ["jump","A"]', "unknown step 'jump'"]),
    "channel the topology lacks": (
        scenario([["deliver", "A", "C"]], nodes={"A": 1, "B": 1, "C": 1}, channels=TRIANGLE),
        ['step 0 ["deliver","A","C"]', "no channel A->C"],
    ),
    "send on a channel the topology lacks": (
        scenario([["send", "A", "C", 1]], nodes={"A": 1, "B": 1, "C": 1}, channels=TRIANGLE),
        ["step 0", "no channel A->C"],
    ),
    "empty channel delivered": (
        scenario([["send", "A", "B", 1], ["deliver", "A", "B"], ["deliver", "A", "B"]]),
        ['step 2 ["deliver","A","B"]: channel A->B is empty'],
    ),
    "empty channel delivered at the start": (scenario([["deliver", "B", "A"]]), ["step 0", "channel B->A is empty"]),
    "insufficient funds": (
        scenario([["send", "A", "B", 4], ["send", "A", "B", 7]]),
        ['step 1 ["send","A","B",7]', "insufficient funds", "A has 6", "cannot send 7"],
    ),
    "zero amount": (scenario([["send", "A", "B", 0]]), ["step 0", "amount must be positive, got 0"]),
    "negative amount": (scenario([["send", "A", "B", -3]]), ["step 0", "amount must be positive, got -3"]),
    "not strongly connected": (
        scenario([], nodes={"A": 1, "B": 1, "C": 1}, channels=[["A", "B"], ["B", "A"], ["B", "C"]]),
        ["channels", "not strongly connected", "no path from 'C' to 'A'"],
    ),
    "single channel between two nodes": (
        scenario([], channels=[["A", "B"]]),
        ["channels", "not strongly connected"],
    ),
    # Anything else malformed.
    "amount is a string": (scenario([["send", "A", "B", "5"]]), ["step 0", 'amount must be an integer, got "5"']),
    "amount is a bool": (scenario([["send", "A", "B", True]]), ["step 0", "amount must be an integer, got true"]),
    "amount is a float": (scenario([["send", "A", "B", 1.5]]), ["step 0", "amount must be an integer, got 1.5"]),
    "node is a number": (scenario([["send", 1, "B", 5]]), ["step 0", "SRC must be a node id"]),
    "wrong arity": (scenario([["deliver", "A"]]), ['step 0 ["deliver","A"]', "takes 2 argument(s)", "got 1"]),
    "run with arguments": (scenario([["run", 3]]), ["step 0", "'run' takes 0 argument(s)"]),
    "step not a list": (scenario([["run"], "run"]), ['step 1 "run"', "a step is a list"]),
    "empty step": (scenario([[]]), ["step 0 []", "a step is a list"]),
    "step kind not a string": (scenario([[1, "A"]]), ["step 0", "a step is a list that starts with its kind"]),
    "empty snapshot id": (scenario([["snapshot", "A", ""]]), ["step 0", "snapshot ID must be a non-empty string"]),
    "numeric snapshot id": (scenario([["snapshot", "A", 7]]), ["step 0", "snapshot ID must be a non-empty string"]),
    "negative initial balance": (json.dumps({"nodes": {"A": -1, "B": 0}, "steps": []}), ["nodes.A", "got -1"]),
    "bool initial balance": (json.dumps({"nodes": {"A": True, "B": 0}, "steps": []}), ["nodes.A", "got true"]),
    "float initial balance": (json.dumps({"nodes": {"A": 1.0, "B": 0}, "steps": []}), ["nodes.A", "got 1.0"]),
    "no nodes": (json.dumps({"nodes": {}, "steps": []}), ["nodes", "at least one node"]),
    "nodes is a list": (json.dumps({"nodes": ["A"], "steps": []}), ["nodes", "got a list"]),
    "empty node id": (json.dumps({"nodes": {"": 1}, "steps": []}), ["nodes", "empty string"]),
    "missing nodes": (json.dumps({"steps": []}), ["missing key 'nodes'"]),
    "missing steps": (json.dumps({"nodes": MESH2}), ["missing key 'steps'"]),
    "steps is an object": (json.dumps({"nodes": MESH2, "steps": {}}), ["steps", "must be a list"]),
    "unknown top-level key": (json.dumps({"nodes": MESH2, "steps": [], "step": []}), ["unknown key 'step'"]),
    "top level is a list": (json.dumps([1, 2]), ["must be a JSON object", "got a list"]),
    "channels is an object": (scenario([], channels={}), ["channels", "must be a list"]),
    "channel is not a pair": (scenario([], channels=[["A", "B"], ["B"]]), ["channels", "channel #1"]),
    "channel to an unknown node": (scenario([], channels=[["A", "B"], ["B", "Q"]]), ["channels", "unknown node 'Q'"]),
    "self-loop": (scenario([], channels=[["A", "B"], ["B", "A"], ["A", "A"]]), ["channels", "A->A", "itself"]),
    "duplicate channel": (scenario([], channels=[["A", "B"], ["B", "A"], ["A", "B"]]), ["channels", "listed twice"]),
    "duplicate node": ('{"nodes": {"A": 1, "A": 2}, "steps": []}', ["key 'A' appears twice"]),
    "invalid JSON": ('{"nodes": {"A": 1},\n "steps": [["run"],]}', ["line 2 column 20", "invalid JSON"]),
    "empty file": ("", ["line 1 column 1", "invalid JSON"]),
    "not UTF-8": (b"\xff\xfe{}", ["not UTF-8"]),
}


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "scenario.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def assert_one_clean_line(stderr: str, path: Path, fragments: list[str]) -> None:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert stderr.endswith("\n")
    line = lines[0]
    assert line.startswith(f"snapmesh sim: {path}: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_invalid_scenario_exits_2_with_one_line(name: str, tmp_path: Path) -> None:
    content, fragments = CASES[name]
    path = write(tmp_path, content)
    code, out, err = run_cli(["run", str(path)])
    assert code == 2
    assert out == ""
    assert_one_clean_line(err, path, fragments)


def snapmesh_command() -> list[str]:
    script = Path(sys.executable).parent / "snapmesh"
    return [str(script)] if script.exists() else [sys.executable, "-m", "snapmesh.cli"]


@pytest.mark.parametrize(
    "name", ["empty channel delivered", "insufficient funds", "not strongly connected", "invalid JSON", "not UTF-8"]
)
def test_invalid_scenario_through_the_real_command(name: str, tmp_path: Path) -> None:
    content, fragments = CASES[name]
    path = write(tmp_path, content)
    done = subprocess.run(
        snapmesh_command() + ["sim", "run", str(path), "--seed", "3"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert_one_clean_line(done.stderr, path, fragments)


def test_the_documented_example_line(tmp_path: Path) -> None:
    path = write(tmp_path, scenario([["run"], ["run"], ["run"], ["run"], ["deliver", "A", "B"]]))
    code, _, err = run_cli(["run", str(path)])
    assert code == 2
    assert err == f'snapmesh sim: {path}: step 4 ["deliver","A","B"]: channel A->B is empty\n'


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    code, out, err = run_cli(["run", str(path)])
    assert (code, out) == (2, "")
    assert_one_clean_line(err, path, ["cannot read", "No such file"])


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    code, out, err = run_cli(["run", str(tmp_path)])
    assert (code, out) == (2, "")
    assert_one_clean_line(err, tmp_path, ["cannot read"])


def test_nothing_runs_before_the_whole_file_is_valid(tmp_path: Path) -> None:
    # Step 1 is fine at run time, step 2 is statically invalid: the error names step 2,
    # and there is no partial output.
    path = write(tmp_path, scenario([["send", "A", "B", 1], ["run"], ["send", "A", "B", -1]]))
    code, out, err = run_cli(["run", str(path)])
    assert (code, out) == (2, "")
    assert "step 2" in err


def test_bad_seed_is_a_usage_error(tmp_path: Path) -> None:
    path = write(tmp_path, scenario([]))
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
        cli.main(["run", str(path), "--seed", "abc"])
    assert exit_info.value.code == 2
    assert "invalid int value" in err.getvalue() and "Traceback" not in err.getvalue()
