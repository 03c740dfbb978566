"""Helpers shared by the deployment tests (test_terraform, test_dashboard, test_compose).

Everything that starts something (a cluster, Prometheus, a compose stack) hands
back a handle whose clean-up the caller runs in a `finally`/fixture teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.cluster_helpers import controller_stub, node_stub  # noqa: F401  (re-exported for the deploy tests)
from support.polling import wait_for
from snapmesh.chaos.compose import project_leftovers  # noqa: F401  (re-exported for the compose tests)
from snapmesh.settings.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"
TERRAFORM_DIR = REPO / "deploy" / "terraform-ec2"
DASHBOARD = COMPOSE_DIR / "grafana" / "dashboards" / "snapmesh.json"
RULES = COMPOSE_DIR / "rules.yml"
VENV_BIN = Path(sys.executable).parent
SNAPMESH = str(VENV_BIN / "snapmesh")

CHECKOV_VERSION = "3.3.30"
CHECKOV_VENV = REPO / ".venv-checkov"

_live = None  # (terminal reporter, capture manager), once a test hands them over (live_log)


def live_log(pytestconfig) -> None:
    """Make `log` write to the terminal as it happens, past pytest's capture."""
    global _live
    plugins = pytestconfig.pluginmanager
    _live = (plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager"))


def log(message: str) -> None:
    """A progress line: live on the terminal when live_log was called, and
    always in the test's captured stderr (shown when it fails)."""
    line = f"[deploy-test {time.strftime('%H:%M:%S')}] {message}"
    print(line, file=sys.stderr, flush=True)
    if _live is not None and _live[0] is not None:
        reporter, capture = _live
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line(line)


def port_is_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


# ----------------------------------------------------------------- HCL (terraform)


def _unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def normalize_hcl(value: Any) -> Any:
    """python-hcl2 7.x and 8.x to one shape: no `__is_block__`/`__comments__`
    markers, no quotes kept around string values and block labels."""
    if isinstance(value, dict):
        return {
            _unquote(key): normalize_hcl(item)
            for key, item in value.items()
            if key not in ("__is_block__", "__comments__", "__start_line__", "__end_line__")
        }
    if isinstance(value, list):
        return [normalize_hcl(item) for item in value]
    return _unquote(value)


def load_hcl(path: Path) -> dict[str, Any]:
    import hcl2

    with path.open(encoding="utf-8") as handle:
        return normalize_hcl(hcl2.load(handle))


def blocks(parsed: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """`resource`/`data` blocks as {"type.name": body}; `variable`/`output` as {name: body}."""
    found: dict[str, dict[str, Any]] = {}
    for entry in parsed.get(kind, []):
        for label, body in entry.items():
            if kind in ("resource", "data"):
                for name, inner in body.items():
                    found[f"{label}.{name}"] = inner
            else:
                found[label] = body
    return found


def checkov_bin() -> Path:
    """checkov in a virtualenv of its own (it downgrades `packaging` and installs
    an `hcl2` module that clashes with python-hcl2), created on first use."""
    exe = CHECKOV_VENV / "bin" / "checkov"
    stamp = CHECKOV_VENV / f".checkov-{CHECKOV_VERSION}"
    if exe.exists() and stamp.exists():
        return exe
    log(f"creating {CHECKOV_VENV.name}/ with checkov=={CHECKOV_VERSION} (~30 s, once)")
    python = shutil.which("python3") or sys.executable
    subprocess.run([python, "-m", "venv", "--clear", str(CHECKOV_VENV)], check=True)
    subprocess.run(
        [str(CHECKOV_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", f"checkov=={CHECKOV_VERSION}"],
        check=True,
    )
    stamp.touch()
    return exe


# ------------------------------------------------------------------ Prometheus


def prometheus_bin() -> str:
    """Debian's prometheus (2.42), installed with apt-get when missing."""
    found = shutil.which("prometheus") or (Path("/usr/bin/prometheus").exists() and "/usr/bin/prometheus")
    if found:
        return str(found)
    if os.geteuid() != 0:
        raise RuntimeError("prometheus is not installed and this is not root: apt-get install prometheus")
    log("installing Debian's prometheus package (~20 s, once)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"],
        check=True,
        env=env,
        capture_output=True,
    )
    # The package may start its own service; this test runs its own instance only.
    subprocess.run(["sh", "-c", "service prometheus stop || true"], capture_output=True)
    return "/usr/bin/prometheus"


@dataclass
class Prometheus:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        return data["result"] if data["resultType"] in ("vector", "matrix") else [data["result"]]

    def stop(self) -> None:
        stop_process(self.process)


def start_prometheus(
    targets: dict[str, list[str]], workdir: Path, *, interval: str = "1s", rule_files: list[Path] = ()
) -> Prometheus:
    """A Prometheus on a free loopback port scraping `targets` ({job: [host:port]})
    and evaluating the alerting rules of `rule_files`."""
    binary = prometheus_bin()
    (port,) = free_ports(1)
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()
        ],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    log_path = workdir / "prometheus.log"
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log_path.open("wb"),
        start_new_session=True,
    )
    prometheus = Prometheus(process, port, log_path)
    try:
        wait_for(
            lambda: _ready(prometheus),
            timeout=30,
            what=f"prometheus ready on :{port} (log: {log_path})", interval=0.5, retry_on=(Exception,),
        )
    except BaseException:
        prometheus.stop()
        raise
    return prometheus


def _ready(prometheus: Prometheus) -> bool:
    if prometheus.process.poll() is not None:
        raise RuntimeError(f"prometheus exited: {prometheus.log_path.read_text()[-2000:]}")
    try:
        with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (panel title, PromQL expression) of a Grafana dashboard, rows included."""
    found = []

    def visit(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((panel.get("title", "?"), target["expr"]))
            visit(panel.get("panels", []))

    visit(dashboard.get("panels", []))
    return found


# ------------------------------------------------------------ local processes


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM the process group, then SIGKILL it if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


# ---------------------------------------------------------------- gRPC clients


def trigger_snapshot(address: str, *, wait: bool = True, timeout: float = 60, initiator: str = "", identity=None):
    from snapmesh.v1 import snapmesh_pb2

    channel, stub = controller_stub(address, identity)
    with channel:
        return stub.TriggerSnapshot(snapmesh_pb2.TriggerSnapshotRequest(initiator=initiator, wait=wait), timeout=timeout)


def status_name(snapshot) -> str:
    from snapmesh.v1 import snapmesh_pb2

    return snapmesh_pb2.Snapshot.Status.Name(snapshot.status)


# ---------------------------------------------------------------------- Docker


def docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run(cmd: list[str], *, timeout: float = 600, check: bool = True, env: dict[str, str] | None = None,
        quiet: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command, log it, and raise with its output tail when it fails."""
    if not quiet:
        log("$ " + " ".join(cmd))
    started = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and result.returncode != 0:
        tail = (result.stdout[-3000:] + "\n" + result.stderr[-3000:]).strip()
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode} after {time.monotonic() - started:.0f}s:\n{tail}")
    return result


