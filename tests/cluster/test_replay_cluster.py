"""`snapmesh replay` and the version check on a data dir a real kvshard cluster recorded.

A short real run (`Cluster(..., app="kvshard")`, its workload through Submit,
three snapshots, small segments so the logs hold checkpoints) leaves a data dir.
Offline, then: the real kvshard reproduces it (exit 0, every node ok, every cut
checked against the COMPLETE snapshots); a copy of kvshard with one planted line
of nondeterminism does not (exit 1, naming the node and the log position); and a
node started on it with a copy whose version is 2 refuses to start, one line.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from snapmesh.app import NodeInfo, load_app
from snapmesh.processes.supervisor import Cluster
from snapmesh.services.app import kvshard as kvshard_module
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.ring import CLI, env_with

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

KVSHARD = Path(kvshard_module.__file__).read_text()
HANDOFF = 'ctx.send(dst, encode({"type": "handoff", "key": key, **entry}))'
PLANTED = 'ctx.send(dst, encode({"type": "handoff", "key": key, **entry, "n": id(object()) % 997}))'


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The data dir of a short kvshard run with load and three COMPLETE snapshots, the cluster stopped."""
    data = tmp_path_factory.mktemp("kvshard")
    path = config.write_cluster(data / "cluster.toml", nodes=3, settings={"segment_records": 60})
    kvshard = load_app("kvshard")
    with Cluster(path, app="kvshard") as cluster:
        cfg = cluster.config
        infos = [NodeInfo(node_id=n.id, peers_out=cfg.topology.outgoing(n.id), peers_in=cfg.topology.incoming(n.id))
                 for n in cfg.nodes]
        commands, stop, answered = kvshard.workload(infos, random.Random(11)), threading.Event(), [0]

        def drive() -> None:
            channels = {n.id: grpc.insecure_channel(n.address) for n in cfg.nodes}
            try:
                while not stop.is_set():
                    node, command = next(commands)
                    try:
                        pb_grpc.NodeStub(channels[node]).Submit(pb.SubmitRequest(command=command), timeout=5)
                        answered[0] += 1
                    except grpc.RpcError:
                        pass  # a guess that missed: the key moved on
            finally:
                for channel in channels.values():
                    channel.close()

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        try:
            with grpc.insecure_channel(cluster.controller_address) as channel:
                stub = pb_grpc.ControllerStub(channel)
                for _ in range(3):
                    time.sleep(0.5)
                    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
                    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
                    assert (snapshot.app.name, snapshot.app.version) == ("kvshard", 1)
        finally:
            stop.set()
            driver.join(30)
        assert answered[0] > 50
    return data


def replay(*argv: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "replay", *argv], capture_output=True, text=True, env=env, timeout=240)


def test_the_real_kvshard_reproduces_its_recorded_data_dir(recorded):
    result = replay("--app", "kvshard", str(recorded))
    print(result.stdout, result.stderr)
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["p1", "p2", "p3"]
    assert all(": ok, " in line and " checkpoint(s); " in line for line in lines), "the logs hold checkpoints"
    assert sum(int(line.rsplit("; ", 1)[1].split()[0]) for line in lines) >= 9, "3 snapshots' cuts, 3 nodes"


def test_a_planted_nondeterminism_is_found_naming_the_node_and_position(recorded, tmp_path):
    assert KVSHARD.count(HANDOFF) == 1
    (tmp_path / "kv_planted.py").write_text(KVSHARD.replace(HANDOFF, PLANTED))
    result = replay("--app", "kv_planted:app", str(recorded), env=env_with(tmp_path))
    print(result.stdout)
    assert result.returncode == 1
    diverged = [line for line in result.stdout.splitlines() if line[:2] in ("p1", "p2", "p3") and ": ok, " not in line]
    assert diverged
    node = diverged[0].split(":")[0]
    assert f"{node}.log." in diverged[0] and ": lsn " in diverged[0] and '"n":' in diverged[0]


def test_a_node_started_with_another_version_refuses_with_one_line(recorded, tmp_path):
    (tmp_path / "kv_v2.py").write_text(KVSHARD.replace('    name="kvshard",\n', '    name="kvshard",\n    version=2,\n'))
    started = subprocess.run([*CLI, "node", "--config", str(recorded / "cluster.toml"), "--id", "p2",
                              "--app", "kv_v2:app"], capture_output=True, text=True, env=env_with(tmp_path), timeout=120)
    lines = started.stderr.strip().splitlines()
    print(started.stderr)
    assert started.returncode == 2 and len(lines) == 1, started.stderr
    assert "the log holds records of app 'kvshard' version 1; this code is app 'kvshard' version 2" in lines[0]
    assert "start the code of version 1 again, or restore a stop snapshot" in lines[0]


KV_V2 = '''\
"""kvshard at version 2: its state is b"v2:" + version 1's (a changed encoding), and an upgrade."""
import dataclasses

from snapmesh.app import App
from snapmesh.services.app import kvshard


class KV2(kvshard.KVShard):
    def snapshot(self):
        return b"v2:" + super().snapshot()

    def restore(self, state):
        if not state.startswith(b"v2:"):
            raise ValueError("not a version 2 state")
        super().restore(state[3:])


def upgrade(state, from_version):
    assert from_version == 1, from_version
    return b"v2:" + state


def _v1(view):
    return dataclasses.replace(view, states={n: s[3:] for n, s in view.states.items()})


app = App(name="kvshard", new=KV2, version=2, upgrade=upgrade, workload=kvshard.workload,
          invariants={name: (lambda view, check=check: check(_v1(view))) for name, check in kvshard.app.invariants.items()})
'''


def test_version_1s_snapshot_restores_into_version_2_upgraded_with_its_invariants(recorded, tmp_path):
    """The way across today: version 2 on fresh data dirs, the controller's store of version 1's
    snapshots copied in; RestoreSnapshot upgrades on the controller, and the cluster goes on."""
    import shutil

    (tmp_path / "kv_v2.py").write_text(KV_V2)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for part in ("controller/snapshots", "controller/blocks", "snapshots"):  # a .pb names its states' blocks
        shutil.copytree(recorded / part, fresh / part)
    old = sorted(p.stem for p in (fresh / "controller" / "snapshots").glob("*.pb"))
    assert len(old) == 3
    path = config.write_cluster(fresh / "cluster.toml", nodes=3)
    with Cluster(path, app="kv_v2:app", env=env_with(tmp_path)) as cluster:
        with grpc.insecure_channel(cluster.controller_address) as channel:
            stub = pb_grpc.ControllerStub(channel)
            target = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=old[-1]), timeout=30)
            assert (target.app.name, target.app.version) == ("kvshard", 1)
            done = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=old[-1]), timeout=120)
            assert done.status == pb.Restore.RESTORED, done.reason
            after = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE, after.reason
    assert (after.app.name, after.app.version) == ("kvshard", 2)
    assert all(n.state.startswith(b"v2:") for n in after.nodes)
    assert [(i.name, i.ok) for i in after.app.invariants] == [("every key exactly once", True)], after.app
    keys = lambda snapshot, cut: sorted(k for n in snapshot.nodes for k in json.loads(n.state[cut:])["keys"])  # noqa: E731
    in_flight = sum(len(c.in_flight) for c in target.channels)
    assert in_flight or keys(after, 3) == keys(target, 0), "every key the snapshot held is held again"
