"""The stack on Docker Swarm, on this machine's real engine.

deploy/compose/generate.py writes the stack (3 nodes, one host h1), and
deploy/compose/swarm.sh deploys it, as docs/deploy.md says: certificates and the
token as Swarm secrets, the cluster file as a Swarm config, an overlay network, a
volume per node, placement by the node label snapmesh.host, the controller's port
published, restart on failure, Prometheus scraping every node by its service name.
The test then:

* takes a snapshot: COMPLETE; Prometheus's targets are every node's service name, up;
* kills a node's container: Swarm starts a new task, and a later snapshot is COMPLETE;
* gathers the volumes and runs the Spark job (jobs/reconcile_job.py, spark-submit in
  the reconcile image): every snapshot consistent with the logs;
* removes the stack (`swarm.sh rm --volumes`): no container, network, volume,
  secret or config of it is left. If the test made the swarm
  (`docker swarm init --advertise-addr 127.0.0.1`), it leaves it, whatever happened.

Prometheus runs from an image of Debian's prometheus binary on the project's base
(no registry here); Grafana's service is deployed with 0 replicas for the same reason.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from support.helpers_deploy import (
    COMPOSE_DIR,
    build_images,
    docker_engine_answers,
    live_log,
    log,
    prometheus_bin,
    run,
    status_name,
    trigger_snapshot,
)
from support.polling import wait_for
from snapmesh.settings.ports import free_ports
from snapmesh.settings.security import load_tls_dir

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1200)]

NODES = ["p1", "p2", "p3"]
DOCKER_LOCK = "/tmp/snapmesh-docker.lock"
SWARM_SH = COMPOSE_DIR / "swarm.sh"
REPO = COMPOSE_DIR.parent.parent
PROMETHEUS_IMAGE = "snapmesh-test-prometheus:swarm"
PUBLIC_PROMETHEUS = "prom/prometheus:v2.53.1"  # the stack's default


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return run(["docker", *args], check=check, timeout=timeout, quiet=True)


def swarm_state() -> str:
    return docker("info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()


def stack_leftovers(stack: str) -> dict[str, list[str]]:
    label = f"label=com.docker.stack.namespace={stack}"
    return {
        "services": docker("service", "ls", "-q", "--filter", label).stdout.split(),
        "containers": docker("ps", "-aq", "--filter", label).stdout.split(),
        "networks": docker("network", "ls", "-q", "--filter", label).stdout.split(),
        "volumes": docker("volume", "ls", "-q", "--filter", label).stdout.split(),
        "configs": docker("config", "ls", "-q", "--filter", label).stdout.split(),
        "secrets": docker("secret", "ls", "-q", "--filter", f"label=org.snapmesh.stack={stack}").stdout.split(),
    }


def running_task_container(stack: str, service: str) -> str:
    """The id of the service's running container ("" if none)."""
    out = docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={stack}_{service}",
                 "--filter", "status=running").stdout.split()
    return out[0] if len(out) == 1 else ""


def healthy(cid: str) -> bool:
    state = docker("inspect", "-f", "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}", cid,
                   check=False).stdout.split()
    return state == ["running", "healthy"]


