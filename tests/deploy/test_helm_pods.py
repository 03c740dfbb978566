"""The Helm chart's rendered pods, run on this machine's Docker engine.

No Kubernetes API server can run here, so tests/helm_pods.py plays the kubelet
and the cluster DNS from `helm template`'s output alone: each StatefulSet pod
becomes a container with the pod's command, args, env, user, security context,
limits, mounted ConfigMap/Secret files and one Docker volume per claim, on a
private network where it answers to the names the chart's Services give it
(`snapmesh-node-0.snapmesh-nodes`, `snapmesh-controller`). The certificate hook
Job's init containers make the TLS Secret (its `kubectl apply` is not run), the
token Secret is the rendered one, and the controller's port is published on
127.0.0.1 as `kubectl port-forward` would. Then, against the images of
`make images` (the service image with this checkout's Python code copied over
it, so the test runs the code it ships with):

* `helm test` on the fresh install (no snapshot yet): its Job's init container takes
  one, then the reconcile container exits 0;
* the page's pod answers through its published port, as a port-forward, by the
  Ingress's host name, and by its Service's name from another pod;
* every pod passes its gRPC readiness probe (plaintext, health port, service);
* a node's container holds its own key only (its init container copies it out of
  the nodes' Secret): no other key anywhere in it, as root or its user; nothing it holds
  passes for the controller on Node.RestoreState; it cannot write another node's log;
* the workload Job (`workload.enabled`: the bank app with the client's pair and the token,
  a `helm test` hook) takes snapshots under load, each COMPLETE and conserved, and so is the next;
* a node's container killed and started again on its volume is back SERVING and
  the next snapshot is COMPLETE;
* `snapmesh restore` and the grpcurl snapshot line of NOTES.txt, through the
  forwarded port with the files fetched from the Secrets, are RESTORED and COMPLETE;
* the reconcile Job (the `helm test` hook) exits 0 over the volumes.

A typo in the chart's command, env, Secret keys or DNS names fails it: the
plan checks below show the cheap ones without starting the cluster.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import warnings
from pathlib import Path

import pytest

from support.helm_chart import CHART, REPO, by_kind, helm, render, set_args
from support.helm_pods import PlanError, PodRunner, docker
from support.helpers_deploy import (
    build_images,
    copies_in,
    docker_engine_answers,
    exec_in,
    identities_in,
    log,
    private_keys_in,
    restore_state_refused,
    status_name,
)
from support.polling import wait_for
from snapmesh.settings import security
from snapmesh.serving import credentials
from snapmesh.settings.ports import free_ports

NODES = 3
OVERLAY = "snapmesh-helm-test"
SNAPMESH = str(Path(sys.executable).parent / "snapmesh")
NODE_PODS = [f"snapmesh-node-{i}" for i in range(NODES)]
PAGE_HOST = "snapmesh.example.com"  # the Ingress's host: the page must accept it
WORKLOAD_S = 5  # the workload Job's run: transfers, and a snapshot every 2 s


def _values(tag: str) -> dict:
    return {"nodes.replicas": NODES, "image.repository": OVERLAY, "image.tag": tag,
            "ingress.enabled": True, "ingress.hosts[0].host": PAGE_HOST,
            "workload.enabled": True, "workload.duration": WORKLOAD_S, "workload.seed": 22}


def _overlay_image(tag: str, workdir: Path) -> str:
    """snapmesh:latest with this checkout's snapmesh/ (services/ inside it, through the link) copied over its installed one."""
    context = workdir / "overlay"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "snapmesh", context / "snapmesh", ignore=ignore)  # follows snapmesh/services -> ../services
    site = "/opt/snapmesh/lib/python3.11/site-packages"
    (context / "Dockerfile").write_text(
        f"FROM snapmesh:latest\nCOPY snapmesh {site}/snapmesh\n")
    image = f"{OVERLAY}:{tag}"
    docker("build", "-q", "--label", f"snapmesh.helm-test={tag}", "-t", image, str(context), timeout=300)
    return image


