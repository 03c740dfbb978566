"""A node inside a grpc.aio server: `snapmesh.embed`, and `snapmesh node` too.

    server = grpc.aio.server(interceptors=[...])           # the program's own
    node = await snapmesh.embed(app, cluster="cluster.toml", node_id="p1", server=server)
    add_ShopServicer_to_server(Shop(node), server)         # the program's own API
    await server.start()
    reply = await node.submit(command, request_id=...)     # from its handlers
    await node.close()

`start_node` takes the node's data-dir lock, recovers from its log, builds the
engine and its shell (channels, reporter, edge, servicer: the same objects `snapmesh
node` has always run), adds the Node service, health and reflection to `server`
and binds the cluster file's address for the node (mutual TLS with the cluster's
certificates under [tls]), then starts the log's flusher, the channels and the
reporter as tasks of the running loop. `snapmesh node` (process.py) is this with a
server of its own: it makes the server, calls `start_node`, starts the server.

Rules
-----
M1. The server keeps its own services, interceptors and ports. snapmesh's checks
    (the token, the peer's certificate: snapmesh.settings.access) are in the Node
    service's handlers (credentials.add_guarded), so they apply to its calls only.
M2. Refused before anything is read or written, each with one EmbedError line: a
    server already started, a node id the cluster file does not name, a server
    that already registers grpc.health.v1, a node already embedded in this process.
    A node that cannot start (its data dir in use, a corrupt log, an app that is
    not deterministic, a log that cannot be written, an address that cannot be
    bound) raises StartFailed with the line `snapmesh node` prints and its exit
    status; nothing is left running or locked.
M3. `close()` stops the node: no new streams, the incoming streams ended, the
    channels and the reporter closed, the held blocks' pending writes to its
    disk finished and their thread ended, the log flushed and closed, the lock
    released; no task of the node is left. The port is the server's: it closes
    when the program stops its server. `submit` after `close` raises NodeClosed.
M4. A node that fails while it serves (the app raised on a message; the log
    cannot be written: the two ways `snapmesh node` exits 1) logs that line,
    refuses `submit` and `submit_many` (Refused UNAVAILABLE), and `await
    node.failed()` returns the line. The program should close it (then the Node
    service's calls are refused too); a restart recovers from its log.
M5. A stop with a snapshot (the Node service's Fence STOP) ends the log in it and stops
    the node as M4 does, but cleanly: `snapmesh node` exits 0, and `failed()` returns the
    line naming the snapshot to restore. Started again on that log (any version of the
    app), the node is fenced (protocol/node/fence.py F4) until it is restored.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from pathlib import Path
from typing import Any

import grpc

from snapmesh.app import App, AppError, Refused, Reply
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.hybrid import HybridNode
from snapmesh.protocol.node.link import DEFAULT_MARK
from snapmesh.protocol.node.machine import Node
from snapmesh.serving.datalock import DataDirLock, DataDirLocked
from snapmesh.serving.durable import fsync_dir
from snapmesh.serving.runtime import CLIENT_OPTIONS, Failure, Services
from snapmesh.services.node.channels import IncomingChannel, OutgoingChannel
from snapmesh.services.node.edge import REFUSAL_CODE, Edge
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.recovery import CorruptLogError, NonDeterministicError, OtherVersionError, recover
from snapmesh.services.node.loggedreports import CorruptLoggedReportError, logged_reports
from snapmesh.services.node.pendingreports import CorruptReportError, PendingReports
from snapmesh.services.node.reporter import StateReporter
from snapmesh.services.node.servicer import NodeServicer
from snapmesh.services.node.translog import TransferLog
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.settings.appsettings import same_app
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger("snapmesh.services.node")

HEALTH_SERVICE = "grpc.health.v1.Health"

# The nodes embedded in this process, by (data dir, node id): a second embed of one is refused (M2).
_EMBEDDED: set[tuple[str, str]] = set()


class EmbedError(RuntimeError):
    """`embed` refused its arguments (M2): one line; nothing read, written or started."""


class StartFailed(EmbedError):
    """The node could not start (M2): `snapmesh node` prints the line and exits with `status`."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NodeClosed(RuntimeError):
    """A call on a node after its `close()`."""


