"""A one-file app on a real cluster: `snapmesh cluster up --app token_ring:app`, real processes, real gRPC.

examples/token_ring.py (one token passed from node to node; invariant: exactly
one token in the states plus in flight) runs on three nodes started by `cluster
up --app`, with examples/ on PYTHONPATH. Commands go through `Node.Submit`, by
the pinned grpcurl (through reflection) and, for a steady stream of passes, by
a Python client. Then: 20 snapshots, all COMPLETE with the invariant checked
and holding, at least one with the token in flight; a restore to that one
leaves exactly one token; a node killed with SIGKILL and started again
(`snapmesh node --app`) recovers through the app with the invariant intact. A
variant that calls random() in on_message refuses to restart, naming the log
position, and a bad --app exits 2 with one line before anything starts.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from snapmesh.app import NodeInfo, load_app
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.polling import wait_for
from support.ring import (
    APP,
    CLI,
    EXAMPLES,
    Passer,
    checked,
    env_with,
    grpcurl_submit,
    held_by,
    in_flight,
    submit,
    tokens,
    wait_serving,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]


CRASHING_RING = '''\
"""token_ring whose second node cannot take the token."""
from snapmesh.app import App
from token_ring import TokenRing, one_token


class Butterfingers(TokenRing):
    def on_message(self, src, payload, ctx):
        raise RuntimeError(f"{self.me} dropped the token from {src}")


app = App(name="crashing_ring", new=Butterfingers, invariants={"one token": one_token})
'''

RANDOM_RING = '''\
"""token_ring with a bug: on_message asks the process's id whether to pass the token straight on.

