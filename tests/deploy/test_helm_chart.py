"""deploy/helm/snapmesh with the real helm, no Kubernetes API server.

`helm lint`; every object of `helm template` at default values, with TLS off,
with the ServiceMonitor on, with cert-manager, at 3 and 7 nodes, validated
strictly against the OpenAPI schema of a current Kubernetes version (the
schemas `kubernetes-validate` vendors, pinned in pyproject.toml); the pieces the
issue names (StatefulSet with volumeClaimTemplates and gRPC probes, the
cluster-file ConfigMap that snapmesh's own loader accepts, the NetworkPolicy, the
Secrets, the hardening); and values.schema.json refusing bad values by name.

No API server runs here, so `helm install`/`upgrade` against a cluster and the
hooks' order are not tested. The templates' `lookup` calls (the node count that an
upgrade may not change, the token kept on upgrade) are, with
`helm template --dry-run=server --is-upgrade` against a stand-in on loopback that
answers the API's discovery and the two GETs those lookups make. The CRD objects (ServiceMonitor, cert-manager's) have no schema
in Kubernetes' OpenAPI; they are checked for their fields by hand below.
The rendered pods are run on Docker by tests/deploy/test_helm_pods.py.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kubernetes_validate
import pytest

from support.helm_chart import CHART, HELM, by_kind, helm, one, render
from snapmesh.settings import config as cluster_config

K8S_VERSION = "1.34.0"  # the kubectl that ships beside the helm binary is 1.34
K8S_VERSIONS = (K8S_VERSION, "1.37.0")  # and the newest schema kubernetes-validate 1.37.0 carries
CRD_KINDS = {"ServiceMonitor": "monitoring.coreos.com/v1", "Certificate": "cert-manager.io/v1", "Issuer": "cert-manager.io/v1",
             "PrometheusRule": "monitoring.coreos.com/v1"}

VARIANTS = {
    "default": {},
    "tls-off": {"tls.enabled": False},
    "servicemonitor": {"metrics.serviceMonitor.enabled": True},
    "cert-manager": {"tls.source": "certManager"},
    "existing-secret": {"tls.source": "existingSecret", "tls.existingSecret": "my-certs"},
    "nodes-3": {"nodes.replicas": 3, "networkPolicy.controllerClientLabels.snapmesh-client": "yes",
                "networkPolicy.metricsPodLabels.app": "prometheus"},
    "nodes-7": {"nodes.replicas": 7, "networkPolicy.controllerCIDR": "10.0.0.0/8", "reconcile.schedule": "*/30 * * * *"},
    # A user's app in their own image (tests/deploy/test_helm_app.py).
    "app": {"app.module": "token_ring:app", "app.params.holder": "node-1", "app.image.repository": "registry.example.com/my-app"},
    "workload": {"workload.enabled": True, "workload.duration": 12, "workload.seed": 7},
    # A rescale onto 6 nodes (tests/deploy/test_helm_rescale.py): its Job and the nodes' fenced-log init container.
    "rescale": {"nodes.replicas": 6, "rescale.snapshot": "20261129T140513.770624Z-670420ae", "app.module": "kvshard"},
    # The conventional values, every one set (tests/deploy/test_helm_chart.py, "conventions").
    "conventions": {"commonLabels.team": "payments", "podAnnotations.example\\.com/owner": "alice",
                    "podLabels.tier": "snapshots", "serviceAccount.annotations.example\\.com/role": "reader",
                    "serviceAccount.name": "snapmesh-sa", "controller.service.type": "LoadBalancer",
                    "controller.service.annotations.example\\.com/lb": "internal",
                    "nodes.service.annotations.example\\.com/dns": "off", "ui.service.annotations.example\\.com/ui": "yes",
                    "ingress.enabled": True, "ingress.className": "nginx", "ingress.hosts[0].host": "snapmesh.example.com",
                    "ingress.tls[0].secretName": "page-tls", "ingress.tls[0].hosts[0]": "snapmesh.example.com",
                    "ui.nodeSelector.disk": "ssd", "ui.tolerations[0].key": "dedicated", "ui.tolerations[0].operator": "Exists",
                    "controller.snapshotInterval": 30, "metrics.serviceMonitor.enabled": True,
                    "metrics.prometheusRule.enabled": True, "metrics.grafanaDashboard.enabled": True,
                    "workload.enabled": True},
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    assert HELM.is_file(), f"{HELM} missing: run `make install`"
    return {name: render(values) for name, values in VARIANTS.items()}


def test_helm_is_the_pinned_real_binary():
    assert helm("version", "--short").stdout.startswith("v4.1.4")


def test_helm_lint_passes():
    out = helm("lint", "--strict", str(CHART)).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates_against_kubernetes_openapi(rendered, variant):
    objects = rendered[variant]
    checked = 0
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            assert obj["apiVersion"] == CRD_KINDS[obj["kind"]]
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    assert checked >= 10


def test_the_schema_check_bites(rendered):
    """A typo in a pod spec field or a wrong type fails the validation above."""
    sts = one(rendered["default"], "StatefulSet", "snapmesh-node")
    typo = copy.deepcopy(sts)
    container = typo["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    wrong = copy.deepcopy(sts)
    wrong["spec"]["replicas"] = "four"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, K8S_VERSION, strict=True)


def _pod(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("variant,count", [("default", 4), ("nodes-3", 3), ("nodes-7", 7)])
def test_nodes_statefulset_claims_probes_and_ids(rendered, variant, count):
    objects = rendered[variant]
    sts = one(objects, "StatefulSet", "snapmesh-node")
    assert sts["spec"]["replicas"] == count
    assert sts["spec"]["serviceName"] == "snapmesh-nodes"
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    container = _pod(sts)["containers"][0]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == 50059, probe
    assert container["readinessProbe"]["grpc"]["service"] == "snapmesh.v1.Node"
    assert '--id "node-${POD_NAME##*-}"' in container["args"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SNAPMESH_HEALTH_PORT"]["value"] == "50059"
    headless = one(objects, "Service", "snapmesh-nodes")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True


@pytest.mark.parametrize("variant,count", [("default", 4), ("nodes-3", 3), ("nodes-7", 7)])
def test_cluster_file_is_one_source_snapmesh_accepts(rendered, variant, count, tmp_path):
    objects = rendered[variant]
    text = one(objects, "ConfigMap", "snapmesh-cluster")["data"]["cluster.toml"]
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    cfg = cluster_config.load(path, env={})
    assert [n.id for n in cfg.nodes] == [f"node-{i}" for i in range(count)]
    assert [n.host for n in cfg.nodes] == [f"snapmesh-node-{i}.snapmesh-nodes" for i in range(count)]
    assert {n.port for n in cfg.nodes} == {50051} and {n.metrics_port for n in cfg.nodes} == {9101}
    assert (cfg.controller.host, cfg.controller.port) == ("snapmesh-controller", 50050)
    assert (cfg.snapshot_mode, cfg.channel_bound, cfg.segment_records) == ("classic", 100_000, 100_000)
    assert cfg.controller.snapshot_deadline_s == 10
    # The ports the pods open and the Services route are the cluster file's.
    sts = one(objects, "StatefulSet", "snapmesh-node")
    ports = {p["name"]: p["containerPort"] for p in _pod(sts)["containers"][0]["ports"]}
    assert (ports["grpc"], ports["metrics"]) == (50051, 9101)
    ctrl = one(objects, "Service", "snapmesh-controller")
    assert {p["name"]: p["port"] for p in ctrl["spec"]["ports"]} == {"grpc": 50050}  # metrics: only when asked
    headless = one(objects, "Service", "snapmesh-controller-headless")
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {"grpc": 50050, "metrics": 9100}
    if "snapmesh-certs-cluster" in {o["metadata"]["name"] for o in objects}:
        assert one(objects, "ConfigMap", "snapmesh-certs-cluster")["data"]["cluster.toml"] == text


def test_cluster_file_follows_the_values(tmp_path):
    objects = render({"cluster.snapshotMode": "overtake", "cluster.channelBound": 500, "cluster.segmentRecords": 1000,
                      "cluster.snapshotDeadlineSeconds": 3, "nodes.port": 7000, "controller.port": 7100})
    path = tmp_path / "cluster.toml"
    path.write_text(one(objects, "ConfigMap", "snapmesh-cluster")["data"]["cluster.toml"])
    cfg = cluster_config.load(path, env={})
    assert (cfg.snapshot_mode, cfg.channel_bound, cfg.segment_records) == ("overtake", 500, 1000)
    assert cfg.controller.snapshot_deadline_s == 3 and cfg.controller.port == 7100
    assert {n.port for n in cfg.nodes} == {7000}


def test_controller_statefulset_service_and_claim(rendered):
    objects = rendered["default"]
    sts = one(objects, "StatefulSet", "snapmesh-controller")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    container = _pod(sts)["containers"][0]
    assert container["args"][:3] == ["controller", "--config", "/etc/snapmesh/cluster.toml"]
    assert container["readinessProbe"]["grpc"]["service"] == "snapmesh.v1.Controller"


def test_hardening(rendered):
    objects = rendered["default"]
    for kind in ("StatefulSet", "Deployment", "Job"):
        for obj in by_kind(objects, kind):
            pod = _pod(obj)
            assert pod["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
            for container in pod.get("initContainers", []) + pod["containers"]:
                sc = container["securityContext"]
                where = f"{obj['metadata']['name']}/{container['name']}"
                assert sc["readOnlyRootFilesystem"] is True, where
                assert sc["allowPrivilegeEscalation"] is False, where
                assert sc["capabilities"]["drop"] == ["ALL"], where
    for obj in by_kind(objects, "StatefulSet") + by_kind(objects, "Deployment"):
        resources = _pod(obj)["containers"][0]["resources"]
        assert resources["requests"] and resources["limits"]
    for obj in by_kind(objects, "StatefulSet"):
        annotations = obj["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
    pdb = one(objects, "PodDisruptionBudget", "snapmesh-node")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_network_policy(rendered):
    nodes = one(rendered["default"], "NetworkPolicy", "snapmesh-node")
    [peers, metrics, health] = nodes["spec"]["ingress"]
    assert [p["port"] for p in peers["ports"]] == [50051]
    components = [f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for f in peers["from"]]
    assert components == ["node", "controller"]
    assert [p["port"] for p in metrics["ports"]] == [9101] and [p["port"] for p in health["ports"]] == [50059]
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert metrics["from"] == [monitoring]  # the labelled monitoring namespace, no other
    node_pods = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "snapmesh", "app.kubernetes.io/instance": "snapmesh",
                                                 "app.kubernetes.io/component": "node"}}}
    component = lambda name: {"podSelector": {"matchLabels": node_pods["podSelector"]["matchLabels"]  # noqa: E731
                                                             | {"app.kubernetes.io/component": name}}}
    ctrl = one(rendered["default"], "NetworkPolicy", "snapmesh-controller")
    [grpc_in, ctrl_metrics, _] = ctrl["spec"]["ingress"]
    # By default the nodes, the page and the `helm test` pod (it takes a snapshot) only.
    assert grpc_in["from"] == [node_pods, component("ui"), component("reconcile")]
    assert ctrl_metrics["from"] == [monitoring] and [p["port"] for p in ctrl_metrics["ports"]] == [9100]
    ctrl7 = one(rendered["nodes-7"], "NetworkPolicy", "snapmesh-controller")
    # A CronJob reconciles there: no `helm test` pod to let in.
    assert ctrl7["spec"]["ingress"][0]["from"] == [node_pods, component("ui"), {"ipBlock": {"cidr": "10.0.0.0/8"}}]
    # Opt-in: the labelled client pods; metrics from the monitoring namespace's labelled pods only.
    ctrl3 = one(rendered["nodes-3"], "NetworkPolicy", "snapmesh-controller")
    assert ctrl3["spec"]["ingress"][0]["from"] == [node_pods, component("ui"), component("reconcile"),
                                                   {"podSelector": {"matchLabels": {"snapmesh-client": "yes"}}}]
    ui = one(rendered["default"], "NetworkPolicy", "snapmesh-ui")
    assert ui["spec"]["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
    nodes3 = one(rendered["nodes-3"], "NetworkPolicy", "snapmesh-node")
    assert nodes3["spec"]["ingress"][1]["from"] == [monitoring | {"podSelector": {"matchLabels": {"app": "prometheus"}}}]


def test_secrets_tls_on_by_default(rendered):
    objects = rendered["default"]
    token = one(objects, "Secret", "snapmesh-token")
    assert token["data"]["token"]
    job = one(objects, "Job", "snapmesh-certs")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install"
    init = _pod(job)["initContainers"]
    assert init[0]["args"][:1] == ["certs"]
    assert one(objects, "Role", "snapmesh-certs")["rules"][0]["resources"] == ["secrets"]
    sts = one(objects, "StatefulSet", "snapmesh-node")
    env = {e["name"]: e.get("value") for e in _pod(sts)["containers"][0]["env"]}
    assert env["SNAPMESH_TLS_DIR"] == "/tls"
    [tls] = [v for v in _pod(sts)["volumes"] if v["name"] == "tls-nodes"]
    sources = tls["projected"]["sources"]
    assert sources[0]["secret"]["name"] == "snapmesh-tls"
    assert {"key": "node-3-key.pem", "path": "node-3-key.pem"} in sources[0]["secret"]["items"]
    assert len(sources) == 1, sources  # no token: the controller's alone (below)
    # TLS off: no certificate, no token, no TLS dir.
    off = rendered["tls-off"]
    assert not by_kind(off, "Secret") and not [j for j in by_kind(off, "Job") if "certs" in j["metadata"]["name"]]
    env = {e["name"] for e in _pod(one(off, "StatefulSet", "snapmesh-node"))["containers"][0]["env"]}
    assert "SNAPMESH_TLS_DIR" not in env


def test_existing_secret_and_cert_manager(rendered):
    existing = rendered["existing-secret"]
    assert not [j for j in by_kind(existing, "Job") if "certs" in j["metadata"]["name"]]
    sts = one(existing, "StatefulSet", "snapmesh-node")
    [tls] = [v for v in _pod(sts)["volumes"] if v["name"] == "tls-nodes"]
    assert tls["projected"]["sources"][0]["secret"]["name"] == "my-certs"
    cm = rendered["cert-manager"]
    certs = {c["metadata"]["name"]: c for c in by_kind(cm, "Certificate")}
    names = ["node-0", "node-1", "node-2", "node-3", "controller", "client"]
    assert set(certs) == {"snapmesh-ca"} | {f"snapmesh-tls-{n}" for n in names}
    assert certs["snapmesh-tls-node-2"]["spec"]["dnsNames"] == ["node-2", "localhost", "snapmesh-node-2.snapmesh-nodes"]
    assert certs["snapmesh-tls-node-2"]["spec"]["privateKey"]["encoding"] == "PKCS8"
    assert certs["snapmesh-tls-node-2"]["spec"]["issuerRef"] == {"name": "snapmesh-ca", "kind": "Issuer"}
    assert {i["metadata"]["name"] for i in by_kind(cm, "Issuer")} == {"snapmesh-selfsigned", "snapmesh-ca"}


def _secret_items(volume: dict) -> set[str]:
    """The files a projected TLS volume holds."""
    return {item["path"] for source in volume["projected"]["sources"] for item in source["secret"].get("items", [])}


@pytest.mark.parametrize("variant", ["default", "cert-manager", "existing-secret", "nodes-7"])
def test_a_node_pod_holds_its_own_key_only(rendered, variant):
    """The node container mounts only the in-memory `tls` its init container fills with
    node-<ordinal>'s files; the nodes' Secret is mounted by that init container alone and
    carries no controller or client key; the controller pod holds no node's key."""
    sts = one(rendered[variant], "StatefulSet", "snapmesh-node")
    spec = _pod(sts)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tls"] == {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    [container] = spec["containers"]
    assert {"name": "tls", "mountPath": "/tls", "readOnly": True} in container["volumeMounts"]
    assert "tls-nodes" not in {m["name"] for m in container["volumeMounts"]}
    [init] = spec["initContainers"]
    assert {m["name"] for m in init["volumeMounts"]} == {"tls-nodes", "tls"}
    assert '"/tls-nodes/$id.pem" "/tls-nodes/$id-key.pem"' in init["args"][0] and "node-${POD_NAME##*-}" in init["args"][0]
    held = _secret_items(volumes["tls-nodes"])
    assert not {f for f in held if f.startswith(("controller", "client"))}, held
    controller = {v["name"]: v for v in _pod(one(rendered[variant], "StatefulSet", "snapmesh-controller"))["volumes"]}
    assert not {f for f in _secret_items(controller["tls"]) if f.startswith("node-")}


