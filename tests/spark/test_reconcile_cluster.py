"""End to end: the Spark job on the logs and snapshots of a real cluster run.

A 4-node cluster runs under load with overlapping snapshots from every
initiator; one node is SIGKILLed and restarted on its log midway (so the logs
hold `restart` records, resends and an abandoned snapshot). Then the job must
find every COMPLETE snapshot consistent, and a deliberately damaged copy of the
same data must be caught. Each run twice: a cluster file without [app] (the bank, the
default app) and one naming `snapmesh.services.app.bank:app`; either way balances are
state bytes and amounts payloads, whose conservation the job reads through the app's describe.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import shutil

import pytest
from google.protobuf import json_format

from support.cluster_helpers import controller_stub
from support.polling import WaitTimedOut, wait_for
from snapmesh.checking.logcheck import check_logs
import snapmesh.bank.logs as bank_logs
from snapmesh.checking.node_logs import read_logs
from snapmesh.settings.config import write_cluster
from snapmesh.load.background import BackgroundLoad
from snapmesh.reconcile.job import format_table, reconcile
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from support.spark_fixtures import spark  # noqa: F401  (the session-wide fixture)

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(300)]

# How the cluster file names the bank: not at all (the default app), or by its module.
BANKS = {"default": None, "bank-app": "snapmesh.services.app.bank:app"}


@pytest.fixture(scope="module", params=sorted(BANKS))
def bank(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory, bank):
    """The data dir of a finished cluster run and the snapshots it produced."""
    root = tmp_path_factory.mktemp("reconcile-e2e")
    config = write_cluster(root / "cluster.toml", nodes=4, initial_balance=1000, deadline=5)
    snapshots: list[pb.Snapshot] = []
    with Cluster(config, app=BANKS[bank]) as cluster:
        channel, stub = controller_stub(cluster.controller_address)
        with channel, BackgroundLoad.for_cluster(cluster, batch=50, max_amount=30, interval=0.01):
            for round_ in range(3):
                for initiator in cluster.node_ids:  # overlapping: none is waited for
                    snapshots.append(stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator=initiator), timeout=10))
                if round_ == 1:
                    cluster.restart_node("p3", kill=True)
            snapshots.append(stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30))
            # Every snapshot finishes (COMPLETE, or FAILED at its deadline) before the stop.
            for snapshot in snapshots:
                request = pb.GetSnapshotRequest(snapshot_id=snapshot.snapshot_id)
                wait_for(lambda request=request: stub.GetSnapshot(request, timeout=5),
                         until=lambda s: s.status != pb.Snapshot.IN_PROGRESS,
                         timeout=30, interval=0.1, what=f"snapshot {snapshot.snapshot_id} to finish")
    return cluster.config.data_dir


def test_every_complete_snapshot_of_a_real_run_is_consistent(spark, cluster_run):  # noqa: F811
    data_dir = cluster_run
    files = sorted((data_dir / "snapshots").glob("*.json"))
    documents = [json.loads(f.read_text()) for f in files]
    complete = {d["snapshot_id"] for d in documents if d["status"] == "COMPLETE"}
    assert len(complete) >= 5, f"too few COMPLETE snapshots to mean anything: {len(complete)}"
    assert "restart" in (data_dir / "p3.log.jsonl").read_text(), "the restart left no trace in the log"

    outcome = reconcile(spark, str(data_dir))
    assert outcome.exit_status == 0, outcome.verdicts
    checked = {v["snapshot_id"] for v in outcome.verdicts if v["scope"] == "snapshot" and v["consistent"] is True}
    assert checked == complete
    assert all(v["consistent"] is not False for v in outcome.verdicts)
    # conservation: every COMPLETE snapshot holds the 4000 the nodes started with (the
    # bank app's describe of its states and payloads)
    totals = {(v["expected_total"], v["observed_total"]) for v in outcome.verdicts if v["snapshot_id"] in complete
              and v["scope"] == "snapshot"}
    assert totals == {(4000, 4000)}, outcome.verdicts

    # The verdict table's "in flight" column (the demo's snapshot with money in
    # flight, shown consistent): what each snapshot recorded, counted by the job.
    recorded = {
        d["snapshot_id"]: (sum(len(c.get("in_flight", [])) for c in d.get("channels", [])),
                           sum(int(t["amount"]) for c in d.get("channels", []) for t in c.get("in_flight", [])))
        for d in documents if d["status"] == "COMPLETE"
    }
    assert {sid: outcome.in_flight.get(sid) for sid in recorded} == recorded
    busiest = max(recorded, key=lambda sid: recorded[sid][0])
    assert recorded[busiest][0] > 0, "no snapshot of this run recorded money in flight"
    [row] = [line for line in format_table(outcome.verdicts, outcome.in_flight).splitlines() if line.startswith(busiest)]
    assert "  ok  " in row and f"  {recorded[busiest][0]} ({recorded[busiest][1]})  " in row, row


def test_the_same_run_passes_the_test_suites_own_log_checker(cluster_run, bank):
    """The tests' checker (snapmesh/checking/logcheck.py), independent of the Spark job, on the
    same logs: a SIGKILL and restart, resends and abandoned snapshots included."""
    if bank != "default":
        pytest.skip("the pure log checker reads the bank's tallies (snapmesh.bank.logs); an app's log has none")
    snapshots = [json_format.Parse(f.read_text(), pb.Snapshot()) for f in sorted((cluster_run / "snapshots").glob("*.json"))]
    complete = [s for s in snapshots if s.status == pb.Snapshot.COMPLETE]
    logs = read_logs(cluster_run, [n.node_id for n in complete[0].nodes])
    report = check_logs(logs, complete, channels=[(c.src, c.dst) for c in complete[0].channels], total=4000,
                        app=bank_logs)
    assert report.transfers > 0 and set(report.snapshots) >= {s.snapshot_id for s in complete}


def test_a_damaged_copy_of_the_same_run_is_caught(spark, cluster_run, bank, tmp_path):  # noqa: F811
    data_dir = cluster_run
    copy = tmp_path / "damaged"
    shutil.copytree(data_dir, copy, ignore=shutil.ignore_patterns("logs", "reconcile"))
    victim = next(
        f for f in sorted((copy / "snapshots").glob("*.json")) if json.loads(f.read_text())["status"] == "COMPLETE"
    )
    snapshot = json.loads(victim.read_text())
    node = snapshot["nodes"][1]
    node["balance"] = str(int(node["balance"]) + 1)  # proto JSON: int64 as a string
    # One more unit in the node's state, every digest made to agree (the export's and
    # its cut record's): only the bank's conservation, read by its describe, can see it.
    state = node["balance"].encode()
    node["state"] = base64.b64encode(state).decode()
    node["state_digest"] = "sha256:" + hashlib.sha256(state).hexdigest()
    redigest_cut(copy, node["node_id"], snapshot["snapshot_id"], hashlib.sha256(state).hexdigest())
    victim.write_text(json.dumps(snapshot))

    outcome = reconcile(spark, str(copy))
    assert outcome.exit_status == 1
    [verdict] = [v for v in outcome.verdicts if v.get("snapshot_id") == snapshot["snapshot_id"]]
    assert verdict["consistent"] is False
    assert verdict["first_discrepancy"] == "bank's describe: total 4001, expected_total 4000", verdict
    assert (verdict["expected_total"], verdict["observed_total"], verdict["discrepancies"]) == (4000, 4001, 2)


def redigest_cut(data_dir, node: str, snapshot_id: str, digest: str) -> None:  # noqa: ANN001
    """Set the digest of `node`'s cut record for `snapshot_id` in its active log."""
    log = data_dir / f"{node}.log.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        record = json.loads(line)
        if record["kind"] == "cut" and record["snapshot_id"] == snapshot_id:
            lines[i] = line.replace(record["digest"], digest)
            break
    else:
        raise AssertionError(f"no cut record of {snapshot_id} in {log}")
    log.write_text("".join(lines))


