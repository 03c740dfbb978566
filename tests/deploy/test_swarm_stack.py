"""The Swarm stack files deploy/compose/generate.py writes (no Docker needed; the
stack runs on the real engine in tests/deploy/test_swarm.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ruamel.yaml import YAML

from support.helpers_deploy import COMPOSE_DIR


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    out = tmp_path_factory.mktemp("stack")
    subprocess.run([sys.executable, str(COMPOSE_DIR / "generate.py"), "--nodes", "5", "--hosts", "3", "--out", str(out)],
                   check=True, capture_output=True, timeout=60)
    yaml = YAML(typ="safe")
    return {name: yaml.load((out / name).read_text()) for name in ("docker-stack.yml", "docker-stack.monitoring.yml")}


def constraint(service: dict) -> list[str]:
    return service["deploy"]["placement"]["constraints"]


def test_hosts_spread_the_nodes_by_label_and_keep_the_rest_on_h1(spread):
    services = spread["docker-stack.yml"]["services"]
    expected = {"p1": "h1", "p2": "h2", "p3": "h3", "p4": "h1", "p5": "h2"}
    for node, host in expected.items():
        assert constraint(services[node]) == [f"node.labels.snapmesh.host == {host}"]
        assert services[node]["volumes"] == [f"{node}-data:/data"]
        assert services[node]["deploy"]["restart_policy"]["condition"] == "on-failure"
    for service in ("controller", "app", "ui"):
        assert constraint(services[service]) == ["node.labels.snapmesh.host == h1"]
    monitoring = spread["docker-stack.monitoring.yml"]["services"]
    assert all(constraint(monitoring[s]) == ["node.labels.snapmesh.host == h1"] for s in ("prometheus", "grafana"))


def test_secrets_are_external_and_each_process_gets_its_own_key_only(spread):
    stack = spread["docker-stack.yml"]
    assert all(s["external"] is True and s["name"].startswith("${SNAPMESH_STACK:-snapmesh}-")
               for s in stack["secrets"].values())
    assert "ca-key.pem" not in stack["secrets"]
    for name, service in stack["services"].items():
        keys = {s["source"] for s in service["secrets"] if s["source"].endswith("-key.pem")}
        own = f"{name}-key.pem" if name not in ("app", "ui") else "client-key.pem"
        assert keys == {own}, (name, keys)  # no node or controller holds the client's key
        targets = {s["target"]: s["source"] for s in service["secrets"]}
        assert targets["client-key.pem"] == own  # a server's healthcheck presents its own pair
    assert stack["networks"]["mesh"]["driver"] == "overlay"
    ports = stack["services"]["controller"]["ports"]
    assert ports[0]["target"] == 50050 and ports[0]["mode"] == "host"
    # The page only reads: the client's pair, no token.
    assert {s["target"] for s in stack["services"]["ui"]["secrets"]} == {"ca.pem", "client.pem", "client-key.pem"}


def test_only_the_controller_and_the_app_hold_the_token(spread):
    """A node's key with the token must never pass for a client: no node service gets
    the token secret; the controller (it checks it) and the app (the client) do."""
    services = spread["docker-stack.yml"]["services"]
    holders = {name for name, service in services.items()
               if any(s["source"] == "token" or s["target"] == "token" for s in service.get("secrets", []))}
    assert holders == {"controller", "app"}


def test_the_page_runs_beside_the_controller(spread):
    ui = spread["docker-stack.yml"]["services"]["ui"]
    assert ui["command"][:5] == ["ui", "--controller", "controller:50050", "--listen", "0.0.0.0:8080"]
    assert ui["command"][5:] == ["--allow-host", "ui"]  # its service name, besides IP addresses and localhost
    assert ui["ports"] == [{"target": 8080, "published": "${SNAPMESH_UI_PORT:-8080}", "protocol": "tcp", "mode": "host"}]
    assert "/healthz" in " ".join(ui["healthcheck"]["test"])


def test_prometheus_scrapes_every_node_by_its_service_name(tmp_path):
    subprocess.run([sys.executable, str(COMPOSE_DIR / "generate.py"), "--nodes", "5", "--hosts", "3", "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    text = (tmp_path / "prometheus.yml").read_text()
    assert all(f'"p{i}:{9100 + i}"' in text for i in range(1, 6)) and '"controller:9100"' in text


@pytest.mark.parametrize("hosts", ["0", "6"])
def test_more_hosts_than_nodes_is_a_usage_error(tmp_path, hosts):
    done = subprocess.run([sys.executable, str(COMPOSE_DIR / "generate.py"), "--nodes", "5", "--hosts", hosts,
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--hosts must be between 1 and the number of nodes (5)" in done.stderr
    assert not list(tmp_path.iterdir())


def test_swarm_sh_without_a_command_is_a_usage_error():
    done = subprocess.run([str(COMPOSE_DIR / "swarm.sh")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "swarm.sh deploy" in done.stderr