def registers(server: grpc.aio.Server, service: str) -> bool:
    """Whether `server` already has a handler for `service` ("grpc.health.v1.Health").
    grpc.aio has no public way to ask: this reads the handlers the server holds
    (its registered methods and the DictionaryGenericHandlers of generated code)."""
    prefix = f"/{service}/"
    for held in gc.get_referents(getattr(server, "_server", server)):
        if isinstance(held, dict) and any(isinstance(k, str) and k.startswith(prefix) for k in held):
            return True
        if isinstance(held, list) and any(
            getattr(h, "service_name", lambda: None)() == service for h in held if hasattr(h, "service_name")
        ):
            return True
    return False


def started(server: grpc.aio.Server) -> bool:
    inner = getattr(server, "_server", None)
    return bool(inner is not None and inner.is_running())


class EmbeddedNode:
    """A running node: `submit`, `submit_many` and `query` (the Edge's, snapmesh.app's
    Reply and Refused), `failed()`, `close()`. Made by `start_node`."""

    def __init__(self, *, node_id: str, engine: Engine, edge: Edge, servicer: NodeServicer, services: Services,
                 channels: dict[str, OutgoingChannel], reporter: StateReporter, translog: TransferLog,
                 lock: DataDirLock, key: tuple[str, str], receive_limit: int, serving_line: str,
                 log_path: Path) -> None:
        self.node_id = node_id
        self.engine = engine
        self._edge = edge
        self._servicer = servicer
        self.services = services
        self._channels = channels
        self._reporter = reporter
        self._translog = translog
        self._lock = lock
        self._key = key
        self.receive_limit = receive_limit  # snapmesh node: its server's receive limit (process.receive_limit); embedded: 0
        self.serving_line = serving_line  # logged once the server serves
        self._log_path = log_path
        self._closed = False
        self._close: asyncio.Future[int] | None = None

    @property
    def port(self) -> int | None:
        return self.services.port

    def failures(self) -> list[Failure]:
        """How the node fails while it serves (M4: the app on a message, the log's disk)."""
        node_id, translog, path = self.node_id, self._translog, self._log_path
        assert translog.flusher is not None
        return [
            # Not a failure: stopped with a snapshot (the Node service's Fence STOP), exit 0.
            Failure(self.engine.stopped, lambda stopped: (
                f"node {node_id}: stopped for snapshot {stopped.result()}, its log ends in it; start it (any version"
                f" of the app: it starts fenced) and restore the snapshot (snapmesh restore {stopped.result()})"), 0),
            Failure(self.engine.app_failed, lambda failed: (
                f"node {node_id}: the app failed on a message, or a refused command could not be taken back"
                f" (apphost.H4), stopping (neither is applied; the restarted node recovers from its log"
                f" and meets the message again): {failed.result()}"), 1),
            # Nothing more is written (see translog); stop serving now. What the file
            # holds is a prefix of the log, so a restart recovers from it.
            Failure(translog.flusher, lambda flusher: (
                f"node {node_id}: the transfer log {path} cannot be written ({flusher.exception()}); nothing "
                f"after lsn {translog.durable_lsn} is on disk and nothing more will be written; stopping "
                "(restart the node once the disk is fixed: it recovers from the log)"), 1),
        ]

    async def failed(self) -> str:
        """Wait until the node fails while it serves (M4): the line saying why.
        NodeClosed when it is closed first."""
        failures = self.failures()
        await asyncio.wait({f.future for f in failures}, return_when=asyncio.FIRST_COMPLETED)
        done = next(f for f in failures if f.future.done())
        if done.future is self._translog.flusher and (done.future.cancelled() or done.future.exception() is None):
            raise NodeClosed(f"node {self.node_id} is closed")
        return done.says(done.future)

    def log_failures(self) -> None:
        """Log the line of a failure (M4) when it happens: the embedding program's log
        says it even if nothing awaits `failed()` (snapmesh node logs it as it exits)."""
        for failure in self.failures():
            failure.future.add_done_callback(
                lambda future, f=failure: self._closed or future.cancelled() or log.error("%s", f.says(future)))

    async def submit(self, command: bytes, *, request_id: str = "", first_sent_unix_ms: int = 0) -> Reply:
        """The Edge's submit: a Reply once durable, else raises snapmesh.app.Refused."""
        self._check_open()
        return await self._edge.submit(command, request_id=request_id, first_sent_unix_ms=first_sent_unix_ms)

    async def submit_many(self, items) -> list[Reply | Refused]:
        """The Edge's submit_many: [(request_id, command), ...] -> [Reply | Refused, ...] in order."""
        self._check_open()
        return await self._edge.submit_many(items)

    async def query(self, query: bytes) -> bytes:
        """The Edge's query: the app's on_query answer, from durable state, not logged; else raises Refused."""
        self._check_open()
        return await self._edge.query(query)

    def _check_open(self) -> None:
        if self._closed:
            raise NodeClosed(f"node {self.node_id} is closed: no call after close()")
        if self.engine.app_failed.done() or (self._translog.flusher is not None and self._translog.flusher.done()):
            raise Refused("UNAVAILABLE", f"node {self.node_id} has failed (node.failed() says why): close it; "
                                         "a restart recovers from its log")

    async def drain(self) -> None:
        """No new streams or calls, the incoming streams ended, health NOT_SERVING."""
        self._servicer.stopping = True
        for rx in self.engine.incoming.values():
            rx.end_stream("the node is stopping")
        await self.services.health.enter_graceful_shutdown()

    async def close(self) -> int:
        """Stop the node (M3): 0, or 1 when the log's last flush failed. Once; later calls wait for the first."""
        if self._close is None:
            self._closed = True
            self._close = asyncio.ensure_future(self._stop())
        return await asyncio.shield(self._close)

    async def _stop(self) -> int:
        status = 0
        try:
            await self.drain()
            await asyncio.gather(*(channel.close() for channel in self._channels.values()))
            await self._reporter.close()
            await self._servicer.close()  # the held blocks' shelf: its writes done, its thread ended
            try:
                await self._translog.close()
            except OSError as exc:
                log.error("node %s: final flush of the transfer log failed: %s", self.node_id, exc)
                status = 1
        finally:
            self._lock.release()
            _EMBEDDED.discard(self._key)
        log.info("node %s stopped", self.node_id)
        return status


