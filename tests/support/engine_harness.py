"""One node's shell in the test process: its engine, servicer and a real transfer log held back from the disk.

`held_node(tmp_path, app=None)`: p1 hosting `app` (None: the bank app, balance 100) (p2 -> p1 -> p2) with an outgoing channel that
never starts; nothing becomes durable until the test calls `log.flush_sync()`,
so a test can act while a call waits for its fsync. `ServicerContext` is enough of a
gRPC servicer context for the servicer's calls; `abort` raises `Aborted`, and
`outcome(call)` is a call's answer or that exception.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from snapmesh.services.node.channels import IncomingChannel, OutgoingChannel
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.recovery import recover
from snapmesh.services.node.pendingreports import PendingReports
from snapmesh.services.node.reporter import StateReporter
from snapmesh.services.node.servicer import NodeServicer
from snapmesh.services.node.translog import TransferLog
from snapmesh.app import App, load_app
from snapmesh.protocol.node.machine import Node


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class ServicerContext:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def auth_context(self) -> dict:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple:
        return ()


async def held_node(
    tmp_path: Path, app: App | None = None, params: dict | None = None
) -> tuple[Engine, TransferLog, NodeServicer]:
    """p1 on a real transfer log that is not flushing (module doc); `app`: the app it hosts (None: the
    bank app, its initial_balance 100), with its `params`."""
    if app is None:
        app, params = load_app("bank"), {"initial_balance": 100, **(params or {})}
    path = tmp_path / "p1.log.jsonl"
    recovered = recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=app, app_params=params)
    engine: Engine | None = None
    log = TransferLog(path, "p1", last_lsn=recovered.last_lsn,
                      on_durable=lambda lsn: engine.durable(lsn) if engine is not None else None)
    metrics = NodeMetrics("p1")
    reporter = StateReporter(address="127.0.0.1:1", log_=log, metrics=metrics, options=[],
                             pending=PendingReports(tmp_path / "p1.reports"))
    node = Node(node_id="p1", incoming=("p2",), outgoing=("p2",), recovered=recovered, now=0.0, wall=0.0, app=app,
                app_params=params)
    never_started = OutgoingChannel(src="p1", dst="p2", address="127.0.0.1:1", metrics=metrics,
                                    on_open=lambda *_: None, on_ack=lambda *_: None, on_lost=lambda *_: None)
    engine = Engine(node=node, log_=log, outgoing={"p2": never_started},
                    incoming={"p2": IncomingChannel(src="p2", dst="p1")}, metrics=metrics, reporter=reporter,
                    app_spec="" if app is None else f"{app.name}:app")
    log.flush_sync()
    return engine, log, NodeServicer(engine)


async def outcome(call: asyncio.Future) -> object:
    """What the servicer's `call` answers: its response, or the `Aborted` it raised."""
    try:
        return await asyncio.wait_for(call, 10)
    except Aborted as exc:
        return exc