The same in one process (an undo's replay agrees with the first run), another after a
restart: the replay of the log then finds a different history."""
import os

from snapmesh.app import App
from token_ring import TOKEN, TokenRing, one_token


class Dice(TokenRing):
    seen = 0  # messages this node took: part of the state, so a replay asks the same questions

    def on_message(self, src, payload, ctx):
        self.seen += 1
        if hash((os.getpid(), self.seen)) % 2:
            ctx.send(self.next, TOKEN)
        else:
            self.tokens += 1

    def snapshot(self):
        return f"{self.tokens} {self.seen}".encode()

    def restore(self, state):
        tokens, _, seen = state.decode().partition(" ")
        self.tokens, self.seen = int(tokens), int(seen or 0)


app = App(name="random_ring", new=Dice, invariants={"one token": one_token})
'''




















class Ring:
    def __init__(self, process: subprocess.Popen, data: Path, env: dict[str, str]) -> None:
        self.process, self.data, self.env = process, data, env
        self.cfg = config.load(data / "cluster.toml", env={})
        self.controller = grpc.insecure_channel(self.cfg.controller.address)
        self.stub = pb_grpc.ControllerStub(self.controller)
        self.in_flight_id = ""

    def snapshot(self) -> pb.Snapshot:
        return self.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    data = tmp_path_factory.mktemp("ring")
    env = env_with(EXAMPLES)
    err = open(data / "cluster-up.err", "w")  # noqa: SIM115  (open for the launcher's life)
    process = subprocess.Popen([*CLI, "cluster", "up", "--nodes", "3", "--data-dir", str(data), "--ui", "off",
                                "--app", APP], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        first = process.stdout.readline()
        assert first.startswith("controller: "), (first, (data / "cluster-up.err").read_text())
        running = Ring(process, data, env)
        yield running
        running.controller.close()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        err.close()


def test_commands_go_through_submit_by_grpcurl(ring):
    p1, p2 = (ring.cfg.node(n).address for n in ("p1", "p2"))
    has = grpcurl_submit(p1, b"has")
    assert has.returncode == 0, has.stderr
    assert base64.b64decode(json.loads(has.stdout)["reply"]) == b"1"  # the smallest id holds it first
    passed = grpcurl_submit(p1, b"pass")
    assert passed.returncode == 0, passed.stderr
    assert base64.b64decode(json.loads(passed.stdout)["reply"]) == b"passed to p2"
    held_by(ring.cfg, "p2")
    refused = grpcurl_submit(p1, b"pass")  # the app's ctx.refuse, with the status it named
    assert refused.returncode != 0 and "FailedPrecondition" in refused.stderr and "does not hold" in refused.stderr
    unknown = grpcurl_submit(p2, b"dance")
    assert unknown.returncode != 0 and "InvalidArgument" in unknown.stderr
    with pytest.raises(grpc.RpcError) as too_big:
        submit(p2, b"x" * (1024 * 1024 + 1))
    assert too_big.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert tokens(ring.cfg) == 1
    with grpc.insecure_channel(p2) as channel:
        node = pb_grpc.NodeStub(channel)
        first = node.Submit(pb.SubmitRequest(request_id="once", command=b"pass"), timeout=10)
        again = node.Submit(pb.SubmitRequest(request_id="once", command=b"pass"), timeout=10)  # a client's retry
        assert (first.reply, first.replayed, again.reply, again.replayed) == (b"passed to p3", False,
                                                                               b"passed to p3", True)
        assert first.epoch == again.epoch == 1
        state = node.GetState(pb.GetStateRequest(), timeout=10)
    held_by(ring.cfg, "p3")
    assert tokens(ring.cfg) == 1
    assert (state.app, state.app_state_bytes) == (APP, 1) and state.app_state_digest.startswith("sha256:")


def test_twenty_snapshots_all_hold_one_token_and_one_catches_it_in_flight(ring):
    passer = Passer(ring.cfg)
    taken: list[pb.Snapshot] = []
    try:
        while len(taken) < 20 or not ring.in_flight_id:
            assert len(taken) < 300, "300 snapshots and the token never in flight"
            snapshot = ring.snapshot()
            checked(snapshot)
            taken.append(snapshot)
            if in_flight(snapshot) and not ring.in_flight_id:
                assert [payload for *_, payload in in_flight(snapshot)] == [b"token"]
                assert sum(int(n.state) for n in snapshot.nodes) == 0
                ring.in_flight_id = snapshot.snapshot_id
    finally:
        passer.stop()
    assert passer.passed > 20
    for snapshot in taken:
        assert all(n.state_digest.startswith("sha256:") for n in snapshot.nodes)


def test_a_restore_to_the_token_in_flight_leaves_exactly_one_token(ring):
    assert ring.in_flight_id, "needs the snapshot with the token in flight"
    restore = ring.stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=ring.in_flight_id), timeout=60)
    assert restore.status == pb.Restore.RESTORED, restore.reason
    assert tokens(ring.cfg) == 1  # the token in flight came back through on_message
    checked(ring.snapshot())


def test_a_node_killed_mid_passing_recovers_through_the_app(ring):
    passer = Passer(ring.cfg)
    time.sleep(1.0)
    pid = int((ring.data / "p2.lock").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    passer.stop()
    restarted = subprocess.Popen([*CLI, "node", "--config", str(ring.data / "cluster.toml"), "--id", "p2",
                                  "--app", APP], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 env=ring.env)
    try:
        wait_serving(ring.cfg.node("p2").address)
        passer = Passer(ring.cfg)
        time.sleep(0.5)
        passer.stop()
        checked(ring.snapshot())
        # the token may be on a channel between two answers
        wait_for(lambda: tokens(ring.cfg), until=lambda n: n == 1, timeout=30, interval=0.2,
                 what="exactly one token after the restart")
    finally:
        restarted.send_signal(signal.SIGTERM)
        _, err = restarted.communicate(timeout=60)
    assert restarted.returncode == 0, err


def test_an_app_that_asks_random_refuses_to_restart_naming_the_log_position(tmp_path):
    (tmp_path / "random_ring.py").write_text(RANDOM_RING, encoding="utf-8")
    env = env_with(tmp_path, EXAMPLES)
    cluster = Cluster(config.write_cluster(tmp_path / "cluster.toml", nodes=3), env=env, app="random_ring:app")
    with cluster:
        passer = Passer(cluster.config)
        # Enough traffic that p2's log holds many of the process's choices (counted, not timed):
        # a new process agrees with each replayed choice by chance one time in two, so with
        # the ~3 messages p2 took of 10 passes the refusal was missed about once in 10 runs.
        wait_for(lambda: passer.passed > 80, timeout=120, interval=0.2, what="more than 80 passes")
        passer.stop()
        cluster.kill_node("p2")
        again = subprocess.run([*CLI, "node", "--config", str(cluster.config_path), "--id", "p2",
                                "--app", "random_ring:app"], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 2, again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "not deterministic" in lines[0] and "lsn" in lines[0], again.stderr


def test_an_app_that_raises_on_a_message_stops_the_node_with_its_text(tmp_path):
    (tmp_path / "crashing_ring.py").write_text(CRASHING_RING, encoding="utf-8")
    env = env_with(tmp_path, EXAMPLES)
    with Cluster(config.write_cluster(tmp_path / "cluster.toml", nodes=2), env=env, app="crashing_ring:app") as cluster:
        assert submit(cluster.node_address("p1"), b"pass") == b"passed to p2"
        wait_for(lambda: not cluster.alive()["p2"], timeout=30, interval=0.2,
                 what="p2 to stop on a message its app raised on")
        assert cluster.node("p2").returncode == 1
        text = (cluster.log_dir / "p2.log").read_text()
        assert "the app failed on a message" in text and "p2 dropped the token from p1" in text


@pytest.mark.parametrize("command", [["cluster", "up", "--nodes", "2", "--ui", "off"], ["node", "--id", "p1"],
                                     ["controller"]])
def test_a_bad_app_exits_2_with_one_line(tmp_path, command):
    args = [*CLI, *command, "--app", "no_such_module_anywhere:app"]
    if command[0] == "cluster":
        args += ["--data-dir", str(tmp_path)]
    else:
        args += ["--config", str(config.write_cluster(tmp_path / "cluster.toml", nodes=2))]
    result = subprocess.run(args, capture_output=True, text=True, env=env_with(EXAMPLES), timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_module_anywhere" in lines[0], result.stderr
    assert not list(tmp_path.glob("*.log.jsonl")) and not (tmp_path / "controller").exists(), \
        "a bad app must stop before anything starts"


def test_overtake_mode_keeps_the_token_in_the_senders_outbox(tmp_path):
    """Markers overtake queued messages: an app's outbox at the cut (OutboxRun.payloads) completes the channels."""
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3, snapshot_mode="overtake")
    with Cluster(path, env=env_with(EXAMPLES), app=APP) as cluster:
        passer = Passer(cluster.config)
        controller = grpc.insecure_channel(cluster.controller_address)
        try:
            stub = pb_grpc.ControllerStub(controller)
            for _ in range(10):
                checked(stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
        finally:
            passer.stop()
            controller.close()
        assert tokens(cluster.config) == 1


def test_an_app_whose_snapshot_is_not_bytes_exits_2_before_anything_starts(tmp_path):
    (tmp_path / "text_ring.py").write_text(
        "from snapmesh.app import App\nfrom token_ring import TokenRing\n\n\n"
        "class Text(TokenRing):\n    def snapshot(self):\n        return str(self.tokens)\n\n\n"
        "app = App(name='text_ring', new=Text)\n", encoding="utf-8")
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=2)
    result = subprocess.run([*CLI, "node", "--config", str(path), "--id", "p1", "--app", "text_ring:app"],
                            capture_output=True, text=True, env=env_with(tmp_path, EXAMPLES), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "snapmesh node: app 'text_ring': snapshot() returned str, not bytes"
    assert not list(tmp_path.glob("*.log.jsonl"))


def test_a_controller_without_the_apps_module_completes_snapshots_unchecked(tmp_path):
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=2)
    with Cluster(path, env=env_with(EXAMPLES), app=APP, controller=False) as cluster:
        env = {**env_with(), "SNAPMESH_APP": APP}  # the nodes' app, but not its module
        controller = subprocess.Popen([*CLI, "controller", "--config", str(path)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        try:
            with grpc.insecure_channel(cluster.controller_address) as channel:
                stub = pb_grpc.ControllerStub(channel)

                def trigger() -> pb.Snapshot:
                    assert controller.poll() is None, "no controller"
                    return stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=30)

                snapshot = wait_for(trigger, until=lambda _: True, timeout=60, interval=0.3, retry_on=grpc.RpcError,
                                    what="a snapshot from the controller")
        finally:
            controller.send_signal(signal.SIGTERM)
            _, err = controller.communicate(timeout=60)
    assert snapshot.status == pb.Snapshot.COMPLETE and snapshot.app.status == pb.AppCheck.UNCHECKED, snapshot
    assert snapshot.reason.startswith("unchecked: --app token_ring:app: no module named 'token_ring'")
    assert [n.state for n in snapshot.nodes] == [b"1", b"0"] and not snapshot.app.invariants
    assert "its snapshots complete unchecked" in err


def test_a_controller_that_runs_another_app_than_the_nodes_exits_2(tmp_path):
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=2)
    with Cluster(path, env=env_with(EXAMPLES), app=APP, controller=False):
        controller = subprocess.run([*CLI, "controller", "--config", str(path)], capture_output=True, text=True,
                                    env=env_with(EXAMPLES), timeout=120)  # the bank: no --app, no [app]
    assert controller.returncode == 2, controller.stderr
    assert f"the controller runs the bank but node 'p1' runs {APP}; every process must run the same app" in \
        controller.stderr


