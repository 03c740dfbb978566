"""`snapmesh snapshot watch`'s table (a table by default): its rows come one
at a time, so its header must line up with rows it has not seen. A real controller
whose nodes were never started: a snapshot is IN_PROGRESS, then FAILED with a reason
(its initiator unreachable); `snapmesh snapshot watch --count 2` prints both rows
under the header, every column starting where the header's does."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cluster_helpers import controller_stub
from snapmesh.settings.config import write_cluster
from snapmesh.commands.snapshot_cli import WATCH
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def lone_controller(tmp_path):
    lone = Cluster(write_cluster(tmp_path / "cluster.toml", nodes=2, deadline=5))
    try:
        lone.start_controller()
        yield lone
    finally:
        lone.stop()


def column_starts(header: str) -> list[int]:
    return [header.index(name) for name in WATCH]


def test_watch_rows_line_up_with_the_header(lone_controller):
    address = lone_controller.controller_address
    watcher = subprocess.Popen([str(Path(sys.executable).with_name("snapmesh")), "snapshot", "watch",
                                "--controller", address, "--count", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        named = watcher.stdout.readline().rstrip("\n")  # the app, then the header, once the stream is open
        header = watcher.stdout.readline().rstrip("\n")
        time.sleep(0.5)
        channel, stub = controller_stub(address)
        with channel:
            stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=10)
        out, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, err
    assert named == "app bank: 2 nodes, epoch 1", named
    rows = out.splitlines()
    assert [row.split()[1] for row in rows] == ["IN_PROGRESS", "FAILED"], rows
    starts = column_starts(header)
    for row in rows:
        for name, start in zip(WATCH[1:], starts[1:], strict=True):
            if start < len(row):  # an empty last cell (no reason yet) is cut off
                assert row[start - 2:start] == "  " and row[start] != " ", (name, header, row)
    assert len(rows[1]) > starts[-1]  # the FAILED row has its reason
    assert "initiator p2 unreachable" in rows[1][starts[-1]:]
