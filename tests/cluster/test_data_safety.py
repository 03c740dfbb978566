"""Data safety on one machine: a second controller or
`cluster up` on a live cluster's data dir refuses before it reads or writes
anything there; `cluster up` is ready only when every process it started
answers itself, not another process on the same port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def snapmesh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snapmesh.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (lock files aside: their pid is rewritten by nobody but the holder)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def assert_unchanged(before: dict[str, bytes], after: dict[str, bytes]) -> None:
    """The same files with the same bytes, except that the live processes' own
    output logs may have grown meanwhile (a channel reconnecting, say); nothing
    in them may be a second start."""
    assert sorted(after) == sorted(before)
    for name, old in before.items():
        new = after[name]
        if name.startswith("logs/") and name.endswith(".log"):
            assert new.startswith(old), name
            assert b"---- start" not in new[len(old):], (name, new[len(old):])
        else:
            assert new == old, name


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A running 2-node cluster: its cluster.toml and data in one dir, as `cluster up --nodes 2 --data-dir` makes."""
    root = tmp_path_factory.mktemp("live")
    with Cluster(write_cluster(root / "cluster.toml", nodes=2)) as cluster:
        yield cluster


def test_a_second_controller_on_a_live_data_dir_exits_2_naming_the_dir_and_holder(live):
    before = tree(live.data_dir)
    result = snapmesh("controller", "--config", str(live.config_path))
    assert result.returncode == 2, result.stderr
    assert str(live.data_dir) in result.stderr and f"pid {live.controller_pid}" in result.stderr
    assert "controller.lock" in result.stderr
    assert "loaded" not in result.stderr and "journal" not in result.stderr
    assert_unchanged(before, tree(live.data_dir))
    assert live.controller.alive


def test_cluster_up_on_a_live_data_dir_exits_2_and_writes_nothing(live):
    before = tree(live.data_dir)
    result = snapmesh("cluster", "up", "--nodes", "3", "--data-dir", str(live.data_dir))
    assert result.returncode == 2, result.stderr
    assert str(live.data_dir) in result.stderr and f"pid {live.controller_pid}" in result.stderr
    assert "controller:" not in result.stdout
    # Not cluster.toml (new ports), not the certificates, not a line in the live logs.
    assert_unchanged(before, tree(live.data_dir))
    assert all(live.alive().values())


def test_cluster_up_with_tls_on_a_live_data_dir_writes_no_certificates(live):
    result = snapmesh("cluster", "up", "--config", str(live.config_path), "--tls")
    assert result.returncode == 2, result.stderr
    assert f"pid {live.controller_pid}" in result.stderr
    assert not (live.data_dir / "tls").exists()


def test_a_nodes_lock_alone_also_stops_cluster_up(tmp_path):
    # Only p2 runs here (another cluster's node, say): no file is written either.
    from snapmesh.serving.datalock import DataDirLock

    lock = DataDirLock.acquire(tmp_path, "p2")
    try:
        result = snapmesh("cluster", "up", "--nodes", "2", "--data-dir", str(tmp_path))
    finally:
        lock.release()
    assert result.returncode == 2, result.stderr
    assert "node 'p2'" in result.stderr and f"pid {os.getpid()}" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["controller.lock", "p1.lock", "p2.lock"]


def test_cluster_up_is_not_ready_on_another_processs_answer(live, tmp_path):
    # This cluster's p1 has the live cluster's p1 port: the live p1 answers SERVING
    # there, but the p1 just started cannot bind and exits.
    from snapmesh.settings.ports import free_ports, port_is_free

    taken = live.config.node("p1").port
    ports = free_ports(5)
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, ports=[ports[0], ports[1], taken, *ports[2:]])
    result = snapmesh("cluster", "up", "--config", str(path))
    assert result.returncode == 1, result.stderr
    assert "controller:" not in result.stdout
    assert "node p1" in result.stderr and "exited before serving" in result.stderr
    # The last lines of p1's own log say why.
    assert f"{tmp_path / 'logs' / 'p1.log'} (last lines)" in result.stderr
    assert f"cannot bind gRPC address 127.0.0.1:{taken}" in result.stderr
    # The rest of this cluster was stopped; the live one still serves.
    assert all(port_is_free("127.0.0.1", p) for p in (ports[0], ports[3])), "the new controller or p2 was left running"
    assert all(live.alive().values())


def test_every_health_answer_carries_the_instance_id_of_this_start(live):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from snapmesh.serving.runtime import INSTANCE_METADATA
    from snapmesh.serving.credentials import open_channel

    before = live.nodes["p2"].instance_id
    live.restart_node("p2")
    assert live.nodes["p2"].instance_id != before
    for name, child in [("controller", live.controller), ("p2", live.nodes["p2"])]:
        with open_channel(child.health_address, None) as channel:
            _, call = health_pb2_grpc.HealthStub(channel).Check.with_call(health_pb2.HealthCheckRequest(), timeout=5)
        assert dict(call.trailing_metadata())[INSTANCE_METADATA] == child.instance_id, name
