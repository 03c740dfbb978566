"""`snapmesh reconcile` on a real cluster whose states are exported as manifests.

Three nodes run an app whose state is a blob of 2 MiB each (real processes, real
gRPC): 6 MiB in all, over the controller's inline export limit, so each JSON
export names its nodes' blocks under controller/blocks instead of holding the
states. The Spark job reads each state through its blocks and holds it to the
node's cut record, as for an inline state: consistent. In a copy of the data dir
with one block file corrupted, and one with another block gone, the snapshot is
inconsistent, its first discrepancy naming (snapshot, node, hash), and the run
exits 1, not 2 and not a crash.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.reconcile.job import reconcile
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.polling import wait_for
from support.spark_fixtures import spark  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]

BLOB_APP = '''\
"""A node whose state is a blob of 2 MiB; "churn N" makes it new."""
import random

from snapmesh.app import App

SIZE = 2 * 1024 * 1024


class Blob:
    def __init__(self, info):
        self.me, self.blob = info.node_id, random.Random(info.node_id).randbytes(SIZE)

    def on_command(self, command, ctx):
        word, *args = command.decode().split()
        self.blob = random.Random(f"{self.me}-{args[0]}").randbytes(SIZE)
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return self.blob

    def restore(self, state):
        self.blob = state


app = App(name="blob", new=Blob)
'''


@pytest.fixture(scope="module")
def blob_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """The data dir of a finished run and its two snapshots, both exported as manifests."""
    root = tmp_path_factory.mktemp("blob-reconcile")
    (root / "apps").mkdir()
    (root / "apps" / "blob_app.py").write_text(BLOB_APP)
    path = write_cluster(root / "cluster.toml", nodes=3, data_dir=root / "data")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "apps"), os.environ.get("PYTHONPATH")]))}
    taken = []
    with Cluster(path, env=env, app="blob_app:app") as cluster, grpc.insecure_channel(cluster.controller_address) as ch:
        for round_ in range(2):
            answer = pb_grpc.ControllerStub(ch).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=120)
            assert answer.status == pb.Snapshot.COMPLETE, answer
            taken.append(answer.snapshot_id)
            with grpc.insecure_channel(cluster.node_address("p2")) as node:
                pb_grpc.NodeStub(node).Submit(pb.SubmitRequest(command=f"churn {round_}".encode()), timeout=30)
        data = Path(cluster.data_dir)
        for sid in taken:
            wait_for(lambda sid=sid: data / "snapshots" / f"{sid}.json", until=Path.exists, timeout=60,
                     what=f"the export of {sid}")
    return data, taken


def manifest(data: Path, sid: str) -> dict[str, list[str]]:
    """Node -> the hex hashes of its blocks, as the export names them (it holds no state)."""
    nodes = json.loads((data / "snapshots" / f"{sid}.json").read_text())["nodes"]
    assert all("state" not in n and n["state_blocks"]["hashes"] for n in nodes), "not a manifest export"
    return {n["node_id"]: [base64.b64decode(h).hex() for h in n["state_blocks"]["hashes"]] for n in nodes}


def copied(data: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(data, copy, ignore=shutil.ignore_patterns("reconcile", "*.lock", "*.sock"))
    return copy


def test_a_manifest_export_reconciles_through_its_blocks_and_a_bad_block_is_named(spark, blob_run, tmp_path):  # noqa: F811
    data, taken = blob_run
    nodes = {sid: manifest(data, sid) for sid in taken}
    outcome = reconcile(spark, str(data))
    assert outcome.exit_status == 0, outcome.verdicts
    assert sorted(v["snapshot_id"] for v in outcome.verdicts if v["scope"] == "snapshot" and v["consistent"]) == taken

    sid = taken[1]
    corrupt = nodes[sid]["p3"][7]  # held by the first snapshot too (p3's state did not change)
    assert corrupt in nodes[taken[0]]["p3"]
    copy = copied(data, tmp_path / "corrupt")
    (copy / "controller" / "blocks" / corrupt).write_bytes(b"\x00" * 8192)
    outcome = reconcile(spark, str(copy))
    assert outcome.exit_status == 1 and not outcome.bad_input
    bad = {v["snapshot_id"]: v for v in outcome.verdicts if v["consistent"] is False}
    assert sorted(bad) == taken, outcome.verdicts
    assert bad[sid]["first_discrepancy"].startswith(
        f"snapshot {sid}, node p3, block sha256:{corrupt}: corrupt: its content hashes to"), bad

    gone = nodes[sid]["p2"][0]  # new in the second snapshot (p2 churned)
    assert gone not in nodes[taken[0]]["p2"]
    copy = copied(data, tmp_path / "missing")
    (copy / "controller" / "blocks" / gone).unlink()
    outcome = reconcile(spark, str(copy))
    assert outcome.exit_status == 1 and not outcome.bad_input
    bad = {v["snapshot_id"]: v for v in outcome.verdicts if v["consistent"] is False}
    assert list(bad) == [sid] and bad[sid]["first_discrepancy"] == (
        f"snapshot {sid}, node p2, block sha256:{gone}: missing from {copy}/controller/blocks")
