"""Rescale on a real local cluster under load: a stop snapshot, a new node set, a restore with rescale.

kvshard runs on 4 nodes under client load (puts of new keys, every third one
moved on). A stop snapshot ends it (the fence stops commands first, so the
handoffs have mostly landed by the cut; keys in flight at the cut are the
last test's: a live cut under load, restored after a stop); the
cluster file is rewritten for 6 nodes (snapmesh.settings.rescaling: the
controller and p1..p4 keep their ports and data dirs, p5 and p6 are new), the
new cluster starts (p1..p4 fenced on their stopped logs), and RestoreSnapshot
with the target node set runs the app's rescale on the controller. A retry
under the same request id is that restore, run once. Then 6 -> 3 the same way.
Every key a client saw created is held exactly once after each rescale. The bank goes 4 -> 3 with its total kept.
A live COMPLETE cut taken under load, with handoffs in flight, rescales 4 -> 6 -> 3 too
(the cluster stops with a snapshot of its own after it, so every log ends in a stop):
each key of the cut, those in flight included, is held exactly once, and no other.
"""

from __future__ import annotations

import json
import threading
import tomllib
from pathlib import Path

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.settings import config, rescaling
from snapmesh.settings.ports import free_ports
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.kvload import Load, cut_keys, in_flight_keys, live_cut_in_flight
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def stop_under_load(cluster: Cluster, run: str, keys: int) -> tuple[pb.Snapshot, set[str]]:
    """Load, then a stop snapshot once `keys` keys were created; every node exits 0."""
    with Load(cluster.config, run) as load, grpc.insecure_channel(cluster.controller_address) as channel:
        wait_for(lambda: len(load.created) >= keys, timeout=60, what=f"{keys} keys created under load")
        stopped = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=120)
        assert stopped.status == pb.Snapshot.COMPLETE, stopped.reason
        exits = {n: wait_for(lambda n=n: cluster.node(n).wait(1), until=lambda s: s is not None, timeout=30,
                             what=f"{n} exits") for n in cluster.node_ids}
        assert exits == {n: 0 for n in cluster.node_ids}
        return stopped, set(load.created)


def rewrite(path: Path, nodes: int) -> list[str]:
    """The cluster file for `nodes` nodes (snapmesh.settings.rescaling); the new node ids."""
    document = tomllib.loads(path.read_text())
    ports = free_ports(2 * rescaling.added(document, nodes))
    config.write(path, rescaling.rescaled(document, nodes, ports), comment="rescaled by the test")
    return [n.id for n in config.load(path, env={}).nodes]


def restore_rescaled(cluster: Cluster, snapshot_id: str, key: str) -> pb.Restore:
    """RestoreSnapshot onto the cluster's node set, then its retry: the same restore, run once."""
    with grpc.insecure_channel(cluster.controller_address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        request = pb.RestoreSnapshotRequest(snapshot_id=snapshot_id, request_id=key, nodes=list(cluster.node_ids))
        done = stub.RestoreSnapshot(request, timeout=120)
        assert done.status == pb.Restore.RESTORED, done.reason
        again = stub.RestoreSnapshot(request, timeout=120)
        assert (again.status, again.epoch) == (pb.Restore.RESTORED, done.epoch), "the retry is the same restore"
        assert stub.GetCluster(pb.GetClusterRequest(), timeout=10).epoch == done.epoch, "it ran once"
        assert sorted(n.node_id for n in done.nodes) == sorted(cluster.node_ids)
    return done


def held(cluster: Cluster) -> list[str]:
    """Every key the nodes hold, from a fresh snapshot: none in flight is missed (the cut counts those too)."""
    with grpc.insecure_channel(cluster.controller_address) as channel:
        after = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE, after.reason
    assert [(i.name, i.ok) for i in after.app.invariants] == [("every key exactly once", True)], after.app
    assert sorted(n.node_id for n in after.nodes) == sorted(cluster.node_ids)
    return [k for n in after.nodes for k in json.loads(n.state)["keys"]] + in_flight_keys(after)


def test_kvshard_rescales_4_to_6_to_3_under_load_with_every_key_exactly_once(tmp_path) -> None:
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=4, settings={"segment_records": 200})
    created: set[str] = set()
    for run, nodes in (("a", 6), ("b", 3)):
        with Cluster(path, app="kvshard") as before:
            stopped, made = stop_under_load(before, run, 60)
        created |= made
        cut = sorted(k for n in stopped.nodes for k in json.loads(n.state)["keys"]) + in_flight_keys(stopped)
        print(f"{run}: {len(cut)} keys at the cut, {len(in_flight_keys(stopped))} of them in flight")
        assert sorted(set(cut)) == sorted(cut) and made <= set(cut), "the stop snapshot holds every key once"
        assert rewrite(path, nodes) == [f"p{i}" for i in range(1, nodes + 1)]
        with Cluster(path, app="kvshard") as after:
            restore_rescaled(after, stopped.snapshot_id, f"rescale-{run}")
            keys = held(after)
            assert sorted(keys) == sorted(set(keys)), f"after {run}: a key held twice"
            assert created <= set(keys), f"after {run}: {sorted(created - set(keys))[:5]} lost"
            assert set(keys) == set(cut), f"after {run}: the keys of the cut, no more, no fewer"


