"""The one process supervisor: snapmesh servers as local child processes.

Everything that runs a cluster on this machine goes through here: `snapmesh
cluster up`, `snapmesh demo`, every real-process test, the benchmarks, and
the fault campaign. Two layers:

- `Child` (`snapmesh.processes.child`): one process from one command line,
  started, stopped, killed, paused and resumed; where it runs (`Host`) and how
  it is dialled (`Security`), and why no child outlives its supervisor.
- `Cluster`: the controller and every node of one cluster file, each a
  `Child`. Start/stop the whole, and the fault operations on one member, all of
  which keep its data dir (its transfer log and the snapshots):

      with Cluster("cluster.toml") as cluster:     # start() on enter, stop() on exit
          cluster.kill_node("p2")                  # SIGKILL, wait until it is gone
          cluster.start_node("p2")                 # again, on its log; waits for SERVING
          cluster.pause_node("p3"); cluster.resume_node("p3")
          cluster.restart_node("p1")               # SIGTERM, then start (kill=True: SIGKILL)
          cluster.restart_controller()

`Cluster(hosts=...)` starts each member on its `Host` and dials it at the
host's address. Not thread-safe: start and restart children from one
long-lived thread, normally the main one (PR_SET_PDEATHSIG is tied to it).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from snapmesh.processes.child import (
    PLAINTEXT,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Child,
    Host,
    Security,
    SupervisorError,
)
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security as tls
from snapmesh.settings.config import ClusterConfig

_ROOT = Path(__file__).resolve().parents[2]


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
    `app`: the app every member runs ("module:attr", through SNAPMESH_APP) in
    place of the cluster file's [app] (None: the file's, by default the bank).
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
        app: str | None = None,
    ) -> None:
        self.hosts: dict[str, Host] = dict(hosts or {})
        self._env = dict(os.environ if env is None else env)
        if app:
            self._env["SNAPMESH_APP"] = app
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
    def child_env(self) -> dict[str, str]:
        """The environment the children run in (a copy): the page's process runs in it too."""
        return dict(self._env)

    @property
    def client_identity(self) -> tls.Identity | None:
        """What a client of this cluster presents (None: plaintext): for
        snapmesh.serving.credentials.open_channel."""
        return self.security.identity

    @property
    def controller_address(self) -> str:
        if "controller" in self.hosts:
            return f"{self.hosts['controller'].address}:{self.config.controller.port}"
        return self.config.controller.address

    @property
    def controller_metrics_address(self) -> str:
        """Where the controller's Prometheus metrics are read (its host's, with hosts)."""
        if "controller" in self.hosts:
            return f"{self.hosts['controller'].address}:{self.config.controller.metrics_port}"
        return self.config.controller.metrics_address

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
