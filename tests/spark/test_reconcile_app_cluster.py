"""`snapmesh reconcile --app` on a real token_ring cluster's logs and export.

Three nodes run examples/token_ring.py (`Cluster(app=...)`, real processes, real
gRPC) while a client passes the token as fast as the nodes answer; snapshots are
taken until one holds the token in flight. Then the Spark job, with the app's SQL
invariant, finds it all clean; and copies of the data dir, each doctored once, give
exactly the verdict they should: a second token in flight one "one token"
violation naming the snapshot, a changed payload a channel verdict, a changed state
digest a digest verdict. The same run on a Spark standalone cluster (the app's
module shipped to executors whose PYTHONPATH lacks it) gives local mode's verdicts.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from snapmesh.app import load_app
from snapmesh.processes.supervisor import Cluster
from snapmesh.reconcile.job import reconcile
from snapmesh.spark.standalone import StandaloneCluster
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.spark_fixtures import spark  # noqa: F401
from support.ring import APP, EXAMPLES, Passer, checked, env_with, in_flight

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory) -> tuple[Path, str]:
    """The data dir of a finished token_ring run, and a snapshot with the token in flight."""
    root = tmp_path_factory.mktemp("ring-reconcile")
    path = config.write_cluster(root / "cluster.toml", nodes=3)
    with Cluster(path, env=env_with(EXAMPLES), app=APP) as cluster:
        passer = Passer(cluster.config)
        controller = grpc.insecure_channel(cluster.controller_address)
        moving, taken = "", 0
        try:
            stub = pb_grpc.ControllerStub(controller)
            while taken < 8 or not moving:
                assert taken < 300, "300 snapshots and the token never in flight"
                snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
                checked(snapshot)
                taken += 1
                moving = moving or (snapshot.snapshot_id if in_flight(snapshot) else "")
        finally:
            passer.stop()
            controller.close()
        data = cluster.config.data_dir
    return Path(data), moving


@pytest.fixture(scope="module")
def ring_app():
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield load_app(APP)
    finally:
        sys.path.remove(str(EXAMPLES))


def doctored(ring_run, tmp_path, change) -> tuple[Path, str]:  # noqa: ANN001
    """A copy of the run's data dir with the in-flight snapshot's export changed by `change(document)`."""
    data, sid = ring_run
    copy = tmp_path / "data"
    shutil.copytree(data, copy, ignore=shutil.ignore_patterns("reconcile", "*.lock", "*.sock"))
    export = copy / "snapshots" / f"{sid}.json"
    document = json.loads(export.read_text())
    change(document)
    export.write_text(json.dumps(document, indent=2))
    return copy, sid


def carrying(document: dict) -> dict:
    """The channel of the export that holds the token in flight."""
    return next(c for c in document["channels"] if c.get("in_flight"))


def by_scope(outcome, scope: str) -> list[dict]:  # noqa: ANN001
    return [v for v in outcome.verdicts if v["scope"] == scope]


def test_a_token_ring_run_reconciles_clean_with_its_sql_invariant(spark, ring_run, ring_app):  # noqa: F811
    data, sid = ring_run
    documents = [json.loads(f.read_text()) for f in (data / "snapshots").glob("*.json")]
    complete = {d["snapshot_id"] for d in documents if d["status"] == "COMPLETE" and d.get("app", {}).get("spec") == APP}
    assert len(complete) >= 8 and sid in complete

    outcome = reconcile(spark, str(data), app=ring_app, app_module="token_ring")
    assert outcome.exit_status == 0, outcome.verdicts
    assert {v["snapshot_id"] for v in by_scope(outcome, "snapshot") if v["consistent"]} == complete
    assert [(v["consistent"], v["first_discrepancy"]) for v in by_scope(outcome, "invariant")] == [
        (True, f"invariant 'one token' holds in {len(complete)} snapshot(s)")]


def test_a_second_token_in_flight_is_one_invariant_verdict_naming_the_snapshot(spark, ring_run, ring_app, tmp_path):  # noqa: F811
    def second_token(document: dict) -> None:
        channel = next(c for c in document["channels"] if not c.get("in_flight"))
        channel["in_flight"] = [{"msg_id": f"{channel['src']}:{channel['dst']}:9999", "amount": "0", "seq": "9999",
                                 "payload": base64.b64encode(b"token").decode()}]

    data, sid = doctored(ring_run, tmp_path, second_token)
    outcome = reconcile(spark, str(data), app=ring_app, app_module="token_ring")
    assert outcome.exit_status == 1
    violations = [v for v in by_scope(outcome, "invariant") if v["consistent"] is False]
    assert len(violations) == 1, outcome.verdicts
    assert violations[0]["snapshot_id"] == sid
    assert violations[0]["first_discrepancy"].startswith(f"invariant 'one token' violated in snapshot {sid}: 1 row(s)")
    assert '"tokens": 2' in violations[0]["first_discrepancy"]
    # and the channel checks see a message nobody sent
    bad = [v for v in by_scope(outcome, "snapshot") if v["consistent"] is False]
    assert [v["snapshot_id"] for v in bad] == [sid] and "9999" in bad[0]["first_discrepancy"]


def test_a_changed_payload_is_a_channel_verdict(spark, ring_run, tmp_path):  # noqa: F811
    def other_payload(document: dict) -> None:
        carrying(document)["in_flight"][0]["payload"] = base64.b64encode(b"tokeN").decode()

    data, sid = doctored(ring_run, tmp_path, other_payload)
    outcome = reconcile(spark, str(data))
    assert outcome.exit_status == 1
    bad = [v for v in outcome.verdicts if v["consistent"] is False]
    assert [(v["scope"], v["snapshot_id"], v["discrepancies"]) for v in bad] == [("snapshot", sid, 1)]
    assert "payload sha256:" in bad[0]["first_discrepancy"] and "logged sha256:" in bad[0]["first_discrepancy"]


def test_a_changed_state_digest_is_a_digest_verdict(spark, ring_run, tmp_path):  # noqa: F811
    def other_digest(document: dict) -> None:
        document["nodes"][1]["state_digest"] = "sha256:" + "0" * 64

    data, sid = doctored(ring_run, tmp_path, other_digest)
    outcome = reconcile(spark, str(data))
    assert outcome.exit_status == 1
    bad = [v for v in outcome.verdicts if v["consistent"] is False]
    assert [(v["scope"], v["snapshot_id"], v["discrepancies"]) for v in bad] == [("snapshot", sid, 1)]
    node = json.loads((data / "snapshots" / f"{sid}.json").read_text())["nodes"][1]["node_id"]
    assert bad[0]["first_discrepancy"].startswith(f"node {node}: state digest sha256:000000000000, its cut record says")


def test_reconcile_app_on_a_standalone_cluster_gives_local_modes_verdicts(spark, ring_run, ring_app, tmp_path):  # noqa: F811
    data, _ = ring_run
    local = reconcile(spark, str(data), app=ring_app, app_module="token_ring")
    # The driver finds the app in its working directory; the workers' executors only by the shipped file.
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    with StandaloneCluster(workers=1, cores=1, memory="1g") as cluster:
        run = subprocess.run(
            [sys.executable, "-m", "snapmesh.cli", "reconcile", "--data-dir", str(data), "--app", APP,
             "--verdicts-dir", str(tmp_path / "out"), "--master", cluster.url],
            capture_output=True, text=True, env=env, cwd=EXAMPLES, timeout=400,
        )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdicts"] == local.verdicts
    assert "holds" in run.stdout and "one token" in run.stdout
