"""A one-file app from the wheel, as a user runs it (issue 32, its first "Done when").

The wheel (built once per run: tests/wheel_build.py) goes into a fresh virtualenv.
A token ring (examples/token_ring.py's text: one token passed from node to node;
invariant: exactly one token in the states plus in flight) is written as `ring.py`
into a temporary directory outside the checkout; it imports only `snapmesh.app` and
the standard library, which is checked. From that directory, with that venv's
`snapmesh` and nothing of the checkout on PYTHONPATH or PATH:

- `snapmesh cluster up --app ring:app` (three nodes, its page on a free port);
  commands by the pinned grpcurl through `Submit`, and a steady stream of passes
  by a Python client;
- 20 snapshots, all COMPLETE with "one token" checked and holding, and snapshots
  taken (at most 300) until one holds the token in flight;
- that snapshot's page in headless Chromium, and `snapmesh snapshot get`, show the
  app's verdict and what its `describe` says: the token in flight;
- `snapmesh reconcile --app ring:app` (Spark) on a copy of the run is clean, and a
  copy whose export was doctored to hold a second token gives exactly one
  invariant verdict, naming that snapshot;
- a restore to the snapshot with the token in flight leaves exactly one token;
- a node killed with SIGKILL and started again (`snapmesh node --app`) recovers
  through the app with the invariant intact;
- a variant whose on_message calls random() refuses to restart, naming the log position.

The venv gets the `reconcile` extra's packages (pyspark, py4j) as links to this
venv's copies rather than a second 450 MB download; snapmesh itself, and so the
job, the CLI and the page, comes from the wheel.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from snapmesh.settings import config
from snapmesh.ui import browser as B
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.polling import wait_for
from support.ring import Passer, grpcurl_submit, in_flight, submit, tokens, wait_serving
from support.wheel_build import ROOT, built_wheel, fresh_venv, user_env
from support.wheel_user import User, launch, link_spark_into, stop

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(600)]

APP = "ring:app"

DICE = '''\
"""The token ring with a bug: on_message tells the next node where the token went, with a random() number."""
from random import random

from snapmesh.app import App
from ring import TOKEN, TokenRing, one_token


class Dice(TokenRing):
    def on_message(self, src, payload, ctx):
        if payload == TOKEN:  # the note's number differs on every replay: by construction, not by luck
            self.tokens += 1
            ctx.send(self.next, b"note %r" % random())


app = App(name="dice", new=Dice, invariants={"one token": one_token})
'''


def imports_beyond_the_contract(source: str) -> list[str]:
    """The modules `source` imports other than snapmesh.app and the standard library's."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        found += [n for n in names if n != "snapmesh.app" and n.split(".")[0] not in sys.stdlib_module_names]
    return found


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> User:
    bin_dir = fresh_venv(built_wheel(tmp_path_factory), tmp_path_factory.mktemp("app-venv") / "venv")
    link_spark_into(bin_dir)
    home = tmp_path_factory.mktemp("my-app")
    assert not home.resolve().is_relative_to(ROOT), "the app must live outside the checkout"
    text = (ROOT / "examples" / "token_ring.py").read_text(encoding="utf-8")
    assert imports_beyond_the_contract(text) == []
    assert imports_beyond_the_contract(DICE) == ["ring"]  # the app above, beside it
    (home / "ring.py").write_text(text, encoding="utf-8")
    (home / "dice.py").write_text(DICE, encoding="utf-8")
    return User(bin_dir, home)


@dataclass
class Ring:
    process: subprocess.Popen
    data: Path
    controller: str
    ui: str
    nodes: dict[str, str]
    stub: pb_grpc.ControllerStub = field(init=False)
    in_flight_id: str = ""

    def snapshot(self) -> pb.Snapshot:
        return self.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)

    def config(self) -> config.ClusterConfig:
        return config.load(self.data / "cluster.toml", env={})


def checked(snapshot: pb.Snapshot) -> pb.Snapshot:
    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
    assert snapshot.app.spec == APP and snapshot.app.status == pb.AppCheck.CHECKED, snapshot.app
    assert [(i.name, i.ok) for i in snapshot.app.invariants] == [("one token", True)], snapshot.app
    return snapshot


