"""The metric families every snapmesh server exports beside its own:

* the default collectors of prometheus_client: `process_*` (CPU, memory, file
  descriptors, start time) and `python_*` (`python_info`, the garbage collector);
* `snapmesh_build_info{version}`, always 1;
* gRPC server metrics per method and status code, recorded by an interceptor,
  with the names and labels of go-grpc-prometheus (what existing dashboards
  graph): `grpc_server_started_total`, `grpc_server_handled_total` (errors are
  the `grpc_code!="OK"` series) and the latency histogram
  `grpc_server_handling_seconds`.

No `_created` series: a server process turns them off for the whole process.

Every name and label: docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from importlib import metadata
from typing import Any, TypeVar

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

Metric = TypeVar("Metric", Counter, Gauge, Histogram)
_LABELS = ["grpc_service", "grpc_method", "grpc_type"]
# From a health check (~0.2 ms) to a long-lived channel stream (minutes).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def version() -> str:
    try:
        return metadata.version("snapmesh")
    except metadata.PackageNotFoundError:
        return "unknown"


def add_standard_collectors(registry: CollectorRegistry) -> None:
    """process_*, python_* and snapmesh_build_info into `registry`; no `_created`
    series (one more series per counter and histogram that nothing graphs)."""
    disable_created_metrics()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Gauge("snapmesh_build_info", "Always 1; the snapmesh version in a label", ["version"], registry=registry).labels(
        version()
    ).set(1)


def labelled(metric: Metric, values: Iterable[str]) -> Metric:
    """`metric` with a series for each of `values` of its one label from the start
    (0: a query sees a label value before its first event, not no series)."""
    for value in values:
        metric.labels(value)
    return metric


def _split(full_method: str) -> tuple[str, str]:
    """'/snapmesh.v1.Node/Transfer' -> ('snapmesh.v1.Node', 'Transfer')."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or "unknown"


def _code_name(context: Any, default: str) -> str:
    code = context.code()
    if code is None:
        return default
    if isinstance(code, grpc.StatusCode):
        return code.name
    for status in grpc.StatusCode:  # grpc.aio may hand back the integer value
        if status.value[0] == code:
            return status.name
    return default


class GrpcServerMetrics(grpc.aio.ServerInterceptor):
    """Counts and times every RPC of a grpc.aio server (asynchronous handlers;
    a synchronous one passes through unmeasured)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.started = Counter(
            "grpc_server_started_total", "RPCs started on the server", _LABELS, registry=registry
        )
        self.handled = Counter(
            "grpc_server_handled_total", "RPCs completed on the server, by status code", [*_LABELS, "grpc_code"],
            registry=registry,
        )
        self.handling = Histogram(
            "grpc_server_handling_seconds", "Time from an RPC's start to its end on the server",
            _LABELS, buckets=LATENCY_BUCKETS, registry=registry,
        )
        self._children: dict[tuple, Any] = {}  # bounded: methods x types x codes

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # unknown method: gRPC answers UNIMPLEMENTED
        service, method = _split(handler_call_details.method)
        if handler.unary_unary:
            kind, behavior, make = "unary", handler.unary_unary, grpc.unary_unary_rpc_method_handler
        elif handler.unary_stream:
            kind, behavior, make = "server_stream", handler.unary_stream, grpc.unary_stream_rpc_method_handler
        elif handler.stream_unary:
            kind, behavior, make = "client_stream", handler.stream_unary, grpc.stream_unary_rpc_method_handler
        else:
            kind, behavior, make = "bidi_stream", handler.stream_stream, grpc.stream_stream_rpc_method_handler
        labels = (service, method, kind)
        if inspect.isasyncgenfunction(behavior):
            wrapped = self._generator(behavior, labels)
        elif inspect.iscoroutinefunction(behavior):
            wrapped = self._coroutine(behavior, labels)
        else:
            return handler
        return make(
            wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )

    def _child(self, metric: Counter | Histogram, labels: tuple[str, ...]):
        """`metric.labels(*labels)`, memoised: RPCs are the hot path (a transfer is one)."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _start(self, labels: tuple[str, str, str]) -> float:
        self._child(self.started, labels).inc()
        return time.perf_counter()

    def _done(self, labels: tuple[str, str, str], code: str, started: float) -> None:
        self._child(self.handled, (*labels, code)).inc()
        self._child(self.handling, labels).observe(time.perf_counter() - started)

    def _coroutine(self, behavior, labels):
        async def measured(request, context):
            started, code = self._start(labels), "UNKNOWN"
            try:
                response = await behavior(request, context)
                code = _code_name(context, "OK")
                return response
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except grpc.aio.AbortError:
                code = _code_name(context, "UNKNOWN")
                raise
            finally:
                self._done(labels, code, started)

        return measured

    def _generator(self, behavior, labels):
        async def measured(request, context):
            started, code = self._start(labels), "UNKNOWN"
            try:
                async for response in behavior(request, context):
                    yield response
                code = _code_name(context, "OK")
            except (asyncio.CancelledError, GeneratorExit):
                code = "CANCELLED"
                raise
            except grpc.aio.AbortError:
                code = _code_name(context, "UNKNOWN")
                raise
            finally:
                self._done(labels, code, started)

        return measured
