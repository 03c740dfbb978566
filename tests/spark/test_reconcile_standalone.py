"""The job on a real Spark standalone cluster: a master and two workers as processes.

`snapmesh reconcile --master spark://127.0.0.1:PORT` (a separate driver process)
must give the verdicts local mode gives, on segmented logs partly converted to
Parquet and with a corruption, so both the checksums and the exact joins run on
the cluster. The cluster stops cleanly: no process, no port left. An unreachable
master is bad input within the bounded wait, never a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from snapmesh.settings.ports import free_ports, port_is_free
from snapmesh.reconcile import ingest
from snapmesh.synth import writer as synth
from snapmesh.reconcile import job as reconcile
from snapmesh.spark.standalone import StandaloneCluster
from support.spark_fixtures import spark  # noqa: F401
from support.spark_data import SIZE, split_logs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def snapmesh_reconcile(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    return subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "reconcile", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_standalone_cluster_gives_the_verdicts_of_local_mode(spark, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    made = synth.generate(str(data), corrupt="missing-inflight", **SIZE)
    split_logs(data)
    ingest.ingest(spark, str(data))
    local = reconcile.reconcile(spark, str(data))
    assert local.exit_status == 1

    with StandaloneCluster(workers=2, cores=1, memory="1g") as cluster:
        procs = list(cluster.procs)
        run = snapmesh_reconcile("--data-dir", str(data), "--out", str(tmp_path / "out"), "--master", cluster.url)
    assert run.returncode == 1, run.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdicts"] == local.verdicts
    assert made.detail["msg_id"] in run.stdout

    assert all(p.returncode is not None for p in procs)  # every JVM exited
    assert port_is_free("127.0.0.1", cluster.port) and port_is_free("127.0.0.1", cluster.webui_port)
    assert not cluster.scratch.exists()


def test_an_unreachable_master_exits_2_within_the_bounded_wait(tmp_path):
    synth.generate(str(tmp_path / "data"), **SIZE)
    (port,) = free_ports(1)
    started = time.monotonic()
    run = snapmesh_reconcile(
        "--data-dir", str(tmp_path / "data"), "--master", f"spark://127.0.0.1:{port}", "--master-timeout", "2", timeout=60
    )
    assert run.returncode == 2
    assert f"Spark master spark://127.0.0.1:{port} unreachable" in run.stderr
    assert time.monotonic() - started < 30