def _refuse_server(server: grpc.aio.Server, node_id: str) -> None:
    if started(server):
        raise EmbedError(f"node {node_id}: the server is already started: embed before server.start()")
    if registers(server, HEALTH_SERVICE):
        raise EmbedError(f"node {node_id}: the server already registers {HEALTH_SERVICE}: the node adds its own")


def node_app(cfg: cluster_config.ClusterConfig, node_id: str) -> App:
    """The app `cfg` names for node `node_id` (cluster_config.hosted: the settings' default app
    for a file without [app]), through the pre-flight every command shares
    (snapmesh.app.preflight). Raises AppError (one line)."""
    from snapmesh.app import NodeInfo, preflight

    hosted = cluster_config.hosted(cfg)
    info = NodeInfo(node_id=node_id, peers_out=cfg.topology.outgoing(node_id), peers_in=cfg.topology.incoming(node_id),
                    params=hosted.params)
    return preflight(hosted.module, [info])


def runs_files_app(cfg: cluster_config.ClusterConfig, app: App) -> bool:
    """Whether `app` is the app `cfg` names for its nodes (cluster_config.hosted), asked of the
    file's app loaded by name (the same App, or one of its name), so no app is named here. An app
    the file names but cannot load is not `app`: an embedder gave its own in its place."""
    from snapmesh.app import load_app

    try:
        named = load_app(cluster_config.hosted(cfg).module)
    except AppError:
        return False
    return named is app or named.name == app.name


def _app_params(cfg: cluster_config.ClusterConfig, app: App, files_app: bool) -> Any:
    """The params `app` runs with on `cfg`'s nodes: the ones the settings make for the file's app
    (cluster_config.hosted: a file without [app] gives its default app its top-level figures), and
    the file's [app] params as they are for an app given in its place (`files_app` False)."""
    return cluster_config.hosted(cfg).params if files_app else cfg.app.params


def _app_spec(cfg: cluster_config.ClusterConfig, app: App, files_app: bool) -> str:
    """What GetState's `app` says: for the file's app its module:attr, except "" when the file names
    the default app by the default's names (no [app], or the default's built-in name: same_app(spec, "")),
    whose GetState answers as it always has; for an app given in place of the file's, its name."""
    if not files_app:
        return app.name
    return "" if same_app(cfg.app.module, "") else cfg.app.module