BASE_IMAGE = "snapmesh-base-slim:bookworm"  # build-base.sh also makes snapmesh-base:bookworm (+ Java)


# The images build_images made in this test run, by tag: the tree does not change during
# a run, so a second build would only find every layer cached, yet cost about 35 s under
# load (five pip runs re-resolving the wheels, a 480 MB build context sent twice), and
# five modules ask for the images.
_BUILT: dict[str, dict[str, str]] = {}


def _images(tag: str) -> dict[str, str]:
    return {"service": f"snapmesh:{tag}", "reconcile": f"snapmesh-reconcile:{tag}"}


def build_images(tag: str = "latest") -> dict[str, str]:
    """deploy/compose/build-images.sh: the base images (debootstrap, reused when
    they exist), the wheels (host cache), then both Dockerfile targets. Once a test
    run: later calls find the images this run built (under another tag: tagged anew)."""
    wanted = _images(tag)
    for built in list(_BUILT.values()):
        if run(["docker", "image", "inspect", *built.values()], check=False, quiet=True).returncode != 0:
            _BUILT.clear()  # removed since: build again
            break
        for kind, image in built.items():
            if image != wanted[kind]:
                run(["docker", "tag", image, wanted[kind]], quiet=True)
        log(f"images of this run's tree reused: {', '.join(built.values())} as {', '.join(wanted.values())}")
        _BUILT[tag] = wanted
        return wanted
    result = run([str(COMPOSE_DIR / "build-images.sh"), tag], timeout=1200,
                 env={**os.environ, "BASE_IMAGE": BASE_IMAGE})
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith(("build-base:", "fetch-wheels:", "build-images:")):
            log(line)
    _BUILT[tag] = wanted
    return wanted


def compose_bin() -> list[str] | None:
    """`docker compose` (v2) where it answers, else `docker-compose` (v1): snapmesh.processes.compose_cli."""
    from snapmesh.processes.compose_cli import compose_command

    return compose_command()


def compose_cmd(project: str, *args: str) -> list[str]:
    return [*(compose_bin() or ["docker-compose"]), "-p", project, "-f", str(COMPOSE_DIR / "docker-compose.yml"), *args]


