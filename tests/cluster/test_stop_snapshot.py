"""Stop with a snapshot, then a new version restores it, on a real local kvshard cluster under load.

Version 1 runs with client load (puts of new keys and moves, so handoffs are in
flight); `TriggerSnapshot(stop=True)` fences every node (commands UNAVAILABLE,
"stopping for a snapshot"), takes the snapshot and stops the nodes once it is
COMPLETE (each exits 0, its log ending in it). Version 2 (another state encoding,
one new command) starts on the same data dirs fenced: only health and RestoreState.
RestoreSnapshot upgrades on the controller and restores; a retry under the same
request id is that restore, run once; every key a client saw created is held
again (0 commands lost), the invariants hold, and the new command answers.
"""

from __future__ import annotations

import json
import subprocess
import threading

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.binaries import grpcurl_binary
from support.polling import wait_for
from support.ring import CLI, env_with

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

KV_V2 = '''\
"""kvshard at version 2: its state is b"v2:" + version 1's, and a new command, count."""
import dataclasses
import json

from snapmesh.app import App
from snapmesh.services.app import kvshard


class KV2(kvshard.KVShard):
    def on_command(self, command, ctx):
        if json.loads(command).get("op") == "count":
            return kvshard.encode({"count": len(self.keys), "at": self.me})
        return super().on_command(command, ctx)

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


class Load:
    """One thread per node: puts of new keys (p1/k0, p1/k1, ...), every third one moved on."""

    def __init__(self, cluster: Cluster) -> None:
        self.cfg = cluster.config
        self.created: set[str] = set()  # keys whose put a client saw answered
        self.refusals: list[str] = []  # the UNAVAILABLE details seen
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._drive, args=(n.id,), daemon=True) for n in self.cfg.nodes]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _drive(self, node: str) -> None:
        peers = self.cfg.topology.outgoing(node)
        with grpc.insecure_channel(self.cfg.node(node).address) as channel:
            stub = pb_grpc.NodeStub(channel)
            i = 0
            while not self.stop.is_set():
                key = f"{node}/k{i}"
                command = json.dumps({"op": "put", "key": key, "value": i}).encode()
                try:
                    stub.Submit(pb.SubmitRequest(command=command, request_id=key), timeout=5)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        self.refusals.append(exc.details() or "")
                        self.stop.wait(0.05)
                    continue  # the same put again (the same request id: once)
                self.created.add(key)
                if i % 3 == 0:
                    move = json.dumps({"op": "move", "key": key, "to": peers[i % len(peers)]}).encode()
                    try:
                        stub.Submit(pb.SubmitRequest(command=move, request_id=f"move {key}"), timeout=5)
                    except grpc.RpcError:
                        pass
                i += 1


def held(snapshot: pb.Snapshot, cut: int) -> list[str]:
    """Every key in the snapshot: the nodes' states (past `cut` bytes of prefix) and the handoffs in flight."""
    keys = [k for n in snapshot.nodes for k in json.loads(n.state[cut:])["keys"]]
    for channel in snapshot.channels:
        for item in channel.in_flight:
            message = json.loads(item.payload)
            keys += [message["key"]] if message["type"] == "handoff" else []
    return keys


def test_v1_stops_with_a_snapshot_under_load_and_v2_restores_it_upgraded_with_nothing_lost(tmp_path) -> None:
    (tmp_path / "kv_v2.py").write_text(KV_V2)
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3, settings={"segment_records": 200})
    with Cluster(path, app="kvshard") as v1:
        with Load(v1) as load, grpc.insecure_channel(v1.controller_address) as channel:
            stub = pb_grpc.ControllerStub(channel)
            wait_for(lambda: len(load.created) >= 60, timeout=60, what="60 keys created under load")
            stopped = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=120)
            assert stopped.status == pb.Snapshot.COMPLETE, stopped.reason
            assert (stopped.app.name, stopped.app.version) == ("kvshard", 1)
            statuses = {n: wait_for(lambda n=n: v1.node(n).wait(1), until=lambda s: s is not None, timeout=30,
                                    what=f"{n} exits") for n in v1.node_ids}
            assert statuses == {n: 0 for n in v1.node_ids}, "each node stopped cleanly once the snapshot was COMPLETE"
        fenced = [r for r in load.refusals if "stopping for a snapshot" in r]
        created = set(load.created)
    assert fenced, f"no command was refused while stopping: {load.refusals[:3]}"
    assert sorted(held(stopped, 0)) == sorted(set(held(stopped, 0))) and created <= set(held(stopped, 0)), (
        "the stop snapshot holds every key a client saw created")

    with Cluster(path, app="kv_v2:app", env=env_with(tmp_path)) as v2:
        node = v2.node_ids[0]
        with grpc.insecure_channel(v2.config.node(node).address) as channel:
            try:
                pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b'{"op": "count", "key": "x"}'), timeout=10)
                raise AssertionError("a fenced node took a command")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
                assert f"stopped for snapshot {stopped.snapshot_id}: it answers only health and RestoreState" in (
                    exc.details())
        with grpc.insecure_channel(v2.controller_address) as channel:
            stub = pb_grpc.ControllerStub(channel)
            request = pb.RestoreSnapshotRequest(snapshot_id=stopped.snapshot_id, request_id="upgrade-1")
            done = stub.RestoreSnapshot(request, timeout=120)
            assert done.status == pb.Restore.RESTORED, done.reason
            again = stub.RestoreSnapshot(request, timeout=120)
            assert (again.status, again.epoch) == (pb.Restore.RESTORED, done.epoch), "the retry is the same restore"
            assert stub.GetCluster(pb.GetClusterRequest(), timeout=10).epoch == done.epoch, "it ran once"
            with grpc.insecure_channel(v2.config.node(node).address) as node_channel:
                count = pb_grpc.NodeStub(node_channel).Submit(
                    pb.SubmitRequest(command=b'{"op": "count", "key": "x"}'), timeout=10)
            assert json.loads(count.reply)["at"] == node
            after = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE, after.reason
    assert (after.app.name, after.app.version) == ("kvshard", 2)
    assert all(n.state.startswith(b"v2:") for n in after.nodes)
    assert [(i.name, i.ok) for i in after.app.invariants] == [("every key exactly once", True)], after.app
    assert created <= set(held(after, 3)), "0 commands lost: every key a client saw created is held after the upgrade"


def test_a_stop_that_cannot_fence_every_node_leaves_the_cluster_taking_commands(tmp_path) -> None:
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3)
    with Cluster(path, app="kvshard") as cluster:
        cluster.stop_node("p3")
        started = subprocess.run([*CLI, "snapshot", "trigger", "--stop", "--controller", cluster.controller_address],
                                 capture_output=True, text=True, timeout=120, env=env_with())
        lines = started.stderr.strip().splitlines()
        assert started.returncode == 1 and len(lines) == 1, started.stderr
        assert "UNAVAILABLE" in lines[0] and "cannot fence p3" in lines[0], lines[0]
        assert "the cluster runs and accepts commands again" in lines[0]
        with grpc.insecure_channel(cluster.config.node("p1").address) as channel:
            put = pb_grpc.NodeStub(channel).Submit(
                pb.SubmitRequest(command=b'{"op": "put", "key": "p1/after", "value": 1}'), timeout=10)
        assert json.loads(put.reply) == {"key": "p1/after", "created_at": "p1"}
        with grpc.insecure_channel(cluster.controller_address) as channel:
            listed = pb_grpc.ControllerStub(channel).ListSnapshots(pb.ListSnapshotsRequest(), timeout=10)
        assert list(listed.snapshots) == [], "no snapshot started: p3 was never fenced"
        grpcurl = [str(grpcurl_binary()), "-plaintext"]  # reflection knows the stop field and the Fence RPC
        described = subprocess.run([*grpcurl, cluster.controller_address, "describe", "snapmesh.v1.TriggerSnapshotRequest"],
                                   capture_output=True, text=True, timeout=60)
        assert "bool stop = 4;" in described.stdout, described.stderr
        fence = subprocess.run([*grpcurl, "-d", '{"snapshot_id": "x"}', cluster.config.node("p1").address,
                                "snapmesh.v1.Node/Fence"], capture_output=True, text=True, timeout=60)
        assert fence.returncode != 0 and "a Fence call needs a snapshot_id and a step" in fence.stderr, fence.stderr


def test_a_controller_killed_during_the_upgrade_resumes_it_after_its_restart(tmp_path) -> None:
    (tmp_path / "kv_v2.py").write_text(KV_V2)
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3)
    with Cluster(path, app="kvshard") as v1:
        with Load(v1) as load, grpc.insecure_channel(v1.controller_address) as channel:
            wait_for(lambda: len(load.created) >= 20, timeout=60, what="20 keys created under load")
            stopped = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=120)
            assert stopped.status == pb.Snapshot.COMPLETE, stopped.reason
            for n in v1.node_ids:
                wait_for(lambda n=n: v1.node(n).wait(1), until=lambda s: s == 0, timeout=30, what=f"{n} exits 0")
        created = set(load.created)

    with Cluster(path, app="kv_v2:app", env=env_with(tmp_path)) as v2:
        v2.pause_node("p3")  # its part cannot be taken: the restore stays RESTORING
        request = pb.RestoreSnapshotRequest(snapshot_id=stopped.snapshot_id, request_id="upgrade-kill")

        def restore() -> None:
            with grpc.insecure_channel(v2.controller_address) as channel:
                try:
                    pb_grpc.ControllerStub(channel).RestoreSnapshot(request, timeout=60)
                except grpc.RpcError:
                    pass  # the controller is killed under it

        caller = threading.Thread(target=restore, daemon=True)
        caller.start()

        def last_restore() -> pb.Restore:
            with grpc.insecure_channel(v2.controller_address) as channel:
                return pb_grpc.ControllerStub(channel).GetCluster(pb.GetClusterRequest(), timeout=5).last_restore

        wait_for(last_restore, until=lambda r: r.status == pb.Restore.RESTORING, retry_on=grpc.RpcError,
                 timeout=30, what="the restore under way")
        v2.kill_controller()
        caller.join(30)
        v2.resume_node("p3")
        v2.start_controller()
        done = wait_for(last_restore, until=lambda r: r.status == pb.Restore.RESTORED, retry_on=grpc.RpcError,
                        timeout=90, what="the resumed restore")
        with grpc.insecure_channel(v2.controller_address) as channel:
            stub = pb_grpc.ControllerStub(channel)
            again = stub.RestoreSnapshot(request, timeout=60)
            assert (again.status, again.epoch) == (pb.Restore.RESTORED, done.epoch), "the retry is the resumed restore"
            after = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
        assert "was under way: resuming it" in v2.controller.output()
    assert after.status == pb.Snapshot.COMPLETE, after.reason
    assert (after.app.name, after.app.version) == ("kvshard", 2) and done.epoch == 2
    assert [(i.name, i.ok) for i in after.app.invariants] == [("every key exactly once", True)], after.app
    assert created <= set(held(after, 3)), "every key a client saw created is held after the resumed upgrade"


def test_the_bank_stops_with_a_snapshot_starts_fenced_and_is_restored_conserved(tmp_path) -> None:
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3)
    with Cluster(path) as bank, grpc.insecure_channel(bank.controller_address) as channel:
        with grpc.insecure_channel(bank.config.node("p1").address) as node:
            pb_grpc.NodeStub(node).Transfer(pb.TransferRequest(to="p2", amount=7), timeout=10)
        stopped = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=60)
        assert stopped.status == pb.Snapshot.COMPLETE and stopped.conserved, stopped.reason
        for n in bank.node_ids:
            wait_for(lambda n=n: bank.node(n).wait(1), until=lambda s: s == 0, timeout=30, what=f"{n} exits 0")
    with Cluster(path) as bank:
        with grpc.insecure_channel(bank.config.node("p1").address) as node:
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.NodeStub(node).Transfer(pb.TransferRequest(to="p2", amount=1), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert f"stopped for snapshot {stopped.snapshot_id}" in refused.value.details()
            with grpc.insecure_channel(bank.controller_address) as channel:
                stub = pb_grpc.ControllerStub(channel)
                done = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=stopped.snapshot_id), timeout=60)
                assert done.status == pb.Restore.RESTORED, done.reason
                pb_grpc.NodeStub(node).Transfer(pb.TransferRequest(to="p2", amount=1), timeout=10)
                after = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE and after.conserved and after.total == stopped.total, after.reason
