"""What every snapmesh server shares: a grpc.aio server with health checking and
reflection (v1 and v1alpha), a Prometheus endpoint (with the standard families of
snapmesh/serving/metrics.py), and a graceful stop on SIGINT/SIGTERM.

Health says SERVING only after the server is bound and started; on stop it turns
NOT_SERVING first, so load balancers and healthchecks drain before the port closes.

SNAPMESH_HEALTH_PORT=N also serves the same health service, and nothing else, in
plaintext on port N of the bind host: for probes that cannot present a client
certificate (Kubernetes' native gRPC probes, deploy/helm/snapmesh) when the main
port is mutual TLS. A value that is not a port stops the server at start-up (exit 2).

Every health answer carries the process's instance id in its trailing metadata
(`snapmesh-instance-id`; SNAPMESH_INSTANCE_ID, which the supervisor sets to a new
value for each start, else a random one): a supervisor waiting for the process it
just started can tell its answer from another process's on the same port.

SNAPMESH_EVENT_LOOP=uvloop|asyncio chooses the event loop every server runs on
(`run_service`): uvloop (libuv; less CPU per wake-up, so per frame and per
transfer) by default when it is installed, else asyncio's own. Any other value, or
uvloop asked for where it is not installed, stops the server at start-up (exit 2).
The server logs `event loop: <name> (<loop class>)` once it serves.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, start_http_server

from snapmesh.serving import metrics, reflection
from snapmesh.settings import security
from snapmesh.serving import credentials

log = logging.getLogger(__name__)

# Channel streams are long-lived and idle between bursts: keepalives notice a dead
# peer in seconds instead of waiting for TCP to give up.
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    # What the API needs, no more: a node's largest request is a RestoreState
    # holding every transfer recorded in flight into it (up to channel_bound per
    # channel), sent by the controller only; ServiceHost lowers it for the
    # controller (CONTROLLER_RECEIVE_BYTES).
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),  # two servers on one port is a configuration error, not load sharing
]

# The controller receives reports of at most chunking.CHUNK_BYTES (1 MiB) per
# message (larger ones come in chunks of that size) and small requests.
CONTROLLER_RECEIVE_BYTES = 4 * 1024 * 1024

CLIENT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # Reconnect fast after a peer restarts; the caller has its own backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


INSTANCE_ENV = "SNAPMESH_INSTANCE_ID"
INSTANCE_METADATA = "snapmesh-instance-id"


def instance_id() -> str:
    """This process's instance id: the supervisor's, else a new random one."""
    return os.environ.get(INSTANCE_ENV) or uuid.uuid4().hex


class _HealthServicer(health.aio.HealthServicer):
    """The standard health service, each answer signed with the instance id."""

    def __init__(self, instance: str) -> None:
        super().__init__()
        self._instance = instance

    async def Check(self, request, context):
        context.set_trailing_metadata(((INSTANCE_METADATA, self._instance),))
        return await super().Check(request, context)


class BindError(RuntimeError):
    """A server could not bind its configured address."""


class EnvironmentSettingError(ValueError):
    """An environment variable the server reads is malformed (exit 2)."""


HEALTH_PORT_ENV = "SNAPMESH_HEALTH_PORT"


def health_port_from_env(env: dict[str, str] | None = None) -> int | None:
    """SNAPMESH_HEALTH_PORT as a port number, None when unset or empty."""
    text = (os.environ if env is None else env).get(HEALTH_PORT_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise EnvironmentSettingError(f"{HEALTH_PORT_ENV}={text!r}: must be a port number from 1 to 65535")
    return int(text)


class Services:
    """snapmesh's services on one grpc.aio server, snapmesh's own (ServiceHost) or
    an embedding program's (snapmesh.embed): each servicer with the cluster's
    checks in its handlers (credentials.add_guarded), health (signed with the
    instance id) and reflection, and the port snapmesh serves them on."""

    def __init__(
        self, server: grpc.aio.Server, identity: security.Identity | None, instance: str | None = None, *,
        shared: bool = True,  # False: snapmesh's own server, whose only ports are the cluster's (ServiceHost)
    ) -> None:
        self.server = server
        self._identity = identity
        self._gate = credentials.guard_of(identity, shared=shared)
        self.instance_id = instance or instance_id()
        self.health = _HealthServicer(self.instance_id)
        self.names: list[str] = []
        self.port: int | None = None

    def add(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        credentials.add_guarded(register, servicer, self.server, self._gate)
        self.names.append(full_name)

    def open(self, bind_address: str) -> int:
        """Add health and reflection, and bind `bind_address` (mutual TLS with an
        identity): the port. BindError when it cannot bind."""
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable([*self.names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name], self.server)
        try:
            port = credentials.open_server_port(self.server, bind_address, self._identity)
        except RuntimeError as exc:
            raise BindError(f"cannot bind gRPC address {bind_address}: {exc}") from None
        if port == 0:
            raise BindError(f"cannot bind gRPC address {bind_address}")
        self.port = port
        return port

    async def serving(self) -> None:
        for name in ("", *self.names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)


class ServiceHost:
    """One grpc.aio server of snapmesh's own (its options, the gRPC metrics
    interceptor) with its Services, its metrics endpoint and its health port."""

    def __init__(
        self,
        *,
        bind_address: str,
        metrics_bind: tuple[str, int] | None,
        registry: CollectorRegistry,
        identity: security.Identity | None = None,  # None: plaintext
        max_receive_bytes: int | None = None,  # None: SERVER_OPTIONS' limit
    ) -> None:
        self.bind_address = bind_address
        self._metrics_bind = metrics_bind
        self._registry = registry
        self._identity = identity
        metrics.add_standard_collectors(registry)  # process_*, python_*, snapmesh_build_info
        options = list(SERVER_OPTIONS)
        if max_receive_bytes is not None:
            options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
            options.append(("grpc.max_receive_message_length", max_receive_bytes))
        self.server = credentials.new_server(options, outer=[metrics.GrpcServerMetrics(registry)])
        self.services = Services(self.server, identity, shared=False)
        self.instance_id = self.services.instance_id
        self._metrics_server = None
        self._health_port = health_port_from_env()
        self._health_server: grpc.aio.Server | None = None

    @property
    def port(self) -> int | None:
        return self.services.port

    def add(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        self.services.add(register, servicer, full_name)

    async def start(self) -> None:
        if self.services.port is None:  # else opened already, by the embed path (snapmesh node)
            self.services.open(self.bind_address)
        if self._metrics_bind is not None:
            host, port = self._metrics_bind
            try:
                self._metrics_server, _ = start_http_server(
                    port, addr=host, registry=self._registry, **credentials.metrics_tls(self._identity)
                )
            except OSError as exc:
                raise BindError(f"cannot bind metrics address {host}:{port}: {exc}") from None
        if self._health_port is not None:
            self._health_server = grpc.aio.server(options=SERVER_OPTIONS)
            health_pb2_grpc.add_HealthServicer_to_server(self.services.health, self._health_server)
            host = self.bind_address.rsplit(":", 1)[0]
            address = f"{host}:{self._health_port}"
            try:
                bound = self._health_server.add_insecure_port(address)
            except RuntimeError as exc:
                raise BindError(f"cannot bind health address {address}: {exc}") from None
            if bound == 0:
                raise BindError(f"cannot bind health address {address}")
            await self._health_server.start()
        await self.server.start()
        # Logged once serving, not before: a refusal at start-up stays one line on stderr.
        loop = asyncio.get_running_loop()
        kind = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
        log.info("event loop: %s (%s.%s)", kind, type(loop).__module__, type(loop).__qualname__)
        await self.services.serving()

    async def stop(self, grace: float = 3.0) -> None:
        await self.services.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None


def say(log_: logging.Logger, *lines: tuple[str, str] | None) -> None:
    """Log the lines a pure module decided, each (a logging level's name, the words); None says nothing."""
    for line in lines:
        if line is not None:
            log_.log(getattr(logging, line[0]), "%s", line[1])


async def wait_for_stop_signal() -> signal.Signals:
    """Return the first SIGINT or SIGTERM received."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda s=sig: received.done() or received.set_result(s))
    try:
        return await received
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@dataclass(frozen=True, slots=True)
class Failure:
    """A way a server fails while it serves: `future` done means it did; `says`
    its error line (from the future), and the server exits with `status`."""

    future: asyncio.Future[Any]
    says: Callable[[asyncio.Future[Any]], str]
    status: int


async def serve_until_stopped(
    host: ServiceHost,
    log_: logging.Logger,
    *,
    serving: Callable[[], None],
    stop_signal: Callable[[], Awaitable[signal.Signals]],
    stopping: Callable[[signal.Signals], str],
    failures: Sequence[Failure],
) -> int:
    """Start `host` (BindError: raised, nothing else done), then `serving()` (its
    serving line); serve until `stop_signal()` or the first of `failures`, logged on
    `log_`: the exit status, 0 after a stop. Draining is the caller's, after this.
    A failure wins over a signal at the same moment: it is what the exit says."""
    await host.start()
    serving()
    stop = asyncio.ensure_future(stop_signal())
    await asyncio.wait({stop, *(f.future for f in failures)}, return_when=asyncio.FIRST_COMPLETED)
    failed = next((f for f in failures if f.future.done()), None)
    if failed is None:
        log_.info("%s", stopping(stop.result()))
        return 0
    stop.cancel()
    log_.error("%s", failed.says(failed.future))
    return failed.status


EVENT_LOOP_ENV = "SNAPMESH_EVENT_LOOP"
EVENT_LOOPS = ("uvloop", "asyncio")


def _uvloop_installed() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def event_loop_from_env(env: dict[str, str] | None = None) -> str:
    """SNAPMESH_EVENT_LOOP as one of EVENT_LOOPS; unset or empty: uvloop when installed, else asyncio."""
    text = (os.environ if env is None else env).get(EVENT_LOOP_ENV, "").strip()
    if not text:
        return "uvloop" if _uvloop_installed() else "asyncio"
    if text not in EVENT_LOOPS:
        raise EnvironmentSettingError(f"{EVENT_LOOP_ENV}={text!r}: must be one of {', '.join(EVENT_LOOPS)}")
    if text == "uvloop" and not _uvloop_installed():
        raise EnvironmentSettingError(f"{EVENT_LOOP_ENV}=uvloop: the uvloop package is not installed (or use asyncio)")
    return text


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop function for one of EVENT_LOOPS."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


# The cyclic garbage collector's first generation is collected every GC_YOUNG container
# allocations (Python's default: 700). A node makes several tuples per message and command,
# so at the default it collected every ~50 commands; the objects imported at start-up are
# frozen out of every collection. On bench.submit_batch's per-command path (in-process, with
# a node's worth of live objects) this saved 1-2 µs of ~11 µs per command.
GC_YOUNG = 20_000


def run_service(name: str, body: Callable[[], Awaitable[int]]) -> int:
    """Run a service's async main on the SNAPMESH_EVENT_LOOP loop, mapping start-up failures to exit codes."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    gc.freeze()  # what start-up made lives as long as the process: no collection need look at it
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    try:
        chosen = event_loop_from_env()
        with asyncio.Runner(loop_factory=loop_factory(chosen)) as runner:
            return runner.run(body())
    except BindError as exc:
        log.error("%s", exc)
        return 1
    except EnvironmentSettingError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130