async def start_node(
    cfg: cluster_config.ClusterConfig, node_id: str, app: App | None, server: grpc.aio.Server, *,
    identity: security.Identity | None = None, services: Services | None = None, metrics: NodeMetrics | None = None,
    receive_limit: int = 0, mark: int = DEFAULT_MARK,
) -> EmbeddedNode:
    """Start node `node_id` of `cfg` running `app` (None: the one `cfg` names, node_app) on `server` (M2)."""
    _refuse_server(server, node_id)
    if app is None:
        try:
            app = node_app(cfg, node_id)
        except AppError as exc:
            raise StartFailed(str(exc), 2) from None
        files_app = True
    else:
        files_app = runs_files_app(cfg, app)
    try:
        node = cfg.node(node_id)
    except cluster_config.ConfigError as exc:
        raise EmbedError(str(exc)) from None
    key = (str(Path(cfg.data_dir).resolve()), node_id)
    if key in _EMBEDDED:
        raise EmbedError(f"node {node_id} is already embedded in this process (data dir {cfg.data_dir})")
    try:
        Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
        lock = DataDirLock.acquire(cfg.data_dir, node_id)
    except DataDirLocked as exc:
        raise StartFailed(str(exc), 2) from None
    except OSError as exc:
        raise StartFailed(f"cannot lock data dir {cfg.data_dir}: {exc}", 2) from None
    _EMBEDDED.add(key)
    try:
        return await _start_locked(cfg, node, app, server, identity=identity, services=services, metrics=metrics,
                                   receive_limit=receive_limit, mark=mark, lock=lock, key=key, files_app=files_app)
    except BaseException:
        lock.release()
        _EMBEDDED.discard(key)
        raise


async def _start_locked(cfg, node, app, server, *, identity, services, metrics, receive_limit, mark, lock, key,
                        files_app):
    node_id = node.id
    incoming = cfg.topology.incoming(node_id)
    outgoing = cfg.topology.outgoing(node_id)
    path = cfg.log_path(node_id)
    try:
        recovered = recover(
            path, node_id, incoming=incoming, outgoing=outgoing, app=app,
            app_params=_app_params(cfg, app, files_app),
        )
        pending = PendingReports(cfg.data_dir / f"{node_id}.reports")
        unreported = pending.load()
        logged = logged_reports(path, node_id)  # the small ones, in the log itself (wal.Report)
    except (NonDeterministicError, OtherVersionError) as exc:  # the line names the cause and the ways on
        raise StartFailed(f"refusing to start: {exc}", 2) from None
    except CorruptLogError as exc:
        raise StartFailed(f"corrupt transfer log, refusing to start: {exc}", 2) from None
    except (CorruptReportError, CorruptLoggedReportError) as exc:
        raise StartFailed(f"corrupt pending report, refusing to start: {exc}", 2) from None
    except OSError as exc:
        raise StartFailed(f"cannot read its data in {cfg.data_dir}: {exc}", 2) from None

    metrics = metrics or NodeMetrics(node_id)
    engine: Engine | None = None

    def on_durable(lsn: int) -> None:
        if engine is not None:
            engine.durable(lsn)

    translog = TransferLog(
        path, node_id, last_lsn=recovered.last_lsn, on_durable=on_durable, observe_fsync=metrics.observe_fsync,
        observe_round=metrics.observe_round,
    )
    # The node machine: core + links + log positions (snapmesh/protocol/node/machine.py); everything below is its shell.
    hybrid = {"align_timeout": cfg.align_timeout_ms / 1e3} if cfg.snapshot_mode == "hybrid" else {}
    node_machine = (HybridNode if hybrid else Node)(
        **hybrid, node_id=node_id, incoming=incoming, outgoing=outgoing, recovered=recovered, mark=mark,
        bound=cfg.channel_bound,
        # Twice the controller's deadline: by then the controller has failed it.
        recording_ttl=2 * cfg.controller.snapshot_deadline_s,
        segment_records=cfg.segment_records, segment_bytes=cfg.segment_bytes,
        reply_window_bytes=cfg.reply_window_bytes, snapshot_mode=cfg.snapshot_mode,
        now=asyncio.get_running_loop().time(),
        wall=time.time(),  # the request-id window's clock (it outlives restarts)
        app=app, app_params=_app_params(cfg, app, files_app), max_reply_bytes=cfg.max_reply_bytes,
    )
    node_machine.log_reports = True  # a small report is held in the log (wal.Report): one fdatasync makes it durable
    rng = random.Random()
    channels: dict[str, OutgoingChannel] = {}
    # The streams start after `engine` is set, and only then call back into it.
    for dst in outgoing:
        channels[dst] = OutgoingChannel(
            src=node_id, dst=dst, address=cfg.node(dst).address, metrics=metrics,
            on_open=lambda d, e, r: engine.link_open(d, e, r),
            on_ack=lambda d, e, s: engine.link_ack(d, e, s),
            on_lost=lambda d: engine.link_lost(d),
            rng=rng, channel_options=CLIENT_OPTIONS, identity=identity, epoch_of=lambda: engine.node.epoch,
        )
    reporter = StateReporter(
        address=cfg.controller.address, log_=translog, metrics=metrics, options=CLIENT_OPTIONS, pending=pending,
        identity=identity, held_s=cfg.controller.snapshot_deadline_s,
    )
    spec = _app_spec(cfg, app, files_app)
    engine = Engine(
        node=node_machine, log_=translog, outgoing=channels,
        incoming={src: IncomingChannel(src=src, dst=node_id) for src in incoming},
        metrics=metrics, reporter=reporter, app_spec=spec,
    )
    try:
        translog.flush_sync()
        fsync_dir(cfg.data_dir)
    except OSError as exc:
        await translog.close()
        raise StartFailed(f"cannot write the transfer log {path}: {exc}", 1) from None
    engine.durable(translog.durable_lsn)
    edge = Edge(engine)  # commands into the app: Submit and SubmitBatch call it, as the embedding program does
    try:
        servicer = NodeServicer(engine, edge)  # with the extra edge its app names (extra_edge.py), which may say `held`
    except AppError as exc:  # X1: not without the edge its app asked for
        await translog.close()
        raise StartFailed(str(exc), 2) from None
    if not recovered.fresh:
        log.info(
            "recovered from %s: %s, %d records read, %d unacknowledged-or-unknown messages, abandoned snapshots: %d",
            path, engine.held(_digest(node_machine)), recovered.records,
            sum(len(v) for v in recovered.outbox.values()), len(recovered.abandoned),
        )
    metrics.initialise(incoming=incoming, outgoing=outgoing, command_codes={*REFUSAL_CODE.values(), "ABORTED"})
    if receive_limit:
        metrics.receive_limit.set(receive_limit)

    services = services or Services(server, identity)
    services.add(pb_grpc.add_NodeServicer_to_server, servicer, pb.DESCRIPTOR.services_by_name["Node"].full_name)
    try:
        services.open(cfg.bind_address(node))
    except Exception:
        await translog.close()
        raise
    translog.start()
    for channel in channels.values():
        channel.start()
    reporter.resume(unreported, recovered.last_lsn, logged)
    # The default app its file names by the default's names (spec "") says what it holds in its edge's words
    # (Engine.held_text), as its line always has (operators grep it).
    what = engine.held() if not spec and engine.held_text is not None else f"app {spec or app.name}"
    if node_machine.stopped:  # its log ends in a stop snapshot (fence.py F4)
        what += (f"; fenced: stopped for snapshot {node_machine.stopped}, it answers only health and RestoreState"
                 " until it is restored")
    return EmbeddedNode(
        node_id=node_id, engine=engine, edge=edge, servicer=servicer, services=services, channels=channels,
        reporter=reporter, translog=translog, lock=lock, key=key, receive_limit=receive_limit,
        serving_line=f"node {node_id} serving on {cfg.bind_address(node)} ({what})", log_path=path,
    )


