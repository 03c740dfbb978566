"""`snapmesh cluster rescale` on a `cluster up` data dir, and its refusals (one line, exit 2, nothing changed).

A kvshard cluster of 4 runs from `cluster up`; keys are put and moved on;
`cluster rescale --nodes 3` stops it with a snapshot, writes the 3-node cluster
file (the controller and p1..p3 on their ports), starts it and restores with the
app's rescale: every key is held once by the 3 nodes. A second rescale grows the
cluster the first one runs to 5 (p4 and p5 new, started fenced on a log of an init
and the stop). SIGTERM to the rescale process stops the cluster it runs, leaving no
process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import grpc
import pytest

from snapmesh.settings import config as cluster_config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.binaries import grpcurl_binary
from support.kvload import Load, cut_keys, in_flight_keys, live_cut_in_flight
from support.processes import REPO, alive, children_of, cluster_up, read_line, wait_gone

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def rescale(*args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "snapmesh.cli", "cluster", "rescale", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=stderr, text=True)


@pytest.fixture
def started():
    """Processes a test starts; whatever it leaves running, and their children, are killed."""
    procs: list[subprocess.Popen] = []
    seen: set[int] = set()

    def add(proc: subprocess.Popen) -> subprocess.Popen:
        procs.append(proc)
        return proc

    add.remember = lambda proc: seen.update(children_of(proc.pid))
    yield add
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in seen:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def until_line(proc: subprocess.Popen, start: str, timeout: float = 120) -> str:
    while True:
        line = read_line(proc, timeout)
        assert line, f"{proc.args}: stdout ended before a line starting {start!r}"
        if line.startswith(start):
            return line.strip()


def test_cluster_rescale_stops_the_cluster_with_a_snapshot_and_runs_it_on_3_then_5_nodes(started, tmp_path):
    data = tmp_path / "d"
    up = started(cluster_up("--nodes", "4", "--data-dir", str(data), "--app", "kvshard", "--ui", "off"))
    until_line(up, "controller:")
    started.remember(up)
    cfg = cluster_config.load(data / "cluster.toml", env={})
    keys = []
    for node in cfg.nodes:
        with grpc.insecure_channel(node.address) as channel:
            stub = pb_grpc.NodeStub(channel)
            for i in range(10):
                key = f"{node.id}/k{i}"
                stub.Submit(pb.SubmitRequest(command=json.dumps({"op": "put", "key": key, "value": i}).encode()),
                            timeout=10)
                keys.append(key)
            move = {"op": "move", "key": f"{node.id}/k0", "to": cfg.topology.outgoing(node.id)[0]}
            stub.Submit(pb.SubmitRequest(command=json.dumps(move).encode()), timeout=10)
    with (tmp_path / "rescale.err").open("w") as err:  # the rescale's own lines, for a failure to show
        proc = started(rescale("--data-dir", str(data), "--nodes", "3", "--ui", "off", stderr=err))
    line = until_line(proc, "rescaled:", timeout=180)
    assert line.startswith("rescaled: ") and line.endswith(" onto 3 nodes (p1, p2, p3) in epoch 2"), line
    assert up.wait(60) == 0, "the cluster up launcher stopped cleanly"
    started.remember(proc)
    new = cluster_config.load(data / "cluster.toml", env={})
    assert [n.id for n in new.nodes] == ["p1", "p2", "p3"]
    assert new.controller.address == cfg.controller.address, "the controller keeps its address"
    assert [n.address for n in new.nodes] == [n.address for n in cfg.nodes[:3]]
    with grpc.insecure_channel(new.controller.address) as channel:
        after = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE, after.reason
    held = [k for n in after.nodes for k in json.loads(n.state)["keys"]]
    assert sorted(held) == sorted(keys), "every key once, on the 3 nodes"
    described = subprocess.run([str(grpcurl_binary()), "-plaintext", new.controller.address, "describe",
                                "snapmesh.v1.RestoreSnapshotRequest"], capture_output=True, text=True, timeout=60)
    assert "repeated string nodes = 3;" in described.stdout, described.stderr  # reflection knows the target set

    with (tmp_path / "grow.err").open("w") as err:  # and back up to 5: the rescale's own cluster is stopped
        grow = started(rescale("--data-dir", str(data), "--nodes", "5", "--ui", "off", stderr=err))
    line = until_line(grow, "rescaled:", timeout=180)
    assert line.endswith(" onto 5 nodes (p1, p2, p3, p4, p5) in epoch 3"), line
    assert proc.wait(60) == 0, "the first rescale's cluster stopped cleanly"
    started.remember(grow)
    first = [json.loads(text)["kind"] for text in (data / "p5.log.jsonl").read_text().splitlines()[:3]]
    assert first[:2] == ["init", "stop"], f"p5 started fenced on a log of an init and the stop: {first}"
    grown = cluster_config.load(data / "cluster.toml", env={})
    with grpc.insecure_channel(grown.node("p5").address) as channel:
        put = pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b'{"op": "put", "key": "p5/new", "value": 1}'),
                                               timeout=10)
    assert json.loads(put.reply) == {"key": "p5/new", "created_at": "p5"}
    with grpc.insecure_channel(grown.controller.address) as channel:
        after = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE and len(after.nodes) == 5, after.reason
    held = [k for n in after.nodes for k in json.loads(n.state)["keys"]]
    assert sorted(held) == sorted([*keys, "p5/new"]), "every key once, on the 5 nodes"
    children = children_of(grow.pid)
    grow.send_signal(signal.SIGTERM)
    assert grow.wait(60) == 0
    assert not wait_gone(children), "no process left behind"

    grown_from = line.split()[1]  # run again for the same snapshot: that restore's answer, nothing rolled back
    with (tmp_path / "again.err").open("w") as err:
        again = started(rescale("--data-dir", str(data), "--nodes", "5", "--snapshot", grown_from, "--ui", "off",
                                stderr=err))
    assert until_line(again, "rescaled:", timeout=180) == line, "the retry is the same rescale, run once"
    started.remember(again)
    with grpc.insecure_channel(grown.node("p5").address) as channel:
        got = pb_grpc.NodeStub(channel).Query(pb.QueryRequest(query=b'{"op": "get", "key": "p5/new"}'), timeout=10)
    assert json.loads(got.reply)["value"] == 1, "the key put after the rescale is still there: not rolled back"
    children = children_of(again.pid)
    again.send_signal(signal.SIGTERM)
    assert again.wait(60) == 0
    assert not wait_gone(children), "no process left behind"


@pytest.mark.parametrize("nodes", ["1", "0"])
def test_nodes_below_2_is_one_line_exit_2(tmp_path, nodes):
    proc = rescale("--data-dir", str(tmp_path), "--nodes", nodes)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.strip().splitlines() == [
        f"snapmesh cluster rescale: --nodes must be at least 2 (a snapshot needs a channel), got {nodes}"]


def test_an_app_without_rescale_is_one_line_exit_2_and_the_bank_has_one(tmp_path):
    path = cluster_config.write_cluster(tmp_path / "cluster.toml", nodes=3)
    before = path.read_text()
    proc = rescale("--data-dir", str(tmp_path), "--nodes", "2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "no cluster runs on" in err, err  # past the app's check: a file without [app] runs the bank app
    assert path.read_text() == before, "nothing changed"
    text = before + '\n[app]\nmodule = "token_ring:app"\n'
    path.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "examples"), str(REPO)]))
    proc = subprocess.run([sys.executable, "-m", "snapmesh.cli", "cluster", "rescale", "--data-dir", str(tmp_path),
                           "--nodes", "2"], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "snapmesh cluster rescale: app 'token_ring' has no rescale(view, nodes): it cannot be restored onto another"
        " node set"], proc.stderr
    assert path.read_text() == text, "nothing changed"


def test_no_cluster_running_and_no_snapshot_is_one_line_exit_2(tmp_path):
    cluster_config.write_cluster(tmp_path / "cluster.toml", nodes=3)
    text = (tmp_path / "cluster.toml").read_text() + '\n[app]\nmodule = "kvshard"\n'
    (tmp_path / "cluster.toml").write_text(text)
    proc = rescale("--data-dir", str(tmp_path), "--nodes", "4")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert f"no cluster runs on {tmp_path.resolve()}: start it" in err and "--snapshot ID" in err
    assert (tmp_path / "cluster.toml").read_text() == text


def test_a_tls_cluster_rescales_with_certificates_made_for_the_new_node_set(started, tmp_path):
    from snapmesh.serving import credentials
    from snapmesh.settings import security

    data = tmp_path / "d"
    up = started(cluster_up("--nodes", "3", "--data-dir", str(data), "--app", "kvshard", "--ui", "off", "--tls"))
    until_line(up, "controller:")
    started.remember(up)
    cfg = cluster_config.load(data / "cluster.toml", env={})
    identity = security.load_tls_dir(data / "tls")
    keys = [f"{n.id}/k" for n in cfg.nodes]
    for node in cfg.nodes:
        with credentials.open_channel(node.address, identity) as channel:
            pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=json.dumps(
                {"op": "put", "key": f"{node.id}/k", "value": 1}).encode()), timeout=10)
    with (tmp_path / "rescale.err").open("w") as err:
        proc = started(rescale("--data-dir", str(data), "--nodes", "4", "--ui", "off", stderr=err))
    line = until_line(proc, "rescaled:", timeout=180)
    assert line.endswith(" onto 4 nodes (p1, p2, p3, p4) in epoch 2"), line
    assert up.wait(60) == 0
    started.remember(proc)
    assert (data / "tls" / "p4.pem").is_file(), "a certificate for the new node"
    identity = security.load_tls_dir(data / "tls")  # the new CA and token
    with credentials.open_channel(cfg.controller.address, identity) as channel:
        after = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE and len(after.nodes) == 4, after.reason
    assert sorted(k for n in after.nodes for k in json.loads(n.state)["keys"]) == sorted(keys)
    children = children_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert not wait_gone(children), "no process left behind"


def test_cluster_rescale_restores_a_live_cut_with_keys_in_flight_named_by_snapshot(started, tmp_path):
    data = tmp_path / "d"
    up = started(cluster_up("--nodes", "4", "--data-dir", str(data), "--app", "kvshard", "--ui", "off"))
    until_line(up, "controller:")
    started.remember(up)
    cfg = cluster_config.load(data / "cluster.toml", env={})
    with Load(cfg, "live") as load, grpc.insecure_channel(cfg.controller.address) as channel:
        live, made = live_cut_in_flight(pb_grpc.ControllerStub(channel), load)
    # The load stops before the rescale: a key it made on the restored nodes would be in no live cut.
    with (tmp_path / "rescale.err").open("w") as err:
        proc = started(rescale("--data-dir", str(data), "--nodes", "3", "--snapshot", live.snapshot_id,
                               "--ui", "off", stderr=err))
    line = until_line(proc, "rescaled:", timeout=180)
    assert line.startswith(f"rescaled: {live.snapshot_id} onto 3 nodes (p1, p2, p3) in epoch "), line
    assert up.wait(60) == 0, "the cluster up launcher stopped cleanly"
    started.remember(proc)
    assert "stopped with snapshot " in (tmp_path / "rescale.err").read_text(), "a stop first: every log ends in one"
    cut = cut_keys(live)
    assert sorted(set(cut)) == sorted(cut) and made <= set(cut) and in_flight_keys(live)
    with grpc.insecure_channel(cfg.controller.address) as channel:
        after = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert after.status == pb.Snapshot.COMPLETE and len(after.nodes) == 3, after.reason
    keys = cut_keys(after)
    assert sorted(keys) == sorted(cut), "every key of the live cut once, those in flight included, and no other"
    children = children_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert not wait_gone(children), "no process left behind"