@pytest.mark.parametrize("variant", ["default", "cert-manager", "existing-secret", "nodes-7"])
def test_no_node_pod_holds_the_token_and_the_controller_pod_no_client_key(rendered, variant):
    """A node's key with the token must never pass for a client: no volume of a node pod
    carries the token Secret, and its init container copies none. The controller holds
    its own pair, the CA and the token (it checks it), never the client's pair."""
    objects = rendered[variant]
    nodes = _pod(one(objects, "StatefulSet", "snapmesh-node"))
    for volume in nodes["volumes"]:
        secrets = [s["secret"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
        assert not [s for s in secrets if s["name"] == "snapmesh-token"], volume
        assert "token" not in {i["path"] for s in secrets for i in s.get("items", [])}, volume
    assert "token" not in nodes["initContainers"][0]["args"][0]
    controller = {v["name"]: v for v in _pod(one(objects, "StatefulSet", "snapmesh-controller"))["volumes"]}
    assert _secret_items(controller["tls"]) == {"ca.pem", "controller.pem", "controller-key.pem", "token"}


@pytest.mark.parametrize("variant", ["workload", "conventions"])
def test_the_workload_job_is_a_client_of_the_release(rendered, variant):
    """The bank workload takes snapshots: it runs where the client's pair and the token are
    (a `helm test` Job before the reconcile Job), never in the page (no token) nor the
    controller (no client pair); it mounts no claim and reaches the nodes and the controller."""
    objects = rendered[variant]
    job = one(objects, "Job", "snapmesh-workload")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert int(job["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        one(objects, "Job", "snapmesh-reconcile")["metadata"]["annotations"].get("helm.sh/hook-weight", 0))
    pod = _pod(job)
    [container] = pod["containers"]
    assert container["args"][:5] == ["app", "--controller", "snapmesh-controller:50050", "--duration",
                                     "12" if variant == "workload" else "30"]
    assert ("--seed" in container["args"]) == (variant == "workload")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(volumes) == {"tmp", "tls"}  # no claim, no cluster file
    assert _secret_items(volumes["tls"]) == {"ca.pem", "client.pem", "client-key.pem", "token"}
    page = {v["name"]: v for v in _pod(one(objects, "Deployment", "snapmesh-ui"))["volumes"]}
    assert "token" not in _secret_items(page["tls"])
    component = {"app.kubernetes.io/name": "snapmesh", "app.kubernetes.io/instance": "snapmesh",
                 "app.kubernetes.io/component": "workload"}
    for policy in ("snapmesh-node", "snapmesh-controller"):
        grpc_in = one(objects, "NetworkPolicy", policy)["spec"]["ingress"][0]
        assert {"podSelector": {"matchLabels": component}} in grpc_in["from"], policy
    assert not [j for j in by_kind(rendered["default"], "Job") if j["metadata"]["name"] == "snapmesh-workload"]


def test_a_plain_token_needs_allow_plain_token():
    objects = render({"auth.token": "a-plain-token", "auth.allowPlainToken": True})
    token = one(objects, "Secret", "snapmesh-token")
    assert base64.b64decode(token["data"]["token"]) == b"a-plain-token"


def test_service_monitor_and_reconcile(rendered):
    assert not by_kind(rendered["default"], "ServiceMonitor")
    [sm] = by_kind(rendered["servicemonitor"], "ServiceMonitor")
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    services = by_kind(rendered["servicemonitor"], "Service")
    labelled = {s["metadata"]["name"]: s["metadata"]["labels"]["snapmesh.dev/job"]
                for s in services if s["metadata"]["labels"].get("snapmesh.dev/metrics") == "true"}
    # Compose's job names, so its alerts and dashboard apply unchanged.
    assert labelled == {"snapmesh-nodes": "snapmesh-nodes", "snapmesh-controller-headless": "snapmesh-controller"}
    assert sm["spec"]["jobLabel"] == "snapmesh.dev/job"
    job = one(rendered["default"], "Job", "snapmesh-reconcile")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    claims = [v["persistentVolumeClaim"]["claimName"] for v in _pod(job)["volumes"] if "persistentVolumeClaim" in v]
    assert claims == ["data-snapmesh-controller-0"] + [f"data-snapmesh-node-{i}" for i in range(4)]
    [cron] = by_kind(rendered["nodes-7"], "CronJob")
    assert cron["spec"]["schedule"] == "*/30 * * * *"
    assert len(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"]) == 2 + 7


def test_notes_print_grpcurl_and_restore():
    out = helm("install", "snapmesh", str(CHART), "--dry-run=client").stdout
    notes = out[out.index("NOTES:"):]
    assert "kubectl -n default port-forward svc/snapmesh-controller 50050:50050" in notes
    assert "grpcurl -cacert snapmesh-tls/ca.pem -cert snapmesh-tls/client.pem -key snapmesh-tls/client-key.pem" in notes
    assert 'authorization: Bearer $(cat snapmesh-tls/token)' in notes
    assert "snapmesh restore --controller 127.0.0.1:50050 --tls-dir snapmesh-tls SNAPSHOT_ID" in notes


@pytest.mark.parametrize("values,message", [
    ({"nodes.replicas": 1}, "/nodes/replicas"),
    ({"nodes.replicas": 65}, "/nodes/replicas"),
    ({"cluster.snapshotMode": "fast"}, "/cluster/snapshotMode"),
    ({"cluster.channelBound": 0}, "/cluster/channelBound"),
    ({"cluster.snapshot_mode": "overtake"}, "cluster.snapshot_mode was renamed cluster.snapshotMode"),
    ({"cluster.channel_bound": 500}, "cluster.channel_bound was renamed cluster.channelBound"),
    ({"cluster.segment_records": 1000}, "cluster.segment_records was renamed cluster.segmentRecords"),
    ({"controller.snapshotInterval": -1}, "/controller/snapshotInterval"),
    ({"ingress.enabled": True}, "ingress.hosts names no host"),
    ({"ingress.enabled": True, "ingress.hosts[0].host": "a b"}, "/ingress/hosts/0/host"),
    ({"ingress.enabled": True, "ingress.hosts[0].host": "x.example", "ui.enabled": False}, "the Ingress is the page's"),
    ({"podLabels.tier": 3}, "/podLabels/tier"),
    ({"serviceAccount.create": "yes"}, "/serviceAccount/create"),
    ({"nodes.port": 70000}, "/nodes/port"),
    ({"tls.source": "vault"}, "/tls/source"),
    ({"nodes.replicaz": 3}, "replicaz"),
    ({"networkPolicy.controllerCIDR": "everyone"}, "/networkPolicy/controllerCIDR"),
    ({"healthPort": 50051}, "nodes.port (50051), nodes.metricsPort (9101) and healthPort (50051) must differ"),
    ({"tls.source": "existingSecret"}, "tls.existingSecret names no Secret"),
    ({"auth.token": "a-plain-token"}, "/auth/allowPlainToken"),  # a token in the values: only when asked for
    ({"networkPolicy.metricsNamespaceLabels": "null"}, "/networkPolicy/metricsNamespaceLabels"),
])
def test_bad_values_are_refused_by_name(values, message):
    from support.helm_chart import set_args

    result = helm("template", "snapmesh", str(CHART), *set_args(values), check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_install_refuses_bad_values_too():
    """`helm install` (client dry run: no API server here) checks the same schema."""
    result = helm("install", "snapmesh", str(CHART), "--dry-run=client", "--set", "nodes.replicas=1", check=False)
    assert result.returncode != 0 and "/nodes/replicas" in result.stderr


def test_chart_files_exist():
    for name in ("Chart.yaml", "values.yaml", "values.schema.json", "templates/NOTES.txt"):
        assert (CHART / name).is_file(), name
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["nodes"]["properties"]["replicas"]["minimum"] == 2


# ---------------------------------------------------------------- lookup against a stand-in API server


class _FakeApi(BaseHTTPRequestHandler):
    """Discovery plus a running StatefulSet snapmesh-node (4 replicas) and its token Secret."""

    TOKEN = "kept-token-from-the-install"
    KINDS = {  # group/version -> the kinds the chart renders
        "v1": ["Secret", "ConfigMap", "Service", "ServiceAccount"],
        "apps/v1": ["StatefulSet", "Deployment"],
        "batch/v1": ["Job", "CronJob"],
        "policy/v1": ["PodDisruptionBudget"],
        "networking.k8s.io/v1": ["NetworkPolicy"],
        "rbac.authorization.k8s.io/v1": ["Role", "RoleBinding"],
    }
    ROUTES = {
        "/version": {"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "linux/amd64"},
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": "v1"}],
             "preferredVersion": {"groupVersion": gv, "version": "v1"}} for gv in KINDS if gv != "v1"]},
        **{("/api/v1" if gv == "v1" else f"/apis/{gv}"): {
            "kind": "APIResourceList", "groupVersion": gv,
            "resources": [{"name": k.lower() + ("ies" if k.endswith("y") else "es" if k.endswith("s") else "s"),
                           "singularName": k.lower(), "namespaced": True, "kind": k, "verbs": ["get"]} for k in kinds]}
           for gv, kinds in KINDS.items()},
        "/apis/apps/v1/namespaces/default/statefulsets/snapmesh-node": {
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "snapmesh-node", "namespace": "default"},
            "spec": {"replicas": 4}},
        "/api/v1/namespaces/default/secrets/snapmesh-token": {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "snapmesh-token", "namespace": "default"},
            "data": {"token": base64.b64encode(TOKEN.encode()).decode()}},
    }
    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        self.seen.append(path)
        body = self.ROUTES.get(path)
        status = 200 if body is not None else 404
        data = json.dumps(body or {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                   "code": 404}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "stand-in", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "c", "context": {"cluster": "stand-in", "user": "u", "namespace": "default"}}],
    }))
    try:
        yield str(path)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _upgrade(kubeconfig: str, replicas: int, *values: str):
    return helm("template", "snapmesh", str(CHART), "--dry-run=server", "--is-upgrade", "--disable-openapi-validation",
                "--kubeconfig", kubeconfig, "--set", f"nodes.replicas={replicas}", *values, check=False)


