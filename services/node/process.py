"""`snapmesh node --config FILE --id NODE_ID [--app MODULE:ATTR]`: run one node.

Start-up: load the cluster file, recover from the transfer log (or start a new
one), open a channel stream to every outgoing peer, serve `snapmesh.v1.Node`
with health and reflection, metrics on the node's metrics port. SIGINT/SIGTERM:
health NOT_SERVING, stop accepting, close streams, finish the held blocks' writes
(heldblocks.py), flush the log, exit 0.
All of it but the server is `snapmesh.embed`'s path (embedded.start_node): this
process is an embedded node on a server of its own (ServiceHost: its options,
gRPC metrics, /metrics, the health port).

The app (snapmesh.app) is `--app`, else the cluster file's [app], else the settings'
default app (its params the file's: snapmesh.settings.appsettings.hosted).
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
import logging
import os
import sys

from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.channels import MAX_MERGED, MAX_MERGED_PAYLOAD
from snapmesh.services.node.edge import MAX_BATCH_BYTES, MAX_BATCH_COMMANDS, MAX_COMMAND_BYTES
from snapmesh.services.node.embedded import StartFailed, node_app, start_node
from snapmesh.services.node.servicer import MAX_BATCH
from snapmesh.app import App
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.settings.appsettings import app_named
from snapmesh.protocol.node.link import DEFAULT_MARK
from snapmesh.protocol import chunking
from snapmesh.protocol.node.requests import MAX_ID_BYTES
from snapmesh.serving.runtime import ServiceHost, serve_until_stopped, wait_for_stop_signal
from snapmesh.serving.startup import OneLineParser, Prepared, server_main

log = logging.getLogger("snapmesh.services.node")

STOP_GRACE_S = 2.0


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="snapmesh node", description="Run one snapmesh node (a gRPC server).")
    parser.add_argument("--config", metavar="FILE", help="cluster file (TOML) (default: the shipped 4-node config)")
    parser.add_argument("--id", required=True, dest="node_id", metavar="ID",
                        help="this node's id in the cluster file (required: no default)")
    parser.add_argument("--app", metavar="MODULE:ATTR",
                        help=f"the app this node runs (snapmesh.app) (default: the cluster file's [app], else {app_named('')})")
    return parser


def main(argv: list[str] | None = None) -> int:
    return server_main(_parser(), argv, _prepare)


def _prepare(args: argparse.Namespace, cfg: cluster_config.ClusterConfig) -> Prepared:
    cfg.node(args.node_id)
    identity = security.load_identity(cfg, args.node_id)
    app = load_node_app(cfg, args.node_id)
    return f"node {args.node_id}", lambda: serve(cfg, args.node_id, identity, app)


def load_node_app(cfg: cluster_config.ClusterConfig, node_id: str) -> App:
    """The app `cfg` names (cluster_config.hosted: the settings' default app for a file
    without [app]), through the pre-flight every command shares (snapmesh.app.preflight), for
    this node. Raises AppError (one line)."""
    return node_app(cfg, node_id)


async def serve(
    cfg: cluster_config.ClusterConfig, node_id: str, identity: security.Identity | None = None, app: App | None = None
) -> int:
    """The node on a server of its own: the embed path (embedded.start_node) on a
    ServiceHost's server, which adds the gRPC metrics, /metrics and the health port.
    `app` None: the one `cfg` names (load_node_app)."""
    app = app if app is not None else load_node_app(cfg, node_id)
    node_cfg = cfg.node(node_id)
    metrics = NodeMetrics(node_id)
    limit = receive_limit(max(len(n.id) for n in cfg.nodes))
    host = ServiceHost(
        bind_address=cfg.bind_address(node_cfg), metrics_bind=cfg.metrics_bind(node_cfg), registry=metrics.registry,
        identity=identity, max_receive_bytes=limit,
    )
    try:
        # One process per node: the lock is taken before anything in the data dir is read or written.
        node = await start_node(cfg, node_id, app, host.server, identity=identity, services=host.services,
                                metrics=metrics, receive_limit=limit, mark=flow_mark())
    except StartFailed as exc:
        print(f"snapmesh node: {exc}", file=sys.stderr)
        return exc.status
    try:
        status = await serve_until_stopped(
            host, log, serving=lambda: log.info("%s", node.serving_line), stop_signal=wait_for_stop_signal,
            stopping=lambda sig: f"node {node_id}: {sig.name} received, stopping",
            failures=node.failures(),
        )
    except BaseException:
        await node.close()
        raise
    # Drain: NOT_SERVING and no new streams, close the incoming streams, stop the
    # server (unary calls in flight finish), then the senders, then the log.
    await node.drain()
    await host.stop(STOP_GRACE_S)
    if await node.close():
        status = 1
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
        "Fence": SMALL_BYTES,
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
