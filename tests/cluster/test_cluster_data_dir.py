"""A cluster lives in its data dir, as real `snapmesh cluster` processes: `cluster up
--data-dir D` again starts it on the same ports (and says plainly when one is
taken), `cluster down` and `cluster status` find it by D from another process,
`--nodes 1` is refused; with `--tls` neither `cluster up` nor `snapmesh certs`
prints the token, and a client with another CA's certificates gets one line. A data
dir remembers its security and its app: started again without `--tls` or `--app` it
runs them, and a start that names others is refused in one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import grpc

from support.processes import children_of, read_line, wait_gone
from support.ring import APP, EXAMPLES, env_with, held_by, submit
from support.binaries import grpcurl_binary
from snapmesh.settings import config as cluster_config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]


def snapmesh(*args: str, timeout: float = 90, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("SNAPMESH_")}
    return subprocess.run([sys.executable, "-m", "snapmesh.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def up():
    """`cluster up ARGS` as a process, started once its `controller:` line is out; all gone after the test."""
    started: list[tuple[subprocess.Popen, set[int]]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([sys.executable, "-m", "snapmesh.cli", "cluster", "up", "--ui", "off", *args],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = read_line(proc, 90)
        started.append((proc, children_of(proc.pid)))
        assert line.startswith("controller: "), (line, proc.stderr.read() if proc.poll() is not None else "")
        return proc, line.split()[1]

    yield start
    for proc, children in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in wait_gone(children, 1):
            os.kill(pid, signal.SIGKILL)


def test_up_again_on_its_data_dir_keeps_every_address_and_down_stops_it_from_another_process(up, tmp_path):
    first, address = up("--nodes", "3", "--data-dir", str(tmp_path))
    ports = cluster_config.load(tmp_path / "cluster.toml")
    status = snapmesh("cluster", "status", "--data-dir", str(tmp_path))
    assert status.returncode == 0, status.stderr
    assert f"running (launcher pid {first.pid})" in status.stdout
    assert status.stdout.count("SERVING") == 4 and address in status.stdout

    down = snapmesh("cluster", "down", "--data-dir", str(tmp_path))
    assert down.returncode == 0 and f"pid {first.pid}" in down.stdout, down.stderr
    assert first.wait(timeout=30) == 0  # stopped cleanly, as by Ctrl-C
    stopped = snapmesh("cluster", "status", "--data-dir", str(tmp_path))
    assert stopped.returncode == 1 and "not running" in stopped.stdout and "SERVING" not in stopped.stdout
    again = snapmesh("cluster", "down", "--data-dir", str(tmp_path))
    assert again.returncode == 1 and "no cluster runs on" in again.stderr

    second, moved = up("--data-dir", str(tmp_path))  # no --nodes: D's own cluster
    assert moved == address
    assert cluster_config.load(tmp_path / "cluster.toml") == ports
    assert snapmesh("snapshot", "trigger", "--wait", "--data-dir", str(tmp_path)).returncode == 0
    assert snapmesh("cluster", "down", "--data-dir", str(tmp_path)).returncode == 0
    second.wait(timeout=30)

    third, same = up("--nodes", "3", "--data-dir", str(tmp_path))  # the same size: the same ports too
    assert same == address
    assert snapmesh("cluster", "down", "--data-dir", str(tmp_path)).returncode == 0
    third.wait(timeout=30)
    resized = snapmesh("cluster", "up", "--nodes", "4", "--data-dir", str(tmp_path))
    assert resized.returncode == 2 and "holds a 3-node cluster" in resized.stderr, resized.stderr
    assert f"snapmesh cluster rescale --data-dir {tmp_path} --nodes 4" in resized.stderr, "the way to resize, said"
    assert len(resized.stderr.strip().splitlines()) == 1, resized.stderr


def test_a_taken_port_of_the_data_dirs_cluster_is_said_plainly(tmp_path):
    cluster_config.write_cluster(tmp_path / "cluster.toml", nodes=2)
    port = cluster_config.load(tmp_path / "cluster.toml").node("p2").port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = snapmesh("cluster", "up", "--data-dir", str(tmp_path), "--ui", "off")
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert f"127.0.0.1:{port}, the gRPC port of node p2 in {tmp_path / 'cluster.toml'}, is taken" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("args, says", [
    (["cluster", "up", "--nodes", "1"], "--nodes must be at least 2"),
    (["cluster", "up", "--nodes", "0"], "--nodes must be at least 2"),
    (["cluster", "status", "--data-dir", "/nonexistent/d"], "no such directory"),
    (["cluster", "down", "--data-dir", "/"], "no cluster.toml there"),
])
def test_bad_cluster_arguments_exit_2_in_one_line(args, says):
    result = snapmesh(*args)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_tls_prints_no_token_its_grpcurl_line_works_and_another_ca_gets_one_line(up, tmp_path):
    proc, address = up("--nodes", "2", "--tls", "--data-dir", str(tmp_path))
    token = (tmp_path / "tls" / "token").read_text().strip()
    grpcurl = read_line(proc, 10)
    assert token not in grpcurl
    assert f'-H "authorization: Bearer $(cat {tmp_path / "tls" / "token"})"' in grpcurl
    line = grpcurl.removeprefix("grpcurl: ").strip().replace("grpcurl ", f"{grpcurl_binary()} ", 1)
    shell = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert shell.returncode == 0 and '"COMPLETE"' in shell.stdout, shell.stderr

    other = tmp_path / "other"
    certs = snapmesh("certs", "--config", str(tmp_path / "cluster.toml"), "--tls-dir", str(other))
    assert certs.returncode == 0, certs.stderr
    assert (other / "token").read_text().strip() not in certs.stdout
    assert f'-H "authorization: Bearer $(cat {other / "token"})"' in certs.stdout

    # The clients find the certificates in the data dir; another CA's: one line, the flag to check.
    assert snapmesh("snapshot", "list", "--data-dir", str(tmp_path)).returncode == 0
    for prog, args in (("snapmesh snapshot list", ["snapshot", "list"]), ("snapmesh restore", ["restore", "x", "--yes"])):
        result = snapmesh(*args, "--data-dir", str(tmp_path), "--tls-dir", str(other))
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"{prog}: the certificates of {address} are from another CA than this client's: check "
            "--tls-dir (or $SNAPMESH_TLS_DIR, or --data-dir's tls/) names this cluster's ca.pem, client.pem and "
            "client-key.pem"], result.stderr
    app = snapmesh("app", "--duration", "1", "--data-dir", str(tmp_path), "--tls-dir", str(other))
    assert app.returncode == 1 and len(app.stderr.strip().splitlines()) == 1, app.stderr
    assert "are from another CA than this client's: check --tls-dir" in app.stderr
    health = snapmesh("health", address, "--tls-dir", str(other))
    assert health.returncode == 1 and health.stderr == "" and len(health.stdout.strip().splitlines()) == 1, health
    assert "are from another CA than this client's: check --tls-dir" in health.stdout


def test_a_tls_data_dir_started_again_without_tls_stays_tls_and_a_plaintext_one_refuses_tls(up, tmp_path):
    first, address = up("--nodes", "2", "--tls", "--data-dir", str(tmp_path))
    assert read_line(first, 10).startswith("grpcurl: ")
    assert snapmesh("cluster", "down", "--data-dir", str(tmp_path)).returncode == 0
    first.wait(timeout=5)

    again, same = up("--data-dir", str(tmp_path))  # no --tls: the data dir remembers it
    assert same == address
    assert read_line(again, 10).startswith("grpcurl: ")  # said as a TLS cluster says it
    with grpc.insecure_channel(address) as channel:  # plaintext, no token: nothing answers
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    trigger = snapmesh("snapshot", "trigger", "--wait", "--data-dir", str(tmp_path))  # the certificates and token
    assert trigger.returncode == 0, trigger.stderr
    assert snapmesh("cluster", "down", "--data-dir", str(tmp_path)).returncode == 0
    again.wait(timeout=5)

    plain = tmp_path / "plain"
    cluster_config.write_cluster(plain / "cluster.toml", nodes=2)
    before = (plain / "cluster.toml").read_text()
    refused_tls = snapmesh("cluster", "up", "--data-dir", str(plain), "--tls", "--ui", "off")
    assert refused_tls.returncode == 2 and refused_tls.stdout == "", refused_tls.stdout
    assert refused_tls.stderr.strip().splitlines() == [
        f"snapmesh cluster: data dir {plain} runs in plaintext (no [tls] in {plain / 'cluster.toml'}), not --tls: "
        f"start it without --tls, or turn TLS on for it deliberately: `snapmesh certs --config "
        f"{plain / 'cluster.toml'} --tls-dir {plain / 'tls'}`, then `snapmesh cluster up --data-dir {plain}`"]
    assert (plain / "cluster.toml").read_text() == before and not (plain / "tls").exists()
    assert not list(plain.glob("logs")) and not list(plain.glob("*.log.jsonl"))  # nothing started


def test_an_apps_data_dir_started_again_without_app_runs_it_and_another_app_is_refused(up, tmp_path):
    env = env_with(EXAMPLES)
    first, _ = up("--nodes", "2", "--app", APP, "--data-dir", str(tmp_path), env=env)
    cfg = cluster_config.load(tmp_path / "cluster.toml", env={})
    assert cfg.app.module == APP
    held_by(cfg, "p1")
    assert submit(cfg.node("p1").address, b"pass") == b"passed to p2"  # the logs now hold the app's records
    held_by(cfg, "p2")
    assert snapmesh("cluster", "down", "--data-dir", str(tmp_path)).returncode == 0
    first.wait(timeout=5)

    again, _ = up("--data-dir", str(tmp_path), env=env)  # no --app: the data dir remembers it
    with grpc.insecure_channel(cfg.node("p2").address) as channel:
        state = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=10)
    assert state.app == APP
    assert submit(cfg.node("p2").address, b"has") == b"1"  # recovered through the app, token and all
    assert snapmesh("cluster", "down", "--data-dir", str(tmp_path)).returncode == 0
    again.wait(timeout=5)

    other = snapmesh("cluster", "up", "--data-dir", str(tmp_path), "--app", "kvshard", "--ui", "off", env=env)
    assert other.returncode == 2 and other.stdout == "", other.stdout
    assert other.stderr.strip().splitlines() == [
        f"snapmesh cluster: data dir {tmp_path} runs the app {APP} ([app] in {tmp_path / 'cluster.toml'}), not "
        f"--app kvshard: its logs replay through that app only; start it without --app, or give another "
        f"--data-dir for kvshard"]
    bank = tmp_path / "bank"
    assert snapmesh("cluster", "up", "--nodes", "2", "--data-dir", str(bank), "--app", "nope:app").returncode == 2
    assert not bank.exists()  # a refused app writes no data dir