def test_upgrade_refuses_another_node_count_without_a_rescale(kubeconfig):
    result = _upgrade(kubeconfig, 5)
    assert result.returncode != 0
    assert "the release runs 4 nodes and this upgrade asks for 5" in result.stderr
    assert ("stop the release with a snapshot (snapmesh snapshot trigger --stop), then upgrade with --set "
            "nodes.replicas=5 --set rescale.snapshot=<its id>") in result.stderr, result.stderr
    assert "Or keep nodes.replicas=4" in result.stderr
    assert "/apis/apps/v1/namespaces/default/statefulsets/snapmesh-node" in _FakeApi.seen


RESCALE = ("--set", "rescale.snapshot=20261129T140513.770624Z-670420ae", "--set", "app.module=kvshard")


def test_upgrade_to_another_node_count_with_a_rescale_renders_it(kubeconfig):
    import yaml

    result = _upgrade(kubeconfig, 3, *RESCALE)  # shrinking: the kept nodes' certificates are there
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert one(objects, "StatefulSet", "snapmesh-node")["spec"]["replicas"] == 3
    args = one(objects, "Job", "snapmesh-rescale")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["restore", "20261129T140513.770624Z-670420ae", "--nodes", "node-0,node-1,node-2"]
    grown = _upgrade(kubeconfig, 6, *RESCALE, "--set", "tls.enabled=false")  # no certificates to make
    assert grown.returncode == 0, grown.stderr
    refused = _upgrade(kubeconfig, 6, *RESCALE)  # the install's certificates Job made 4 nodes' only
    assert refused.returncode != 0 and "growing from 4 to 6 nodes needs certificates for the new nodes" in refused.stderr


