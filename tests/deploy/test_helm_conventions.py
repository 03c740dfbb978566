"""deploy/helm/snapmesh follows the conventions users expect of a chart (issue 37).

With the real helm (`.venv/bin/helm`), no API server: camelCase values (the old
names refused with their new one); the conventional values reaching every object
and pod; the image tag from `.Chart.AppVersion`; a LoadBalancer that publishes no
metrics port unless asked; `controller.snapshotInterval`; the page beside the
controller (Deployment, Service, optional Ingress, the Host names it accepts); the
`helm test` Job that takes a snapshot before it reconciles; the chart README with a
values table (`helm show readme`) and Chart.yaml's home, sources and icon; and the
PrometheusRule and Grafana dashboard carrying exactly what Compose ships. The
rendered objects are validated against Kubernetes' OpenAPI in tests/deploy/test_helm_chart.py
(variant "conventions"); the page and the `helm test` pod run as containers in
tests/deploy/test_helm_pods.py.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from support.helm_chart import CHART, REPO, by_kind, helm, one, render

COMPOSE = REPO / "deploy" / "compose"
POD_KINDS = ("StatefulSet", "Deployment", "Job", "CronJob")


def _pod_template(obj: dict) -> dict:
    spec = obj["spec"]
    return spec["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob" else spec["template"]


def _workloads(objects: list[dict], hooks: bool = False) -> list[dict]:
    """The chart's own pods (the certificate hook Job is Helm's machinery, not the application's)."""
    return [o for o in objects if o["kind"] in POD_KINDS
            and (hooks or "pre-install" not in o["metadata"].get("annotations", {}).get("helm.sh/hook", ""))]


