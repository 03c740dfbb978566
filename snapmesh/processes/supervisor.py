"""The one process supervisor: snapmesh servers as local child processes.

Everything that runs a cluster on this machine goes through here: `snapmesh
cluster up`, `snapmesh demo`, every real-process test, the benchmarks, and
the fault campaign. Two layers:

- `Child`: one process from one command line. `start` (optionally waiting for
  gRPC health SERVING), `stop` (SIGTERM, SIGKILL after a grace period),
  `kill` (SIGKILL, or any signal, and wait), `pause`/`resume` (SIGSTOP/SIGCONT).
  It can be started again after it exited; its output is appended to one log
  file, each start headed by a `---- start #N` line.
- `Cluster`: the controller and every node of one cluster file, each a
  `Child`. Start/stop the whole, and the fault operations on one member, all of
  which keep its data dir (its transfer log and the snapshots):

      with Cluster("cluster.toml") as cluster:     # start() on enter, stop() on exit
          cluster.kill_node("p2")                  # SIGKILL, wait until it is gone
          cluster.start_node("p2")                 # again, on its log; waits for SERVING
          cluster.pause_node("p3"); cluster.resume_node("p3")
          cluster.restart_node("p1")               # SIGTERM, then start (kill=True: SIGKILL)
          cluster.restart_controller()

No orphans: every child runs in its own session (a Ctrl-C in a terminal reaches
only the supervising process, which stops the children in order) and asks the
kernel to SIGKILL it when its parent dies (PR_SET_PDEATHSIG, armed by the child
itself: `snapmesh.processes.orphans`), so even a SIGKILLed supervisor leaves nothing
behind. PR_SET_PDEATHSIG is tied to the thread that forked the child: start
and restart children from a long-lived thread, normally the main one. Not
thread-safe.

Hosts: a child runs on this machine, or on a `Host` (a Linux network
namespace of the multi-host bench, snapmesh.hosts), through `ip netns exec`.
`Host.command` is the one place that knows how to start a process on a host;
`run_on_host` runs a short command there (a probe). `Cluster(hosts=...)`
starts each member on its host and dials it at the host's address.

`Security` is the one place where how the children talk to each other is
decided: its flags go on every child's command line and its `channel` is what
the health checks dial. Today it is plaintext on loopback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from snapmesh.settings import config as cluster_config
from snapmesh.settings import security as tls
from snapmesh.processes import orphans
from snapmesh.settings.config import ClusterConfig
from snapmesh.serving.runtime import INSTANCE_ENV, INSTANCE_METADATA

STARTUP_TIMEOUT_S = 30.0  # longest wait for a child to answer SERVING
STOP_TIMEOUT_S = 5.0  # grace between SIGTERM and SIGKILL
_ROOT = Path(__file__).resolve().parents[2]


class SupervisorError(RuntimeError):
    """A child did not start or is not in the state an operation needs (the message says which, and why)."""


@dataclass(frozen=True, slots=True)
class Security:
    """How children are reached: plaintext (`identity` None), or mutual TLS with
    the client identity `identity` (snapmesh.settings.security). The children find their
    own certificates in the cluster file's [tls] or SNAPMESH_TLS_DIR (`Cluster`'s
    `tls_dir` sets it), so they need no extra flags."""

    identity: tls.Identity | None = None

    def child_args(self) -> list[str]:
        return []

    def channel(self, address: str) -> grpc.Channel:
        return tls.open_channel(address, self.identity)


PLAINTEXT = Security()


@dataclass(frozen=True, slots=True)
class Host:
    """A machine a child runs on: `namespace` is its Linux network namespace
    (None: this machine's own network), `address` the IP others reach it at."""

    name: str
    namespace: str | None
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as a command that runs it on this host. `ip netns exec` execs
        in place (no fork), so the child is still our child: PR_SET_PDEATHSIG
        and the session hold as for a local one."""
        return ["ip", "netns", "exec", self.namespace, *argv] if self.namespace else list(argv)


def run_on_host(host: Host | None, argv: Sequence[str], *, timeout: float = 60.0,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a short command on `host` (None: here) and wait: its exit status and output."""
    command = host.command(argv) if host is not None else list(argv)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


# ------------------------------------------------------------------- health


def wait_serving(
    address: str,
    timeout: float = STARTUP_TIMEOUT_S,
    *,
    child: Child | None = None,
    security: Security = PLAINTEXT,
    instance: str | None = None,
) -> None:
    """Block until the gRPC server at `address` answers SERVING on health checking.

    `instance`: only an answer carrying that instance id counts (snapmesh.serving.runtime):
    the process just started, not another one on the same port.
    SupervisorError on timeout, or at once when `child` exits first.
    """
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    last = "no answer"
    with security.channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if child is not None and not child.alive:
                raise SupervisorError(f"{address}: process exited before serving (exit status {child.returncode})")
            try:
                response, call = stub.Check.with_call(health_pb2.HealthCheckRequest(), timeout=0.5, wait_for_ready=True)
                answered = dict(call.trailing_metadata() or ()).get(INSTANCE_METADATA)
                if instance is not None and answered != instance:
                    last = f"another process answers there (instance {answered or 'unknown'}, not {instance})"
                elif response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                else:
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            except grpc.RpcError as error:
                last = error.code().name
            time.sleep(0.05)
    raise SupervisorError(f"{address}: not SERVING after {timeout:g}s (last: {last})")


# -------------------------------------------------------------------- Child


class Child:
    """One supervised process. `health_address`: where it answers gRPC health
    checks once ready (None: `start` never waits)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        health_address: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT_S,
        security: Security = PLAINTEXT,
        host: Host | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = env
        self.health_address = health_address
        self.startup_timeout = startup_timeout
        self.security = security
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.instance_id: str | None = None  # new for each start: what its health answers carry

    @property
    def alive(self) -> bool:
        """Started and not exited (a paused child is alive)."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise SupervisorError(f"{self.name} was never started")
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status of the last run (negative: killed by that signal); None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def start(self, *, wait: bool = True) -> Child:
        """Start the process (again, after it exited); with `wait`, return once it
        is SERVING, or SIGKILL it and raise SupervisorError."""
        if self.alive:
            raise SupervisorError(f"{self.name} is already running")
        self.starts += 1
        self.instance_id = uuid.uuid4().hex
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            argv = self.host.command(self.argv) if self.host is not None else self.argv
            log.write(f"---- start #{self.starts}: {' '.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**(os.environ if self.env is None else self.env), orphans.ENV: str(os.getpid()),
                     INSTANCE_ENV: self.instance_id},
                start_new_session=True,
            )
        if wait:
            try:
                self.wait_serving()
            except SupervisorError:
                self.kill(signal.SIGKILL)
                raise
        return self

    def wait_serving(self, timeout: float | None = None) -> None:
        """Return once the child itself (its instance id) answers SERVING; SupervisorError
        (with its log's tail) if it exits or times out."""
        if self.health_address is None:
            return
        try:
            wait_serving(self.health_address, timeout or self.startup_timeout, child=self, security=self.security,
                         instance=self.instance_id)
        except SupervisorError as exc:
            tail = self.log_tail()
            detail = f"\n--- {self.log_path} (last lines) ---\n{tail}" if tail else ""
            raise SupervisorError(f"{self.name} at {exc}{detail}") from None

    def send_signal(self, sig: int) -> None:
        """Send `sig` if the child runs; do not wait."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing."""
        self._require_alive("pause")
        self.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        self._require_alive("resume")
        self.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (waking it if paused), SIGKILL after `timeout`; the exit status."""
        return self.kill(signal.SIGTERM, timeout)

    def kill(self, sig: int = signal.SIGKILL, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Send `sig` and wait for the exit (SIGKILL after `timeout`); the exit status (None: never started)."""
        if self.proc is None:
            return None
        if self.alive:
            self.send_signal(sig)
            self.send_signal(signal.SIGCONT)
            self.wait(timeout)
        return self.proc.returncode

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Wait up to `timeout` for an exit already under way, then SIGKILL; the exit status."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.proc.wait()
        return self.proc.returncode

    def output(self) -> str:
        """Everything the child printed, over all its starts."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def _require_alive(self, what: str) -> None:
        if not self.alive:
            raise SupervisorError(f"cannot {what} {self.name}: it is not running")


# ------------------------------------------------------------------ Cluster


class Cluster:
    """The controller and every node of a cluster file, as supervised children.

    `config`: a ClusterConfig or a path to a cluster file. `data_dir` overrides
    the file's (through SNAPMESH_DATA_DIR, so the children see it too).
    `controller`: False when something else answers on the controller's port
    (the node tests' report sink); the controller operations then refuse.
    `controller_args`: extra arguments for `snapmesh controller` (e.g. --interval).
    `env`: the children's environment (default: this process's).
    `tls_dir`: mutual TLS and the token, with the files `snapmesh certs` wrote
    there (through SNAPMESH_TLS_DIR); with it, or a cluster file with [tls],
    `client_identity` is what a client presents, and a bad certificate, key or
    token file is a ConfigError naming it.
    `hosts`: name ("controller" or a node id) -> the Host it runs on (the
    multi-host bench); every member is then dialled at its host's address.
    Children's output goes to `<data_dir>/logs/<controller|node id>.log`.
    """

    def __init__(
        self,
        config: ClusterConfig | str | os.PathLike[str],
        *,
        data_dir: str | os.PathLike[str] | None = None,
        controller: bool = True,
        controller_args: Sequence[str] = (),
        startup_timeout: float = STARTUP_TIMEOUT_S,
        python: str = sys.executable,
        security: Security = PLAINTEXT,
        env: dict[str, str] | None = None,
        tls_dir: str | os.PathLike[str] | None = None,
        hosts: Mapping[str, Host] | None = None,
    ) -> None:
        self.hosts: dict[str, Host] = dict(hosts or {})
        self._env = dict(os.environ if env is None else env)
        if data_dir is not None:
            self._env["SNAPMESH_DATA_DIR"] = str(Path(data_dir).resolve())
        if tls_dir is not None:
            self._env["SNAPMESH_TLS_DIR"] = str(Path(tls_dir).resolve())
        path = config.path if isinstance(config, ClusterConfig) else Path(config)
        self.config_path = Path(path).resolve()
        self.config = cluster_config.load(self.config_path, env=self._env)
        if self.config_path.parent == cluster_config.SHIPPED_CONFIGS:
            # A shipped file's relative data_dir depends on the current directory
            # (snapmesh.settings.config): the children get it as resolved here.
            self._env["SNAPMESH_DATA_DIR"] = str(self.config.data_dir)
        if security is PLAINTEXT and self.config.tls is not None:
            try:  # the client's certificate and token, as the cluster file or tls_dir names them
                security = Security(identity=tls.load_identity(self.config, cluster_config.CLIENT_NAME))
            except tls.SecurityError as exc:
                raise cluster_config.ConfigError(str(exc)) from None
        self._env["PYTHONUNBUFFERED"] = "1"
        self._env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), self._env.get("PYTHONPATH")) if p)
        self.security = security
        self.log_dir = self.config.data_dir / "logs"
        base = [python, "-m", "snapmesh.cli"]
        config_args = ["--config", str(self.config_path), *security.child_args()]

        def child(name: str, args: list[str], address: str) -> Child:
            return Child(name if name == "controller" else f"node {name}", [*base, *args, *config_args],
                         log_path=self.log_dir / f"{name}.log", env=self._env, health_address=address,
                         startup_timeout=startup_timeout, security=security, host=self.hosts.get(name))

        self.controller: Child | None = (
            child("controller", ["controller", *controller_args], self.controller_address) if controller else None
        )
        self.nodes: dict[str, Child] = {
            n.id: child(n.id, ["node", "--id", n.id], self.direct_address(n.id)) for n in self.config.nodes
        }

    # -- addresses and processes

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    @property
    def client_identity(self) -> tls.Identity | None:
        """What a client of this cluster presents (None: plaintext): for
        snapmesh.settings.security.open_channel."""
        return self.security.identity

    @property
    def controller_address(self) -> str:
        if "controller" in self.hosts:
            return f"{self.hosts['controller'].address}:{self.config.controller.port}"
        return self.config.controller.address

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(self.nodes)

    def node_address(self, node_id: str) -> str:
        """The address peers and clients dial (a proxy's, when the file puts one in between)."""
        if node_id in self.hosts:
            return f"{self.hosts[node_id].address}:{self.config.node(node_id).port}"
        return self.config.node(node_id).address

    def direct_address(self, node_id: str) -> str:
        """The address the node itself listens on (`listen_port` when set)."""
        node = self.config.node(node_id)
        host = self.hosts[node_id].address if node_id in self.hosts else node.host
        return f"{host}:{node.listen_port or node.port}"

    def node(self, node_id: str) -> Child:
        self.config.node(node_id)  # ConfigError naming the file for an unknown id
        return self.nodes[node_id]

    def node_pid(self, node_id: str) -> int:
        return self.node(node_id).pid

    @property
    def controller_pid(self) -> int:
        return self._controller().pid

    def children(self) -> list[Child]:
        """Nodes first, then the controller: the order they are stopped in."""
        return [*self.nodes.values(), *([self.controller] if self.controller else [])]

    def pids(self) -> list[int]:
        return [c.pid for c in self.children() if c.alive]

    def alive(self) -> dict[str, bool]:
        result = {"controller": self.controller.alive} if self.controller else {}
        result.update({n: c.alive for n, c in self.nodes.items()})
        return result

    # -- the whole cluster

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, *node_ids: str) -> Cluster:
        """Start the controller (if supervised) and every node, or only the nodes
        named; all at once, then return once each is SERVING. On failure stop
        everything and raise SupervisorError."""
        chosen = [self.node(n) for n in node_ids] if node_ids else self.children()
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            for child in chosen:
                child.start(wait=False)
            for child in chosen:
                child.wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every child (nodes first), SIGKILL what is left after `timeout`."""
        running = [c for c in self.children() if c.alive]
        for child in running:
            child.send_signal(signal.SIGTERM)
            child.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + timeout
        for child in running:
            child.wait(max(0.0, deadline - time.monotonic()))

    # -- one node (its data dir is always kept)

    def start_node(self, node_id: str) -> None:
        """(Re)start a stopped node on its log; return once it is SERVING."""
        self.node(node_id).start()

    def stop_node(self, node_id: str, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a clean stop), SIGKILL after `timeout`; the exit status."""
        return self.node(node_id).stop(timeout)

    def kill_node(self, node_id: str, sig: int = signal.SIGKILL, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """A crash: send `sig` (default SIGKILL) and wait until the node is gone; the exit status."""
        return self.node(node_id).kill(sig, timeout)

    def restart_node(self, node_id: str, *, kill: bool = False) -> None:
        """Stop the node (SIGTERM, or SIGKILL with `kill`) and start it again; return once SERVING."""
        child = self.node(node_id)
        child.kill(signal.SIGKILL if kill else signal.SIGTERM)
        child.start()

    def pause_node(self, node_id: str) -> None:
        """SIGSTOP: the node keeps its connections but stops answering."""
        self.node(node_id).pause()

    def resume_node(self, node_id: str) -> None:
        self.node(node_id).resume()

    def signal_node(self, node_id: str, sig: int) -> None:
        """Send any signal without waiting."""
        self.node(node_id).send_signal(sig)

    # -- the controller (its snapshots dir is kept)

    def start_controller(self) -> None:
        self._controller().start()

    def stop_controller(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        return self._controller().kill(sig, timeout)

    def kill_controller(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        return self._controller().kill(signal.SIGKILL, timeout)

    def restart_controller(self, *, kill: bool = False) -> None:
        child = self._controller()
        child.kill(signal.SIGKILL if kill else signal.SIGTERM)
        child.start()

    def pause_controller(self) -> None:
        self._controller().pause()

    def resume_controller(self) -> None:
        self._controller().resume()

    def _controller(self) -> Child:
        if self.controller is None:
            raise SupervisorError("this cluster does not supervise a controller (controller=False)")
        return self.controller
