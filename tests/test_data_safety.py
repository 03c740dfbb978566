"""Data safety on one machine (issue 25, section 1): a second controller or
`cluster up` on a live cluster's data dir refuses before it reads or writes
anything there; `cluster up` is ready only when every process it started
answers itself, not another process on the same port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.config import write_cluster
from snapmesh.supervisor import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parent.parent


def snapmesh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snapmesh.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (lock files aside: their pid is rewritten by nobody but the holder)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


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
    assert tree(live.data_dir) == before
    assert live.controller.alive


def test_cluster_up_on_a_live_data_dir_exits_2_and_writes_nothing(live):
    before = tree(live.data_dir)
    result = snapmesh("cluster", "up", "--nodes", "3", "--data-dir", str(live.data_dir))
    assert result.returncode == 2, result.stderr
    assert str(live.data_dir) in result.stderr and f"pid {live.controller_pid}" in result.stderr
    assert "controller:" not in result.stdout
    # Not cluster.toml (new ports), not the certificates, not a line in the live logs.
    assert tree(live.data_dir) == before
    assert all(live.alive().values())


def test_cluster_up_with_tls_on_a_live_data_dir_writes_no_certificates(live):
    result = snapmesh("cluster", "up", "--config", str(live.config_path), "--tls")
    assert result.returncode == 2, result.stderr
    assert f"pid {live.controller_pid}" in result.stderr
    assert not (live.data_dir / "tls").exists()


def test_a_nodes_lock_alone_also_stops_cluster_up(tmp_path):
    # Only p2 runs here (another cluster's node, say): no file is written either.
    from snapmesh.datalock import DataDirLock

    lock = DataDirLock.acquire(tmp_path, "p2")
    try:
        result = snapmesh("cluster", "up", "--nodes", "2", "--data-dir", str(tmp_path))
    finally:
        lock.release()
    assert result.returncode == 2, result.stderr
    assert "node 'p2'" in result.stderr and f"pid {os.getpid()}" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["controller.lock", "p1.lock", "p2.lock"]
