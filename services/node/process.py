"""`snapmesh node --config FILE --id NODE_ID [--app MODULE:ATTR]`: run one node.

Start-up: load the cluster file, recover from the transfer log (or start a new
one), open a channel stream to every outgoing peer, serve `snapmesh.v1.Node`
with health and reflection, metrics on the node's metrics port. SIGINT/SIGTERM:
health NOT_SERVING, stop accepting, close streams, flush the log, exit 0.

The app (snapmesh.app) is `--app`, else the cluster file's [app], else the bank.
It is loaded before anything starts, and one machine is made and snapshotted as a
probe: an app that does not import, lacks a method, whose `new` raises or whose
`snapshot()` is not bytes exits 2 with one line. A replay of the log through the
app that sends other messages than the log holds (a non-deterministic app)
exits 2 naming the log position. An app that raises in `on_message` stops the
node (exit 1) with the app's text: that message is neither applied nor acknowledged,
and the restarted node meets it again.

Exit codes: 0 clean stop; 1 cannot bind, the log cannot be written, or the app
failed on a message; 2 bad arguments, a bad cluster file or app, a corrupt log,
or the data dir in use by another process for this node (one line on stderr;
nothing in the data dir touched).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time

from snapmesh.bank.formats import NODE_TALLY_KEY  # the log lines keep their v1 wording
from snapmesh.bank.rules import starting_tally
from snapmesh.services.node.channels import IncomingChannel, OutgoingChannel
from snapmesh.serving.datalock import serve_holding
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.recovery import CorruptLogError, NonDeterministicError, OtherVersionError, recover
from snapmesh.services.node.reporter import CorruptReportError, PendingReports, StateReporter
from snapmesh.services.node.channels import MAX_MERGED, MAX_MERGED_PAYLOAD
from snapmesh.services.node.edge import MAX_BATCH_BYTES, MAX_BATCH_COMMANDS, MAX_COMMAND_BYTES, Edge
from snapmesh.services.node.servicer import MAX_BATCH, REFUSAL_STATUS, NodeServicer
from snapmesh.services.node.translog import TransferLog
from snapmesh.app import App, NodeInfo, preflight
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.serving.durable import fsync_dir
from snapmesh.protocol.node.link import DEFAULT_MARK
from snapmesh.protocol.hybrid import HybridNode
from snapmesh.protocol import chunking
from snapmesh.protocol.node.machine import Node
from snapmesh.protocol.node.requests import MAX_ID_BYTES
from snapmesh.serving.runtime import CLIENT_OPTIONS, Failure, ServiceHost, serve_until_stopped, wait_for_stop_signal
from snapmesh.serving.startup import OneLineParser, Prepared, server_main
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger("snapmesh.services.node")

STOP_GRACE_S = 2.0


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="snapmesh node", description="Run one snapmesh node (a gRPC server).")
    parser.add_argument("--config", metavar="FILE", help="cluster file (TOML) (default: the shipped 4-node config)")
    parser.add_argument("--id", required=True, dest="node_id", metavar="ID",
                        help="this node's id in the cluster file (required: no default)")
    parser.add_argument("--app", metavar="MODULE:ATTR",
                        help="the app this node runs (snapmesh.app) (default: the cluster file's [app], else the bank)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return server_main(_parser(), argv, _prepare)


def _prepare(args: argparse.Namespace, cfg: cluster_config.ClusterConfig) -> Prepared:
    cfg.node(args.node_id)
    identity = security.load_identity(cfg, args.node_id)
    app = load_node_app(cfg, args.node_id)
    return f"node {args.node_id}", lambda: serve(cfg, args.node_id, identity, app)


def load_node_app(cfg: cluster_config.ClusterConfig, node_id: str) -> App | None:
    """The app `cfg` names (None: the bank), through the pre-flight every command
    shares (snapmesh.app.preflight), for this node. Raises AppError (one line)."""
    if cluster_config.runs_bank(cfg.app):
        return None
    info = NodeInfo(node_id=node_id, peers_out=cfg.topology.outgoing(node_id), peers_in=cfg.topology.incoming(node_id),
                    params=cfg.app.params)
    return preflight(cfg.app.module, [info])


async def serve(
    cfg: cluster_config.ClusterConfig, node_id: str, identity: security.Identity | None = None, app: App | None = None
) -> int:
    # One process per node: the lock is taken before anything in the data dir is read or written.
    return await serve_holding(
        cfg.data_dir, node_id, "snapmesh node", lambda: _serve_locked(cfg, node_id, identity, app)
    )


async def _serve_locked(
    cfg: cluster_config.ClusterConfig, node_id: str, identity: security.Identity | None = None, app: App | None = None
) -> int:
    node = cfg.node(node_id)
    incoming = cfg.topology.incoming(node_id)
    outgoing = cfg.topology.outgoing(node_id)
    path = cfg.log_path(node_id)
    try:
        recovered = recover(
            path, node_id, initial_tally=0 if app is not None else starting_tally(cfg), incoming=incoming, outgoing=outgoing,
            app=app, app_params=cfg.app.params,
        )
        pending = PendingReports(cfg.data_dir / f"{node_id}.reports")
        unreported = pending.load()
    except (NonDeterministicError, OtherVersionError) as exc:  # the line names the cause and the ways on
        print(f"snapmesh node: refusing to start: {exc}", file=sys.stderr)
        return 2
    except CorruptLogError as exc:
        print(f"snapmesh node: corrupt transfer log, refusing to start: {exc}", file=sys.stderr)
        return 2
    except CorruptReportError as exc:
        print(f"snapmesh node: corrupt pending report, refusing to start: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"snapmesh node: cannot read its data in {cfg.data_dir}: {exc}", file=sys.stderr)
        return 2

    metrics = NodeMetrics(node_id)
    engine: Engine | None = None

    def on_durable(lsn: int) -> None:
        if engine is not None:
            engine.durable(lsn)

    translog = TransferLog(
        path, node_id, last_lsn=recovered.last_lsn, on_durable=on_durable, observe_fsync=metrics.observe_fsync,
        observe_round=metrics.observe_round,
    )
    if not recovered.fresh:
        log.info(
            "recovered from %s: %s %d, %d records read, %d unacknowledged-or-unknown messages, "
            "abandoned snapshots: %d",
            path,
            NODE_TALLY_KEY,
            recovered.tally,
            recovered.records,
            sum(len(v) for v in recovered.outbox.values()),
            len(recovered.abandoned),
        )
    # The node machine: core + links + log positions (snapmesh/protocol/node/machine.py); everything below is its shell.
    hybrid = {"align_timeout": cfg.align_timeout_ms / 1e3} if cfg.snapshot_mode == "hybrid" else {}
    node_machine = (HybridNode if hybrid else Node)(
        **hybrid,
        node_id=node_id,
        incoming=incoming,
        outgoing=outgoing,
        recovered=recovered,
        mark=flow_mark(),
        bound=cfg.channel_bound,
        # Twice the controller's deadline: by then the controller has failed it.
        recording_ttl=2 * cfg.controller.snapshot_deadline_s,
        segment_records=cfg.segment_records,
        segment_bytes=cfg.segment_bytes,
        reply_window_bytes=cfg.reply_window_bytes,
        snapshot_mode=cfg.snapshot_mode,
        now=asyncio.get_running_loop().time(),
        wall=time.time(),  # the request-id window's clock (it outlives restarts)
        app=app,
        app_params=cfg.app.params,
        max_reply_bytes=cfg.max_reply_bytes,
    )

    rng = random.Random()
    channels: dict[str, OutgoingChannel] = {}
    # The streams start after `engine` is set, and only then call back into it.
    for dst in outgoing:
        channels[dst] = OutgoingChannel(
            src=node_id,
            dst=dst,
            address=cfg.node(dst).address,
            metrics=metrics,
            on_open=lambda d, e, r: engine.link_open(d, e, r),
            on_ack=lambda d, e, s: engine.link_ack(d, e, s),
            on_lost=lambda d: engine.link_lost(d),
            rng=rng,
            channel_options=CLIENT_OPTIONS,
            identity=identity,
            epoch_of=lambda: engine.node.epoch,
        )
    reporter = StateReporter(
        address=cfg.controller.address, log_=translog, metrics=metrics, options=CLIENT_OPTIONS, pending=pending,
        identity=identity,
    )
    engine = Engine(
        node=node_machine,
        log_=translog,
        outgoing=channels,
        incoming={src: IncomingChannel(src=src, dst=node_id) for src in incoming},
        metrics=metrics,
        reporter=reporter,
        app_spec="" if app is None else cfg.app.module,
    )
    try:
        translog.flush_sync()
        fsync_dir(cfg.data_dir)
    except OSError as exc:
        await translog.close()
        print(f"snapmesh node: cannot write the transfer log {path}: {exc}", file=sys.stderr)
        return 1
    engine.durable(translog.durable_lsn)
    edge = Edge(engine)  # commands into the app: Submit and SubmitBatch call it, as an embedding program would
    servicer = NodeServicer(engine, edge)
    metrics.initialise(incoming=incoming, outgoing=outgoing, codes={c.name for c in REFUSAL_STATUS.values()})

    limit = receive_limit(max(len(n.id) for n in cfg.nodes))
    metrics.receive_limit.set(limit)
    host = ServiceHost(
        bind_address=cfg.bind_address(node), metrics_bind=cfg.metrics_bind(node), registry=metrics.registry, identity=identity,
        max_receive_bytes=limit,
    )
    host.add(pb_grpc.add_NodeServicer_to_server, servicer, pb.DESCRIPTOR.services_by_name["Node"].full_name)

    def serving() -> None:
        for channel in channels.values():
            channel.start()
        reporter.resume(unreported, recovered.last_lsn)
        if app is None:
            log.info("node %s serving on %s (%s %d)", node_id, host.bind_address, NODE_TALLY_KEY, node_machine.tally)
        else:
            log.info("node %s serving on %s (app %s)", node_id, host.bind_address, cfg.app.module)

    translog.start()
    assert translog.flusher is not None
    try:
        status = await serve_until_stopped(
            host, log, serving=serving, stop_signal=wait_for_stop_signal,
            stopping=lambda sig: f"node {node_id}: {sig.name} received, stopping",
            failures=[
                Failure(engine.app_failed, lambda failed: (
                    f"node {node_id}: the app failed on a message, or a refused command could not be taken back"
                    f" (apphost.H4), stopping (neither is applied; the restarted node recovers from its log"
                    f" and meets the message again): {failed.result()}"), 1),
                # Nothing more is written (see translog); stop serving now. What the file
                # holds is a prefix of the log, so a restart recovers from it.
                Failure(translog.flusher, lambda flusher: (
                    f"node {node_id}: the transfer log {path} cannot be written ({flusher.exception()}); nothing "
                    f"after lsn {translog.durable_lsn} is on disk and nothing more will be written; stopping "
                    "(restart the node once the disk is fixed: it recovers from the log)"), 1),
            ],
        )
    except BaseException:
        await translog.close()
        raise

    # Drain: NOT_SERVING and no new streams, close the incoming streams, stop the
    # server (unary calls in flight finish), then the senders, then the log.
    servicer.stopping = True
    for rx in engine.incoming.values():
        rx.end_stream("the node is stopping")
    await host.stop(STOP_GRACE_S)
    await asyncio.gather(*(channel.close() for channel in channels.values()))
    await reporter.close()
    try:
        await translog.close()
    except OSError as exc:
        log.error("node %s: final flush of %s failed: %s", node_id, path, exc)
        status = 1
    log.info("node %s stopped", node_id)
    return status


def flow_mark() -> int:
    """The flow-control mark (link L7): link.DEFAULT_MARK, or SNAPMESH_FLOW_MARK (for the
    benchmark that shows snapshot latency at two marks). A bad value exits 2."""
    text = os.environ.get("SNAPMESH_FLOW_MARK", "")
    if not text:
        return DEFAULT_MARK
    if not text.isdigit() or int(text) < 1:
        print(f"SNAPMESH_FLOW_MARK: must be a positive integer, got {text!r}", file=sys.stderr)
        raise SystemExit(2)
    return int(text)


# What each RPC of the node may carry, at most, in bytes. gRPC's receive limit is one
# per server (grpc.max_receive_message_length; the server has no per-method one, and a
# handler, interceptor or deserializer that refuses a large message runs after gRPC has
# read and held all of it), so the node's limit is the largest of these, and each RPC
# whose content has no such bound carries it in pieces instead: a restore over
# chunking.CHUNK_BYTES by RestoreStateChunks (the controller cuts it), an app's frame
# cut at MAX_MERGED_PAYLOAD bytes of payloads of at most MAX_MESSAGE_BYTES each (the
# sender cuts it), a report by the controller's ReportStateChunks. So a client's Submit
# of 60 MB is refused by gRPC (RESOURCE_EXHAUSTED) before it is held.
SMALL_BYTES = 64 * 1024  # a call of ids and numbers, and any call's framing


def rpc_budgets(longest_id: int) -> dict[str, int]:
    """The most each RPC of the node may carry (`longest_id`: the longest node id)."""
    ids = 2 * longest_id + 64  # one message's ids, its seq and numbers, and framing
    return {
        "Transfer": SMALL_BYTES,
        "TransferBatch": MAX_BATCH * (MAX_ID_BYTES + ids) + SMALL_BYTES,
        "GetState": SMALL_BYTES,
        "StartSnapshot": SMALL_BYTES,
        "AbortSnapshot": SMALL_BYTES,
        # MAX_MERGED messages, each with its ids (a marker: its snapshot id) and an app's payloads.
        "Channel": MAX_MERGED_PAYLOAD + MAX_MERGED * (ids + 64) + SMALL_BYTES,
        "RestoreState": chunking.CHUNK_BYTES + SMALL_BYTES,  # larger: RestoreStateChunks
        "RestoreStateChunks": chunking.CHUNK_BYTES + SMALL_BYTES,
        "Submit": MAX_COMMAND_BYTES + MAX_ID_BYTES + SMALL_BYTES,
        # Its commands and request ids (edge.py E3), and per item at most 23 bytes more: the item's
        # tag and length, the two fields' tags and lengths, first_sent_unix_ms as a tag and varint.
        "SubmitBatch": MAX_BATCH_BYTES + MAX_BATCH_COMMANDS * 24 + SMALL_BYTES,
        "Query": MAX_COMMAND_BYTES + SMALL_BYTES,  # a query holds at most what a command does (edge.py E7)
    }


def receive_limit(longest_id: int) -> int:
    """The node's receive limit: the largest message any of its RPCs may carry (rpc_budgets)."""
    return max(rpc_budgets(longest_id).values())


if __name__ == "__main__":
    sys.exit(main())