@pytest.fixture(scope="module")
def swarm(pytestconfig):
    """This engine in swarm mode: made here (and left at the end) unless it already was."""
    live_log(pytestconfig)
    if not docker_engine_answers():
        pytest.skip("NO DOCKER ENGINE ANSWERS (`docker info` failed): the swarm stack was NOT tested")
    with open(DOCKER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = False
        state = swarm_state()
        # swarm init makes the docker_gwbridge network, and leaving keeps it: a test leaves nothing behind
        had_gwbridge = docker("network", "inspect", "docker_gwbridge", check=False).returncode == 0
        try:
            if state == "inactive":
                made = True
                docker("swarm", "init", "--advertise-addr", "127.0.0.1")
                log("swarm: initialised on 127.0.0.1 (left at the end)")
            else:
                assert state == "active", f"this engine's swarm state is {state!r}"
                log("swarm: this engine already is in a swarm (kept at the end)")
            node = docker("info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
            had_label = docker("node", "inspect", "-f", '{{index .Spec.Labels "snapmesh.host"}}', node).stdout.strip()
            run([str(SWARM_SH), "label-self", "h1"], quiet=True)
            yield
            if not made and had_label != "h1":
                docker("node", "update", "--label-rm", "snapmesh.host", node, check=False)
        finally:
            if made:
                docker("swarm", "leave", "--force", check=False)
                if not had_gwbridge:
                    docker("network", "rm", "docker_gwbridge", check=False)
                log(f"swarm: left ({swarm_state()})")


def prometheus_image(work: Path) -> str:
    """Debian's prometheus binary on the project's base: the stack's Prometheus without a
    registry. Where that binary cannot run on the base (a host with a newer C library,
    as GitHub's Ubuntu runners may be), the public image, which such machines can pull."""
    context = work / "prometheus-image"
    context.mkdir()
    shutil.copy(prometheus_bin(), context / "prometheus")
    (context / "Dockerfile").write_text(
        "FROM snapmesh-base-slim:bookworm\nCOPY prometheus /bin/prometheus\n"
        "RUN mkdir /prometheus && chown 65534:65534 /prometheus\nUSER 65534\nENTRYPOINT [\"/bin/prometheus\"]\n"
    )
    docker("build", "-q", "-t", PROMETHEUS_IMAGE, str(context), timeout=600)
    if docker("run", "--rm", PROMETHEUS_IMAGE, "--version", check=False).returncode == 0:
        return PROMETHEUS_IMAGE
    docker("image", "rm", PROMETHEUS_IMAGE, check=False)
    log(f"swarm: Debian's prometheus does not run on the base image; pulling {PUBLIC_PROMETHEUS}")
    docker("pull", "-q", PUBLIC_PROMETHEUS, timeout=600)
    return PUBLIC_PROMETHEUS


class Stack:
    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        self.stack_dir = work / "stack"
        self.tls = work / "tls"
        controller_port, self.prometheus_port, self.ui_port = free_ports(3)
        self.controller = f"127.0.0.1:{controller_port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SNAPMESH_", "PROMETHEUS_", "GRAFANA_"))},
            "SNAPMESH_STACK_DIR": str(self.stack_dir),
            "SNAPMESH_TLS_EXPORT": str(self.tls),
            "SNAPMESH_CONTROLLER_PORT": str(controller_port),
            "SNAPMESH_CONTROLLER_FLAGS": "--deadline 30",
            "SNAPMESH_APP_FLAGS": "--duration 31536000 --snapshot-every 0 --transfer-interval 0.2",
            "PROMETHEUS_PORT": str(self.prometheus_port),
            "SNAPMESH_UI_PORT": str(self.ui_port),
            "GRAFANA_REPLICAS": "0",
        }
        self.identity = None

    def swarm_sh(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return run([str(SWARM_SH), *args], env=self.env, timeout=timeout)

    def snapshot(self, what: str):
        """A COMPLETE snapshot, retried while the cluster comes (back) up."""
        last = []

        def attempt():
            try:
                snap = trigger_snapshot(self.controller, identity=self.identity, timeout=60)
            except Exception as exc:  # noqa: BLE001 - not up yet: UNAVAILABLE, a node not connected
                last[:] = [repr(exc)[:300]]
                return None
            last[:] = [f"{status_name(snap)} {snap.reason}"]
            return snap if status_name(snap) == "COMPLETE" else None

        snap = wait_for(attempt, timeout=180, interval=2, what=f"{what}: a COMPLETE snapshot (last: {last})",
                        retry_on=(Exception,))
        log(f"{what}: snapshot {snap.snapshot_id} COMPLETE, total {snap.total}")
        assert snap.conserved and sorted(n.node_id for n in snap.nodes) == NODES
        return snap


@pytest.fixture(scope="module")
def stack(swarm, tmp_path_factory):
    work = tmp_path_factory.mktemp("swarm")
    if docker("image", "inspect", "snapmesh:latest", "snapmesh-reconcile:latest", check=False).returncode != 0:
        build_images()
    name = f"snapmeshswarm{os.getpid()}{uuid.uuid4().hex[:4]}"
    st = Stack(name, work)
    run([sys.executable, str(COMPOSE_DIR / "generate.py"), "--nodes", str(len(NODES)), "--hosts", "1",
         "--out", str(st.stack_dir)], quiet=True)
    (st.stack_dir / "grafana").symlink_to(COMPOSE_DIR / "grafana")
    try:
        st.env["PROMETHEUS_IMAGE"] = prometheus_image(work)
        started = time.monotonic()
        st.swarm_sh("deploy", name)
        st.identity = load_tls_dir(st.tls)
        wait_for(lambda: all(running_task_container(name, s) and healthy(running_task_container(name, s))
                             for s in [*NODES, "controller", "ui"]),
                 timeout=240, interval=2, what="every node, the controller and the page healthy", retry_on=(Exception,))
        log(f"swarm: stack {name} healthy in {time.monotonic() - started:.0f}s")
        yield st
    finally:
        try:
            st.swarm_sh("rm", name, "--volumes")
        finally:
            left = stack_leftovers(name)
            docker("image", "rm", PROMETHEUS_IMAGE, check=False)
        assert not any(left.values()), f"stack {name} left behind {left}"


def test_the_stack_is_what_the_issue_asks(stack):
    services = {}
    for line in docker("service", "ls", "--filter", f"label=com.docker.stack.namespace={stack.name}",
                       "--format", "{{.Name}}").stdout.split():
        spec = json.loads(docker("service", "inspect", line).stdout)[0]["Spec"]
        services[line.removeprefix(f"{stack.name}_")] = spec
    assert {*NODES, "controller", "app", "ui", "prometheus", "grafana"} <= set(services)
    for node in NODES:
        task = services[node]["TaskTemplate"]
        assert task["Placement"]["Constraints"] == ["node.labels.snapmesh.host == h1"]
        assert task["RestartPolicy"]["Condition"] == "on-failure"
        mounts = {m["Target"]: m["Source"] for m in task["ContainerSpec"]["Mounts"]}
        assert mounts["/data"] == f"{stack.name}_{node}-data", "each node has its own volume"
        secrets = {s["File"]["Name"]: s["SecretName"] for s in task["ContainerSpec"]["Secrets"]}
        assert {f"{node}.pem", f"{node}-key.pem", "ca.pem"} <= set(secrets)
        assert "token" not in secrets, f"{node} holds the token: only the controller and the app may"
        keys = {source for source in secrets.values() if source.endswith("-key.pem")}
        assert keys == {f"{stack.name}-{node}-key.pem"}, f"{node} holds {keys}: its own key only"
    ports = services["controller"]["EndpointSpec"]["Ports"]
    assert [(p["TargetPort"], p["PublishedPort"]) for p in ports] == [(50050, int(stack.controller.rsplit(":", 1)[1]))]
    network = json.loads(docker("network", "inspect", f"{stack.name}_mesh").stdout)[0]
    assert network["Driver"] == "overlay"
    ui = services["ui"]["TaskTemplate"]
    assert [(p["TargetPort"], p["PublishedPort"]) for p in services["ui"]["EndpointSpec"]["Ports"]] == [(8080, stack.ui_port)]
    ui_files = {s["File"]["Name"] for s in ui["ContainerSpec"]["Secrets"]}
    assert ui_files == {"ca.pem", "client.pem", "client-key.pem"}, "the page reads: the client's pair, no token"


def test_the_page_answers_from_the_host(stack):
    """The page beside the controller, by its published port: its snapshot list (a
    snapshot taken first, so the list is not empty), and a foreign Host refused."""
    snap = stack.snapshot("for the page")
    url = f"http://127.0.0.1:{stack.ui_port}/"

    def page():
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status == 200 and answer.read().decode()
        except OSError:
            return None

    html = wait_for(lambda: (text := page()) and snap.snapshot_id in text and text, timeout=60, interval=2,
                    what=f"the page at {url} listing {snap.snapshot_id}", retry_on=(Exception,))
    assert "<html" in html.lower()
    request = urllib.request.Request(url, headers={"Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 421


def test_a_snapshot_is_complete_and_prometheus_scrapes_every_node_by_service_name(stack):
    stack.snapshot("deployed")

    def targets():
        url = f"http://127.0.0.1:{stack.prometheus_port}/api/v1/targets"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                active = json.load(answer)["data"]["activeTargets"]
        except OSError:
            return None
        up = {t["labels"]["instance"] for t in active if t["health"] == "up"}
        wanted = {"controller:9100"} | {f"{n}:{9100 + i}" for i, n in enumerate(NODES, 1)}
        return up if wanted <= up else None

    up = wait_for(targets, timeout=120, interval=2, what="Prometheus scraping the controller and every node by its service name",
                  retry_on=(Exception,))
    log(f"prometheus: up {sorted(up)}")
    assert "controller:9100" in up


def test_deploying_again_keeps_the_secrets_made_the_first_time(stack):
    before = stack_leftovers(stack.name)["secrets"]
    assert len(before) == 6 + 2 * len(NODES), before  # ca, token, client, controller pairs; each node's pair
    again = stack.swarm_sh("deploy", stack.name)
    assert f"the secrets of {stack.name} exist: kept" in again.stdout
    assert sorted(stack_leftovers(stack.name)["secrets"]) == sorted(before)
    stack.snapshot("deployed again")


def test_a_killed_node_gets_a_new_task_and_a_later_snapshot_is_complete(stack):
    old = running_task_container(stack.name, "p2")
    assert old
    docker("kill", old)
    log(f"swarm: killed p2's container {old[:12]}")
    new = wait_for(lambda: (c := running_task_container(stack.name, "p2")) and c != old and healthy(c) and c,
                   timeout=180, interval=2, what="a new healthy task for p2", retry_on=(Exception,))
    tasks = docker("service", "ps", "-q", f"{stack.name}_p2").stdout.split()
    log(f"swarm: p2 runs again in {new[:12]} ({len(tasks)} tasks)")
    assert len(tasks) >= 2
    stack.snapshot("after p2's restart")


def reconciling_block() -> str:
    """The first sh block of docs/deploy.md's Swarm "Reconciling" paragraph, as a user copies it."""
    text = (REPO / "docs" / "deploy.md").read_text()
    rest = text[text.index("**Reconciling.** The Spark job"):]
    block = rest[rest.index("```sh\n") + len("```sh\n"):]
    return block[: block.index("```")]


def test_the_reconciling_block_has_no_placeholder():
    block = reconciling_block()
    assert "..." not in block and "<" not in block, block
    assert block.startswith("STACK=snapmesh\n"), block


def test_the_spark_job_reconciles_the_snapshots_with_the_logs(stack):
    """docs/deploy.md's Reconciling block, run as written from the repository root (its
    stack name set to this test's): every COMPLETE snapshot consistent with the logs."""
    block = reconciling_block().replace("STACK=snapmesh\n", f"STACK={stack.name}\n", 1)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    verdicts = json.loads(done.stdout[done.stdout.index("{"):])["verdicts"]
    complete = [v for v in verdicts if v["scope"] == "snapshot" and v["status"] == "COMPLETE"]
    log(f"spark: {len(verdicts)} verdict(s): " + ", ".join(f"{v['scope']} {v['status']} {v['consistent']}" for v in verdicts))
    assert len(complete) >= 2 and all(v["consistent"] is True for v in complete), verdicts
    assert all(v["consistent"] is not False for v in verdicts), verdicts
