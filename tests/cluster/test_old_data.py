"""Old data still works: data dirs written by commit 2b5e557 (tests/fixtures/data-2b5e557, made
by tests/fixtures/make_old_data.py) start under this code as real `snapmesh cluster up`
processes. Each node recovers its log (the bank's money adds up once the transfers in
flight when it stopped arrive; kvshard's keys are where they were), the controller lists
the old COMPLETE snapshots from its journal and store, `snapshot verify` passes them, one
restores, and the cluster goes on taking snapshots."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from support.polling import wait_for
from support.processes import children_of, read_line, wait_gone
from snapmesh.settings import config as cluster_config
from snapmesh.settings.ports import free_ports
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "data-2b5e557"
MANIFEST = json.loads((FIXTURE / "fixture.json").read_text())
KVSHARD = "snapmesh.services.app.kvshard:app"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SNAPMESH_")}


def snapmesh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapmesh.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=clean_env())


def old_data_dir(name: str, tmp_path: Path) -> Path:
    """A copy of the fixture's data dir `name`, its cluster.toml naming the copy and fresh ports."""
    data_dir = tmp_path / name
    shutil.copytree(FIXTURE / name, data_dir)
    toml = data_dir / "cluster.toml"
    text = toml.read_text().replace('"DATA_DIR"', json.dumps(str(data_dir)))
    # every port the file names, metrics ports too: a fixed one may be taken on a busy machine
    ports = iter(free_ports(len(re.findall(r"\b(?:metrics_)?port = \d+", text))))
    toml.write_text(re.sub(r"\b(metrics_)?port = \d+", lambda m: f"{m[1] or ''}port = {next(ports)}", text))
    return data_dir


@pytest.fixture
def up():
    """`cluster up --data-dir D ARGS` as a process, started once its `controller:` line is out; gone after the test."""
    started: list[tuple[subprocess.Popen, set[int]]] = []

    def start(data_dir: Path, *args: str) -> cluster_config.ClusterConfig:
        proc = subprocess.Popen([sys.executable, "-m", "snapmesh.cli", "cluster", "up", "--ui", "off", "--data-dir",
                                 str(data_dir), *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=clean_env())
        line = read_line(proc, 90)
        started.append((proc, children_of(proc.pid)))
        assert line.startswith("controller: "), (line, proc.stderr.read() if proc.poll() is not None else "")
        return cluster_config.load(data_dir / "cluster.toml", env={})

    yield start
    for proc, children in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in wait_gone(children, 5):
            os.kill(pid, signal.SIGKILL)


def states(cfg: cluster_config.ClusterConfig) -> dict[str, pb.NodeStateResponse]:
    found = {}
    for node in cfg.nodes:
        with grpc.insecure_channel(node.address) as channel:
            found[node.id] = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=5)
    return found


def balances(cfg: cluster_config.ClusterConfig) -> dict[str, int]:
    return {node: state.balance for node, state in states(cfg).items()}


