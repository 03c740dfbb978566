"""examples/shop from the wheel, outside the checkout, both ways it runs (its README).

The wheel (built once per run: tests/support/wheel_build.py) goes into a fresh
virtualenv (Spark linked in); everything runs from a directory outside the checkout,
with nothing of the checkout on PYTHONPATH or PATH. The shop is the wheel's
`snapmesh.examples.shop`: its app, its proto's generated code (made by the wheel's
build), its server and its client.

- As an app module: `snapmesh cluster up --app snapmesh.examples.shop:app`;
  `snapmesh submit` and `snapmesh query` from the shell; `snapmesh app` drives its
  workload and takes snapshots; `snapmesh reconcile --app` (Spark, once) on a copy
  of that run is clean; under a load whose large orders travel between warehouses,
  snapshots until one holds an order in flight, and a restore to it; a node killed
  with SIGKILL and started again.
- As the user's own processes: the shipped cluster.toml (on free ports),
  `snapmesh controller`, and three `python -m snapmesh.examples.shop.server`, each
  embedding its warehouse's node; the shop's own API by its shipped client (a retry
  with a request id runs once; a bad item is refused) and by a load through the Shop
  stubs; an order in flight caught, a shop process killed with SIGKILL and started
  again, a restore to the snapshot with orders in flight.

Every COMPLETE snapshot of both clusters is checked by the controller, with both
invariants (stock conserved, each order once) holding. One cluster per way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from snapmesh.settings.ports import free_ports
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.polling import wait_for
from support.ring import wait_serving
from support.shop_run import (
    SPEC, ShopLoad, by_shop_api, by_submit, catch_orders_in_flight, checked, every_complete_snapshot_checked, placed,
)
from support.wheel_build import ROOT, built_wheel, fresh_venv, user_env
from support.wheel_user import User, launch, link_spark_into, stop

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(900)]

ORDER = json.dumps({"op": "order", "item": "pear", "qty": 3})


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> User:
    bin_dir = fresh_venv(built_wheel(tmp_path_factory), tmp_path_factory.mktemp("shop-venv") / "venv")
    link_spark_into(bin_dir)
    home = tmp_path_factory.mktemp("my-shop")
    assert not home.resolve().is_relative_to(ROOT), "the shop must run outside the checkout"
    return User(bin_dir, home)


def controller_stub(address: str) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.ControllerStub(channel)


# ---- one way: an app module under `cluster up --app` ------------------------------------


@dataclass
class UpCluster:
    process: subprocess.Popen
    data: Path
    nodes: dict[str, str]
    stub: pb_grpc.ControllerStub


@pytest.fixture(scope="module")
def up(user):
    data = user.home / "up-data"
    process, printed = launch(user, SPEC, data)
    channel, stub = controller_stub(printed["controller"])
    try:
        yield UpCluster(process, data, {name.split()[1]: a for name, a in printed.items() if name.startswith("node ")},
                        stub)
    finally:
        channel.close()
        assert stop(process) == 0


def test_cluster_up_runs_the_shop_from_the_wheel_with_its_workload(up, user):
    data = str(up.data)
    first = user.snapmesh("submit", "--node", "p1", "--data-dir", data, "--request-id", "o-1", ORDER)
    again = user.snapmesh("submit", "--node", "p1", "--data-dir", data, "--request-id", "o-1", ORDER)
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    assert json.loads(first.stdout) == json.loads(again.stdout) == {"order": "p1-1", "status": "fulfilled",
                                                                     "warehouse": "p1"}
    stock = user.snapmesh("query", "--node", "p1", "--data-dir", data, json.dumps({"op": "stock"}))
    assert stock.returncode == 0, stock.stderr
    assert json.loads(stock.stdout)["stock"]["pear"] == 97  # the retry ran nothing
    refused = user.snapmesh("submit", "--node", "p1", "--data-dir", data, json.dumps({"op": "order", "item": "kiwi",
                                                                                    "qty": 1}))
    assert refused.returncode == 1 and refused.stderr.startswith("INVALID_ARGUMENT: unknown item 'kiwi'"), \
        refused.stderr
    run = user.snapmesh("app", "--app", SPEC, "--data-dir", data, "--duration", "3", "--snapshot-every", "0.25",
                        "--seed", "3", timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert every_complete_snapshot_checked(up.stub) >= 5


@pytest.fixture(scope="module")
def up_copy(up, tmp_path_factory) -> Path:
    """The run's logs and exports as they are after the workload (idle), for Spark to read."""
    copy = tmp_path_factory.mktemp("shop-run") / "data"
    shutil.copytree(up.data, copy, ignore=shutil.ignore_patterns("reconcile", "*.lock", "*.sock", "logs"))
    return copy


