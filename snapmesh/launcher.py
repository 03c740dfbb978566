"""A whole cluster as local processes on loopback: `snapmesh cluster up`, and the
`LocalCluster` API the tests, the demo and the benchmarks use.

    snapmesh cluster up [--config FILE] [--nodes N] [--data-dir DIR] [--tls]

With no arguments it runs the shipped 4-node full mesh (snapmesh/configs/local-4.toml).
`--nodes N` writes an N-node full-mesh config on free loopback ports into the data
dir (a new temporary directory unless --data-dir is given) and runs that.
It starts the controller and every node as child processes, waits until each one
answers SERVING on gRPC health, prints exactly one line `controller: HOST:PORT` on
stdout, and on SIGINT/SIGTERM stops them all (SIGTERM, then SIGKILL after a
grace period). Children's output goes to `<data_dir>/logs/<name>.log`.
`--tls` makes dev certificates and a token into `<data_dir>/tls/` (`ca.pem`,
`client.pem`, `client-key.pem`, `token`, one certificate per process), runs
every connection over mutual TLS with the token on the control plane, and
prints a second line `grpcurl: ...` with the command to trigger a snapshot.

No orphans: every child runs in its own session (a Ctrl-C in the terminal
reaches only the launcher, which stops the children in order) and asks the
kernel to SIGKILL it if the launcher dies (PR_SET_PDEATHSIG), so even a
SIGKILLed launcher leaves nothing behind.

Exit status: 0 after a clean stop, 1 when the cluster cannot start, 2 for bad
arguments or a malformed cluster file (the message names the field).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from snapmesh import config as cluster_config
from snapmesh import security
from snapmesh.argparsing import parse_args
from snapmesh.config import ClusterConfig, ConfigError

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A process of the cluster did not start (the message says which, and why)."""


