"""An app's cluster speaks in the app's words, never the bank's ("What a user reads").

A three-node kvshard cluster started by `snapmesh cluster up --app kvshard`
(real processes, its page on a free port), watched by `snapmesh snapshot watch`,
driven for a moment by `snapmesh app --app kvshard` (keys put and moved between
nodes), then snapshots and `snapmesh restore` to one. The `cluster up` banner, the
watch, the load generator's output and the page name the app (the page and the
watch its name and version too, from GetCluster); the restore prints the app's
view (each node's recorded state and the messages replayed to it, the
invariants, the describe); `snapshot list` and `verify` show the invariants; the
export carries none of the bank's v1 figures; the node logs say what each node
recorded without a balance; and none of these, nor the controller's log or the
nodes' metrics, names a balance, an amount, money or `conserved`. The nodes count the app's messages and refused commands
(snapmesh_messages_*, snapmesh_commands_refused_total), export none of the
bank's series, and every dashboard panel that is not the bank's queries a metric
this cluster exports.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import snapmesh.bank.logs as bank_logs
from snapmesh.checking import node_logs
from snapmesh.protocol import wal
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.metrics_table import differences, documented, families, scrape
from support.polling import wait_for
from support.ring import CLI, env_with, wait_serving

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

BANK_WORDS = re.compile(r"\b(balances?|amounts?|money|conserved)\b", re.IGNORECASE)
KVSHARD = "kvshard (snapmesh.services.app.kvshard:app), kvshard version 1"  # how GetCluster's app reads
DASHBOARDS = [Path(__file__).resolve().parents[2] / "deploy" / path for path in
              ("compose/grafana/dashboards/snapmesh.json", "helm/snapmesh/files/snapmesh-dashboard.json")]


def bank_words(text: str) -> list[str]:
    """The lines of `text` that name a bank word."""
    return [line for line in text.splitlines() if BANK_WORDS.search(line)]


def counted(text: str, name: str) -> float:
    """The sum of every sample of counter `name` in a scrape."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def sample_names(text: str) -> set[str]:
    """Every sample name a scrape holds (a histogram's _bucket, _sum and _count, a counter's _total)."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


class Lines:
    """A process's stdout, its lines collected as they come."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # watch's Ctrl-C: exit 0
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(10)
        return self.process.returncode


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """What the cluster's user reads: the banner, the watch, the load's output, the page,
    the restore, the node logs, and the nodes' and controller's scrapes."""
    data = tmp_path_factory.mktemp("words")
    env = env_with()
    said: dict = {}
    with open(data / "cluster-up.err", "w") as err:
        process = subprocess.Popen([*CLI, "cluster", "up", "--nodes", "3", "--data-dir", str(data), "--ui",
                                    "127.0.0.1:0", "--app", "kvshard"], stdout=subprocess.PIPE, stderr=err, text=True,
                                   env=env)
        watch = None
        try:
            first = process.stdout.readline()
            assert first.startswith("controller: "), (first, (data / "cluster-up.err").read_text())
            up = [first]
            while not up[-1].startswith("ui: "):
                up.append(process.stdout.readline())
                assert up[-1], ("cluster up ended its output", up, (data / "cluster-up.err").read_text())
            page = up[-1].split("ui: ", 1)[1].strip().rstrip("/")
            cfg = config.load(data / "cluster.toml", env={})
            for node in cfg.nodes:
                wait_serving(node.address)
            watch = Lines(subprocess.Popen([*CLI, "snapshot", "watch", "--data-dir", str(data)], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, env=env))
            drive = subprocess.run([*CLI, "app", "--app", "kvshard", "--data-dir", str(data), "--duration", "2",
                                    "--snapshot-every", "0", "--seed", "7"], capture_output=True, text=True, env=env,
                                   timeout=120)
            assert drive.returncode == 0, drive.stdout[-2000:] + drive.stderr
            taken: list[pb.Snapshot] = []
            with grpc.insecure_channel(cfg.controller.address) as channel:
                controller = pb_grpc.ControllerStub(channel)

                def watched_complete() -> bool:
                    """Snapshots until the watch shows one COMPLETE (it may subscribe after the first)."""
                    assert watch.process.poll() is None, watch.lines
                    taken.append(controller.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
                    assert taken[-1].status == pb.Snapshot.COMPLETE, taken[-1].reason
                    return any(taken[-1].snapshot_id in line and " COMPLETE " in line for line in watch.lines)

                wait_for(watched_complete, timeout=90, interval=0.2, what="the watch to show a COMPLETE snapshot")
            assert watch.stop() == 0, watch.process.stderr.read()
            snapshot = taken[-1]
            said["page"] = get(page + "/")
            said["page snapshot"] = get(f"{page}/snapshot/{snapshot.snapshot_id}")
            for what, args in (("list", ["list"]), ("verify", ["verify", snapshot.snapshot_id])):
                shown = subprocess.run([*CLI, "snapshot", *args, "--data-dir", str(data)], capture_output=True,
                                       text=True, env=env, timeout=120)
                assert shown.returncode == 0, (what, shown.stdout + shown.stderr)
                said[what] = shown.stdout
            restore = subprocess.run([*CLI, "restore", "--yes", "--data-dir", str(data), snapshot.snapshot_id],
                                     capture_output=True, text=True, env=env, timeout=120)
            assert restore.returncode == 0, restore.stdout + restore.stderr
            scrapes = {n.id: scrape(n.metrics_address) for n in cfg.nodes}
            said["controller scrape"] = scrape(cfg.controller.metrics_address)
        finally:
            if watch is not None:
                watch.stop()
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    logs = {n.id: (cfg.data_dir / "logs" / f"{n.id}.log").read_text() for n in cfg.nodes}
    said.update(data_dir=cfg.data_dir, banner=(data / "cluster-up.err").read_text(), up="".join(up), watch="\n".join(watch.lines),
                app=drive.stdout, restore=restore.stdout, logs=logs, scrapes=scrapes, snapshot=snapshot,
                export=(cfg.data_dir / "snapshots" / f"{snapshot.snapshot_id}.json").read_text(),
                controller_log=(cfg.data_dir / "logs" / "controller.log").read_text())
    yield said


def test_the_outputs_of_an_app_cluster_name_the_app_and_no_bank_words(shard):
    banner, restored, logs = shard["banner"], shard["restore"], shard["logs"]
    assert "starting 3 nodes of app kvshard (snapmesh.services.app.kvshard:app)" in banner, banner
    assert re.search(r"^snapshot \S+  epoch 2  RESTORED$", restored, re.M), restored
    assert re.search(r"^app kvshard \(kvshard version \d+\)$", restored, re.M), restored
    assert re.search(r"^invariant\s+verdict$", restored, re.M) and "describe" in restored, restored
    assert re.search(r"^node\s+epoch\s+state bytes\s+messages replayed$", restored, re.M), restored
    for node, text in logs.items():
        assert re.search(r"recorded local state \(app state sha256:[0-9a-f]{16}\)", text), (node, text[-2000:])
    said = {"banner": bank_words(banner), "up": bank_words(shard["up"]), "restore": bank_words(restored),
            **{f"log {node}": bank_words(text) for node, text in logs.items()}}
    assert not any(said.values()), said


def test_the_transfer_logs_carry_no_balance_or_amount_and_still_read(shard):
    # Every record of every segment, the restore and its replays too: an app's records have no tally.
    logs = node_logs.read_logs(shard["data_dir"])
    assert len(logs) == 3, sorted(logs)
    kinds = {r["kind"] for records in logs.values() for r in records}
    assert {"init", "send", "recv", "cut", "restore"} <= kinds, kinds
    tallied = [r for records in logs.values() for r in records if {"balance", "amount"} & set(r)]
    assert not tallied, tallied[:5]
    assert node_logs.log_events(logs, bank_logs)  # the bank's reading: a missing tally is an app's 0
    for node in logs:
        for path in node_logs.log_files(shard["data_dir"], node):
            lines, _ = wal.split_lines(path.read_bytes(), str(path))
            assert all(wal.parse(raw, where, node_id=node) for where, raw in lines)


def test_list_verify_the_export_and_the_controller_log_show_the_invariants_and_no_bank_words(shard):
    sid = shard["snapshot"].snapshot_id
    listed, verified = shard["list"], shard["verify"]
    assert re.search(rf"^{sid}\s+COMPLETE\s.*\sok\s*$", listed, re.M), listed
    assert re.search(r"^snapshot\s.*\sinvariants\s+reason$", listed, re.M), listed
    assert re.search(r"^invariants\s+ok\s+1 of app \S*kvshard\S* held$", verified, re.M), verified
    export = json.loads(shard["export"])
    assert export["app"]["invariants"] and all(i["ok"] for i in export["app"]["invariants"]), export["app"]
    assert {"total", "expected_total", "conserved"}.isdisjoint(export), sorted(export)
    assert all("balance" not in n and n["state_digest"] for n in export["nodes"]), export["nodes"]
    items = [t for c in export["channels"] for t in c["in_flight"]]
    assert all("amount" not in t and "payload" in t for t in items), items
    assert f"snapshot {sid} COMPLETE in " in shard["controller_log"], shard["controller_log"][-2000:]
    said = {what: bank_words(shard[what]) for what in ("list", "verify", "export", "controller_log")}
    assert not any(said.values()), said


def test_the_watch_names_the_app_and_its_verdict_is_the_invariants(shard):
    watch = shard["watch"].splitlines()
    assert watch[0] == f"app {KVSHARD}: 3 nodes, epoch 1", watch
    assert watch[1].split() == ["snapshot", "status", "reported", "initiator", "epoch", "started", "(UTC)",
                                "duration", "invariants", "reason"], watch
    complete = [line for line in watch if shard["snapshot"].snapshot_id in line and " COMPLETE " in line]
    assert complete and complete[-1].split()[2] == "3/3" and complete[-1].split()[-1] == "ok", watch
    assert not bank_words(shard["watch"]), shard["watch"]


def test_the_load_generator_names_the_app_and_its_version(shard):
    out = shard["app"]
    assert out.startswith("kvshard workload: seed 7"), out[:300]
    assert out.splitlines()[1] == f"  app {KVSHARD}", out[:500]
    assert not bank_words(out), bank_words(out)


def test_the_page_names_the_app_and_its_version(shard):
    index, detail = shard["page"], shard["page snapshot"]
    assert f"<dt>app</dt><dd data-setting='app'>{KVSHARD}</dd>" in index, index[:3000]
    assert "<span id='app-version'>(kvshard version 1)</span>" in detail, detail[:3000]
    said = {"index": bank_words(re.sub(r"<[^>]+>", " ", index)),
            "snapshot": bank_words(re.sub(r"<[^>]+>", " ", detail))}
    assert not any(said.values()), said


def test_the_metrics_count_the_apps_messages_and_commands_and_none_of_the_banks(shard):
    scrapes = shard["scrapes"].values()
    assert sum(counted(s, "snapmesh_messages_sent_total") for s in scrapes) >= 1
    assert sum(counted(s, "snapmesh_messages_received_total") for s in scrapes) >= 1
    # The commands the app refused (kvshard: a key not there, a put of one there), as the load generator counted them.
    refused = int(re.search(r"commands: \d+ replies, (\d+) refused", shard["app"]).group(1))
    assert refused > 0 and sum(counted(s, "snapmesh_commands_refused_total") for s in scrapes) == refused, shard["app"]
    table = documented()
    for node, text in shard["scrapes"].items():
        # Exactly the table's every-node rows: none of the bank's (transfers, their refusals, the balance).
        assert not (problems := differences(table["node"], families(text))), f"{node}: {problems}"
        assert 'snapmesh_commands_refused_total{grpc_code="ABORTED",node="' in text, node  # at 0 from the start
        assert not bank_words(text), (node, bank_words(text))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.parts[-4] if "compose" in p.parts else "helm")
def test_every_dashboard_panel_but_the_banks_queries_what_this_cluster_exports(shard, path):
    exported = {node: sample_names(text) for node, text in shard["scrapes"].items()}
    controller = sample_names(shard["controller scrape"])
    panels = json.loads(path.read_text())["panels"]
    every_app = [p for p in panels if p["title"].endswith("(every app)")]
    assert len(every_app) >= 2, [p["title"] for p in panels]
    for panel in panels:
        names = {name for t in panel["targets"] for name in re.findall(r"\bsnapmesh_[a-z0-9_]+", t["expr"])}
        if panel["title"].endswith("(the bank)"):
            assert not any(names & got for got in exported.values()), (panel["title"], names)  # the bank's alone
            continue
        for name in names:
            by = [node for node, got in exported.items() if name in got] + (["controller"] if name in controller else [])
            assert by, f"panel {panel['title']!r} queries {name}, which nothing in an app's cluster exports"
            if panel in every_app:
                assert by == list(exported), f"panel {panel['title']!r}: {name} from {by} only"
