"""The app as a setting in Compose and Swarm (issue 46): SNAPMESH_APP and SNAPMESH_APP_PARAMS
reach every process that runs or checks the app (no Docker engine needed: the files are
rendered, and `docker compose config` resolves the variables as `up` would), and a
user's image (deploy/compose/Dockerfile.app-example: snapmesh's node image plus one
file) carries the module.

The `docker`-marked test builds that image FROM $SNAPMESH_TEST_BASE_IMAGE (default
snapmesh:latest, `make images`; skipped when absent), starts the stack on it under a
project of its own with the app as a setting, and holds: every snapshot names the app,
its invariants (the controller's checks) hold, and the load generator drives the app's
workload. `down -v` and the image's removal always run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import pytest
from ruamel.yaml import YAML

from support.helpers_deploy import (
    COMPOSE_DIR,
    REPO,
    compose_bin,
    compose_cmd,
    container_health,
    container_id,
    docker_engine_answers,
    log,
    project_leftovers,
    run,
    trigger_snapshot,
)
from support.polling import wait_for

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


# ------------------------------------------------------------- a user's image

EXAMPLE = COMPOSE_DIR / "Dockerfile.app-example"


def test_the_example_image_extends_snapmeshs_with_one_file(monkeypatch):
    """The base image is a build argument (default snapmesh:latest), the one file lands on
    the image's PYTHONPATH, and the default file is an app that loads."""
    from snapmesh.app import load_app

    lines = [line.strip() for line in EXAMPLE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0] == "ARG BASE_IMAGE=snapmesh:latest" and lines[1] == "FROM ${BASE_IMAGE}", lines
    app_file = next(line.split("=", 1)[1] for line in lines if line.startswith("ARG APP_FILE="))
    assert "COPY ${APP_FILE} /opt/snapmesh-app/" in lines and "ENV PYTHONPATH=/opt/snapmesh-app" in lines
    assert (REPO / "examples" / app_file).is_file()
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    assert load_app(f"{app_file.removesuffix('.py')}:app").workload is not None


CASES = {  # app -> (its name, its params): a built-in, and the example's one file with its [app] params
    "kvshard": ("kvshard", {}),
    "token_ring:app": ("token_ring", {"holder": "p2"}),
}


@pytest.mark.docker
@pytest.mark.timeout(900)
@pytest.mark.parametrize("spec", CASES)
def test_the_stack_runs_the_app_given_as_a_setting_on_a_users_image(spec, tmp_path):
    from snapmesh.settings.security import load_tls_dir
    from snapmesh.v1 import snapmesh_pb2 as pb

    if not docker_engine_answers() or compose_bin() is None:
        pytest.skip("no Docker engine or no compose here")
    base = os.environ.get("SNAPMESH_TEST_BASE_IMAGE", "snapmesh:latest")
    if run(["docker", "image", "inspect", base], check=False, quiet=True).returncode != 0:
        pytest.skip(f"no image {base}: `make images` builds it")
    tag = f"snapmesh-app-test:{uuid.uuid4().hex[:8]}"
    project = f"snapmeshapp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    run(["docker", "build", "-q", "-f", str(EXAMPLE), "--build-arg", f"BASE_IMAGE={base}", "-t", tag,
         str(REPO / "examples")], timeout=600)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "SNAPMESH_"))},
        "SNAPMESH_IMAGE": tag, "SNAPMESH_APP": spec, "SNAPMESH_APP_PARAMS": json.dumps(CASES[spec][1]),
        "SNAPMESH_RESTART": "no", "SNAPMESH_CONTROLLER_PUBLISH": "127.0.0.1:", "SNAPMESH_UI_PUBLISH": "127.0.0.1:",
        "SNAPMESH_APP_FLAGS": "--duration 3600 --snapshot-every 0 --seed 7", "COMPOSE_PROFILES": "",
        "SNAPMESH_TLS_EXPORT": str(tmp_path),
    }
    name = CASES[spec][0]
    try:
        run(compose_cmd(project, "up", "-d", "--no-build", *(f"p{i}" for i in range(1, 5)), "controller", "app"),
            env=env, timeout=300)
        out = run(compose_cmd(project, "port", "controller", "50050"), env=env, quiet=True).stdout.strip()
        identity = load_tls_dir(tmp_path)
        app_cid = container_id(project, "app", env)

        def driving() -> bool:
            logs = run(["docker", "logs", app_cid], quiet=True, check=False)
            return f"{name} workload: seed 7" in logs.stdout + logs.stderr or None

        wait_for(driving, timeout=180, interval=2, what=f"the load generator driving {spec}", retry_on=(Exception,))

        def complete():
            snap = trigger_snapshot(out, identity=identity, wait=True, timeout=60)
            return snap.status == pb.Snapshot.COMPLETE and snap

        snapshot = wait_for(complete, timeout=180, interval=2, what="a COMPLETE snapshot", retry_on=(Exception,))
        verdicts = {i.name: i.ok for i in snapshot.app.invariants}
        log(f"{spec} on {tag}: snapshot {snapshot.snapshot_id} app {snapshot.app.spec} invariants {verdicts}")
        assert snapshot.app.spec == spec and verdicts and all(verdicts.values()), snapshot
        assert container_health(app_cid) == "running"
        logs = run(["docker", "logs", app_cid], quiet=True, check=False)
        assert not re.search(r"Traceback|snapmesh app: ", logs.stdout + logs.stderr), logs.stderr[-2000:]
    finally:
        run(compose_cmd(project, "down", "-v", "--remove-orphans", "-t", "5"), env=env, check=False, timeout=180)
        run(["docker", "rmi", "-f", tag], check=False, quiet=True)
        left = project_leftovers(project)
        assert not any(left.values()), f"compose project {project} left behind {left}"
