"""The Grafana dashboard against a real Prometheus: every PromQL expression in
deploy/compose/grafana/dashboards/snapmesh.json returns data.

Starts a 4-node cluster on free loopback ports (the supervisor), Debian's
Prometheus on loopback scraping it every second (apt-get installs it when
missing), drives transfers and snapshots with `snapmesh app`, then evaluates
each expression through Prometheus' HTTP API.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from helpers_deploy import (
    COMPOSE_DIR,
    DASHBOARD,
    SNAPMESH,
    dashboard_exprs,
    log,
    prometheus_bin,
    start_prometheus,
    status_name,
    trigger_snapshot,
    wait_for,
)
from snapmesh.config import write_cluster
from snapmesh.supervisor import Cluster

pytestmark = pytest.mark.cluster

# What issue 5 asks the dashboard to show: (words in a panel title, metric its queries use).
REQUIRED_PANELS = [
    ("transfers per second", "snapmesh_transfers_sent_total"),
    ("balances", "snapmesh_balance"),
    ("snapshot duration", "snapmesh_snapshot_duration_seconds_bucket"),
    ("completed and failed", "snapmesh_snapshots_total"),
    ("markers per second", "snapmesh_markers_sent_total"),
    ("recorded in-flight", "snapmesh_channel_recorded_messages_total"),
    ("unacknowledged", "snapmesh_channel_unacked_messages"),
]


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_json_has_the_panels_issue_5_lists():
    dashboard = load_dashboard()
    assert dashboard["uid"] == "snapmesh"
    datasource_yml = (COMPOSE_DIR / "grafana/provisioning/datasources/prometheus.yml").read_text()
    provider_yml = (COMPOSE_DIR / "grafana/provisioning/dashboards/snapmesh.yml").read_text()
    assert "uid: snapmesh-prometheus" in datasource_yml and "url: http://prometheus:9090" in datasource_yml
    assert "path: /var/lib/grafana/dashboards" in provider_yml
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"]["uid"] == "snapmesh-prometheus", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "snapmesh-prometheus", panel["title"]
    for words, metric in REQUIRED_PANELS:
        matching = [p for p in panels if words in p["title"].lower()]
        assert matching, f"no panel titled like {words!r}"
        exprs = " ".join(t["expr"] for p in matching for t in p["targets"])
        assert metric in exprs, f"panel {words!r} does not query {metric}"
    balance_exprs = [t["expr"] for p in panels if "balances" in p["title"].lower() for t in p["targets"]]
    assert "sum(snapmesh_balance)" in balance_exprs, "the balances panel needs the total line"


def test_prometheus_yml_is_valid_for_promtool():
    promtool = Path(prometheus_bin()).with_name("promtool")
    result = subprocess.run([str(promtool), "check", "config", str(COMPOSE_DIR / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def cluster_and_prometheus(tmp_path):
    cluster = Cluster(write_cluster(tmp_path / "cluster" / "cluster.toml", nodes=4, data_dir=tmp_path / "cluster" / "data"))
    prometheus = None
    try:
        cluster.start()
        targets = {
            "snapmesh-controller": [cluster.config.controller.metrics_address],
            "snapmesh-nodes": [n.metrics_address for n in cluster.config.nodes],
        }
        prometheus = start_prometheus(targets, tmp_path)
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

    # Every target scraped at least once (Prometheus' first scrape can take ~12 s).
    wanted = 1 + len(cluster.node_ids)
    wait_for(
        lambda: len([s for s in prometheus.query("up == 1")]) == wanted,
        timeout=60,
        interval=1,
        what=f"{wanted} targets up in prometheus",
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

    empty = {}

    def all_return_data() -> bool:
        empty.clear()
        for title, expr in exprs:
            result = prometheus.query(expr)
            if not finite_values(result):
                empty[expr] = (title, result)
        return not empty

    try:
        wait_for(all_return_data, timeout=30, interval=1, what="every dashboard expression to return data")
    except TimeoutError:
        pytest.fail("dashboard expressions without data:\n" + "\n".join(
            f"  [{title}] {expr} -> {result}" for expr, (title, result) in empty.items()))

    # The total of the balances is the flat line: once nothing is in flight it is exact.
    expected = 1000 * len(cluster.node_ids)
    wait_for(
        lambda: finite_values(prometheus.query("sum(snapmesh_balance)")) == [expected],
        timeout=20,
        interval=1,
        what=f"sum(snapmesh_balance) == {expected} after the load stopped",
    )