class Cluster:
    def __init__(self, runner: PodRunner, port: int, tls_dir: Path, tag: str = "", page_port: int = 0,
                 page_pod: str = "") -> None:
        self.runner, self.port, self.tls_dir, self.tag, self.page_port = runner, port, tls_dir, tag, page_port
        self.page_pod = page_pod  # a pod inside the network holding the client's pair (no token)
        self.address = f"127.0.0.1:{port}"
        self.identity = security.load_tls_dir(tls_dir)
        self.expected_total = 1000 * NODES

    def stub(self):
        from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

        channel = credentials.open_channel(self.address, self.identity)
        return channel, pb_grpc.ControllerStub(channel)

    def snapshot(self):
        from snapmesh.v1 import snapmesh_pb2 as pb

        channel, stub = self.stub()
        with channel:
            return stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)

    def complete_snapshot(self, what: str, tries: int = 1):
        for attempt in range(tries):
            snapshot = self.snapshot()
            if status_name(snapshot) == "COMPLETE" or attempt == tries - 1:
                break
            log(f"{what}: {status_name(snapshot)} ({snapshot.reason}); again")
            time.sleep(2)
        assert status_name(snapshot) == "COMPLETE", f"{what}: {snapshot}"
        assert snapshot.conserved and snapshot.total == self.expected_total == snapshot.expected_total, f"{what}: {snapshot}"
        return snapshot

    def workload(self) -> str:
        """The chart's workload Job (the bank app, a `helm test` hook before the reconcile Job):
        transfers and a snapshot every 2 s, each finished and conserved, else it exits 1. It runs
        where the client's pair and the token are: the page holds no token, the controller no pair."""
        results = self.runner.run_job(self.runner.job_pod("snapmesh-workload"), timeout=WORKLOAD_S + 120)
        [(name, code, logs)] = results
        assert (name, code) == ("workload", 0), logs[-4000:]
        assert "all snapshots conserved: yes" in logs, logs[-4000:]
        taken = re.search(r"snapshots: (\d+) complete", logs)
        assert taken and int(taken.group(1)) >= 1, logs[-4000:]  # it took snapshots, under load
        return logs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not docker_engine_answers():
        reason = "NO DOCKER ENGINE ANSWERS (`docker info` failed): the chart's pods were NOT run"
        warnings.warn(reason, stacklevel=2)
        pytest.skip(reason)
    started = time.monotonic()
    if docker("image", "inspect", "snapmesh:latest", "snapmesh-reconcile:latest", check=False).returncode != 0:
        build_images()
    workdir = tmp_path_factory.mktemp("helm-pods")
    runner = None
    tag = f"t{int(time.time())}{abs(hash(workdir)) % 10000}"
    try:
        _overlay_image(tag, workdir)
        runner = PodRunner(render(_values(tag)), workdir)
        certs = runner.job_pod("snapmesh-certs")
        results = runner.run_job(certs, skip=("apply",))
        assert [(name, code) for name, code, _ in results] == [("certs", 0), ("manifest", 0)], results
        secret = runner.add_secret_manifest(runner.job_dir(certs, "out") / "secret.json")
        assert secret == "snapmesh-tls"
        port, page_port = free_ports(2, "127.0.0.1")
        for pod in runner.statefulset_pods("snapmesh-node"):
            runner.start(pod)
        [controller] = runner.statefulset_pods("snapmesh-controller")
        runner.start(controller, publish={50050: port})
        runner.wait_ready([*NODE_PODS, "snapmesh-controller-0"])
        [page] = runner.deployment_pods("snapmesh-ui")
        runner.start(page, publish={8080: page_port})  # `kubectl port-forward svc/snapmesh-ui 8080`
        tls_dir = workdir / "client-tls"  # what NOTES.txt has the user fetch from the Secrets
        tls_dir.mkdir()
        for name in ("ca.pem", "client.pem", "client-key.pem"):
            (tls_dir / name).write_bytes(runner.secrets["snapmesh-tls"][name])
        (tls_dir / "token").write_bytes(runner.secrets["snapmesh-token"]["token"])
        log(f"helm pods: {NODES} nodes and the controller ready in {time.monotonic() - started:.0f} s")
        yield Cluster(runner, port, tls_dir, tag, page_port, page.name)
    finally:
        if runner is not None:
            runner.close()
            assert not runner.leftovers(), f"left behind: {runner.leftovers()}"
        docker("rmi", "-f", f"{OVERLAY}:{tag}", check=False)
        log(f"helm pods: total {time.monotonic() - started:.0f} s")


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_helm_test_passes_on_a_fresh_install(cluster):
    """`helm test` right after `helm install`, before anyone took a snapshot: the test
    Job's init container takes one, then reconcile finds it consistent with the logs."""
    from snapmesh.v1 import snapmesh_pb2 as pb

    channel, stub = cluster.stub()
    with channel:
        assert not stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10).snapshots, "not a fresh install"
    results = cluster.runner.run_job(cluster.runner.job_pod("snapmesh-reconcile"), timeout=600)
    assert [(name, code) for name, code, _ in results] == [("snapshot", 0), ("reconcile", 0)], results[-1][2][-4000:]
    assert "COMPLETE" in results[0][2], results[0][2]
    log("helm test on a fresh install: " + " | ".join(results[1][2].splitlines()[-3:]))


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_the_page_answers_through_its_service(cluster):
    """The page's pod, reached as a port-forward would (Host 127.0.0.1), by the Ingress's
    host name, and by its Service's name from another pod; a foreign Host is refused."""
    import urllib.error
    import urllib.request

    snapshot = cluster.complete_snapshot("for the page", tries=2)
    url = f"http://127.0.0.1:{cluster.page_port}/"

    def page(host: str | None = None):
        request = urllib.request.Request(url, headers={"Host": host} if host else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code
        except OSError:
            return None

    def listed():
        text = page()
        return isinstance(text, str) and snapshot.snapshot_id in text and text

    html = wait_for(listed, timeout=60, interval=1, what=f"the page listing {snapshot.snapshot_id}", retry_on=(Exception,))
    assert "<html" in html.lower()
    assert snapshot.snapshot_id in page(PAGE_HOST)
    assert page("attacker.example") == 421
    by_name = exec_in(cluster.runner.containers["snapmesh-controller-0"],
                      "python -c \"import urllib.request as u; print(u.urlopen('http://snapmesh-ui:8080/healthz').status)\"")
    assert by_name.stdout.strip() == "200", by_name.stderr


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_pods_answer_to_the_services_names(cluster):
    runner = cluster.runner
    for pod in NODE_PODS:
        aliases = docker("inspect", "-f", f"{{{{json (index .NetworkSettings.Networks \"{runner.network}\").Aliases}}}}",
                         runner.containers[pod]).stdout
        assert f'"{pod}.snapmesh-nodes"' in aliases
        assert runner.probe(pod, "livenessProbe") and runner.probe(pod, "startupProbe")
    from snapmesh.v1 import snapmesh_pb2 as pb

    channel, stub = cluster.stub()
    with channel:
        info = stub.GetCluster(pb.GetClusterRequest(), timeout=10)
    assert [(n.node_id, n.address) for n in info.nodes] == [
        (f"node-{i}", f"snapmesh-node-{i}.snapmesh-nodes:50051") for i in range(NODES)]
    assert len(info.channels) == NODES * (NODES - 1)
    # Inside the network each node answers mutual TLS at that name (its certificate names it),
    # asked from the page's pod: the controller's holds no client pair.
    for i in range(NODES):
        out = docker("exec", runner.containers[cluster.page_pod], "snapmesh", "health",
                     f"snapmesh-node-{i}.snapmesh-nodes:50051", "--timeout", "5").stdout
        assert "SERVING" in out


# ---------------------------------------------- each node pod holds its own key only


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_node_pod_holds_only_its_own_key(cluster):
    """node-1's container finds no private key but its own anywhere (as root or its user), nor a
    copy of the controller's, the client's or node-0's key under another name."""
    runner = cluster.runner
    node1 = runner.containers["snapmesh-node-1"]
    assert private_keys_in(node1) == {"/tls/node-1-key.pem": "/tls/node-1-key.pem"}
    assert sorted(exec_in(node1, "ls /tls").stdout.split()) == ["ca.pem", "node-1-key.pem", "node-1.pem"]
    for key in ("controller-key.pem", "node-0-key.pem"):
        assert exec_in(node1, f"cat /tls/{key}").returncode != 0, key
    secret = runner.secrets["snapmesh-tls"]
    others = ("controller-key.pem", "client-key.pem", "node-0-key.pem", "node-2-key.pem")
    assert copies_in(node1, *(secret[key].decode() for key in others)) == [], f"node-1 holds one of {others}"
    mounts = json.loads(docker("inspect", "-f", "{{json .Mounts}}", node1).stdout)
    assert {m["Destination"] for m in mounts} == {"/data", "/etc/snapmesh", "/tmp", "/tls"}


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_nothing_a_node_pod_holds_passes_for_the_controller(cluster, tmp_path):
    """With every certificate and key in node-1's container, and the token, Node.RestoreState on
    node-0 is refused: only the controller's certificate may restore a node."""
    runner = cluster.runner
    pairs = identities_in(runner.containers["snapmesh-node-1"], "/tls", tmp_path / "node-1")
    assert sorted(pairs) == ["node-1"]
    template = f'{{{{(index .NetworkSettings.Networks "{runner.network}").IPAddress}}}}'
    ip = docker("inspect", "-f", template, runner.containers["snapmesh-node-0"]).stdout.strip()
    for identity in pairs.values():
        assert restore_state_refused(f"{ip}:50051", "node-0", identity)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_node_pod_cannot_write_another_nodes_data(cluster):
    """node-1 writes where node-0's log would be: it lands on node-1's own claim; node-0's log never sees it."""
    import uuid

    runner = cluster.runner
    node0, node1 = runner.containers["snapmesh-node-0"], runner.containers["snapmesh-node-1"]
    marker = f"written-by-node-1-{uuid.uuid4().hex}"
    wrote = exec_in(node1, f"echo {marker} >> /data/node-0.log.jsonl")
    try:
        assert wrote.returncode == 0, wrote.stderr
        log0 = exec_in(node0, "cat /data/node-0.log.jsonl")
        assert log0.returncode == 0 and log0.stdout, "node-0 has no log"
        assert marker not in log0.stdout, "node-1 appended to node-0's transfer log"
    finally:
        exec_in(node1, "rm -f /data/node-0.log.jsonl")


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_snapshot_under_load_is_complete(cluster):
    log("workload job: " + " | ".join(cluster.workload().splitlines()[-3:]))
    cluster.complete_snapshot("after the workload", tries=2)


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_killed_node_is_back_serving_on_its_volume(cluster):
    runner = cluster.runner
    name = runner.containers["snapmesh-node-1"]
    docker("kill", name)
    docker("start", name)
    runner.wait_ready(["snapmesh-node-1"], timeout=120)
    output = docker("logs", name)
    # It replayed the log it wrote before the kill, from its claim's volume at /data.
    text = output.stdout + output.stderr
    found = re.search(r"recovered from /data/node-1\.log\.jsonl: balance (\d+), (\d+) records read", text)
    assert found and int(found.group(2)) > 0, text[-2000:]
    cluster.workload()
    cluster.complete_snapshot("node-1 restarted", tries=3)


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_restore_is_restored(cluster):
    snapshot = cluster.complete_snapshot("before the restore", tries=2)
    result = subprocess.run([SNAPMESH, "restore", "--controller", cluster.address, "--tls-dir", str(cluster.tls_dir),
                             snapshot.snapshot_id], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESTORED" in result.stdout
    cluster.complete_snapshot("after the restore", tries=3)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_the_notes_grpcurl_line_takes_a_snapshot(cluster):
    """NOTES.txt's grpcurl line, run with the real grpcurl (.venv/bin), the forwarded port and the fetched files."""
    out = helm("install", "snapmesh", str(CHART), "--dry-run=client", *set_args({"nodes.replicas": NODES})).stdout
    [line] = [x.strip() for x in out[out.index("NOTES:"):].splitlines() if x.strip().startswith("grpcurl ")]
    assert "127.0.0.1:50050" in line and "snapmesh-tls/" in line
    line = line.replace("127.0.0.1:50050", cluster.address).replace("snapmesh-tls/", f"{cluster.tls_dir}/")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["status"] == "COMPLETE" and answer["conserved"] is True, answer


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_reconcile_job_exits_0(cluster):
    runner = cluster.runner
    results = runner.run_job(runner.job_pod("snapmesh-reconcile"), timeout=600)
    assert [(name, code) for name, code, _ in results] == [("snapshot", 0), ("reconcile", 0)], results[-1][2][-4000:]
    logs = results[-1][2]
    log("reconcile job: " + " | ".join(line for line in logs.splitlines()[-3:]))


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_cert_manager_certificates_serve(cluster, tmp_path):
    """tls.source=certManager: the Secrets cert-manager would make from the rendered
    Certificates (played by PodRunner.play_cert_manager) mounted as the chart
    projects them; 2 nodes and the controller come up on mutual TLS and take a
    COMPLETE snapshot. (Its own small cluster, beside the module's.)"""
    tag = cluster.tag  # the overlay image the module built
    objects = render({"nodes.replicas": 2, "image.repository": OVERLAY, "image.tag": tag, "tls.source": "certManager",
                      "reconcile.enabled": False})
    runner = PodRunner(objects, tmp_path)
    try:
        made = runner.play_cert_manager()
        assert sorted(made) == sorted(f"snapmesh-tls-{n}" for n in ("node-0", "node-1", "controller", "client"))
        [port] = free_ports(1, "127.0.0.1")
        for pod in runner.statefulset_pods("snapmesh-node"):
            runner.start(pod)
        [controller] = runner.statefulset_pods("snapmesh-controller")
        runner.start(controller, publish={50050: port})
        runner.wait_ready(["snapmesh-node-0", "snapmesh-node-1", "snapmesh-controller-0"])
        tls_dir = tmp_path / "client-tls"  # NOTES.txt's cert-manager lines: ca.crt, tls.crt, tls.key of snapmesh-tls-client
        tls_dir.mkdir()
        client = runner.secrets["snapmesh-tls-client"]
        for key, name in (("ca.crt", "ca.pem"), ("tls.crt", "client.pem"), ("tls.key", "client-key.pem")):
            (tls_dir / name).write_bytes(client[key])
        (tls_dir / "token").write_bytes(runner.secrets["snapmesh-token"]["token"])
        small = Cluster(runner, port, tls_dir)
        small.expected_total = 2000
        small.complete_snapshot("cert-manager certificates", tries=3)
    finally:
        runner.close()
        assert not runner.leftovers()


# ---------------------------------------------------------------- typos fail (no cluster needed)


def _cluster_hosts(objects) -> list[str]:
    [cm] = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "snapmesh-cluster"]
    raw = tomllib.loads(cm["data"]["cluster.toml"])
    return [n["host"] for n in raw["nodes"]] + [raw["controller"]["host"]]


def _resolvable(objects, tmp_path) -> set[str]:
    runner = PodRunner(objects, tmp_path)
    pods = runner.statefulset_pods("snapmesh-node") + runner.statefulset_pods("snapmesh-controller")
    return {alias for pod in pods for alias in runner.aliases(pod)}


def test_every_host_of_the_cluster_file_is_a_name_the_services_give(tmp_path):
    objects = render({"nodes.replicas": NODES})
    assert set(_cluster_hosts(objects)) <= _resolvable(objects, tmp_path)
    broken = copy.deepcopy(objects)
    [sts] = [o for o in broken if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "snapmesh-node"]
    sts["spec"]["serviceName"] = "snapmesh-node"  # a typo: no headless Service of that name
    missing = set(_cluster_hosts(broken)) - _resolvable(broken, tmp_path)
    assert missing == {f"snapmesh-node-{i}.snapmesh-nodes" for i in range(NODES)}


def test_a_secret_key_typo_is_refused(tmp_path):
    objects = render({"nodes.replicas": NODES})
    for obj in objects:
        if obj["kind"] == "StatefulSet" and obj["metadata"]["name"] == "snapmesh-node":
            tls = next(v for v in obj["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls-nodes")
            item = tls["projected"]["sources"][0]["secret"]["items"][0]
            original, item["key"] = item["key"], "tokn"  # a node holds no token now: the typo is in its TLS files
    runner = PodRunner(objects, tmp_path)
    pod = runner.statefulset_pods("snapmesh-node")[0]
    tls = next(v for v in pod.spec["volumes"] if v["name"] == "tls-nodes")
    # The hook Job's Secret, as `snapmesh certs` names its files (the Job itself runs in the cluster test).
    keys = [item["key"] for item in tls["projected"]["sources"][0]["secret"]["items"]]
    runner.secrets["snapmesh-tls"] = {key: b"pem" for key in keys if key != "tokn"} | {original: b"pem"}
    spelled_right = copy.deepcopy(tls)
    spelled_right["projected"]["sources"][0]["secret"]["items"][0]["key"] = original
    runner._materialize(pod, spelled_right, None)  # the same volume, spelled right, materializes
    with pytest.raises(PlanError, match="no key 'tokn'"):
        runner._materialize(pod, tls, None)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_command_typo_fails_the_pod(tmp_path):
    if not docker_engine_answers():
        pytest.skip("NO DOCKER ENGINE ANSWERS: not run")
    objects = render({"nodes.replicas": NODES, "tls.enabled": False})
    [sts] = [o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "snapmesh-controller"]
    sts["spec"]["template"]["spec"]["containers"][0]["args"][0] = "controler"
    runner = PodRunner(objects, tmp_path)
    try:
        [pod] = runner.statefulset_pods("snapmesh-controller")
        runner.start(pod)
        with pytest.raises(AssertionError, match="exited 2"):
            runner.wait_ready(["snapmesh-controller-0"], timeout=60)
    finally:
        runner.close()
        assert not runner.leftovers()
