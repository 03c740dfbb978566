"""The app as a setting in Compose and Swarm (issue 46): SNAPMESH_APP and SNAPMESH_APP_PARAMS
reach every process that runs or checks the app (no Docker engine needed: the files are
rendered, and `docker compose config` resolves the variables as `up` would).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from ruamel.yaml import YAML

from support.helpers_deploy import COMPOSE_DIR, compose_bin

NODES = [f"p{i}" for i in range(1, 5)]
# Every process that runs the app, checks its invariants, drives or shows it.
APP_PROCESSES = [*NODES, "controller", "app", "ui", "reconcile", "reconcile-spark"]
PARAMS = {"keys": 3, "name": "inventory"}


def resolved(env: dict[str, str]) -> dict:
    """docker-compose.yml with every profile, as Compose resolves it under `env`."""
    if compose_bin() is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SNAPMESH_", "COMPOSE_"))}
    done = subprocess.run([*compose_bin(), "-f", str(COMPOSE_DIR / "docker-compose.yml"), "--profile", "spark",
                           "--profile", "reconcile", "config"], capture_output=True, text=True, timeout=60,
                          env={**clean, **env})
    assert done.returncode == 0, done.stderr
    return YAML(typ="safe").load(done.stdout)


def test_compose_gives_every_app_process_the_app_and_its_params():
    services = resolved({"SNAPMESH_APP": "kvshard", "SNAPMESH_APP_PARAMS": json.dumps(PARAMS)})["services"]
    for name in APP_PROCESSES:
        env = services[name].get("environment") or {}
        assert env.get("SNAPMESH_APP") == "kvshard", (name, env)
        assert json.loads(env.get("SNAPMESH_APP_PARAMS")) == PARAMS, (name, env)


def test_compose_without_the_setting_runs_the_bank_as_before():
    services = resolved({})["services"]
    for name in APP_PROCESSES:
        env = services[name].get("environment") or {}
        assert env.get("SNAPMESH_APP", "") == "" and env.get("SNAPMESH_APP_PARAMS", "") == "", (name, env)
    command = services["app"]["command"]  # a string (Compose v1) or a list (v2)
    assert "app --controller controller:50050" in (command if isinstance(command, str) else " ".join(command))


def test_swarm_gives_every_app_process_the_app_and_its_params():
    stack = YAML(typ="safe").load((COMPOSE_DIR / "docker-stack.yml").read_text())
    for name in [*NODES, "controller", "app", "ui"]:
        env = stack["services"][name]["environment"]
        assert env["SNAPMESH_APP"] == "${SNAPMESH_APP:-}", name
        assert env["SNAPMESH_APP_PARAMS"] == "${SNAPMESH_APP_PARAMS:-}", name