BANK = "snapmesh.services.app.bank:app"


def test_the_bank_rescales_4_to_3_with_its_total_kept(tmp_path) -> None:
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=4)
    document = tomllib.loads(path.read_text())
    document["app"] = {"module": BANK, "total": 4000, "heirs": {"p4": "p2"}}
    config.write(path, document)
    with Cluster(path) as before:
        with grpc.insecure_channel(before.config.node("p4").address) as channel:
            pays = [pb.SubmitRequest(command=json.dumps({"to": to, "amount": 7}).encode()) for to in ("p1", "p2", "p3")]
            for request in pays * 5:
                pb_grpc.NodeStub(channel).Submit(request, timeout=10)
        with grpc.insecure_channel(before.controller_address) as channel:
            stopped = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=120)
        assert stopped.status == pb.Snapshot.COMPLETE, stopped.reason
        wait_for(lambda: all(before.node(n).wait(1) is not None for n in before.node_ids), timeout=30,
                 what="every node exits")
    p4 = int(next(n.state for n in stopped.nodes if n.node_id == "p4"))
    assert p4 == 1000 - 3 * 5 * 7
    rewrite(path, 3)
    with Cluster(path) as after:
        done = restore_rescaled(after, stopped.snapshot_id, "bank-rescale")
        with grpc.insecure_channel(after.controller_address) as channel:
            snap = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    balances = {n.node_id: int(n.state) for n in snap.nodes}
    assert sorted(balances) == ["p1", "p2", "p3"] and sum(balances.values()) == 4000, balances
    assert [(i.name, i.ok) for i in snap.app.invariants] == [("conserved", True)], snap.app
    assert balances["p2"] == 1000 + 5 * 7 + p4, "p4's balance went to its heir, p2"
    assert done.status == pb.Restore.RESTORED


def test_a_controller_killed_during_a_rescale_resumes_it_after_its_restart(tmp_path) -> None:
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3)
    with Cluster(path, app="kvshard") as before:
        stopped, created = stop_under_load(before, "a", 30)
    rewrite(path, 4)
    with Cluster(path, app="kvshard") as after:
        after.pause_node("p2")  # its part cannot be taken: the rescale stays RESTORING
        request = pb.RestoreSnapshotRequest(snapshot_id=stopped.snapshot_id, request_id="rescale-kill",
                                            nodes=list(after.node_ids))

        def restore() -> None:
            with grpc.insecure_channel(after.controller_address) as channel:
                try:
                    pb_grpc.ControllerStub(channel).RestoreSnapshot(request, timeout=60)
                except grpc.RpcError:
                    pass  # the controller is killed under it

        caller = threading.Thread(target=restore, daemon=True)
        caller.start()

        def last_restore() -> pb.Restore:
            with grpc.insecure_channel(after.controller_address) as channel:
                return pb_grpc.ControllerStub(channel).GetCluster(pb.GetClusterRequest(), timeout=5).last_restore

        wait_for(last_restore, until=lambda r: r.status == pb.Restore.RESTORING, retry_on=grpc.RpcError,
                 timeout=30, what="the rescale under way")
        after.kill_controller()
        caller.join(30)
        after.resume_node("p2")
        after.start_controller()
        done = wait_for(last_restore, until=lambda r: r.status == pb.Restore.RESTORED, retry_on=grpc.RpcError,
                        timeout=90, what="the resumed rescale")
        with grpc.insecure_channel(after.controller_address) as channel:
            again = pb_grpc.ControllerStub(channel).RestoreSnapshot(request, timeout=60)
        assert (again.status, again.epoch) == (pb.Restore.RESTORED, done.epoch), "the retry is the resumed rescale"
        assert sorted(n.node_id for n in done.nodes) == ["p1", "p2", "p3", "p4"]
        assert "was under way: resuming it" in after.controller.output()
        keys = held(after)
    assert sorted(keys) == sorted(set(keys)) and created <= set(keys), "every key once after the resumed rescale"


def live_cut_with_keys_in_flight(cluster: Cluster, run: str) -> tuple[pb.Snapshot, set[str]]:
    """Under load, a live cut with keys in flight; then the cluster stops with a snapshot of its
    own (every log ends in a stop: a node starts on another node set from a stopped log only)."""
    with Load(cluster.config, run) as load, grpc.insecure_channel(cluster.controller_address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        live, made = live_cut_in_flight(stub, load)
        stopped = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=120)
        assert stopped.status == pb.Snapshot.COMPLETE, stopped.reason
        wait_for(lambda: all(cluster.node(n).wait(1) is not None for n in cluster.node_ids), timeout=30,
                 what="every node exits")
    return live, made


