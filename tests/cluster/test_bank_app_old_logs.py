"""Logs the native bank wrote (commit 2b5e557's data dir, tests/fixtures/data-2b5e557/bank)
recover on nodes that host the bank app, mapped once when read (snapmesh/bank/oldlogs.py).

Real `snapmesh node` processes start on a copy of the fixture's logs with the bank app
as their [app]: each serves the balance its log holds once the transfers in flight at
the stop arrive (their amounts, mapped to the app's messages, are delivered), each
active segment now opens with a checkpoint of the bank app's state, and a restart of
every node, reading that segment, serves the same balances. An old COMPLETE snapshot
(a balance per node, amounts in flight, no state bytes) then restores into the bank
app through RestoreState, as the native bank's restore gives it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import grpc
import pytest

from support.node_harness import ReportSink
from support.polling import wait_for
from snapmesh.processes import supervisor
from snapmesh.protocol import wal
from snapmesh.settings.ports import free_ports
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data-2b5e557"
OLD = json.loads((FIXTURE / "fixture.json").read_text())["bank"]
NODES = ["p1", "p2", "p3"]


def bank_app_data_dir(tmp_path: Path) -> tuple[Path, int]:
    """A copy of the fixture's node logs, its cluster file hosting the bank app; (cluster file, controller port)."""
    data_dir = tmp_path / "bank"
    data_dir.mkdir()
    for node in NODES:
        shutil.copy(FIXTURE / "bank" / f"{node}.log.jsonl", data_dir)
    text = (FIXTURE / "bank" / "cluster.toml").read_text().replace('"DATA_DIR"', json.dumps(str(data_dir)))
    ports = free_ports(len(re.findall(r"\bport = \d+", text)))
    iterator = iter(ports)
    text = re.sub(r"\bport = \d+", lambda _: f"port = {next(iterator)}", text)
    text += '\n[app]\nmodule = "snapmesh.services.app.bank:app"\ninitial_balance = 1000\n'
    (data_dir / "cluster.toml").write_text(text)
    controller = int(re.search(r"\[controller\][^\[]*?\bport = (\d+)", text).group(1))
    return data_dir / "cluster.toml", controller


def balances(cluster: supervisor.Cluster) -> dict[str, int]:
    found = {}
    for node in NODES:
        with grpc.insecure_channel(cluster.config.node(node).address) as channel:
            found[node] = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=5).balance
    return found


def restore_request(snapshot: dict, node: str) -> pb.RestoreStateRequest:
    """The native snapshot's RestoreState for `node`, as the controller of 2b5e557 sent it."""
    balance = next(int(n["balance"]) for n in snapshot["nodes"] if n["node_id"] == node)
    request = pb.RestoreStateRequest(snapshot_id=snapshot["snapshot_id"], epoch=2, balance=balance)
    for channel in snapshot["channels"]:
        if channel["dst"] == node:
            request.channels.add(src=channel["src"], dst=node, in_flight=[
                pb.InFlightTransfer(msg_id=t["msg_id"], amount=int(t["amount"]), seq=int(t["seq"]))
                for t in channel["in_flight"]])
    return request


def test_a_native_bank_data_dir_recovers_once_as_the_bank_app_and_restores_its_snapshot(tmp_path: Path) -> None:
    path, controller = bank_app_data_dir(tmp_path)
    cluster = supervisor.Cluster(path, controller=False)
    sink = ReportSink(controller)
    try:
        cluster.start()
        recovered = wait_for(lambda: balances(cluster), until=lambda b: b == OLD["balances_after_recovery"],
                             timeout=60, retry_on=grpc.RpcError, what="the old logs' balances, in flight delivered")
        for node in NODES:
            first = wal.parse((path.parent / f"{node}.log.jsonl").read_text().splitlines()[0], node)
            assert type(first) is wal.Checkpoint and first.app == "bank", first
        for node in NODES:
            cluster.restart_node(node)
        assert wait_for(lambda: balances(cluster), retry_on=grpc.RpcError, timeout=60,
                        what="the balances after a restart") == recovered

        snapshot = json.loads((FIXTURE / "bank" / "snapshots" / f"{OLD['restore']}.json").read_text())
        for node in NODES:
            with grpc.insecure_channel(cluster.config.node(node).address) as channel:
                pb_grpc.NodeStub(channel).RestoreState(restore_request(snapshot, node), timeout=10)
        wait_for(lambda: balances(cluster), until=lambda b: b == OLD["balances_after_restore"], timeout=60,
                 retry_on=grpc.RpcError, what="the restored balances and the amounts in flight at the cut")
    finally:
        cluster.stop()
        sink.close()