def test_kvshard_on_a_cluster_finds_every_key_once_through_snapshots_and_a_kill(tmp_path):
    """The built-in kvshard (keys that move by handoff): its workload through Submit, snapshots
    checked by its invariant, a node killed with SIGKILL and started again on its log."""
    kvshard = load_app("kvshard")
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=3)
    with Cluster(path, app="kvshard") as cluster:
        cfg = cluster.config
        infos = [NodeInfo(node_id=n.id, peers_out=cfg.topology.outgoing(n.id), peers_in=cfg.topology.incoming(n.id))
                 for n in cfg.nodes]
        commands = kvshard.workload(infos, random.Random(7))
        stop = threading.Event()
        answered = [0]

        def drive() -> None:
            channels = {n.id: grpc.insecure_channel(n.address) for n in cfg.nodes}
            try:
                while not stop.is_set():
                    node, command = next(commands)
                    try:
                        pb_grpc.NodeStub(channels[node]).Submit(pb.SubmitRequest(command=command), timeout=5)
                        answered[0] += 1
                    except grpc.RpcError:
                        pass  # a guess that missed (the key moved on), or a node being restarted
            finally:
                for channel in channels.values():
                    channel.close()

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        with grpc.insecure_channel(cluster.controller_address) as channel:
            stub = pb_grpc.ControllerStub(channel)

            def judged() -> pb.Snapshot:
                snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
                assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
                assert [(i.name, i.ok) for i in snapshot.app.invariants] == [
                    (name, True) for name in kvshard.invariants], snapshot.app
                return snapshot

            try:
                for _ in range(5):
                    judged()
                cluster.kill_node("p2")
                cluster.start_node("p2")
                for _ in range(5):
                    judged()
            finally:
                stop.set()
                driver.join(30)
        assert answered[0] > 50
