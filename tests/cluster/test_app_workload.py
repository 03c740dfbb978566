"""`snapmesh app --app kvshard`: an app's workload through the load generator against a real cluster.

A three-node kvshard cluster (the cluster file's [app] table: module and its
`keys` param); `snapmesh app --app kvshard --data-dir D` finds the controller
there, drives the workload with request ids, counts replies and refusals per
node, and has every snapshot's invariants checked by the controller and again
by itself. A command retried under its request id across a SIGKILL of its node
gets its first reply; a bad --app, or a bank-only flag with --app, is one line
and exit 2.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from snapmesh.services.app import kvshard
from snapmesh.load.background import BackgroundLoad
from snapmesh.load.generator import LoadGenerator
from snapmesh.services.app.drive import node_infos, snapshot_problems, snapshot_view
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "snapmesh.cli"]
KEYS = 8  # [app] keys: a bound on the live keys the workload means to keep


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    data = tmp_path_factory.mktemp("kvshard")
    path = config.write_cluster(data / "cluster.toml", nodes=3, settings={"app": {"module": "kvshard", "keys": KEYS}})
    with Cluster(path) as cluster:
        yield cluster


def app_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "app", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_workload_runs_through_submit_with_snapshots_checked(shard):
    done = app_command("--app", "kvshard", "--data-dir", str(shard.config.data_dir), "--duration", "4",
                       "--snapshot-every", "1", "--seed", "5")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    out = done.stdout
    assert out.startswith("kvshard workload: seed 5"), out[:300]
    replies = int(re.search(r"commands: (\d+) replies, (\d+) refused, 0 given up", out).group(1))
    assert replies > 20, out[-2000:]
    for node in ("p1", "p2", "p3"):
        assert re.search(rf"\n  {node}: \d+ replies; refusals: ", out), out[-2000:]
    assert re.search(r"snapshots: [1-9]\d* complete, 0 failed, 0 not finished; invariants broken: 0", out), out[-2000:]
    assert "every key exactly once ok (checked again: ok)" in out
    with grpc.insecure_channel(shard.controller_address) as channel:
        snap = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert snap.status == pb.Snapshot.COMPLETE and snapshot_problems(kvshard.app, snap) == []
    assert kvshard.places(snapshot_view(snap))  # the keys the workload made, each in one place


def test_a_command_retried_across_a_kill_gets_its_first_reply(shard):
    topology = shard.config.topology
    infos = node_infos(list(topology.nodes), topology.channels, {})
    generator = LoadGenerator(kvshard.app, {n: shard.direct_address(n) for n in topology.nodes}, infos, seed=1,
                              timeout=5.0, give_up_s=90)
    driver = BackgroundLoad(generator, callers=0).start()  # no stream: only the commands sent here
    command = kvshard.encode({"op": "put", "key": "p2/retried", "value": 1})
    try:
        first = driver.submit("p2", command, "retry-across-a-kill")
        shard.kill_node("p2")
        began = time.monotonic()
        answers = []
        # The retry runs on a thread and the restart on this one: a child started from a
        # short-lived thread dies with it (PR_SET_PDEATHSIG is the forking thread's).
        retry = threading.Thread(target=lambda: answers.append(driver.submit("p2", command, "retry-across-a-kill")))
        retry.start()  # UNAVAILABLE until p2 is back
        time.sleep(1.0)
        shard.start("p2")
        retry.join()
        [again] = answers
    finally:
        driver.stop()
    assert first is not None and again is not None, driver.stats.last_error
    assert (again.reply, again.replayed) == (first.reply, True) and b"created_at" in first.reply
    assert driver.stats.retries > 0 and time.monotonic() - began >= 1.0
    assert driver.stats.node("p2").replies == 2 and not driver.stats.node("p2").refusals


@pytest.mark.parametrize("args, words", [
    (["--app", "no_such_module_anywhere:app"], "no_such_module_anywhere"),
    (["--app", "kvshard", "--transfer-interval", "0.5"], "--transfer-interval"),
    (["--app", "snapmesh.app:App"], "not a snapmesh.app.App"),
])
def test_a_bad_app_is_one_line_and_exit_2(args, words):
    done = app_command(*args, "--controller", "127.0.0.1:1", "--duration", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and done.stdout == "", done.stderr