@pytest.fixture(scope="module")
def restored_run(tmp_path_factory, bank):
    """The data dir of a 3-node run under load with two restores (epochs 1, 2 and 3)."""
    config = write_cluster(tmp_path_factory.mktemp("reconcile-restores") / "cluster.toml", nodes=3, deadline=5)
    with Cluster(config, app=BANKS[bank]) as cluster:
        channel, stub = controller_stub(cluster.controller_address)
        with channel, BackgroundLoad.for_cluster(cluster, batch=20, interval=0.01) as load:

            def snapshot() -> pb.Snapshot:
                done = load.stats.accepted
                with contextlib.suppress(WaitTimedOut):  # load in between (up to a minute of it)
                    wait_for(lambda: load.stats.accepted, until=lambda n: n >= done + 100, timeout=60, interval=0.05,
                             what="100 more transfers before the snapshot")
                taken = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=60)
                assert taken.status == pb.Snapshot.COMPLETE, taken.reason
                return taken

            first, second = snapshot(), snapshot()
            for target in (second, first):  # epoch 2 from the newer one, epoch 3 from the older one
                answer = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=target.snapshot_id), timeout=90)
                assert answer.status == pb.Restore.RESTORED, answer.reason
                snapshot()
    return cluster.config.data_dir


def test_a_run_with_two_restores_is_consistent_epoch_by_epoch(spark, restored_run):  # noqa: F811
    documents = [json.loads(f.read_text()) for f in sorted((restored_run / "snapshots").glob("*.json"))]
    complete = {d["snapshot_id"] for d in documents if d["status"] == "COMPLETE"}
    assert {d.get("epoch", "1") for d in documents} >= {"1", "2", "3"}

    outcome = reconcile(spark, str(restored_run))
    assert outcome.exit_status == 0, outcome.verdicts
    checked = {v["snapshot_id"] for v in outcome.verdicts if v["scope"] == "snapshot" and v["consistent"] is True}
    assert checked == complete
    restores = [v for v in outcome.verdicts if v["scope"] == "restore"]
    assert [(v["status"], v["consistent"]) for v in restores] == [("epoch 2", True), ("epoch 3", True)]
    totals = {(v["expected_total"], v["observed_total"]) for v in outcome.verdicts if v["snapshot_id"] in complete
              and v["scope"] == "snapshot"}
    assert totals == {(3000, 3000)}, outcome.verdicts
