"""An app's cluster speaks in the app's words, never the bank's (issue 46, "What a user reads").

A three-node kvshard cluster started by `snapmesh cluster up --app kvshard`
(real processes), driven for a moment by `snapmesh app --app kvshard` (keys put
and moved between nodes), then one snapshot and `snapmesh restore` to it. The
`cluster up` banner names the app; the restore prints the app's view (each
node's recorded state and the messages replayed to it, the invariants, the
describe); the node logs say what each node recorded without a balance; and none
of these names a balance, an amount, money or `conserved`. The nodes' metrics
count the app's messages (snapmesh_messages_*), not the bank's transfers.
"""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.request

import grpc
import pytest

from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.ring import CLI, env_with, wait_serving

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

BANK_WORDS = re.compile(r"\b(balances?|amounts?|money|conserved)\b", re.IGNORECASE)


def bank_words(text: str) -> list[str]:
    """The lines of `text` that name a bank word."""
    return [line for line in text.splitlines() if BANK_WORDS.search(line)]


def counted(text: str, name: str) -> float:
    """The sum of every sample of counter `name` in a scrape."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """The cluster's outputs: (banner stderr, restore stdout, node logs, the nodes' scrapes)."""
    data = tmp_path_factory.mktemp("words")
    env = env_with()
    with open(data / "cluster-up.err", "w") as err:
        process = subprocess.Popen([*CLI, "cluster", "up", "--nodes", "3", "--data-dir", str(data), "--ui", "off",
                                    "--app", "kvshard"], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        try:
            first = process.stdout.readline()
            assert first.startswith("controller: "), (first, (data / "cluster-up.err").read_text())
            cfg = config.load(data / "cluster.toml", env={})
            for node in cfg.nodes:
                wait_serving(node.address)
            drive = subprocess.run([*CLI, "app", "--app", "kvshard", "--data-dir", str(data), "--duration", "2",
                                    "--snapshot-every", "0", "--seed", "7"], capture_output=True, text=True, env=env,
                                   timeout=120)
            assert drive.returncode == 0, drive.stdout[-2000:] + drive.stderr
            with grpc.insecure_channel(cfg.controller.address) as channel:
                taken = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
            assert taken.status == pb.Snapshot.COMPLETE, taken.reason
            restore = subprocess.run([*CLI, "restore", "--yes", "--data-dir", str(data), taken.snapshot_id],
                                     capture_output=True, text=True, env=env, timeout=120)
            assert restore.returncode == 0, restore.stdout + restore.stderr
            scrapes = {n.id: urllib.request.urlopen(f"http://{n.metrics_address}/metrics", timeout=5).read().decode()
                       for n in cfg.nodes}
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    logs = {n.id: (cfg.data_dir / "logs" / f"{n.id}.log").read_text() for n in cfg.nodes}
    yield (data / "cluster-up.err").read_text(), restore.stdout, logs, scrapes


def test_the_outputs_of_an_app_cluster_name_the_app_and_no_bank_words(shard):
    banner, restored, logs, _ = shard
    assert "starting 3 nodes of app kvshard (snapmesh.services.app.kvshard:app)" in banner, banner
    assert re.search(r"^snapshot \S+  epoch 2  RESTORED$", restored, re.M), restored
    assert re.search(r"^app kvshard \(kvshard version \d+\)$", restored, re.M), restored
    assert re.search(r"^invariant\s+verdict$", restored, re.M) and "describe" in restored, restored
    assert re.search(r"^node\s+epoch\s+state bytes\s+messages replayed$", restored, re.M), restored
    for node, text in logs.items():
        assert re.search(r"recorded local state \(app state sha256:[0-9a-f]{16}\)", text), (node, text[-2000:])
    said = {"banner": bank_words(banner), "restore": bank_words(restored),
            **{f"log {node}": bank_words(text) for node, text in logs.items()}}
    assert not any(said.values()), said


def test_the_metrics_count_the_apps_messages(shard):
    scrapes = shard[3].values()
    assert sum(counted(s, "snapmesh_messages_sent_total") for s in scrapes) >= 1
    assert sum(counted(s, "snapmesh_messages_received_total") for s in scrapes) >= 1
    assert sum(counted(s, "snapmesh_transfers_sent_total") + counted(s, "snapmesh_transfers_received_total")
               for s in scrapes) == 0  # the bank's transfer counters stay the bank's