@pytest.fixture(scope="module")
def ring(user):
    data = user.home / "data"
    process, printed = launch(user, APP, data, ui="127.0.0.1:0")
    channel = grpc.insecure_channel(printed["controller"])
    try:
        running = Ring(process, data, printed["controller"], printed["ui"],
                       {name.split()[1]: a for name, a in printed.items() if name.startswith("node ")})
        running.stub = pb_grpc.ControllerStub(channel)
        yield running
    finally:
        channel.close()
        assert stop(process) == 0


def test_commands_go_through_submit_by_grpcurl(ring):
    def reply(answer: subprocess.CompletedProcess) -> bytes:
        assert answer.returncode == 0, answer.stderr
        return base64.b64decode(json.loads(answer.stdout)["reply"])

    assert reply(grpcurl_submit(ring.nodes["p1"], b"has")) == b"1"  # the smallest id holds it first
    assert reply(grpcurl_submit(ring.nodes["p1"], b"pass")) == b"passed to p2"
    refused = grpcurl_submit(ring.nodes["p1"], b"pass")
    assert refused.returncode != 0 and "FailedPrecondition" in refused.stderr and "p1 does not hold the token" in \
        refused.stderr
    # the pass answers once logged; the token travels on
    wait_for(lambda: reply(grpcurl_submit(ring.nodes["p2"], b"has")), until=lambda has: has == b"1", timeout=30, interval=0.2,
             what="the token passed to p2")


def test_twenty_snapshots_hold_one_token_and_one_catches_it_in_flight(ring):
    passer = Passer(ring.config())
    taken = 0
    try:
        # Passing as fast as the nodes answer while snapshots are taken: most cuts find the token
        # at a node; keep taking them (bounded) until one finds it on a channel.
        while taken < 20 or not ring.in_flight_id:
            assert taken < 300, "300 snapshots and the token never in flight"
            snapshot = checked(ring.snapshot())
            taken += 1
            if in_flight(snapshot) and not ring.in_flight_id:
                assert [payload for *_, payload in in_flight(snapshot)] == [b"token"]
                assert [n.state for n in snapshot.nodes] == [b"0", b"0", b"0"]
                ring.in_flight_id = snapshot.snapshot_id
    finally:
        passer.stop()
    assert passer.passed > 20


def test_the_page_and_snapshot_get_show_the_token_in_flight(ring, user):
    assert ring.in_flight_id, "needs the snapshot with the token in flight"
    snapshot = checked(ring.stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=ring.in_flight_id), timeout=10))
    [(src, dst, seq, _)] = in_flight(snapshot)
    B.install()
    driver = B.chrome(1400, 1000)
    try:
        driver.get(f"{ring.ui}snapshot/{ring.in_flight_id}")
        shown = driver.execute_script(
            "function t(s){ return Array.from(document.querySelectorAll(s)).map(e => e.textContent); }"
            "return {app: t('#app h2'), checks: t('#invariants tr[data-invariant]'),"
            " said: t(\"#described tr[data-key='token'] td:last-child\")}")
    finally:
        driver.quit()
    [heading] = shown["app"]
    assert heading.startswith(f"App {APP} (") and heading.endswith(" version 1)"), shown  # the app and its version
    assert shown["checks"] == ["one tokenok"], shown
    [said] = shown["said"]
    assert json.loads(said) == [f"in flight {src}->{dst} (seq {seq})"], said
    got = user.snapmesh("snapshot", "get", ring.in_flight_id, "--data-dir", str(ring.data))
    assert got.returncode == 0, got.stderr
    assert re.search(r"^one token\s+ok$", got.stdout, re.M), got.stdout
    assert re.search(rf'^token\s+\["in flight {src}->{dst} \(seq {seq}\)"\]$', got.stdout, re.M), got.stdout


def reconcile(user: User, data: Path, out: Path) -> tuple[int, dict, str]:
    done = user.snapmesh("reconcile", "--data-dir", str(data), "--app", APP, "--verdicts-dir", str(out), timeout=540,
                         env={**user_env(), "SPARK_LOCAL_IP": "127.0.0.1"})
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return done.returncode, summary, done.stderr[-3000:]


