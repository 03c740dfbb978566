"""The bank through the app contract keeps its v1 figures, filled by its controller-side adapter.

A three-node cluster runs the bank as an app (`cluster up --app
snapmesh.services.app.bank:app`: state = the balance, a message = the amount, both
decimal ASCII), real processes over real gRPC, driven by `snapmesh app` with
snapshots taken under load. Every COMPLETE snapshot carries what a v1 client of
the bank reads: each node's `balance` (its state bytes read), each in-flight
item's `amount` (its payload read), `total` = their sum, `expected_total` = 3 x
1000 and `conserved`, beside the app's invariant `conserved`; the export carries
them; `snapshot list` shows the bank's total and conserved columns; and `restore`
answers each node's balance after it (recorded balance plus the amounts replayed
to it), which the nodes' own GetState agrees with.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import grpc
import pytest

from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.ring import CLI, env_with, wait_serving

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

BANK = "snapmesh.services.app.bank:app"
NODES = 3
INITIAL = 1000  # the bank app's default initial_balance


def figures_agree(snapshot: pb.Snapshot) -> None:
    """The v1 figures are the state bytes and payloads read, and they add up."""
    assert snapshot.app.name == "bank" and [(i.name, i.ok) for i in snapshot.app.invariants] == [("conserved", True)]
    assert all(n.HasField("balance") and n.balance == int(n.state) for n in snapshot.nodes), snapshot.nodes
    items = [t for c in snapshot.channels for t in c.in_flight]
    assert all(t.HasField("amount") and t.amount == int(t.payload) for t in items), items
    assert snapshot.total == sum(n.balance for n in snapshot.nodes) + sum(t.amount for t in items)
    assert snapshot.HasField("conserved") and snapshot.conserved
    assert snapshot.expected_total == snapshot.total == NODES * INITIAL


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    """(the COMPLETE snapshots, `snapshot list` stdout, the restore's stdout, the one restored, the
    balances GetState reads after it, the export of the one restored)."""
    data = tmp_path_factory.mktemp("bank-v1")
    env = env_with()
    with open(data / "cluster-up.err", "w") as err:
        process = subprocess.Popen([*CLI, "cluster", "up", "--nodes", str(NODES), "--data-dir", str(data), "--ui", "off",
                                    "--app", BANK], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        try:
            first = process.stdout.readline()
            assert first.startswith("controller: "), (first, (data / "cluster-up.err").read_text())
            cfg = config.load(data / "cluster.toml", env={})
            for node in cfg.nodes:
                wait_serving(node.address)
            drive = subprocess.run([*CLI, "app", "--app", BANK, "--data-dir", str(data), "--duration", "3",
                                    "--snapshot-every", "0.2", "--seed", "11"], capture_output=True, text=True, env=env,
                                   timeout=120)
            assert drive.returncode == 0, drive.stdout[-2000:] + drive.stderr
            with grpc.insecure_channel(cfg.controller.address) as channel:
                stub = pb_grpc.ControllerStub(channel)
                listed = stub.ListSnapshots(pb.ListSnapshotsRequest(status=pb.Snapshot.COMPLETE), timeout=60).snapshots
                snapshots = [stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=s.snapshot_id), timeout=60)
                             for s in listed]
            assert snapshots, "no COMPLETE snapshot"
            chosen = max(snapshots, key=lambda s: sum(len(c.in_flight) for c in s.channels))
            shown = subprocess.run([*CLI, "snapshot", "list", "--data-dir", str(data)], capture_output=True, text=True,
                                   env=env, timeout=120)
            assert shown.returncode == 0, shown.stdout + shown.stderr
            restore = subprocess.run([*CLI, "restore", "--yes", "--data-dir", str(data), chosen.snapshot_id],
                                     capture_output=True, text=True, env=env, timeout=120)
            assert restore.returncode == 0, restore.stdout + restore.stderr
            after = {}
            for node in cfg.nodes:
                with grpc.insecure_channel(node.address) as channel:
                    reply = pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b'{"op": "balance"}'), timeout=30)
                after[node.id] = json.loads(reply.reply)["balance"]
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    export = json.loads((cfg.data_dir / "snapshots" / f"{chosen.snapshot_id}.json").read_text())
    yield snapshots, shown.stdout, restore.stdout, chosen, after, export


def test_every_snapshot_carries_the_banks_figures_read_from_its_bytes(bank):
    snapshots, *_ = bank
    for snapshot in snapshots:
        figures_agree(snapshot)


def test_the_export_and_the_list_keep_the_banks_fields(bank):
    _, listed, _, chosen, _, export = bank
    assert export["total"] == export["expected_total"] == str(NODES * INITIAL) and export["conserved"] is True
    assert [n["balance"] for n in export["nodes"]] == [str(n.balance) for n in chosen.nodes]
    items = [t for c in export["channels"] for t in c["in_flight"]]
    assert [t["amount"] for t in items] == [str(t.amount) for c in chosen.channels for t in c.in_flight]
    assert re.search(r"^snapshot\s.*\stotal\s+conserved\s+reason$", listed, re.M), listed
    assert re.search(rf"^{chosen.snapshot_id}\s+COMPLETE\s.*\s{NODES * INITIAL}\s+yes\s*$", listed, re.M), listed


def test_the_restore_answers_each_nodes_balance_after_it(bank):
    *_, restored, chosen, after, _ = bank
    replayed = {n.node_id: 0 for n in chosen.nodes}
    for channel in chosen.channels:
        replayed[channel.dst] += sum(t.amount for t in channel.in_flight)
    expected = {n.node_id: n.balance + replayed[n.node_id] for n in chosen.nodes}
    assert after == expected  # what the nodes hold is what the restore says
    rows = dict(re.findall(r"^(n\d+|p\d+)\s+(\d+)$", restored, re.M))
    assert {k: int(v) for k, v in rows.items()} == expected, restored
    assert re.search(rf"^total\s+{NODES * INITIAL}$", restored, re.M), restored


def test_some_snapshot_caught_transfers_in_flight(bank):
    # the amounts are read from payloads only if some were recorded: under load, with 15 snapshots, they are
    snapshots, *_ = bank
    assert sum(len(c.in_flight) for s in snapshots for c in s.channels) > 0
