"""What every snapmesh server shares: a grpc.aio server with health checking and
reflection (v1 and v1alpha), a Prometheus endpoint, and a graceful stop on SIGINT/SIGTERM.

Health says SERVING only after the server is bound and started; on stop it turns
NOT_SERVING first, so load balancers and healthchecks drain before the port closes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, start_http_server

from snapmesh import reflection, security

log = logging.getLogger(__name__)

# Channel streams are long-lived and idle between bursts: keepalives notice a dead
# peer in seconds instead of waiting for TCP to give up.
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    # Batches of transfers can be large; stay well above the 4 MiB default.
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),  # two servers on one port is a configuration error, not load sharing
]

CLIENT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # Reconnect fast after a peer restarts; the caller has its own backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class BindError(RuntimeError):
    """A server could not bind its configured address."""


class ServiceHost:
    """One grpc.aio server plus its health, reflection and metrics endpoint."""

    def __init__(
        self,
        *,
        bind_address: str,
        metrics_bind: tuple[str, int] | None,
        registry: CollectorRegistry,
        identity: security.Identity | None = None,  # None: plaintext
    ) -> None:
        self.bind_address = bind_address
        self._metrics_bind = metrics_bind
        self._registry = registry
        self._identity = identity
        self.server = security.new_server(identity, SERVER_OPTIONS)
        self._health = health.aio.HealthServicer()
        self._service_names: list[str] = []
        self._metrics_server = None
        self.port: int | None = None

    def add(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        register(servicer, self.server)
        self._service_names.append(full_name)

    async def start(self) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self.server)
        names = [*self._service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
        reflection.enable(names, self.server)  # grpc.reflection.v1 and v1alpha
        try:
            self.port = security.open_server_port(self.server, self.bind_address, self._identity)
        except RuntimeError as exc:
            raise BindError(f"cannot bind gRPC address {self.bind_address}: {exc}") from None
        if self.port == 0:
            raise BindError(f"cannot bind gRPC address {self.bind_address}")
        if self._metrics_bind is not None:
            host, port = self._metrics_bind
            try:
                self._metrics_server, _ = start_http_server(port, addr=host, registry=self._registry)
            except OSError as exc:
                raise BindError(f"cannot bind metrics address {host}:{port}: {exc}") from None
        await self.server.start()
        for name in ("", *self._service_names):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 3.0) -> None:
        await self._health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None


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


def run_service(name: str, body: Callable[[], Awaitable[int]]) -> int:
    """Run a service's async main, mapping start-up failures to exit codes."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        return asyncio.run(body())
    except BindError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