def test_upgrade_with_the_same_count_keeps_the_token(kubeconfig):
    import yaml

    result = _upgrade(kubeconfig, 4)
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    token = one(objects, "Secret", "snapmesh-token")["data"]["token"]
    assert base64.b64decode(token).decode() == _FakeApi.TOKEN
    assert one(objects, "StatefulSet", "snapmesh-node")["spec"]["replicas"] == 4


def test_the_issue_command_renders_what_it_names():
    """`.venv/bin/helm template deploy/helm/snapmesh`, as the issue runs it (release name `release-name`)."""
    import subprocess

    import yaml

    from support.helm_chart import REPO

    out = subprocess.run([str(HELM), "template", "deploy/helm/snapmesh"], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    objects = [d for d in yaml.safe_load_all(out) if d]
    sts = one(objects, "StatefulSet", "release-name-snapmesh-node")
    assert sts["spec"]["volumeClaimTemplates"]
    assert all("grpc" in sts["spec"]["template"]["spec"]["containers"][0][p]
               for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    toml = one(objects, "ConfigMap", "release-name-snapmesh-cluster")["data"]["cluster.toml"]
    assert 'host = "release-name-snapmesh-node-0.release-name-snapmesh-nodes"' in toml
    assert {o["metadata"]["name"] for o in by_kind(objects, "NetworkPolicy")} == {
        "release-name-snapmesh-node", "release-name-snapmesh-controller", "release-name-snapmesh-ui"}
    secrets = {o["metadata"]["name"]: o for o in by_kind(objects, "Secret")}
    assert set(secrets) == {"release-name-snapmesh-token", "release-name-snapmesh-tls"}
    assert secrets["release-name-snapmesh-tls"]["metadata"]["annotations"]["helm.sh/hook"] == "pre-install"
    certs = one(objects, "Job", "release-name-snapmesh-certs")  # fills the TLS Secret at install
    assert certs["spec"]["template"]["spec"]["containers"][0]["args"] == ["apply", "-f", "/out/secret.json"]
