"""The fault campaign's Docker compose cluster (`snapmesh chaos --compose`): the
stack of deploy/compose (nodes, controller, mutual TLS and the token on) under
a compose project of its own, plus an override file this run writes:

- every node's gRPC port published on a fixed free loopback port, and the
  controller's, so that the load generator and the campaign dial them from
  the host with the client certificate the `certs` service exported (the
  nodes' certificates name 127.0.0.1) and a restart keeps the address;
- `SNAPMESH_RESTART=no`: a killed container stays down until we start it;
- the small disk: the disk node's data dir is /disk, a size-limited tmpfs
  volume (`driver_opts: type=tmpfs`) that the `disk-keeper` container (no
  network, `sleep infinity`) also mounts, so the tmpfs outlives the node's
  container between a kill and the restart; the keeper fills it (dd until
  ENOSPC) for a full-disk fault and empties it again. The keeper also mounts
  every process's data volume (`<name>-data` at /data/<name>): the logs and
  snapshots are copied out through it.

The faults, in docker terms: `docker kill -s KILL` then `docker start`;
`docker pause`/`unpause`; cut streams: every established connection into the
node's gRPC port from a peer's address destroyed in the container's network
namespace (`nsenter -n ss -K`: the kernel resets them); partition: `docker
network disconnect`, `connect` again under the node's alias after the hold;
a second instance: `docker exec` of `snapmesh node` in the node's container.
`teardown` is `down -v` and checks nothing of the project is left.

With `--app`, every container is given SNAPMESH_APP (and this process's
SNAPMESH_APP_PARAMS) as a user's stack is, and the image is $SNAPMESH_IMAGE when
set (a user's image with their module), else snapmesh:latest.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc

import snapmesh
from snapmesh.processes import compose_cli
from snapmesh.settings import config as cluster_config
from snapmesh.chaos.campaign import FaultNotApplied, Options
from snapmesh.checking.node_logs import read_node_log
from snapmesh.settings.appsettings import PARAMS_ENV
from snapmesh.settings.ports import free_ports
from snapmesh.settings.security import load_tls_dir
from snapmesh.processes.child import Security, SupervisorError, wait_serving

COMPOSE_DIR = Path(snapmesh.__file__).resolve().parent.parent / "deploy" / "compose"
IMAGE = "snapmesh:latest"
BASE_IMAGE = "snapmesh-base-slim:bookworm"  # debootstrap'd by build-base.sh: no registry needed
DISK_SIZE = "64m"  # the disk node's tmpfs
KEEPER = "disk-keeper"
STARTUP_TIMEOUT_S = 120.0
COMPOSE_TIMEOUT_S = 300.0
PAUSE_TRIES = 3


class ComposeError(SupervisorError):
    """A docker or Compose command failed (the message has its output's tail)."""


def docker(*args: str, timeout: float = 120, check: bool = True, env: dict[str, str] | None = None,
           text: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(args, capture_output=True, text=text, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ComposeError(f"{' '.join(args)}: {exc}") from None
    if check and done.returncode != 0:
        err = done.stderr if text else done.stderr.decode(errors="replace")
        raise ComposeError(f"{' '.join(args)} exited {done.returncode}: {err.strip()[-1500:]}")
    return done


def engine_problem() -> str:
    """Why the compose campaign cannot run here ("" when it can)."""
    if shutil.which("docker") is None:
        return "`docker` is not installed"
    if compose_cli.problem():
        return compose_cli.problem()
    if not (COMPOSE_DIR / "docker-compose.yml").exists():
        return f"no compose stack at {COMPOSE_DIR} (a source checkout is needed)"
    try:
        if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
            return "no Docker engine answers (`docker info` failed)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine answers ({exc})"
    return ""


def project_leftovers(project: str) -> dict[str, list[str]]:
    """Containers, networks and volumes labelled with the compose project."""
    label = f"label=com.docker.compose.project={project}"
    found = {}
    for kind, cmd in (
        ("containers", ["docker", "ps", "-aq", "--filter", label]),
        ("networks", ["docker", "network", "ls", "-q", "--filter", label]),
        ("volumes", ["docker", "volume", "ls", "-q", "--filter", label]),
    ):
        found[kind] = docker(*cmd, check=False).stdout.split()
    return found


class ComposeBackend:
    name = "compose"

    def __init__(self, options: Options, work: Path, say: Callable[[str], None]) -> None:
        self.say = say
        self.work = work
        # The app: SNAPMESH_APP and SNAPMESH_APP_PARAMS for every container, as a user's stack is given it
        # (deploy/compose); the image: $SNAPMESH_IMAGE (a user's, with their module), else snapmesh:latest.
        app = {"SNAPMESH_APP": options.app, **{k: os.environ[k] for k in (PARAMS_ENV,) if options.app and k in os.environ}}
        self.image = os.environ.get("SNAPMESH_IMAGE") or IMAGE
        self.config = cluster_config.load(COMPOSE_DIR / "cluster.toml", env={"SNAPMESH_DATA_DIR": "/data", **app})
        self.ids = [n.id for n in self.config.nodes]
        self.deadline = options.deadline  # the local campaign's, not the stack's 10 s: recoveries are timed alike
        self.project = f"snapmeshchaos-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.network = f"{self.project}_mesh"
        ports = free_ports(1 + len(self.ids))
        self.controller_address = f"127.0.0.1:{ports[0]}"
        self.published = {n: ports[i] for i, n in enumerate(self.ids, start=1)}
        self.data_dir = work / "data"
        self.tls_dir = work / "tls"
        self.override = work / "chaos.override.yml"
        self.client_identity = None
        self.security = Security()
        self.disk_node = ""
        self.disk_skip = "the stack is not up yet"
        self.cids: dict[str, str] = {}
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "SNAPMESH_"))},
            "SNAPMESH_RESTART": "no",
            "SNAPMESH_CONTROLLER_PUBLISH": self.controller_address,
            "SNAPMESH_CONTROLLER_FLAGS": f"--deadline {options.deadline:g}",
            "SNAPMESH_TLS_EXPORT": str(self.tls_dir),
            "COMPOSE_PROFILES": "",
            "SNAPMESH_IMAGE": self.image,
            **app,
        }

    # ------------------------------------------------------------ set-up

    def _compose(self, *args: str, timeout: float = COMPOSE_TIMEOUT_S, check: bool = True):
        compose = compose_cli.compose_command() or ["docker-compose"]
        return docker(*compose, "-p", self.project, "-f", str(COMPOSE_DIR / "docker-compose.yml"),
                      "-f", str(self.override), *args, timeout=timeout, check=check, env=self.env)

    def _ensure_image(self) -> None:
        if docker("docker", "image", "inspect", self.image, check=False).returncode == 0:
            self.say(f"compose: reusing the image {self.image} (`make images` rebuilds {IMAGE})")
            return
        if self.image != IMAGE:
            raise ComposeError(f"no image {self.image} ($SNAPMESH_IMAGE): build it first "
                               "(deploy/compose/Dockerfile.app-example)")
        self.say(f"compose: no image {IMAGE}: building it (deploy/compose/build-images.sh, base {BASE_IMAGE})")
        docker(str(COMPOSE_DIR / "build-images.sh"), timeout=1800, env={**os.environ, "BASE_IMAGE": BASE_IMAGE})

    def _write_override(self, disk_node: str) -> None:
        services: dict[str, dict] = {
            node: {"ports": [f"127.0.0.1:{self.published[node]}:{self.config.node(node).port}"]}
            for node in self.ids
        }
        services[disk_node]["environment"] = {"SNAPMESH_DATA_DIR": "/disk"}
        services[disk_node]["volumes"] = ["chaos-disk:/disk"]
        services[KEEPER] = {
            "image": "${SNAPMESH_IMAGE:-snapmesh:latest}", "entrypoint": ["sleep", "infinity"], "init": True,
            "restart": "no", "network_mode": "none",
            "volumes": [*(f"{name}-data:/data/{name}" for name in (*self.ids, "controller")), "chaos-disk:/disk"],
        }
        volumes = {"chaos-disk": {"driver": "local",
                                  "driver_opts": {"type": "tmpfs", "device": "tmpfs", "o": f"size={DISK_SIZE},mode=1777"}}}
        self.override.write_text(json.dumps({"services": services, "volumes": volumes}, indent=2) + "\n")  # JSON is YAML

    def start(self, disk_node: str) -> None:
        self.disk_node = disk_node
        self._ensure_image()
        self._write_override(disk_node)
        self.tls_dir.mkdir()
        self.say(f"compose: project {self.project}, {disk_node} on a {DISK_SIZE} tmpfs, controller at "
                 f"{self.controller_address}")
        self._compose("up", "-d", *self.ids, "controller", KEEPER)
        for service in (*self.ids, "controller", KEEPER):
            out = self._compose("ps", "-q", service).stdout.split()
            if not out:
                raise ComposeError(f"no container for the service {service}")
            self.cids[service] = out[0]
        self.client_identity = load_tls_dir(self.tls_dir)
        self.security = Security(self.client_identity)
        for service in (*self.ids, "controller"):
            self._wait_serving(service)
        self.disk_skip = ""

    def _address(self, service: str) -> str:
        return self.controller_address if service == "controller" else self.direct_address(service)

    def _wait_serving(self, service: str) -> None:
        """SERVING through its published port, or a ComposeError as soon as the container has exited."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                wait_serving(self._address(service), timeout=2, security=self.security)
                return
            except SupervisorError as exc:
                running, status = self._state(service)
                if not running or time.monotonic() > deadline:
                    tail = docker("docker", "logs", "--tail", "5", self.cids[service], check=False)
                    raise ComposeError(f"{service}: {exc} (running {running}, exit {status}): "
                                       f"{(tail.stdout + tail.stderr).strip()[-500:]}") from None

    def _state(self, service: str) -> tuple[bool, int]:
        out = docker("docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", self.cids[service]).stdout
        running, status = out.split()
        return running == "true", int(status)

    def channel(self, address: str) -> grpc.Channel:
        return self.security.channel(address)

    def direct_address(self, node: str) -> str:
        return f"127.0.0.1:{self.published[node]}"

    # ------------------------------------------------------------ the faults

    def _kill(self, service: str) -> None:
        docker("docker", "kill", "-s", "KILL", self.cids[service], check=False)  # already gone is fine
        docker("docker", "wait", self.cids[service], timeout=60)

    def _start(self, *services: str) -> None:
        docker("docker", "start", *(self.cids[s] for s in services))
        for service in services:
            self._wait_serving(service)

    def kill_node(self, node: str) -> None:
        self._kill(node)

    def start_nodes(self, nodes: tuple[str, ...]) -> None:
        self._start(*nodes)

    def node_alive(self, node: str) -> bool:
        return self._state(node)[0]

    def pause_node(self, node: str) -> None:
        """`docker pause`, tried PAUSE_TRIES times: the cgroup freezer gives up ("unable to freeze")
        when a task does not stop in time, and runc then thaws the container, so a pause that
        never took is a fault not applied, not a broken cluster."""
        for attempt in range(1, PAUSE_TRIES + 1):
            done = docker("docker", "pause", self.cids[node], check=False)
            if done.returncode == 0:
                return
            if docker("docker", "inspect", "-f", "{{.State.Paused}}", self.cids[node]).stdout.strip() == "true":
                return
            if attempt < PAUSE_TRIES:
                time.sleep(1.0)
        raise FaultNotApplied(f"docker pause failed {PAUSE_TRIES} times: {done.stderr.strip()[-300:]}")

    def resume_node(self, node: str) -> None:
        docker("docker", "unpause", self.cids[node])

    def _ip(self, service: str) -> str:
        template = f'{{{{with index .NetworkSettings.Networks "{self.network}"}}}}{{{{.IPAddress}}}}{{{{end}}}}'
        return docker("docker", "inspect", "-f", template, self.cids[service]).stdout.strip()

    def cut_streams(self, node: str) -> None:
        """The kernel destroys (RST) every connection into the node's port from a peer."""
        pid = docker("docker", "inspect", "-f", "{{.State.Pid}}", self.cids[node]).stdout.strip()
        peers = " or ".join(f"dst {ip}" for n in self.ids if n != node and (ip := self._ip(n)))
        port = self.config.node(node).port
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]  # nsenter needs root (a CI runner has sudo)
        done = docker(*sudo, "nsenter", "-t", pid, "-n", "ss", "-K", "-H", "-t", "state", "established",
                      f"( sport = :{port} ) and ( {peers} )")
        self.say(f"          {len(done.stdout.splitlines())} streams into {node} reset")

    def block(self, node: str) -> None:
        docker("docker", "network", "disconnect", "-f", self.network, self.cids[node])

    def unblock(self, node: str) -> None:
        if not self._ip(node):
            docker("docker", "network", "connect", "--alias", node, self.network, self.cids[node])

    def kill_controller(self) -> None:
        self._kill("controller")

    def start_controller(self) -> None:
        self._start("controller")

    def fill_disk(self) -> None:
        docker("docker", "exec", self.cids[KEEPER], "sh", "-c", "dd if=/dev/zero of=/disk/chaos-fill bs=64k "
               "2>/dev/null; exit 0", timeout=60)

    def free_disk(self) -> None:
        docker("docker", "exec", self.cids[KEEPER], "rm", "-f", "/disk/chaos-fill")

    def wait_exit(self, node: str, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while (state := self._state(node))[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        return None if state[0] else state[1]

    def second_instance(self, node: str) -> tuple[int, str]:
        done = docker("docker", "exec", self.cids[node], "snapmesh", "node", "--config", "/etc/snapmesh/cluster.toml",
                      "--id", node, check=False, timeout=60)
        return done.returncode, done.stderr

    # ------------------------------------------------------------ the end

    def _copy_out(self, directory: str, *, logs_only: bool) -> None:
        """The keeper's `directory` (every file, or only the nodes' logs) into data_dir, through a tar stream."""
        stream = docker("docker", "cp", f"{self.cids[KEEPER]}:{directory}", "-", text=False, timeout=300).stdout
        with tarfile.open(fileobj=io.BytesIO(stream)) as archive:
            for member in archive.getmembers():
                _, _, relative = member.name.partition("/")  # docker names the top directory itself
                if not relative or relative.endswith("chaos-fill") or not (member.isfile() or member.isdir()):
                    continue
                if logs_only and ("/" in relative or ".log" not in relative or not relative.endswith(".jsonl")):
                    continue
                member.name = relative
                archive.extract(member, self.data_dir, set_attrs=False)

    def read_logs(self) -> dict[str, list[dict]]:
        self.data_dir.mkdir(exist_ok=True)
        for directory in (*(f"/data/{node}" for node in self.ids), "/disk"):
            self._copy_out(directory, logs_only=True)
        return {n: read_node_log(self.data_dir, n) for n in self.ids}

    def heal(self) -> None:
        for node in self.ids:
            docker("docker", "unpause", self.cids[node], check=False)  # refused when not paused: fine
            self.unblock(node)

    def stop(self) -> dict[str, int | None]:
        """SIGTERM (tini passes it on) to every node, then the controller; the data copied out."""
        docker("docker", "stop", "-t", "10", *(self.cids[n] for n in self.ids), timeout=120)
        docker("docker", "stop", "-t", "10", self.cids["controller"], timeout=60)
        self.data_dir.mkdir(exist_ok=True)
        for directory in (*(f"/data/{name}" for name in (*self.ids, "controller")), "/disk"):
            self._copy_out(directory, logs_only=False)
        return {n: self._state(n)[1] for n in self.ids}

    def teardown(self) -> str:
        if not self.override.exists():
            return ""
        logs = self.data_dir / "logs"  # every container's output, as the local cluster keeps its children's
        logs.mkdir(parents=True, exist_ok=True)
        for service, cid in self.cids.items():
            done = docker("docker", "logs", cid, check=False, timeout=60)
            (logs / f"{service}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        self._compose("down", "-v", "--remove-orphans", "-t", "5", check=False, timeout=COMPOSE_TIMEOUT_S)
        left = project_leftovers(self.project)
        if any(left.values()):
            return f"compose project {self.project} left behind {left}"
        return ""