# ------------------------------------------------------------------ configs


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that were free a moment ago.

    Drawn below the kernel's ephemeral range: ports the kernel hands out (to
    every outgoing connection on the machine) would soon be taken by a client
    socket, and the server started on them later would fail to bind.
    """
    low, _ = _ephemeral_range()
    candidates = range(max(1024, low - 16384), low)
    rng = random.SystemRandom()
    ports: list[int] = []
    for _ in range(count * 50):
        if len(ports) == count:
            break
        port = rng.choice(candidates)
        if port not in ports and port_is_free(host, port):
            ports.append(port)
    if len(ports) < count:
        raise ClusterError(f"found only {len(ports)} free ports below {low}, needed {count}")
    return ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(host: str, port: int) -> bool:
    """Nothing listens on host:port: a server could bind it now (SO_REUSEADDR, as
    gRPC servers use, so connections closing in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def write_config(
    path: str | os.PathLike[str],
    *,
    nodes: int | Sequence[str] = 4,
    topology: str | Iterable[Sequence[str]] = "mesh",
    initial_balance: int = 1000,
    deadline: float = 10.0,
    data_dir: str | os.PathLike[str] | None = None,
    ports: Sequence[int] | None = None,
    host: str = "127.0.0.1",
) -> Path:
    """Write a cluster file and return its path.

    `nodes`: a count (ids p1..pN) or the ids. `topology`: "mesh" (every ordered
    pair), "ring" (one-way p1->p2->...->pN->p1) or explicit [src, dst] pairs.
    `data_dir` defaults to the file's directory. `ports`: 2 + 2N ports
    (controller port and metrics port, then each node's); default: free ones.
    """
    path = Path(path)
    ids = [f"p{i}" for i in range(1, nodes + 1)] if isinstance(nodes, int) else list(nodes)
    if not ids:
        raise ValueError("a cluster needs at least one node")
    ports = list(ports) if ports is not None else free_ports(2 + 2 * len(ids), host)
    if len(ports) != 2 + 2 * len(ids):
        raise ValueError(f"need {2 + 2 * len(ids)} ports, got {len(ports)}")
    if topology == "mesh":
        channels = None
    elif topology == "ring":
        channels = [(ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids))] if len(ids) > 1 else []
    elif isinstance(topology, str):
        raise ValueError(f"unknown topology {topology!r} (mesh, ring, or a list of [src, dst] pairs)")
    else:
        channels = [tuple(c) for c in topology]

    data = Path(data_dir) if data_dir is not None else path.parent
    lines = [
        "# Written by snapmesh.launcher.write_config",
        f"data_dir = {_toml_str(str(data.resolve()))}",
        f"initial_balance = {int(initial_balance)}",
    ]
    if channels is not None:
        pairs = ", ".join(f"[{_toml_str(s)}, {_toml_str(d)}]" for s, d in channels)
        lines.append(f"channels = [{pairs}]")
    lines += [
        "",
        "[controller]",
        f"host = {_toml_str(host)}",
        f"port = {ports[0]}",
        f"metrics_port = {ports[1]}",
        f"snapshot_deadline_s = {float(deadline)!r}",
    ]
    for index, node_id in enumerate(ids):
        lines += [
            "",
            "[[nodes]]",
            f"id = {_toml_str(node_id)}",
            f"host = {_toml_str(host)}",
            f"port = {ports[2 + 2 * index]}",
            f"metrics_port = {ports[3 + 2 * index]}",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _toml_str(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# ---------------------------------------------------------------- processes


def _die_with_parent(parent_pid: int):
    """A preexec_fn: the kernel SIGKILLs the child when the launcher dies."""

    def preexec() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # not Linux: the launcher still stops its children on a clean exit
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def wait_serving(
    address: str, timeout: float, alive=lambda: True, exit_code=lambda: None, identity: security.Identity | None = None
) -> None:
    """Block until the gRPC server at `address` answers SERVING; ClusterError on timeout.
    `identity`: the client certificate for a TLS cluster (None: plaintext)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    last = "no answer"
    with security.open_channel(address, identity) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if not alive():
                raise ClusterError(f"{address}: process exited before serving (exit status {exit_code()})")
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5, wait_for_ready=True)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            except grpc.RpcError as error:
                last = error.code().name
            time.sleep(0.05)
    raise ClusterError(f"{address}: not SERVING after {timeout:g}s (last: {last})")


class _Child:
    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Send `sig` (waking the process if stopped), SIGKILL after `timeout`; return the exit code."""
        if self.proc is None:
            return None
        if self.alive:
            self.send(sig)
            self.send(signal.SIGCONT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.send(signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class LocalCluster:
    """The controller and every node of a cluster file, as local child processes.

        with LocalCluster(config_path) as cluster:    # start() on enter, stop() on exit
            stub = ControllerStub(security.open_channel(cluster.controller_address, cluster.client_identity))

    `config`: a ClusterConfig or a path to a cluster file. `data_dir` overrides
    the file's (through SNAPMESH_DATA_DIR, so the children see it too).
    `tls_dir`: run with mutual TLS and the token, with the files `snapmesh certs`
    wrote there (through SNAPMESH_TLS_DIR); `client_identity` is then what a client
    presents. A bad certificate, key or token file is a ConfigError naming it.
    `controller_args`: extra arguments for `snapmesh controller` (e.g. --interval).

    Children die with the thread that started them (PR_SET_PDEATHSIG is tied
    to the parent thread): start and restart processes from a long-lived thread,
    normally the main one. Not thread-safe.
    """

    def __init__(
        self,
        config: ClusterConfig | str | os.PathLike[str],
        *,
        data_dir: str | os.PathLike[str] | None = None,
        controller_args: Sequence[str] = (),
        startup_timeout: float = STARTUP_TIMEOUT_S,
        python: str = sys.executable,
        tls_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._env = dict(os.environ)
        if data_dir is not None:
            self._env["SNAPMESH_DATA_DIR"] = str(Path(data_dir).resolve())
        if tls_dir is not None:
            self._env["SNAPMESH_TLS_DIR"] = str(Path(tls_dir).resolve())
        path = config.path if isinstance(config, ClusterConfig) else Path(config)
        self.config_path = Path(path).resolve()
        self.config = cluster_config.load(self.config_path, env=self._env)
        try:
            self.client_identity = security.load_identity(self.config, cluster_config.CLIENT_NAME)
        except security.SecurityError as exc:
            raise ConfigError(str(exc)) from None
        self._env["PYTHONUNBUFFERED"] = "1"
        root = str(Path(__file__).resolve().parent.parent)
        self._env["PYTHONPATH"] = os.pathsep.join(p for p in (root, self._env.get("PYTHONPATH")) if p)
        self.controller_args = list(controller_args)
        self.startup_timeout = startup_timeout
        self.python = python
        self.log_dir = self.config.data_dir / "logs"
        self._controller: _Child | None = None
        self._nodes: dict[str, _Child] = {}

    # -- addresses

    @property
    def controller_address(self) -> str:
        return self.config.controller.address

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.config.nodes)

    def node_address(self, node_id: str) -> str:
        return self.config.node(node_id).address

    def node_pid(self, node_id: str) -> int:
        child = self._nodes.get(node_id)
        if child is None or child.proc is None:
            raise ClusterError(f"node {node_id} was never started")
        return child.proc.pid

    @property
    def controller_pid(self) -> int:
        if self._controller is None or self._controller.proc is None:
            raise ClusterError("the controller was never started")
        return self._controller.proc.pid

    def pids(self) -> list[int]:
        children = [self._controller, *self._nodes.values()]
        return [c.proc.pid for c in children if c is not None and c.alive]

    # -- lifecycle

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        """Start the controller and every node; return once all are SERVING."""
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._spawn_controller()
            for node in self.config.nodes:
                self._spawn_node(node.id)
            self._wait(self._controller, self.controller_address)
            for node in self.config.nodes:
                self._wait(self._nodes[node.id], node.address)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM everything (nodes first), SIGKILL what is left after `timeout`."""
        children = [*self._nodes.values(), self._controller]
        children = [c for c in children if c is not None and c.alive]
        for child in children:
            child.send(signal.SIGTERM)
            child.send(signal.SIGCONT)
        deadline = time.monotonic() + timeout
        for child in children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.send(signal.SIGKILL)
                child.proc.wait()

    def start_node(self, node_id: str) -> None:
        """(Re)start one node on its data dir; return once it is SERVING."""
        child = self._nodes.get(node_id)
        if child is not None and child.alive:
            raise ClusterError(f"node {node_id} is already running")
        self._spawn_node(node_id)
        self._wait(self._nodes[node_id], self.node_address(node_id))

    def kill_node(self, node_id: str, sig: int = signal.SIGKILL, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Send `sig` to a node and wait for it to exit (SIGKILL after `timeout`)."""
        return self._node(node_id).stop(sig, timeout)

    def signal_node(self, node_id: str, sig: int) -> None:
        """Send `sig` without waiting (SIGSTOP, SIGCONT, ...)."""
        self._node(node_id).send(sig)

    def stop_controller(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        if self._controller is None:
            return None
        return self._controller.stop(sig, timeout)

    def start_controller(self) -> None:
        if self._controller is not None and self._controller.alive:
            raise ClusterError("the controller is already running")
        self._spawn_controller()
        self._wait(self._controller, self.controller_address)

    def alive(self) -> dict[str, bool]:
        result = {"controller": self._controller is not None and self._controller.alive}
        result.update({n: c.alive for n, c in self._nodes.items()})
        return result

    # -- internals

    def _node(self, node_id: str) -> _Child:
        self.config.node(node_id)  # ConfigError for an unknown id
        child = self._nodes.get(node_id)
        if child is None:
            raise ClusterError(f"node {node_id} was never started")
        return child

    def _command(self, *args: str) -> list[str]:
        return [self.python, "-m", "snapmesh.cli", *args]

    def _spawn_controller(self) -> None:
        args = self._command("controller", "--config", str(self.config_path), *self.controller_args)
        self._controller = _Child("controller", args, self.log_dir / "controller.log", self._env)
        self._controller.start()

    def _spawn_node(self, node_id: str) -> None:
        args = self._command("node", "--config", str(self.config_path), "--id", node_id)
        child = _Child(f"node {node_id}", args, self.log_dir / f"{node_id}.log", self._env)
        self._nodes[node_id] = child
        child.start()

    def _wait(self, child: _Child, address: str) -> None:
        try:
            wait_serving(
                address,
                self.startup_timeout,
                alive=lambda: child.alive,
                exit_code=lambda: child.proc.returncode if child.proc is not None else None,
                identity=self.client_identity,
            )
        except ClusterError as exc:
            tail = child.log_tail()
            detail = f"\n--- {child.log_path} (last lines) ---\n{tail}" if tail else ""
            raise ClusterError(f"{child.name} at {exc}{detail}") from None


# --------------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh cluster: {message}\n")


class _StopRequested(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh cluster", description="Run a local cluster on loopback.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    up = commands.add_parser("up", help="start the controller and every node; Ctrl-C stops them")
    source = up.add_mutually_exclusive_group()
    source.add_argument("--config", metavar="FILE", help="cluster file (default: the shipped 4-node mesh)")
    source.add_argument("--nodes", type=int, metavar="N", help="an N-node full mesh on free loopback ports")
    up.add_argument("--data-dir", metavar="DIR", help="where logs, snapshots and node logs go")
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS and a control-plane token, dev certificates made into <data_dir>/tls/")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.nodes is not None and args.nodes < 1:
        print(f"snapmesh cluster: --nodes must be at least 1, got {args.nodes}", file=sys.stderr)
        return 2

    def request_stop(signum, frame) -> None:
        raise _StopRequested(signal.Signals(signum).name)

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster: LocalCluster | None = None
    try:
        if args.nodes is not None:
            data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="snapmesh-"))
            config_path = write_config(data_dir / "cluster.toml", nodes=args.nodes, data_dir=data_dir)
            config_dir = None
        else:
            config_path = Path(args.config or cluster_config.DEFAULT_CONFIG)
            config_dir = args.data_dir
        tls_dir = None
        if args.tls:
            env = dict(os.environ)
            if config_dir is not None:
                env["SNAPMESH_DATA_DIR"] = str(Path(config_dir).resolve())
            plain = cluster_config.load(config_path, env=env)
            tls_dir = plain.data_dir / "tls"
            try:
                security.write_certs(plain, tls_dir)
            except OSError as exc:
                raise ConfigError(f"cannot write certificates into {tls_dir}: {exc}") from None
        cluster = LocalCluster(config_path, data_dir=config_dir, tls_dir=tls_dir)
        print(f"snapmesh cluster: starting {len(cluster.config.nodes)} nodes; logs in {cluster.log_dir}",
              file=sys.stderr, flush=True)
        cluster.start()
        print(f"controller: {cluster.controller_address}", flush=True)
        if tls_dir is not None:
            token = cluster.client_identity.token if cluster.client_identity else None
            print(f"grpcurl: {security.grpcurl_line(cluster.controller_address, tls_dir, token)}", flush=True)
        reported: set[str] = set()
        while True:
            time.sleep(0.5)
            for name, alive in cluster.alive().items():
                if not alive and name not in reported:
                    reported.add(name)
                    print(f"snapmesh cluster: {name} exited; see {cluster.log_dir}", file=sys.stderr, flush=True)
    except ConfigError as exc:
        print(f"snapmesh cluster: {exc}", file=sys.stderr)
        return 2
    except ClusterError as exc:
        print(f"snapmesh cluster: cannot start: {exc}", file=sys.stderr)
        return 1
    except _StopRequested as stop:
        print(f"snapmesh cluster: {stop}: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