def _leaf_values(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            keys += _leaf_values(value, path + ".")
        else:
            keys.append(path)
    return keys


# ---------------------------------------------------------------- camelCase


def test_every_value_name_is_camel_case():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The keys of a labels or annotations map are Kubernetes' data, not value names.
    data = lambda parent: parent.endswith(("Labels", "labels", "Annotations", "annotations"))  # noqa: E731
    snake = [k for k in _leaf_values(values) if "_" in k.split(".")[-1] and not any(map(data, k.split(".")[:-1]))]
    assert not snake, f"snake_case values: {snake}"


@pytest.mark.parametrize("old,new", [("snapshot_mode", "snapshotMode"), ("channel_bound", "channelBound"),
                                     ("segment_records", "segmentRecords")])
def test_an_old_name_in_a_values_file_is_refused_with_its_new_name(tmp_path, old, new):
    values = tmp_path / "old.yaml"
    values.write_text(f"cluster:\n  {old}: 7\n")
    result = helm("template", "snapmesh", str(CHART), "-f", str(values), check=False)
    assert result.returncode != 0
    assert f"cluster.{old} was renamed cluster.{new}" in result.stderr, result.stderr


# ---------------------------------------------------------------- the conventional values


@pytest.fixture(scope="module")
def conventions() -> list[dict]:
    return render({
        "commonLabels.team": "payments", "podAnnotations.example\\.com/owner": "alice", "podLabels.tier": "snapshots",
        "serviceAccount.annotations.example\\.com/role": "reader", "controller.service.annotations.example\\.com/lb": "internal",
        "nodes.service.annotations.example\\.com/dns": "off", "ui.service.annotations.example\\.com/ui": "yes",
        "ui.nodeSelector.disk": "ssd", "ui.tolerations[0].key": "dedicated", "ui.tolerations[0].operator": "Exists",
        "ui.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight": 1,
        "ui.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey":
            "kubernetes.io/hostname",
        "metrics.serviceMonitor.enabled": True, "metrics.prometheusRule.enabled": True,
        "metrics.grafanaDashboard.enabled": True, "workload.enabled": True,
    })


def test_common_labels_are_on_every_object_and_pod(conventions):
    for obj in conventions:
        assert obj["metadata"]["labels"].get("team") == "payments", (obj["kind"], obj["metadata"]["name"])
    for obj in _workloads(conventions):
        assert _pod_template(obj)["metadata"]["labels"]["team"] == "payments", obj["metadata"]["name"]


def test_pod_annotations_and_labels_are_on_every_pod(conventions):
    workloads = _workloads(conventions)
    assert {o["kind"] for o in workloads} == {"StatefulSet", "Deployment", "Job"}
    for obj in workloads:
        metadata = _pod_template(obj)["metadata"]
        assert metadata["annotations"]["example.com/owner"] == "alice", obj["metadata"]["name"]
        assert metadata["labels"]["tier"] == "snapshots", obj["metadata"]["name"]
    # ...and never in a selector: changing them must not orphan the pods.
    for obj in by_kind(conventions, "StatefulSet") + by_kind(conventions, "Deployment"):
        assert "tier" not in obj["spec"]["selector"]["matchLabels"]


def test_one_service_account_runs_every_pod_without_a_token(conventions):
    account = one(conventions, "ServiceAccount", "snapmesh")
    assert account["metadata"]["annotations"] == {"example.com/role": "reader"}
    assert account["automountServiceAccountToken"] is False
    for obj in _workloads(conventions):
        pod = _pod_template(obj)["spec"]
        assert pod["serviceAccountName"] == "snapmesh", obj["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False, obj["metadata"]["name"]
    named = render({"serviceAccount.create": False, "serviceAccount.name": "theirs"})
    assert not [a for a in by_kind(named, "ServiceAccount") if a["metadata"]["name"] in ("snapmesh", "theirs")]
    assert {_pod_template(o)["spec"]["serviceAccountName"] for o in _workloads(named)} == {"theirs"}


def test_service_annotations(conventions):
    assert one(conventions, "Service", "snapmesh-controller")["metadata"]["annotations"] == {"example.com/lb": "internal"}
    assert one(conventions, "Service", "snapmesh-nodes")["metadata"]["annotations"] == {"example.com/dns": "off"}
    assert one(conventions, "Service", "snapmesh-ui")["metadata"]["annotations"] == {"example.com/ui": "yes"}


def test_scheduling_values_reach_the_page(conventions):
    pod = one(conventions, "Deployment", "snapmesh-ui")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"disk": "ssd"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1
    assert pod["containers"][0]["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}


def test_the_image_tag_defaults_to_the_app_version():
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    import tomllib

    package = tomllib.loads((CHART.parents[2] / "pyproject.toml").read_text())["project"]["version"]
    assert app_version == package, "Chart.yaml's appVersion moves with the package's version (the images' tag)"
    objects = render()
    images = {c["image"] for o in _workloads(objects) for c in _pod_template(o)["spec"].get("initContainers", [])
              + _pod_template(o)["spec"]["containers"]}
    assert images == {f"snapmesh:{app_version}", f"snapmesh-reconcile:{app_version}"}
    tagged = render({"image.tag": "1.2.3"})
    assert one(tagged, "StatefulSet", "snapmesh-node")["spec"]["template"]["spec"]["containers"][0]["image"] == "snapmesh:1.2.3"
    # `make images` tags the images with that version too.
    assert "docker tag" in (COMPOSE / "build-images.sh").read_text()


@pytest.mark.parametrize("kind", ["LoadBalancer", "NodePort", "ClusterIP"])
def test_the_controller_service_publishes_metrics_only_when_asked(kind):
    ports = lambda objects: {p["name"] for p in one(objects, "Service", "snapmesh-controller")["spec"]["ports"]}  # noqa: E731
    objects = render({"controller.service.type": kind})
    assert one(objects, "Service", "snapmesh-controller")["spec"]["type"] == kind
    assert ports(objects) == {"grpc"}
    assert ports(render({"controller.service.type": kind, "controller.service.exposeMetrics": True})) == {"grpc", "metrics"}


def test_snapshot_interval_makes_the_controller_take_snapshots():
    args = lambda objects: one(objects, "StatefulSet", "snapmesh-controller")["spec"]["template"]["spec"]["containers"][0]["args"]  # noqa: E731
    assert "--interval" not in args(render())
    assert args(render({"controller.snapshotInterval": 30}))[3:5] == ["--interval", "30"]


# ---------------------------------------------------------------- the page


def test_the_page_runs_beside_the_controller():
    objects = render({"ingress.enabled": True, "ingress.hosts[0].host": "snapmesh.example.com", "ui.allowHosts[0]": "page.corp"},
                     namespace="snaps")
    deployment = one(objects, "Deployment", "snapmesh-ui")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[:5] == ["ui", "--controller", "snapmesh-controller:50050", "--listen", "0.0.0.0:8080"]
    allowed = [args[i + 1] for i, a in enumerate(args) if a == "--allow-host"]
    assert allowed == ["snapmesh-ui", "snapmesh-ui.snaps", "snapmesh-ui.snaps.svc", "snapmesh-ui.snaps.svc.cluster.local",
                       "snapmesh.example.com", "page.corp"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # The page only reads: the client's pair, no token.
    [tls] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    files = {i["path"] for s in tls["projected"]["sources"] for i in s["secret"]["items"]}
    assert files == {"ca.pem", "client.pem", "client-key.pem"}
    service = one(objects, "Service", "snapmesh-ui")
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    ingress = one(objects, "Ingress", "snapmesh-ui")
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "snapmesh.example.com"
    assert rule["http"]["paths"] == [{"path": "/", "pathType": "Prefix",
                                      "backend": {"service": {"name": "snapmesh-ui", "port": {"name": "http"}}}}]
    assert not by_kind(render(), "Ingress")
    off = render({"ui.enabled": False})
    assert not [o for o in off if o["metadata"]["name"] == "snapmesh-ui"]


def test_the_notes_give_the_page():
    out = helm("install", "snapmesh", str(CHART), "--dry-run=client", "--set", "ingress.enabled=true",
               "--set", "ingress.hosts[0].host=snapmesh.example.com").stdout
    notes = out[out.index("NOTES:"):]
    assert "kubectl -n default port-forward svc/snapmesh-ui 8080:8080" in notes
    assert "statefulset/snapmesh-controller deployment/snapmesh-ui" in notes  # rollout status waits for it too
    assert "http://127.0.0.1:8080/" in notes and "http://snapmesh.example.com/" in notes


# ---------------------------------------------------------------- helm test on a fresh install


def test_the_helm_test_job_takes_a_snapshot_before_it_reconciles():
    job = one(render(), "Job", "snapmesh-reconcile")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    pod = job["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["args"] == ["snapshot", "trigger", "--wait", "--controller", "snapmesh-controller:50050"]
    [tls] = [v for v in pod["volumes"] if v["name"] == "tls"]
    files = {i["path"] for s in tls["projected"]["sources"] for i in s["secret"]["items"]}
    assert files == {"ca.pem", "client.pem", "client-key.pem", "token"}  # TriggerSnapshot needs the token
    assert "tls" not in {m["name"] for m in pod["containers"][0]["volumeMounts"]}  # reconcile itself needs none
    # A scheduled reconcile takes no snapshot of its own.
    [cron] = by_kind(render({"reconcile.schedule": "0 * * * *"}), "CronJob")
    assert "initContainers" not in cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]


# ---------------------------------------------------------------- README, Chart.yaml


def _table_keys(readme: str) -> set[str]:
    """The value paths the README's table rows name: `a.b`, `a.b.*`, and `.c` for a
    sibling of the row's first key (`controller.resources`, `.nodeSelector`)."""
    keys = set()
    for line in readme.splitlines():
        if not line.startswith("| `"):
            continue
        tokens = re.findall(r"`([^`]+)`", line.split("|")[1])
        parent = tokens[0].rsplit(".", 1)[0] if "." in tokens[0] else ""
        for token in tokens:
            keys.add((parent + token if token.startswith(".") else token).removesuffix(".*"))
    return keys


def test_helm_show_readme_gives_a_values_table_naming_every_value():
    readme = helm("show", "readme", str(CHART)).stdout
    assert "| key | default | what |" in readme
    named = _table_keys(readme)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # A value is in the table when it or a map holding it has a row.
    missing = [key for key in _leaf_values(values)
               if not any(".".join(key.split(".")[:i]) in named for i in range(1, key.count(".") + 2))]
    assert not missing, f"values without a README row: {missing}"
    assert "existingSecret" in readme and "helm template" in readme


def test_chart_yaml_has_home_sources_and_icon():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://") and chart["icon"].startswith("https://")
    assert chart["sources"] and all(s.startswith("https://") for s in chart["sources"])
    icon = chart["icon"].rsplit("/main/", 1)[1]
    assert (REPO / icon).is_file(), f"the icon's file {icon} is not in the repository"
    assert helm("show", "chart", str(CHART)).stdout.count("icon:") == 1


# ---------------------------------------------------------------- what Compose ships, for the operator


def test_the_chart_carries_composes_rules_and_dashboard_unchanged():
    assert (CHART / "files" / "rules.yml").read_text() == (COMPOSE / "rules.yml").read_text(), \
        "deploy/helm/snapmesh/files/rules.yml drifted from deploy/compose/rules.yml: copy it"
    dashboard = COMPOSE / "grafana" / "dashboards" / "snapmesh.json"
    assert (CHART / "files" / "snapmesh-dashboard.json").read_text() == dashboard.read_text(), \
        "deploy/helm/snapmesh/files/snapmesh-dashboard.json drifted from deploy/compose's dashboard: copy it"


def test_prometheus_rule_and_dashboard_configmap(conventions):
    [rule] = by_kind(conventions, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load((COMPOSE / "rules.yml").read_text())["groups"]
    # Its job names are the ServiceMonitor's.
    [monitor] = by_kind(conventions, "ServiceMonitor")
    jobs = {s["metadata"]["labels"][monitor["spec"]["jobLabel"]] for s in by_kind(conventions, "Service")
            if s["metadata"]["labels"].get("snapmesh.dev/metrics") == "true"}
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    assert set(re.findall(r'job="([^"]+)"', exprs)) == jobs == {"snapmesh-nodes", "snapmesh-controller"}
    dashboard = one(conventions, "ConfigMap", "snapmesh-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's default label
    shipped = json.loads((COMPOSE / "grafana" / "dashboards" / "snapmesh.json").read_text())
    assert json.loads(dashboard["data"]["snapmesh.json"]) == shipped
    off = render()
    assert not by_kind(off, "PrometheusRule") and not [o for o in off if o["metadata"]["name"] == "snapmesh-dashboard"]
