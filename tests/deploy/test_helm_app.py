"""The app as Helm values (issue 46): `app.module`, `app.params` and `app.image` reach
every pod that runs, checks or shows the app (the real helm; kubernetes-validate and
`helm lint` run over the same values in tests/deploy/test_helm_chart.py, variant "app").
"""

from __future__ import annotations

import json

import pytest

from support.helm_chart import HELM, helm, render, CHART

APP = {"app.module": "token_ring:app", "app.params.holder": "node-1", "app.image.repository": "registry.example.com/my-app",
       "app.image.tag": "1.2"}


def pods(objects: list[dict]) -> dict[str, list[dict]]:
    """Each workload's containers (and init containers), by kind/name."""
    out = {}
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        pod = spec.get("template", {}).get("spec") if obj["kind"] != "Pod" else spec
        if pod:
            out[f"{obj['kind']}/{obj['metadata']['name']}"] = pod.get("initContainers", []) + pod["containers"]
    return out


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.fixture(scope="module")
def app_objects() -> list[dict]:
    assert HELM.is_file(), f"{HELM} missing: run `make install`"
    return render(APP)


def test_every_pod_that_runs_checks_or_shows_the_app_is_given_it(app_objects):
    containers = pods(app_objects)
    given = {"StatefulSet/snapmesh-node": "node", "StatefulSet/snapmesh-controller": "controller",
             "Deployment/snapmesh-ui": "ui", "Job/snapmesh-reconcile": "reconcile"}
    for workload, name in given.items():
        container = next(c for c in containers[workload] if c["name"] == name)
        assert env(container)["SNAPMESH_APP"] == "token_ring:app", workload
        assert json.loads(env(container)["SNAPMESH_APP_PARAMS"]) == {"holder": "node-1"}, workload


def test_the_users_image_runs_the_nodes_the_controller_and_the_page(app_objects):
    containers = pods(app_objects)
    for workload, name in (("StatefulSet/snapmesh-node", "node"), ("StatefulSet/snapmesh-controller", "controller"),
                           ("Deployment/snapmesh-ui", "ui")):
        container = next(c for c in containers[workload] if c["name"] == name)
        assert container["image"] == "registry.example.com/my-app:1.2", workload
    reconcile = next(c for c in containers["Job/snapmesh-reconcile"] if c["name"] == "reconcile")
    assert reconcile["image"].startswith("snapmesh-reconcile:")  # reconcileImage: the user builds theirs FROM it


def test_without_an_app_the_pods_run_the_bank_on_snapmeshs_image():
    containers = pods(render())
    for workload, listed in containers.items():
        for container in listed:
            assert "SNAPMESH_APP" not in env(container), workload
            assert not container["image"].startswith("registry.example.com"), workload


def test_the_schema_refuses_a_module_that_is_not_module_attr():
    result = helm("template", "snapmesh", str(CHART), "--set-string", "app.module=my app.py", check=False)
    assert result.returncode != 0 and "/app/module" in result.stderr, result.stderr


def test_helm_lint_passes_with_an_app():
    out = helm("lint", "--strict", str(CHART), "--set-string", "app.module=kvshard", "--set-string",
               "app.params.keys=3").stdout
    assert "0 chart(s) failed" in out