def test_reconcile_app_finds_the_run_clean(up, up_copy, user, tmp_path):
    out = tmp_path / "out"
    done = user.snapmesh("reconcile", "--data-dir", str(up_copy), "--app", SPEC, "--verdicts-dir", str(out),
                         timeout=600, env={**user_env(), "SPARK_LOCAL_IP": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads((out / "summary.json").read_text())["verdicts"]
    invariant = {v["first_discrepancy"].split("'")[1]: v["consistent"] for v in verdicts if v["scope"] == "invariant"}
    assert invariant == {"stock conserved": True, "each order once": True, "no order from nowhere": True}, verdicts


def test_a_restore_to_a_snapshot_with_orders_in_flight_holds_the_invariants(up, user):
    load = ShopLoad(up.nodes, by_submit)
    try:
        caught = catch_orders_in_flight(up.stub, load)
        sent = load.sent
        wait_for(lambda: load.sent, until=lambda n: n >= sent + 20, timeout=60, what="commands after the cut")
    finally:
        load.stop()
    moved_on = checked(up.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
    assert placed(moved_on) != placed(caught)  # orders taken after the cut: the restore must take them back
    restored = user.snapmesh("restore", caught.snapshot_id, "--data-dir", str(up.data), "--yes")
    assert restored.returncode == 0, restored.stderr
    after = checked(up.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
    assert placed(after) == placed(caught)  # back at the cut; its orders in flight arrive
    assert every_complete_snapshot_checked(up.stub) >= 7


def test_a_node_killed_with_sigkill_recovers_with_the_invariants(up, user):
    load = ShopLoad(up.nodes, by_submit, seed=2)
    again = None
    try:
        wait_for(lambda: load.sent, until=lambda n: n >= 30, timeout=60, what="commands before the kill")
        os.kill(int((up.data / "p2.lock").read_text().split()[0]), signal.SIGKILL)
        with open(up.data.parent / "p2-again.err", "w") as err:
            again = user.start("node", "--config", str(up.data / "cluster.toml"), "--id", "p2", "--app", SPEC,
                               stdout=subprocess.DEVNULL, stderr=err)
        wait_serving(up.nodes["p2"])
        sent = load.sent
        wait_for(lambda: load.sent, until=lambda n: n >= sent + 30, timeout=60, what="commands after the restart")
        for _ in range(3):
            checked(up.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
    finally:
        load.stop()
        status = None if again is None else stop(again, signal.SIGTERM)
    assert status == 0, (up.data.parent / "p2-again.err").read_text()[-2000:]
    every_complete_snapshot_checked(up.stub)


# ---- the other way: the user's own processes, each embedding its warehouse's node -------


@dataclass
class OwnShop:
    user: User
    dir: Path
    controller: subprocess.Popen
    stub: pb_grpc.ControllerStub
    controller_address: str
    shops: dict[str, str]  # node id -> the shop API's address
    processes: dict[str, subprocess.Popen]

    def start_shop(self, node: str) -> None:
        err = open(self.dir / f"shop-{node}.err", "a")  # noqa: SIM115  (the shop's for its life)
        process = self.user.python("-m", "snapmesh.examples.shop.server", "--cluster", "cluster.toml", "--node", node,
                                   "--listen", self.shops[node], cwd=self.dir, stdout=subprocess.PIPE, stderr=err)
        err.close()
        self.processes[node] = process
        line = process.stdout.readline()
        assert line.startswith(f"shop {node} serving on {self.shops[node]}"), \
            (line, (self.dir / f"shop-{node}.err").read_text()[-2000:])

    def client(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.user.bin / "python"), "-m", "snapmesh.examples.shop.client", *args],
                              capture_output=True, text=True, timeout=60, cwd=self.dir, env=user_env())


def shipped_cluster_file(user: User, into: Path) -> tuple[str, str]:
    """The wheel's examples/shop/cluster.toml, its ports swapped for free ones; the controller's address."""
    where = user.snapmesh("examples", "--path")
    assert where.returncode == 0, where.stderr
    text = (Path(where.stdout.strip()) / "shop" / "cluster.toml").read_text()
    ports = iter(free_ports(8))
    text = re.sub(r"^(port|metrics_port) = \d+", lambda m: f"{m.group(1)} = {next(ports)}", text, flags=re.M)
    (into / "cluster.toml").write_text(text)
    controller_port = re.search(r"^\[controller\][^\[]*?^port = (\d+)", text, flags=re.M | re.S).group(1)
    return text, f"127.0.0.1:{controller_port}"


@pytest.fixture(scope="module")
def own(user):
    where = user.home / "own"
    where.mkdir()
    _, address = shipped_cluster_file(user, where)
    with open(where / "controller.err", "w") as err:
        controller = user.start("controller", "--config", "cluster.toml", cwd=where, stdout=subprocess.DEVNULL,
                                stderr=err)
    channel, stub = controller_stub(address)
    shops = {f"p{k}": f"127.0.0.1:{port}" for k, port in enumerate(free_ports(3), start=1)}
    shop = OwnShop(user, where, controller, stub, address, shops, {})
    try:
        for node in shop.shops:
            shop.start_shop(node)
        yield shop
    finally:
        statuses = {node: stop(process, signal.SIGTERM) for node, process in shop.processes.items()}
        channel.close()
        statuses["controller"] = stop(controller, signal.SIGTERM)
        assert statuses == dict.fromkeys([*shop.processes, "controller"], 0), statuses


def test_own_processes_serve_the_shop_api_with_their_embedded_nodes(own):
    first = own.client(own.shops["p1"], "order", "pear", "3", "--request-id", "r-1")
    again = own.client(own.shops["p1"], "order", "pear", "3", "--request-id", "r-1")
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    assert json.loads(first.stdout) == {"order_id": "p1-1", "replayed": False, "status": "fulfilled",
                                        "warehouse": "p1"}
    assert json.loads(again.stdout)["replayed"] is True
    moved = own.client(own.shops["p1"], "move", "apple", "10", "p3")
    assert moved.returncode == 0 and json.loads(moved.stdout)["left"] == 90, moved.stderr
    stock = wait_for(lambda: json.loads(own.client(own.shops["p3"], "stock").stdout), until=lambda s: s["stock"]["apple"]
                     == 110, timeout=30, what="the apples at p3")
    assert stock["warehouse"] == "p3"
    refused = own.client(own.shops["p2"], "order", "kiwi", "1")
    assert refused.returncode == 1 and refused.stderr.startswith("INVALID_ARGUMENT: unknown item 'kiwi'"), \
        refused.stderr
    checked(own.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))


def test_own_processes_a_shop_killed_with_sigkill_and_started_again_recovers(own):
    load = ShopLoad(own.shops, by_shop_api, seed=4)
    try:
        wait_for(lambda: load.sent, until=lambda n: n >= 30, timeout=60, what="commands before the kill")
        own.processes["p1"].send_signal(signal.SIGKILL)
        own.processes["p1"].wait(30)
        stop(own.processes["p1"])
        own.start_shop("p1")
        sent = load.sent
        wait_for(lambda: load.sent, until=lambda n: n >= sent + 30, timeout=60, what="commands after the restart")
        for _ in range(3):
            checked(own.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
    finally:
        load.stop()


def test_own_processes_a_restore_with_orders_in_flight_holds_the_invariants(own, user):
    load = ShopLoad(own.shops, by_shop_api, seed=5)
    try:
        caught = catch_orders_in_flight(own.stub, load)
        sent = load.sent
        wait_for(lambda: load.sent, until=lambda n: n >= sent + 20, timeout=60, what="commands after the cut")
    finally:
        load.stop()
    moved_on = checked(own.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
    assert placed(moved_on) != placed(caught)  # orders taken after the cut: the restore must take them back
    restored = user.snapmesh("restore", caught.snapshot_id, "--controller", own.controller_address, "--yes")
    assert restored.returncode == 0, restored.stderr
    after = checked(own.stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
    assert placed(after) == placed(caught)  # back at the cut; its orders in flight arrive
    assert every_complete_snapshot_checked(own.stub) >= 5