def test_a_live_cut_with_keys_in_flight_rescales_4_to_6_to_3_with_each_key_exactly_once(tmp_path) -> None:
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=4, settings={"segment_records": 200})
    for run, nodes in (("a", 6), ("b", 3)):
        with Cluster(path, app="kvshard") as before:
            live, made = live_cut_with_keys_in_flight(before, run)
        flying = in_flight_keys(live)
        cut = cut_keys(live)
        print(f"{run}: {len(cut)} keys at the cut {live.snapshot_id}, {len(flying)} of them in flight")
        assert sorted(set(cut)) == sorted(cut) and made <= set(cut), "the live cut holds every key once"
        rewrite(path, nodes)
        with Cluster(path, app="kvshard") as after:
            restore_rescaled(after, live.snapshot_id, f"live-{run}")
            keys = held(after)
        assert sorted(keys) == sorted(set(keys)), f"after {run}: a key held twice"
        assert set(flying) <= set(keys), f"after {run}: keys in flight at the cut lost: {sorted(set(flying) - set(keys))}"
        assert set(keys) == set(cut), f"after {run}: the keys of the cut, no more, no fewer"


def test_a_running_controller_rescales_onto_its_rewritten_cluster_file_and_resumes_after_a_kill(tmp_path) -> None:
    """No controller restart: the stop, a new cluster file, the new node set started, and
    RestoreSnapshot with the target; then 6 -> 3 with the controller killed mid-rescale."""
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=4, settings={"segment_records": 200})
    with Cluster(path, app="kvshard") as cluster:
        live, made = live_cut_with_keys_in_flight(cluster, "a")  # the nodes exited; the controller runs on
        pid = cluster.controller_pid
        rewrite(path, 6)
        six = Cluster(path, app="kvshard", controller=False)
        try:
            six.start()
            with grpc.insecure_channel(cluster.controller_address) as channel:
                stub = pb_grpc.ControllerStub(channel)
                five = pb.RestoreSnapshotRequest(snapshot_id=live.snapshot_id, request_id="five", nodes=six.node_ids[:5])
                with pytest.raises(grpc.RpcError) as refused:
                    stub.RestoreSnapshot(five, timeout=60)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "\n" not in refused.value.details() and ("the target node set (p1, p2, p3, p4, p5) is not the "
                        "nodes this controller runs (p1, p2, p3, p4), and its cluster file names p1, p2, p3, p4, p5, p6"
                        ) in refused.value.details(), refused.value.details()
                assert stub.GetCluster(pb.GetClusterRequest(), timeout=10).epoch == 1, "nothing changed"
            restore_rescaled(six, live.snapshot_id, "running-a")
            keys = held(six)
            assert sorted(keys) == sorted(cut_keys(live)), "every key of the live cut once, those in flight too"
            assert cluster.controller_pid == pid, "the same controller process throughout"
            with Load(six.config, "b") as load, grpc.insecure_channel(cluster.controller_address) as channel:
                wait_for(lambda: len(load.created) >= 30, timeout=60, what="30 keys created on 6 nodes")
                stopped = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True),
                                                                          timeout=120)
            assert stopped.status == pb.Snapshot.COMPLETE and len(stopped.nodes) == 6, stopped.reason
            wait_for(lambda: all(six.node(n).wait(1) is not None for n in six.node_ids), timeout=30,
                     what="the 6 nodes exit")
        finally:
            six.stop()
        rewrite(path, 3)
        three = Cluster(path, app="kvshard", controller=False)
        try:
            three.start()
            three.pause_node("p2")  # its part cannot be taken: the rescale stays RESTORING
            request = pb.RestoreSnapshotRequest(snapshot_id=stopped.snapshot_id, request_id="running-b",
                                                nodes=list(three.node_ids))

            def restore() -> None:
                with grpc.insecure_channel(cluster.controller_address) as channel:
                    try:
                        pb_grpc.ControllerStub(channel).RestoreSnapshot(request, timeout=60)
                    except grpc.RpcError:
                        pass  # the controller is killed under it

            caller = threading.Thread(target=restore, daemon=True)
            caller.start()

            def last_restore() -> pb.Restore:
                with grpc.insecure_channel(cluster.controller_address) as channel:
                    return pb_grpc.ControllerStub(channel).GetCluster(pb.GetClusterRequest(), timeout=5).last_restore

            wait_for(last_restore, until=lambda r: r.status == pb.Restore.RESTORING and r.request_id == "running-b",
                     retry_on=grpc.RpcError, timeout=30, what="the rescale under way")
            cluster.kill_controller()
            caller.join(30)
            three.resume_node("p2")
            cluster.start_controller()  # on the same cluster file, which names the 3 nodes
            done = wait_for(last_restore, until=lambda r: r.status == pb.Restore.RESTORED, retry_on=grpc.RpcError,
                            timeout=90, what="the resumed rescale")
            with grpc.insecure_channel(cluster.controller_address) as channel:
                again = pb_grpc.ControllerStub(channel).RestoreSnapshot(request, timeout=60)
            assert (again.status, again.epoch) == (pb.Restore.RESTORED, done.epoch), "the retry is the resumed rescale"
            assert "was under way: resuming it" in cluster.controller.output()
            keys = held(three)
            assert sorted(keys) == sorted(cut_keys(stopped)) and made <= set(keys), "every key once after the resume"
        finally:
            three.stop()
