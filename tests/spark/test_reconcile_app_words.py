"""`snapmesh reconcile`'s table of a kvshard cluster speaks the app's words, not the bank's.

Three kvshard nodes (`snapmesh cluster up --app kvshard`, real processes) are
driven by `snapmesh app --app kvshard` with snapshots under load; then the Spark
job (local mode, with the app's SQL invariant) reads their logs and exports. The
export of an app snapshot has no `total` (snapmesh/protocol/appstate.py V3), so
its rows show no expected or observed total ("-") and its in-flight column the
number of messages without an amount; every row is consistent, the invariant
holds, and the table names no balance, amount, money or `conserved`.
"""

from __future__ import annotations

import re
import signal
import subprocess

import pytest

from snapmesh.app import load_app
from snapmesh.reconcile.job import run_job
from snapmesh.settings import config
from support.ring import CLI, env_with, wait_serving
from support.spark_fixtures import spark  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]

BANK_WORDS = re.compile(r"\b(balances?|amounts?|money|conserved)\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def shard_data(tmp_path_factory):
    """The data dir of a finished kvshard run with COMPLETE snapshots."""
    data = tmp_path_factory.mktemp("kv-reconcile")
    env = env_with()
    with open(data / "cluster-up.err", "w") as err:
        process = subprocess.Popen([*CLI, "cluster", "up", "--nodes", "3", "--data-dir", str(data), "--ui", "off",
                                    "--app", "kvshard"], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        try:
            first = process.stdout.readline()
            assert first.startswith("controller: "), (first, (data / "cluster-up.err").read_text())
            for node in config.load(data / "cluster.toml", env={}).nodes:
                wait_serving(node.address)
            drive = subprocess.run([*CLI, "app", "--app", "kvshard", "--data-dir", str(data), "--duration", "3",
                                    "--snapshot-every", "0.5", "--seed", "5"], capture_output=True, text=True, env=env,
                                   timeout=120)
            assert drive.returncode == 0, drive.stdout[-2000:] + drive.stderr
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    return config.load(data / "cluster.toml", env={}).data_dir


def test_the_reconcile_table_of_kvshard_shows_no_totals_and_no_bank_words(spark, shard_data, tmp_path, capsys):  # noqa: F811
    status = run_job(spark, str(shard_data), str(tmp_path / "out"), app=load_app("kvshard"),
                     app_module="snapmesh.services.app.kvshard")
    table = capsys.readouterr().out
    assert status == 0, table
    head, _, *rows = table.splitlines()
    assert head.split()[:9] == ["snapshot", "status", "verdict", "nodes", "channels", "in", "flight", "expected",
                                "observed"], head
    complete = [r.split() for r in rows if re.match(r"^\d{8}T\S+\s+COMPLETE\s", r)]
    assert complete, table
    for cells in complete:
        # snapshot, status, verdict, nodes, channels, in flight (a count alone), expected, observed
        assert cells[2] == "ok" and re.fullmatch(r"\d+", cells[5]) and cells[6:8] == ["-", "-"], (cells, table)
    assert re.search(r"holds\s", table), table  # the app's invariant's row
    assert not [line for line in table.splitlines() if BANK_WORDS.search(line)], table