def _digest(node: Node) -> str:
    """The digest of the app's state a node recovered ("" with no app)."""
    state = node.app_state()
    return "" if state is None else digest(state)


async def embed(
    app: App | str, *, cluster: str | Path | cluster_config.ClusterConfig, node_id: str, server: grpc.aio.Server,
) -> EmbeddedNode:
    """snapmesh.embed: node `node_id` of the cluster file `cluster` running `app`
    (an App, or "module:attr") on `server`, a grpc.aio server not yet started (M1-M3)."""
    _refuse_server(server, node_id)
    cfg = cluster if isinstance(cluster, cluster_config.ClusterConfig) else cluster_config.load(cluster)
    try:
        cfg.node(node_id)
    except cluster_config.ConfigError as exc:
        raise EmbedError(str(exc)) from None
    if isinstance(app, str):
        from snapmesh.app import NodeInfo, preflight

        hosted = cluster_config.hosted(cfg)  # the file's app runs with the params the settings make for it
        info = NodeInfo(node_id=node_id, peers_out=cfg.topology.outgoing(node_id),
                        peers_in=cfg.topology.incoming(node_id),
                        params=hosted.params if same_app(app, hosted.module) else cfg.app.params)
        app = preflight(app, [info])
    identity = security.load_identity(cfg, node_id)
    node = await start_node(cfg, node_id, app, server, identity=identity)
    await node.services.serving()  # health answers once the program starts its server
    node.log_failures()
    log.info("%s (embedded: once the server starts)", node.serving_line)
    return node