def listed(data_dir: Path) -> dict[str, str]:
    """snapshot id -> status, from `snapmesh snapshot list`."""
    result = snapmesh("snapshot", "list", "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    return {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[1:] if line.strip()}


def verified(data_dir: Path, snapshot_id: str) -> None:
    result = snapmesh("snapshot", "verify", snapshot_id, "--data-dir", str(data_dir))
    assert result.returncode == 0, (snapshot_id, result.stdout, result.stderr)


def takes_a_snapshot(data_dir: Path, before: dict[str, str]) -> str:
    result = snapmesh("snapshot", "trigger", "--wait", "--data-dir", str(data_dir))
    assert result.returncode == 0, (result.stdout, result.stderr)
    new = {sid: status for sid, status in listed(data_dir).items() if sid not in before}
    assert list(new.values()) == ["COMPLETE"], new
    verified(data_dir, next(iter(new)))
    return next(iter(new))


def test_a_bank_data_dir_of_2b5e557_recovers_its_money_lists_verifies_and_restores_its_snapshots(up, tmp_path):
    old = MANIFEST["bank"]
    assert old["unreceived_at_stop"] > 0 and len(old["complete"]) >= 2  # the fixture has transfers in flight
    data_dir = old_data_dir("bank", tmp_path)
    cfg = up(data_dir)

    # Every node recovered its log: its balance is the log's once the transfers in flight at the stop arrive.
    assert sum(old["balances_after_recovery"].values()) == old["total"]
    wait_for(lambda: balances(cfg), until=lambda b: b == old["balances_after_recovery"], timeout=60, interval=0.2,
             retry_on=grpc.RpcError, what="the old cluster's balances, with what was in flight at the stop")
    assert {s.epoch for s in states(cfg).values()} == {1}

    snapshots = listed(data_dir)
    assert {sid: snapshots.get(sid) for sid in old["complete"]} == dict.fromkeys(old["complete"], "COMPLETE")
    for sid in old["complete"]:
        verified(data_dir, sid)

    restore = snapmesh("restore", old["restore"], "--yes", "--data-dir", str(data_dir))
    assert restore.returncode == 0, (restore.stdout, restore.stderr)
    wait_for(lambda: balances(cfg), until=lambda b: b == old["balances_after_restore"], timeout=60, interval=0.2,
             what="the restored balances and the transfers in flight at the cut")
    assert {s.epoch for s in states(cfg).values()} == {2}

    first = takes_a_snapshot(data_dir, snapshots)
    with grpc.insecure_channel(cfg.node("p1").address) as channel:
        pb_grpc.NodeStub(channel).Transfer(pb.TransferRequest(to="p2", amount=5), timeout=10)
    takes_a_snapshot(data_dir, {**snapshots, first: "COMPLETE"})
    wait_for(lambda: balances(cfg), until=lambda b: sum(b.values()) == old["total"], timeout=30, interval=0.2,
             what="the money to add up after a transfer")


def test_a_kvshard_data_dir_of_2b5e557_keeps_its_keys_and_restores_its_snapshot(up, tmp_path):
    old = MANIFEST["kvshard"]
    data_dir = old_data_dir("kvshard", tmp_path)
    cfg = up(data_dir, "--app", KVSHARD)

    def get(key: str, node: str) -> dict:
        with grpc.insecure_channel(cfg.node(node).address) as channel:
            command = json.dumps({"op": "get", "key": key}).encode()
            reply = pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=command), timeout=10).reply
        return json.loads(reply)

    def keys() -> dict[str, int]:
        return {key: get(key, where["at"])["value"] for key, where in old["keys"].items()}

    expected = {key: where["value"] for key, where in old["keys"].items()}
    assert wait_for(keys, until=lambda found: True, timeout=60, interval=0.2, retry_on=grpc.RpcError,
                    what="the old kvshard nodes to answer") == expected

    snapshots = listed(data_dir)
    assert {sid: snapshots.get(sid) for sid in old["complete"]} == dict.fromkeys(old["complete"], "COMPLETE")
    verified(data_dir, old["complete"][-1])
    gone = next(iter(old["keys"]))
    with grpc.insecure_channel(cfg.node(old["keys"][gone]["at"]).address) as channel:
        command = json.dumps({"op": "delete", "key": gone}).encode()
        pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=command), timeout=10)
    with pytest.raises(grpc.RpcError) as deleted:
        get(gone, old["keys"][gone]["at"])
    assert deleted.value.code() == grpc.StatusCode.NOT_FOUND
    restore = snapmesh("restore", old["complete"][-1], "--yes", "--data-dir", str(data_dir))
    assert restore.returncode == 0, (restore.stdout, restore.stderr)
    assert wait_for(keys, until=lambda found: found == expected, timeout=30, interval=0.2, retry_on=grpc.RpcError,
                    what="the keys after the restore") == expected
    takes_a_snapshot(data_dir, snapshots)
