"""One supervised process: `Child`, and where it runs (`Host`) and how it is dialled (`Security`).

A `Child` is one process from one command line: `start` (optionally waiting
for gRPC health SERVING), `stop` (SIGTERM, SIGKILL after a grace period),
`kill` (SIGKILL, or any signal, and wait), `pause`/`resume` (SIGSTOP/SIGCONT).
It can be started again after it exited; its output is appended to one log
file, each start headed by a `---- start #N` line. `snapmesh.processes.supervisor`
builds a whole cluster of them.

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
`run_on_host` runs a short command there (a probe).

`Security` is the one place where how the children talk to each other is
decided: its flags go on every child's command line and its `channel` is what
the health checks dial. Today it is plaintext on loopback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from snapmesh.processes import orphans
from snapmesh.serving.runtime import INSTANCE_ENV, INSTANCE_METADATA
from snapmesh.settings import security as tls
from snapmesh.serving import credentials

STARTUP_TIMEOUT_S = 30.0  # longest wait for a child to answer SERVING
STOP_TIMEOUT_S = 5.0  # grace between SIGTERM and SIGKILL


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
        return credentials.open_channel(address, self.identity)


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