@pytest.fixture(scope="module")
def run_copy(ring, tmp_path_factory) -> Path:
    """The run's logs and exports as they are now (idle, before the restore), for Spark to read."""
    assert ring.in_flight_id, "needs the snapshot with the token in flight"
    copy = tmp_path_factory.mktemp("ring-run") / "data"
    shutil.copytree(ring.data, copy, ignore=shutil.ignore_patterns("reconcile", "*.lock", "*.sock", "logs"))
    return copy


def test_reconcile_app_finds_the_run_clean(run_copy, user, tmp_path):
    status, summary, err = reconcile(user, run_copy, tmp_path / "out")
    assert status == 0, err
    invariant = [v for v in summary["verdicts"] if v["scope"] == "invariant"]
    assert [v["consistent"] for v in invariant] == [True] and "invariant 'one token' holds" in \
        invariant[0]["first_discrepancy"], invariant


def test_reconcile_app_on_an_export_doctored_to_hold_a_second_token_gives_one_invariant_verdict(
        ring, run_copy, user, tmp_path):
    sid = ring.in_flight_id
    doctored = tmp_path / "doctored"
    shutil.copytree(run_copy, doctored, ignore=shutil.ignore_patterns("reconcile"))
    export = doctored / "snapshots" / f"{sid}.json"
    document = json.loads(export.read_text())
    channel = next(c for c in document["channels"] if not c.get("in_flight"))
    channel["in_flight"] = [{"msg_id": f"{channel['src']}:{channel['dst']}:9999", "seq": "9999",
                             "payload": base64.b64encode(b"token").decode()}]
    export.write_text(json.dumps(document))
    status, summary, err = reconcile(user, doctored, tmp_path / "out")
    assert status == 1, err
    violated = [v for v in summary["verdicts"] if v["scope"] == "invariant" and v["consistent"] is False]
    assert len(violated) == 1, summary["verdicts"]
    assert violated[0]["snapshot_id"] == sid
    assert violated[0]["first_discrepancy"].startswith(f"invariant 'one token' violated in snapshot {sid}")


def test_a_restore_to_the_token_in_flight_leaves_exactly_one_token(ring, user):
    assert ring.in_flight_id, "needs the snapshot with the token in flight"
    restored = user.snapmesh("restore", ring.in_flight_id, "--data-dir", str(ring.data), "--yes")
    assert restored.returncode == 0, restored.stderr
    assert tokens(ring.config()) == 1  # the token in flight came back through on_message
    checked(ring.snapshot())


def test_a_node_killed_with_sigkill_recovers_through_the_app(ring, user):
    passer = Passer(ring.config())
    time.sleep(1.0)
    pid = int((ring.data / "p2.lock").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    passer.stop()
    again = user.start("node", "--config", str(ring.data / "cluster.toml"), "--id", "p2", "--app", APP,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_serving(ring.nodes["p2"])
        passer = Passer(ring.config())
        time.sleep(0.5)
        passer.stop()
        checked(ring.snapshot())
        # the token may be on a channel between two answers
        wait_for(lambda: tokens(ring.config()), until=lambda n: n == 1, timeout=30, interval=0.2,
                 what="exactly one token after the restart")
    finally:
        status = stop(again, signal.SIGTERM)
    assert status == 0


def test_an_app_that_calls_random_refuses_to_restart_naming_the_log_position(user):
    data = user.home / "dice-data"
    process, printed = launch(user, "dice:app", data)
    try:
        submit(printed["node p1"], b"pass")
        passer = Passer(config.load(data / "cluster.toml", env={}))
        time.sleep(2.0)
        passer.stop()
        assert passer.passed > 5
        pid = int((data / "p2.lock").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        again = user.snapmesh("node", "--config", str(data / "cluster.toml"), "--id", "p2", "--app", "dice:app")
    finally:
        stop(process)
    assert again.returncode == 2, again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1, again.stderr
    assert "lsn " in lines[0] and "deterministic" in lines[0] and "p2.log" in lines[0], lines[0]