def container_id(project: str, service: str, env: dict[str, str]) -> str:
    out = run(compose_cmd(project, "ps", "-q", service), env=env, quiet=True).stdout.strip()
    if not out:
        raise RuntimeError(f"no container for service {service}")
    return out.splitlines()[0]


def container_health(cid: str) -> str:
    out = run(
        ["docker", "inspect", "-f", "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}", cid],
        quiet=True,
    ).stdout.split()
    return out[1] if len(out) > 1 else out[0]


def copy_volume(volume: str, dest: Path, image: str = "snapmesh:latest") -> Path:
    """Copy a named volume's files to `dest` (for a failure's post-mortem)."""
    name = f"snapmesh-copy-{os.getpid()}-{int(time.monotonic() * 1000)}"
    run(["docker", "create", "--name", name, "-v", f"{volume}:/data", image], quiet=True)
    try:
        run(["docker", "cp", f"{name}:/data", str(dest)], quiet=True)
    finally:
        run(["docker", "rm", "-f", name], quiet=True, check=False)
    return dest


# ------------------------------------------------- what a container holds (keys, data)


def exec_in(cid: str, script: str, *, root: bool = False) -> subprocess.CompletedProcess:
    """`sh -c script` in the container, as its own user or as root (with the container's
    capabilities: root without them cannot read what only its user may)."""
    user = ["-u", "0"] if root else []
    return run(["docker", "exec", *user, cid, "sh", "-c", script], quiet=True, check=False)


def _as_root_and_user(cid: str, script: str) -> list[str]:
    """The lines `script` prints as root and as the container's own user (a file either can read).
    The two run at once: each is a walk of the whole file system, mostly waiting on the storage driver."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda root: exec_in(cid, script, root=root), (True, False)))
    return sorted({line for result in done for line in result.stdout.splitlines()})


def private_keys_in(cid: str) -> dict[str, str]:
    """Every `*-key.pem` anywhere in the container, searched as root and as its own user,
    and the file each resolves to."""
    found = _as_root_and_user(cid, "find / \\( -path /proc -o -path /sys \\) -prune -o -name '*-key.pem' -print"
                                   " 2>/dev/null | while read -r f; do echo \"$f $(readlink -f \"$f\")\"; done")
    return dict(line.split() for line in found)


def copies_in(cid: str, *pems: str) -> list[str]:
    """The files in the container (searched as root and as its own user; not the image's
    /usr and /opt, made before any key existed) holding the body of any of the PEMs `pems`,
    under any name: one walk of the file system for them all."""
    bodies = [pem.splitlines()[1] for pem in pems]
    assert bodies and all(len(body) > 40 for body in bodies), f"no PEM body: {bodies!r}"
    patterns = " ".join(f"-e '{body}'" for body in bodies)
    return _as_root_and_user(cid, f"grep -rlF {patterns} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr"
                                  " --exclude-dir=opt 2>/dev/null")


def identities_in(cid: str, directory: str, workdir: Path) -> dict[str, Any]:
    """Every certificate and key pair in the container's `directory`, with the CA and
    the token there (a node's holds none), loaded as the identity it would present."""
    from snapmesh.settings import security

    workdir.mkdir(parents=True)
    for name in exec_in(cid, f"ls {directory}").stdout.split():
        done = run(["docker", "exec", cid, "cat", f"{directory}/{name}"], quiet=True, check=False)
        if done.returncode == 0:
            (workdir / name).write_text(done.stdout)
    pairs = {}
    for key in workdir.glob("*-key.pem"):
        name = key.name.removesuffix("-key.pem")
        pairs[name] = security.load_files(name, ca=workdir / "ca.pem", cert=workdir / f"{name}.pem", key=key,
                                          token_file=workdir / "token" if (workdir / "token").exists() else None)
    return pairs


def restore_state_refused(address: str, server_name: str, identity) -> bool:
    """Node.RestoreState with `identity` (and its token) answers PERMISSION_DENIED; any
    other answer, a success included, raises naming it."""
    import grpc

    from snapmesh.v1 import snapmesh_pb2 as pb

    channel, stub = node_stub(address, identity, server_name=server_name)
    with channel:
        try:
            answer = stub.RestoreState(pb.RestoreStateRequest(snapshot_id="probe-not-the-controller", epoch=1),
                                       timeout=10)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.PERMISSION_DENIED:
                return True
            raise AssertionError(f"RestoreState as {identity.name}: {error.code().name} {error.details()}") from None
    raise AssertionError(f"RestoreState as {identity.name} was accepted: {answer}")
