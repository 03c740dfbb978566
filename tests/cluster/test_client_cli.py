"""`snapmesh submit` and `snapmesh query` as a user runs them, against real node processes.

examples/token_ring.py on two nodes (p1 holds the token first). Each command runs
as its own process (`python -m snapmesh.cli`), finding the node by `--config`,
`--data-dir` or `--address`: text in and the reply out; `--request-id` answered
once (a rerun is replayed, and the app does not run it again); a refusal is one
line `CODE: text` and exit 1; `--base64` both ways; `--batch` one result per line
in order, exit 1 when an item was refused, and its ids `ID:N` making a rerun
exactly-once; `query` reads without a log record. Bad arguments exit 2 without a server.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from snapmesh.commands import submit as submit_cli
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings import config
from snapmesh.settings.config import write_cluster
from snapmesh.settings.security import write_certs
from snapmesh.services.node import edge
from support.ring import APP, CLI, EXAMPLES, env_with, held_by

ENV = env_with(EXAMPLES)


def snapmesh(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=ENV, input=stdin)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("client")
    running = Cluster(write_cluster(tmp / "cluster.toml", nodes=2, data_dir=tmp), app=APP, env=ENV)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_submit_query_and_batch_from_the_command_line(cluster, tmp_path: Path) -> None:
    cfg = config.load(cluster.config_path)
    by_file = ("--config", str(cluster.config_path))
    has = snapmesh("submit", *by_file, "--node", "p1", "has")
    assert (has.returncode, has.stdout, has.stderr) == (0, "1\n", "")

    passed = snapmesh("submit", "--data-dir", str(cluster.config_path.parent), "--node", "p1", "--request-id", "r1", "pass")
    assert (passed.returncode, passed.stdout) == (0, "passed to p2\n"), passed.stderr
    held_by(cfg, "p2")
    again = snapmesh("submit", *by_file, "--node", "p1", "--request-id", "r1", "pass")  # a retry: not run again
    assert (again.returncode, again.stdout) == (0, "passed to p2\n")
    assert "answered before" in again.stderr

    refused = snapmesh("submit", *by_file, "--node", "p1", "pass")  # p1 no longer holds it
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == "FAILED_PRECONDITION: p1 does not hold the token\n"

    address = cfg.node("p2").address
    binary = snapmesh("submit", "--address", address, "--base64", base64.b64encode(b"has").decode())
    assert (binary.returncode, binary.stdout) == (0, base64.b64encode(b"1").decode() + "\n")

    read = snapmesh("query", *by_file, "--node", "p2", "has")
    assert (read.returncode, read.stdout) == (0, "1\n"), read.stderr
    unknown = snapmesh("query", *by_file, "--node", "p2", "dance")
    assert unknown.returncode == 1 and unknown.stderr.startswith("INVALID_ARGUMENT: unknown query")
    assert unknown.stderr.count("\n") == 1

    batch = tmp_path / "commands.txt"
    batch.write_text("has\ndance\n\npass\nhas\n", encoding="utf-8")
    out = snapmesh("submit", *by_file, "--node", "p2", "--request-id", "b1", "--batch", str(batch))
    lines = out.stdout.splitlines()
    assert out.returncode == 1, out.stderr  # "dance" is refused
    assert lines[0] == "OK: 1" and lines[1].startswith("INVALID_ARGUMENT: unknown command")
    assert lines[2:] == ["OK: passed to p1", "OK: 0"]
    rerun = snapmesh("submit", *by_file, "--node", "p2", "--request-id", "b1", "--batch", "-", stdin=batch.read_text())
    assert rerun.stdout.splitlines() == lines, "ids b1:N: the same replies, nothing run twice"
    held_by(cfg, "p1")
    assert snapmesh("query", *by_file, "--node", "p1", "has").stdout == "1\n", "one pass, not two"
    ok = snapmesh("submit", *by_file, "--node", "p1", "--batch", "-", stdin="has\nhas\n")
    assert (ok.returncode, ok.stdout) == (0, "OK: 1\nOK: 1\n")


@pytest.mark.parametrize(("args", "says"), [
    (["submit", "has"], "give --node ID"),
    (["submit", "--node", "p9", "has"], "no node 'p9'"),
    (["submit", "--node", "p1"], "give TEXT or --batch"),
    (["submit", "--node", "p1", "--base64", "not base64!"], "not base64"),
    (["submit", "--address", "http://127.0.0.1:1", "has"], "is a URL"),
    (["query", "--node", "p1", "--config", "/nonexistent.toml", "has"], "no such file"),
])
def test_bad_arguments_exit_2_with_one_line(args, says) -> None:
    result = snapmesh(*args)
    assert result.returncode == 2 and says in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_a_long_batch_goes_in_calls_within_the_nodes_limits() -> None:
    assert (submit_cli.MAX_BATCH_COMMANDS, submit_cli.MAX_BATCH_BYTES) == (edge.MAX_BATCH_COMMANDS, edge.MAX_BATCH_BYTES)
    many = [("", b"x")] * (2 * edge.MAX_BATCH_COMMANDS + 1)
    assert [len(c) for c in submit_cli.chunks(many)] == [edge.MAX_BATCH_COMMANDS, edge.MAX_BATCH_COMMANDS, 1]
    big = [("id", b"y" * (edge.MAX_BATCH_BYTES // 3))] * 4
    assert [len(c) for c in submit_cli.chunks(big)] == [2, 2]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_submit_finds_a_tls_clusters_certificates_in_its_data_dir(tmp_path: Path) -> None:
    # As the controller's clients do: --data-dir D's cluster.toml names the node, D/tls/ holds
    # the client certificate; the same call in plaintext is refused with the fix in words.
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path)
    write_certs(config.load(path), tmp_path / "tls")
    with Cluster(path, app=APP, env=ENV, tls_dir=tmp_path / "tls"):
        secure = snapmesh("submit", "--data-dir", str(tmp_path), "--node", "p1", "has")
        assert (secure.returncode, secure.stdout) == (0, "1\n"), secure.stderr
        read = snapmesh("query", "--data-dir", str(tmp_path), "--node", "p1", "has")
        assert (read.returncode, read.stdout) == (0, "1\n"), read.stderr
        plain = snapmesh("submit", "--config", str(path), "--node", "p1", "has")
        assert plain.returncode == 1 and "TLS is on" in plain.stderr, plain.stderr
