"""`snapmesh cluster up` as a real subprocess: its one line, a clean stop, no leftovers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from snapmesh.settings import config as cluster_config
from snapmesh.settings.config import write_cluster
from snapmesh.settings.ports import port_is_free
from support.polling import wait_for
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
    cfg = cluster_config.load(tmp_path / "cluster.toml")
    # then each process's addresses, then the snapshot page
    addresses = [read_line(proc, 10) for _ in range(1 + len(cfg.nodes))]
    assert addresses == [f"controller metrics: http://{cfg.controller.metrics_address}/metrics\n"] + [
        f"node {n.id}: {n.address} metrics: http://{n.metrics_address}/metrics\n" for n in cfg.nodes
    ]
    ui = read_line(proc, 10)  # 127.0.0.1:8080, or a free port when taken
    assert re.fullmatch(r"ui: http://127\.0\.0\.1:\d+/\n", ui), ui
    children = launched.remember(proc)
    with urllib.request.urlopen(ui.split()[1], timeout=10) as page:
        assert page.status == 200 and b"snapmesh snapshots" in page.read()
    assert len(children) == 5  # the controller, three nodes and the page
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
    for _ in range(3):  # the addresses, then the page's line
        read_line(proc, 10)
    assert read_line(proc, 20).startswith("ui: ")
    children = launched.remember(proc)
    assert len(children) == 4  # the controller, two nodes and the page: each dies with the launcher
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


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _stderr_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """The lines `proc` writes on stderr up to the first holding `text` (a thread: readline blocks)."""
    lines: list[str] = []

    def read() -> None:
        for line in iter(proc.stderr.readline, ""):
            lines.append(line)
            if text in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return "".join(lines)


def _page_pids(proc: subprocess.Popen) -> list[int]:
    return [pid for pid in children_of(proc.pid) if "ui" in _cmdline(pid) and "--listen" in _cmdline(pid)]


def test_the_page_runs_in_its_own_process_restarted_if_it_dies_and_stopped_with_the_cluster(launched, tmp_path):
    """The page reads node logs, so its memory follows its visitors: an out-of-memory
    kill must take the page alone, not the supervisor and every node with it."""
    proc = launched("--nodes", "2", "--data-dir", str(tmp_path), "--ui", "127.0.0.1:0")
    assert read_line(proc, 60).startswith("controller: ")
    for _ in range(3):  # the controller's and each node's addresses
        read_line(proc, 10)
    ui = read_line(proc, 20)
    assert re.fullmatch(r"ui: http://127\.0\.0\.1:\d+/\n", ui), ui
    url = ui.split()[1]
    pages = _page_pids(proc)
    launched.remember(proc)
    assert len(pages) == 1, [_cmdline(p) for p in children_of(proc.pid)]  # a child process, not a thread
    with urllib.request.urlopen(url + "healthz", timeout=10) as answer:
        assert answer.status == 200

    os.kill(pages[0], signal.SIGKILL)  # as the kernel's OOM killer would
    assert wait_gone(pages) == set()
    wait_for(lambda: [p for p in _page_pids(proc) if p != pages[0]], timeout=30, interval=0.2, what="the page started again")
    again = _page_pids(proc)
    launched.remember(proc)
    assert again and again != pages, "the page was not started again"
    assert proc.poll() is None  # the supervisor and the nodes lived on

    def healthz() -> int:  # the same URL it printed
        with urllib.request.urlopen(url + "healthz", timeout=5) as answer:
            return answer.status

    assert wait_for(healthz, timeout=20, interval=0.2, retry_on=OSError,
                    what="the restarted page answers at its URL") == 200

    # The page answers a moment before the supervisor has read its URL and said so: wait for the line.
    said = _stderr_until(proc, "started again at ", timeout=20)
    children = launched.remember(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    err = said + err
    assert proc.returncode == 0, err
    assert "the snapshot page exited" in err and "started again at " + url in err
    assert wait_gone(children | set(again)) == set()
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    assert port_is_free(host, int(port))
