"""The Grafana dashboard and the alerts against a real Prometheus: every PromQL
expression in deploy/compose/grafana/dashboards/snapmesh.json returns data, and
every alert of deploy/compose/rules.yml evaluates on the real scrape.

Starts a 4-node cluster on free loopback ports (the supervisor), Debian's
Prometheus on loopback scraping it every second (apt-get installs it when
missing), drives transfers and snapshots with `snapmesh app`, then evaluates
each expression through Prometheus' HTTP API.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from support.helpers_deploy import (
    COMPOSE_DIR,
    DASHBOARD,
    SNAPMESH,
    RULES,
    dashboard_exprs,
    log,
    prometheus_bin,
    start_prometheus,
    status_name,
    trigger_snapshot,
)
from support.polling import wait_for
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster

pytestmark = pytest.mark.cluster

# What issues 5 and 25 ask the dashboard to show: (words in a panel title, metric its queries use).
REQUIRED_PANELS = [
    ("messages per second", "snapmesh_messages_sent_total"),  # every app's, as the two below
    ("messages per second", "snapmesh_messages_received_total"),
    ("refused commands", "snapmesh_commands_refused_total"),
    ("transfers per second", "snapmesh_transfers_sent_total"),
    ("balances", "snapmesh_balance"),
    ("snapshot duration", "snapmesh_snapshot_duration_seconds_bucket"),
    ("completed and failed", "snapmesh_snapshots_total"),
    ("markers per second", "snapmesh_markers_sent_total"),
    ("recorded in-flight", "snapmesh_channel_recorded_messages_total"),
    ("unacknowledged", "snapmesh_channel_unacked_messages"),
    ("fsync latency", "snapmesh_log_fsync_seconds_bucket"),
    ("reconnects", "snapmesh_channel_reconnects_total"),
    ("stream errors", "snapmesh_channel_stream_errors_total"),
    ("refused transfers", "snapmesh_transfers_refused_total"),
    ("up", "up{"),
    ("cpu", "process_cpu_seconds_total"),
    ("memory", "process_resident_memory_bytes"),
    ("since the last complete", "snapmesh_last_complete_snapshot_timestamp_seconds"),
]
# The alerts deploy/compose/rules.yml must hold: an operator pages on these.
REQUIRED_ALERTS = {
    "SnapmeshNoCompleteSnapshot": "snapmesh_last_complete_snapshot_timestamp_seconds",
    "SnapmeshNodeDown": 'up{job="snapmesh-nodes"}',
    "SnapmeshSnapshotsFailing": 'snapmesh_snapshots_total{status="FAILED"}',
    "SnapmeshFsyncSlow": "snapmesh_log_fsync_seconds_bucket",
}


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_json_has_the_panels_issues_5_and_25_list():
    dashboard = load_dashboard()
    assert dashboard["uid"] == "snapmesh"
    datasource_yml = (COMPOSE_DIR / "grafana/provisioning/datasources/prometheus.yml").read_text()
    provider_yml = (COMPOSE_DIR / "grafana/provisioning/dashboards/snapmesh.yml").read_text()
    assert "uid: snapmesh-prometheus" in datasource_yml and "url: http://prometheus:9090" in datasource_yml
    assert "path: /var/lib/grafana/dashboards" in provider_yml
    # The datasource is a template variable, not a hard-coded uid: the dashboard imports into any Grafana.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "snapmesh-prometheus" not in DASHBOARD.read_text()
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    for words, metric in REQUIRED_PANELS:
        matching = [p for p in panels if re.search(rf"\b{re.escape(words)}\b", p["title"].lower())]
        assert matching, f"no panel titled like {words!r}"
        exprs = " ".join(t["expr"] for p in matching for t in p["targets"])
        assert metric in exprs, f"panel {words!r} does not query {metric}"
    balance_exprs = [t["expr"] for p in panels if "balances" in p["title"].lower() for t in p["targets"]]
    assert "sum(snapmesh_balance)" in balance_exprs, "the balances panel needs the total line"
    assert "_ms_" not in DASHBOARD.read_text(), "durations are in seconds"


def test_rules_are_valid_for_promtool_and_hold_the_alerts_issue_25_lists():
    promtool = Path(prometheus_bin()).with_name("promtool")
    result = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {RULES.read_text().count('- alert: ')} rules found" in result.stdout, result.stdout
    prometheus_yml = (COMPOSE_DIR / "prometheus.yml").read_text()
    assert "rule_files:\n  - rules.yml" in prometheus_yml
    assert "./rules.yml:/etc/prometheus/rules.yml:ro" in (COMPOSE_DIR / "docker-compose.yml").read_text()
    text = RULES.read_text()
    for alert, metric in REQUIRED_ALERTS.items():
        assert f"- alert: {alert}\n" in text, alert
        block = text.split(f"- alert: {alert}\n", 1)[1].split("- alert:", 1)[0]
        assert metric in block, (alert, metric)


def test_prometheus_yml_is_valid_for_promtool():
    promtool = Path(prometheus_bin()).with_name("promtool")
    result = subprocess.run([str(promtool), "check", "config", str(COMPOSE_DIR / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def cluster_and_prometheus(tmp_path_factory):
    """A 4-node cluster, a Prometheus scraping it every second with the alerts of
    rules.yml, and a load: `snapmesh app` (transfers, a snapshot every second) and
    three snapshots through the API."""
    tmp_path = tmp_path_factory.mktemp("dashboard")
    cluster = Cluster(write_cluster(tmp_path / "cluster" / "cluster.toml", nodes=4, data_dir=tmp_path / "cluster" / "data"))
    prometheus = None
    try:
        cluster.start()
        targets = {
            "snapmesh-controller": [cluster.config.controller.metrics_address],
            "snapmesh-nodes": [n.metrics_address for n in cluster.config.nodes],
        }
        prometheus = start_prometheus(targets, tmp_path, rule_files=[RULES])
        # Every target scraped at least once (Prometheus' first scrape can take ~12 s).
        wanted = 1 + len(cluster.node_ids)
        wait_for(
            lambda: len([s for s in prometheus.query("up == 1")]) == wanted,
            timeout=60,
            interval=1,
            what=f"{wanted} targets up in prometheus", retry_on=(Exception,),
        )
        log(f"prometheus scrapes all {wanted} targets")
        # Load and snapshots: the app moves money and snapshots every second...
        app = subprocess.run(
            [SNAPMESH, "app", "--controller", cluster.controller_address, "--duration", "12",
             "--transfer-interval", "0.05", "--snapshot-every", "1", "--seed", "5"],
            capture_output=True, text=True, timeout=90,
        )
        assert app.returncode == 0, app.stdout[-3000:] + app.stderr[-3000:]
        # ... and a few more through the controller's API.
        for _ in range(3):
            snapshot = trigger_snapshot(cluster.controller_address, wait=True, timeout=30)
            assert status_name(snapshot) == "COMPLETE" and snapshot.conserved, snapshot
        yield cluster, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()


def finite_values(result: list[dict]) -> list[float]:
    values = []
    for series in result:
        samples = [series["value"]] if "value" in series else series.get("values", [])
        values += [float(v) for _, v in samples if math.isfinite(float(v))]
    return values


@pytest.mark.timeout(240)
def test_every_dashboard_expression_returns_data(cluster_and_prometheus):
    cluster, prometheus = cluster_and_prometheus
    exprs = dashboard_exprs(load_dashboard())
    assert len(exprs) >= 7

    empty = {}

    def all_return_data() -> bool:
        empty.clear()
        for title, expr in exprs:
            result = prometheus.query(expr)
            if not finite_values(result):
                empty[expr] = (title, result)
        return not empty

    try:
        wait_for(all_return_data, timeout=30, interval=1, what="every dashboard expression to return data", retry_on=(Exception,))
    except TimeoutError:
        pytest.fail("dashboard expressions without data:\n" + "\n".join(
            f"  [{title}] {expr} -> {result}" for expr, (title, result) in empty.items()))

    # The total of the balances is the flat line: once nothing is in flight it is exact.
    expected = 1000 * len(cluster.node_ids)
    wait_for(
        lambda: finite_values(prometheus.query("sum(snapmesh_balance)")) == [expected],
        timeout=20,
        interval=1,
        what=f"sum(snapmesh_balance) == {expected} after the load stopped", retry_on=(Exception,),
    )


SIGNAL = re.compile(r"^(?P<signal>.+?)\s*(?:>|<|==|!=|>=|<=)\s*[-+0-9.e]+$", re.S)


@pytest.mark.timeout(180)
def test_every_alert_evaluates_against_the_scrape_and_a_node_down_fires(cluster_and_prometheus):
    cluster, prometheus = cluster_and_prometheus
    # Prometheus loaded the rules file and evaluates each alert without error...
    rules = wait_for(
        lambda: [r for g in prometheus.api("/api/v1/rules")["groups"] for r in g["rules"] if r.get("lastEvaluation", "")
                 and not r["lastEvaluation"].startswith("0001")],
        timeout=30, interval=1, what="the rules evaluated once", retry_on=(Exception,),
    )
    by_name = {r["name"]: r for r in rules}
    assert set(REQUIRED_ALERTS) <= set(by_name), sorted(by_name)
    for rule in by_name.values():
        assert rule["type"] == "alerting" and rule["health"] == "ok" and not rule.get("lastError"), rule
    # ... on series that exist: each alert's signal (its expression without the
    # threshold) returns a finite value from the real scrape.
    for name, rule in by_name.items():
        match = SIGNAL.match(rule["query"].strip())
        assert match, f"{name}: expected `<signal> <comparison> <threshold>`, got {rule['query']!r}"
        values = finite_values(prometheus.query(match["signal"]))
        assert values, f"{name}: {match['signal']} returns no data"
    # A healthy cluster with a fresh COMPLETE snapshot: neither of these is even pending.
    active = {a["labels"]["alertname"] for a in prometheus.api("/api/v1/alerts")["alerts"]}
    assert not active & {"SnapmeshNoCompleteSnapshot", "SnapmeshNodeDown", "SnapmeshControllerDown"}, active

    # A node down: the alert becomes pending (its `for` is a minute), naming the node's instance.
    cluster.stop_node("p4")
    instance = cluster.config.node("p4").metrics_address

    def node_down_alert():
        return [a for a in prometheus.api("/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == "SnapmeshNodeDown" and a["labels"].get("instance") == instance]

    alerts = wait_for(node_down_alert, timeout=30, interval=1, what="SnapmeshNodeDown for p4", retry_on=(Exception,))
    assert alerts[0]["state"] in ("pending", "firing"), alerts
