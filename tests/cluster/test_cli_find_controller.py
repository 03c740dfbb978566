"""How every client command finds the controller, and what it exits with, as real
processes against one real cluster: `--controller`, then `$SNAPMESH_CONTROLLER`,
then `--data-dir D`'s cluster.toml, then 127.0.0.1:50050 (snapmesh.settings.target);
a usage error (an URL given as an address, a data dir without its file) exits 2
in one line, an unreachable controller 1."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.settings.ports import free_ports

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
ENV = "SNAPMESH_CONTROLLER"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("find")
    with Cluster(write_cluster(root / "cluster.toml", nodes=2)) as running:
        yield running


@pytest.fixture(scope="module")
def nowhere() -> str:
    """An address nobody listens on."""
    return f"127.0.0.1:{free_ports(1)[0]}"


def snapmesh(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SNAPMESH_CONTROLLER", "SNAPMESH_TLS_DIR")}
    return subprocess.run([sys.executable, "-m", "snapmesh.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**base, **(env or {})})


def test_each_client_command_finds_the_controller_by_the_data_dir_alone(cluster):
    data_dir = str(cluster.data_dir)
    taken = snapmesh("snapshot", "trigger", "--wait", "--data-dir", data_dir)
    assert taken.returncode == 0 and "COMPLETE" in taken.stdout, taken.stderr
    for command in ("list", "get latest"):  # watch waits for an update: below
        result = snapmesh("snapshot", *command.split(), "--data-dir", data_dir)
        assert result.returncode == 0, (command, result.stderr)
    restore = snapmesh("restore", "20260101T000000.000000Z-00000000", "--yes", "--data-dir", data_dir)
    assert restore.returncode == 1 and "NOT_FOUND" in restore.stderr, restore.stderr  # it reached the controller
    app = snapmesh("app", "--data-dir", data_dir, "--duration", "1", "--snapshot-every", "0", "--seed", "1")
    assert app.returncode == 0, app.stderr
    assert "bank workload: seed 1" in app.stdout


def test_watch_finds_it_by_the_data_dir_too(cluster, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "snapmesh.cli", "snapshot", "watch", "--count", "1", "--json",
                             "--data-dir", str(cluster.data_dir)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = threading.Event()
        while proc.poll() is None and not deadline.wait(0.3):
            snapmesh("snapshot", "trigger", "--data-dir", str(cluster.data_dir))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and '"snapshot_id"' in out, err


def test_the_page_finds_the_controller_by_the_data_dir(cluster):
    proc = subprocess.Popen([sys.executable, "-m", "snapmesh.cli", "ui", "--data-dir", str(cluster.data_dir),
                             "--listen", "127.0.0.1:0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ui: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        with urllib.request.urlopen(line.split()[1], timeout=10) as page:  # 503 (raises) when the controller is down
            body = page.read().decode()
        assert page.status == 200 and cluster.controller_address in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_flag_wins_over_the_environment_which_wins_over_the_data_dir(cluster, nowhere):
    data_dir = str(cluster.data_dir)
    env_wins = snapmesh("snapshot", "list", "--data-dir", data_dir, "--timeout", "3",
                        env={ENV: nowhere})
    assert env_wins.returncode == 1 and nowhere in env_wins.stderr, env_wins.stderr
    flag_wins = snapmesh("snapshot", "list", "--data-dir", data_dir, "--controller", cluster.controller_address,
                         env={ENV: nowhere})
    assert flag_wins.returncode == 0, flag_wins.stderr
    env_only = snapmesh("snapshot", "list", env={ENV: cluster.controller_address})
    assert env_only.returncode == 0, env_only.stderr


def test_with_nothing_given_it_is_the_shipped_default(tmp_path):
    from snapmesh.settings import target

    assert target.find(None, None, None, env={}).address == target.DEFAULT_CONTROLLER == "127.0.0.1:50050"
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, ports=list(range(20001, 20007)))
    found = target.find(None, tmp_path, None, env={})
    assert (found.address, found.source) == ("127.0.0.1:20001", str(path))
    assert target.find(None, tmp_path, None, env={ENV: "h:1"}).address == "h:1"
    assert target.find("f:2", tmp_path, None, env={ENV: "h:1"}).address == "f:2"


@pytest.mark.parametrize("args", [
    ["snapshot", "list", "--controller", "http://127.0.0.1:50050"],
    ["snapshot", "trigger", "--controller", "https://controller:50050/"],
    ["restore", "some-id", "--yes", "--controller", "http://127.0.0.1:50050"],
    ["app", "--duration", "1", "--controller", "http://127.0.0.1:50050"],
    ["ui", "--controller", "http://127.0.0.1:50050"],
    ["health", "http://127.0.0.1:50050"],
    ["snapshot", "list", "--data-dir", "/nonexistent/snapmesh"],
    ["restore", "x", "--yes", "--data-dir", "/"],
    ["snapshot", "list", "--controller", "127.0.0.1:50050", "--timeout", "0"],
    ["restore", "x", "--yes", "--controller", "127.0.0.1:1", "--timeout", "-1"],
])
def test_usage_errors_exit_2_in_one_line(args):
    result = snapmesh(*args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"snapmesh {args[0]}"), result.stderr


def test_a_url_is_refused_with_the_address_to_give_instead():
    result = snapmesh("snapshot", "list", "--controller", "http://127.0.0.1:50050")
    assert "is a URL, not HOST:PORT: give it without the scheme (127.0.0.1:50050)" in result.stderr


@pytest.mark.parametrize("args", [
    ["snapshot", "list", "--timeout", "3"],
    ["snapshot", "get", "latest", "--timeout", "3"],
    ["restore", "some-id", "--yes", "--timeout", "3"],
    ["app", "--duration", "1"],
    ["health", "--timeout", "3"],
])
def test_an_unreachable_controller_exits_1_everywhere(args, nowhere):
    argv = [*args[:1], nowhere, *args[1:]] if args[0] == "health" else [*args, "--controller", nowhere]
    result = snapmesh(*argv)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
