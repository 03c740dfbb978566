"""`snapmesh cluster up` as a real subprocess: its one line, a clean stop, no leftovers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from snapmesh.settings import config as cluster_config
from snapmesh.settings.config import write_cluster
from snapmesh.settings.ports import port_is_free
from support.processes import REPO, alive, children_of, cluster_up, read_line, wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]













@pytest.fixture
def launched():
    """Start `cluster up` processes; whatever a test leaves running is killed."""
    procs: list[subprocess.Popen] = []
    descendants: set[int] = set()

    def launch(*args: str) -> subprocess.Popen:
        proc = cluster_up(*args)
        procs.append(proc)
        return proc

    def remember(proc: subprocess.Popen) -> set[int]:
        found = children_of(proc.pid)
        descendants.update(found)
        return found

    launch.remember = remember
    yield launch
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in descendants:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def all_ports(cfg: cluster_config.ClusterConfig) -> list[tuple[str, int]]:
    endpoints = [cfg.controller, *cfg.nodes]
    return [(e.host, p) for e in endpoints for p in (e.port, e.metrics_port)]


def test_cluster_up_prints_the_addresses_and_sigterm_stops_every_child(launched, tmp_path):
    proc = launched("--nodes", "3", "--data-dir", str(tmp_path))
    line = read_line(proc, 60)
    match = re.fullmatch(r"controller: (127\.0\.0\.1):(\d+)\n", line)
    assert match, line
    children = launched.remember(proc)
    cfg = cluster_config.load(tmp_path / "cluster.toml")
    # then each process's addresses, then the snapshot page
    addresses = [read_line(proc, 10) for _ in range(1 + len(cfg.nodes))]
    assert addresses == [f"controller metrics: http://{cfg.controller.metrics_address}/metrics\n"] + [
        f"node {n.id}: {n.address} metrics: http://{n.metrics_address}/metrics\n" for n in cfg.nodes
    ]
    ui = read_line(proc, 10)  # 127.0.0.1:8080, or a free port when taken
    assert re.fullmatch(r"ui: http://127\.0\.0\.1:\d+/\n", ui), ui
    with urllib.request.urlopen(ui.split()[1], timeout=10) as page:
        assert page.status == 200 and b"snapmesh snapshots" in page.read()
    assert len(children) == 4  # the controller and three nodes
    assert cfg.controller.address == f"{match[1]}:{match[2]}"
    assert (tmp_path / "p1.log.jsonl").exists()
    assert not port_is_free(cfg.controller.host, cfg.controller.port)

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out == ""  # those lines were all
    assert wait_gone(children) == set()
    busy = [p for p in all_ports(cfg) if not port_is_free(*p)]
    assert busy == []


def test_ctrl_c_stops_a_cluster_started_from_a_config_file(launched, tmp_path):
    path = write_cluster(tmp_path / "ring.toml", nodes=3, topology="ring")
    proc = launched("--config", str(path), "--data-dir", str(tmp_path / "elsewhere"))
    assert read_line(proc, 60).startswith("controller: ")
    children = launched.remember(proc)
    assert (tmp_path / "elsewhere" / "p2.log.jsonl").exists()  # --data-dir wins over the file's

    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert wait_gone(children) == set()
    cfg = cluster_config.load(path)
    assert [p for p in all_ports(cfg) if not port_is_free(*p)] == []


def test_children_die_when_the_launcher_is_sigkilled(launched, tmp_path):
    proc = launched("--nodes", "2", "--data-dir", str(tmp_path))
    assert read_line(proc, 60).startswith("controller: ")
    children = launched.remember(proc)
    assert len(children) == 3
    proc.kill()
    proc.wait()
    assert wait_gone(children) == set()


def test_a_malformed_config_exits_2_naming_the_field(launched, tmp_path):
    path = write_cluster(tmp_path / "bad.toml", nodes=2)
    path.write_text(path.read_text().replace("initial_balance = 1000", 'initial_balance = "lots"'))
    proc = launched("--config", str(path))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "initial_balance" in err and str(path) in err
    assert out == ""
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [["--nodes", "0"], ["down"], ["up", "--config", "a", "--nodes", "2"], ["--ui", "nonsense"]])
def test_bad_arguments_exit_2(args):
    argv = args if args and args[0] in ("down", "up") else ["up", *args]
    result = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "cluster", *argv], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2, result
    assert result.stdout == ""


def test_a_node_that_cannot_start_stops_the_rest_and_exits_1(launched, tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    cfg = cluster_config.load(path)
    import socket

    with socket.socket() as squatter:  # p2's port is taken
        squatter.bind((cfg.node("p2").host, cfg.node("p2").port))
        squatter.listen()
        proc = launched("--config", str(path))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "p2" in err
    assert out == ""


def test_a_child_that_dies_is_reported_once_on_stderr_and_the_rest_keep_serving(launched, tmp_path):
    proc = launched("--nodes", "2", "--data-dir", str(tmp_path), "--ui", "off")
    assert read_line(proc, 60).startswith("controller: ")
    children = launched.remember(proc)
    p2 = [pid for pid in children if b"--id\x00p2\x00" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(p2) == 1, children
    os.kill(p2[0], signal.SIGKILL)
    time.sleep(2)  # the launcher looks every 0.5 s; give it several looks, to see it says so only once
    assert proc.poll() is None  # the launcher keeps the rest running
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err.count("snapmesh cluster: p2 exited; see ") == 1, err
    assert wait_gone(children) == set()
