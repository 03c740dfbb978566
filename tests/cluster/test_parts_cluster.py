"""An app's snapshot_blocks() on real processes (snapmesh/app A8, blocks.py B6): two
nodes whose states are 4 MiB each (8 MiB in all), in parts of about 6 KiB that
grow. A second snapshot after a part grew in the middle of p1's state sends and
stores that part's blocks only (with snapshot() alone every block after it would
move); the JSON export of states this large is their manifests, and verifies;
a restore of the second snapshot brings the grown state back."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import grpc
import pytest

from snapmesh.checking import snapshot_file
from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol import blocks
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

PARTED_APP = '''\
"""A node whose state is 4 MiB in parts of 6 KiB; "grow I" inserts 100 bytes into part I."""
import random

from snapmesh.app import App

PART, COUNT = 6 * 1024, 683


class Parted:
    def __init__(self, info):
        rng = random.Random(info.node_id)
        self.parts = [rng.randbytes(PART) for _ in range(COUNT)]

    def on_command(self, command, ctx):
        word, index = command.decode().split()
        part = self.parts[int(index)]
        self.parts[int(index)] = part[:10] + bytes(100) + part[10:]
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return b"".join(self.parts)

    def snapshot_blocks(self):
        return list(self.parts)

    def restore(self, state):
        self.parts = [state[i:i + PART] for i in range(0, len(state), PART)]  # the grown part is cut anew


app = App(name="parted", new=Parted)
'''


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "parted_app.py").write_text(PARTED_APP)
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "apps"), os.environ.get("PYTHONPATH")]))}
    running = Cluster(path, env=env, app="parted_app:app").start()
    try:
        yield running
    finally:
        running.stop()


def snapshot(stub) -> str:
    answer = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=120)
    assert answer.status == pb.Snapshot.COMPLETE, answer
    return answer.snapshot_id


def filed(data: Path, sid: str) -> tuple[Path, Path]:
    files = data / "controller" / "snapshots" / f"{sid}.pb", data / "snapshots" / f"{sid}.json"
    wait_for(lambda: all(p.exists() for p in files), timeout=60, what=f"the files of {sid}")
    return files


def block_files(data: Path) -> int:
    return sum(1 for p in (data / "controller" / "blocks").iterdir() if not p.name.startswith("."))


def test_a_part_that_grew_sends_and_stores_its_own_blocks_only(cluster):
    data = Path(cluster.data_dir)
    with grpc.insecure_channel(cluster.controller_address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        first = snapshot(stub)
        filed(data, first)
        held = block_files(data)
        with grpc.insecure_channel(cluster.node_address("p1")) as node:
            assert pb_grpc.NodeStub(node).Submit(pb.SubmitRequest(command=b"grow 300"), timeout=30).reply == b"ok"
        second = snapshot(stub)
        compact, export = filed(data, second)
        assert block_files(data) == held + 1  # the grown part's one block (6 KiB + 100 bytes)
        text = export.read_text()
        assert '"state_blocks"' in text and '"state":' not in text and len(text) < 2 * 1024 * 1024
        for path in (compact, export):
            verdict = snapshot_file.check(path)
            assert verdict.ok, verdict.as_dict()
        log = cluster.node("p1").output()
        sent = [int(line.rsplit("(", 1)[1].split()[0]) for line in log.splitlines()
                if f"snapshot {second}: reported state" in line]
        assert sent and sent[0] < 700 * 40 + 2 * blocks.BLOCK_BYTES  # the manifest and one block, not 4 MiB
        grown = next(n.state for n in snapshot_file.read(compact).nodes if n.node_id == "p1")
        restore = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=second), timeout=120)
        assert restore.status == pb.Restore.RESTORED, restore
        with grpc.insecure_channel(cluster.node_address("p1")) as node:
            state = pb_grpc.NodeStub(node).GetState(pb.GetStateRequest(), timeout=30)
    assert state.app_state_digest == snapshot_file.PREFIX + hashlib.sha256(grown).hexdigest()
    assert json.loads(text)["snapshot_id"] == second
