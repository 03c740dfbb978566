"""`snapmesh cluster rescale --data-dir D --nodes N [--snapshot ID]`: a local cluster onto N nodes.

    snapmesh cluster rescale --data-dir D --nodes N [--snapshot ID] [--ui HOST:PORT]

D is the data dir of a `snapmesh cluster up` cluster. In order:
1. The running cluster of D stops with a snapshot (TriggerSnapshot stop:
   every node fenced, the snapshot taken, the nodes stopped, their logs ending
   in it), and that snapshot is the one restored. With --snapshot ID, the
   snapshot ID (any COMPLETE snapshot of this cluster: a live cut, with
   messages in flight, or an earlier stop snapshot) is restored instead; a
   running cluster still stops with a snapshot first, so that every node's log
   ends in a stop (a node starts on another node set from a stopped log only).
2. The cluster of D, if it runs, is stopped (`cluster down`).
3. D/cluster.toml is written for N nodes (snapmesh.settings.rescaling: the
   controller and the first N nodes keep their ports and data dirs, new nodes
   get free ports, the channels a full mesh), each new node gets a log of an
   init and a stop for the snapshot (so it starts fenced, as the kept nodes do),
   a bank with no `total` in its [app] gets the one it had there (the bank's
   default total follows the node count, a rescale keeps the total), and a TLS
   cluster's certificates are made again for the new node set
   (D/tls/: clients take the new CA).
4. The cluster starts again from D in the foreground, as `cluster up --data-dir D`
   (removed nodes are not started; every node starts fenced on its stopped
   log), and once the controller answers, RestoreSnapshot with the target node
   set restores the snapshot with the app's rescale (run and checked on the
   controller before any node changes). The request id is
   "rescale <snapshot> onto <N>": a rescale run again for the same snapshot and
   N joins that restore, never runs it twice: `--snapshot ID` with the node count
   the cluster already has is such a retry (an interrupted rescale finishes, a
   finished one is answered again). It prints
   `rescaled: <snapshot> onto N nodes (...) in epoch E` on stdout, or the refusal
   on stderr (the cluster then stays fenced: `snapmesh restore` finishes it).

Refused with one line and exit 2, before anything changes: --nodes below 2, a D
with no cluster file, an app without rescale, a cluster
that already has N nodes (without --snapshot), no cluster running and no --snapshot. Exit 1 when the
stop snapshot or the stop fails (the running cluster is left as it is).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
import tomllib
from pathlib import Path

import grpc

from snapmesh.app import App, AppError, load_app
from snapmesh.processes import cluster_admin, fencelog
from snapmesh.settings import config as cluster_config
from snapmesh.settings import rescaling, security
from snapmesh.settings.appsettings import runs_bank
from snapmesh.settings.config import hosted
from snapmesh.settings.ports import free_ports
from snapmesh.settings.target import CLUSTER_FILE
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

PROG = "snapmesh cluster rescale"
TLS_DIR = "tls"
STOP_TIMEOUT_S = 120.0
RESTORE_TIMEOUT_S = 300.0
POLL_S = 0.2


class Refused(Exception):
    """Bad input or a state that refuses the rescale: one line, exit 2."""


def add_parser(commands) -> None:
    sub = commands.add_parser("rescale", help="restore a stop snapshot onto N nodes (the app's rescale)",
                              description="Stop the cluster of a data dir with a snapshot, and run it again on N "
                              "nodes from that snapshot, with the app's rescale(view, nodes).")
    sub.add_argument("--data-dir", metavar="DIR", required=True, help="the data dir of a `cluster up` cluster")
    sub.add_argument("--nodes", type=int, required=True, metavar="N", help="the new node count (N >= 2)")
    sub.add_argument("--snapshot", metavar="ID", help="restore this stop snapshot (default: take one now)")
    sub.add_argument("--ui", default="127.0.0.1:8080", metavar="HOST:PORT",
                     help="serve the snapshot page here, as for cluster up (default 127.0.0.1:8080; off: no page)")


def main(args, *, up: Callable[[list[str]], int]) -> int:
    """The rescale; `up` is `cluster up`'s main (the launcher's), which runs the new cluster."""
    try:
        data_dir, cfg, app = _checked(args)
        running = cluster_admin.running_launcher(data_dir)
        if not args.snapshot and running is None:
            raise Refused(f"no cluster runs on {data_dir}: start it (snapmesh cluster up --data-dir {data_dir}), "
                          "or name a stop snapshot with --snapshot ID")
    except Refused as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    identity = _identity(data_dir, cfg)
    snapshot_id = args.snapshot
    if running is not None and (not snapshot_id or len(cfg.nodes) != args.nodes):
        # Every node's log must end in a stop to start on another node set, even when the
        # snapshot restored is an earlier one (a live cut, with messages in flight).
        stopped = _stop(cfg.controller.address, identity)
        if not stopped:
            return 1
        snapshot_id = snapshot_id or stopped
    if running is not None and cluster_admin.down(data_dir, STOP_TIMEOUT_S) != 0:
        return 1
    path = data_dir / CLUSTER_FILE
    document = tomllib.loads(path.read_text())
    ports = free_ports(2 * rescaling.added(document, args.nodes))
    cluster_config.write(path, _kept_total(cfg, rescaling.rescaled(document, args.nodes, ports)),
                         comment=f"Written by snapmesh cluster rescale onto {args.nodes} nodes from {snapshot_id}")
    new = cluster_config.load(path, env={})
    fencelog.write(new, [n.id for n in new.nodes if n.id not in {o.id for o in cfg.nodes}], app, snapshot_id)
    if cfg.tls is not None and [n.id for n in new.nodes] != [n.id for n in cfg.nodes]:
        security.write_certs(new, data_dir / TLS_DIR)
    nodes = [n.id for n in new.nodes]
    print(f"{PROG}: restoring {snapshot_id} onto {len(nodes)} nodes ({', '.join(nodes)}) once the cluster is up",
          file=sys.stderr, flush=True)
    threading.Thread(target=_restore, args=(data_dir, new, snapshot_id, nodes), daemon=True).start()
    return up(["up", "--data-dir", str(data_dir), "--ui", args.ui])


def _checked(args) -> tuple[Path, cluster_config.ClusterConfig, App]:
    if args.nodes < rescaling.MIN_NODES:
        raise Refused(f"--nodes must be at least {rescaling.MIN_NODES} (a snapshot needs a channel), got {args.nodes}")
    data_dir = Path(args.data_dir).resolve()
    path = data_dir / CLUSTER_FILE
    if not path.is_file():
        raise Refused(f"{data_dir} holds no cluster ({path} is missing): snapmesh cluster up --data-dir {data_dir}")
    try:
        cfg = cluster_config.load(path, env={})
    except cluster_config.ConfigError as exc:
        raise Refused(str(exc)) from None
    try:
        app = load_app(hosted(cfg).module)
    except AppError as exc:
        raise Refused(str(exc)) from None
    if app.rescale is None:
        raise Refused(f"app {app.name!r} has no rescale(view, nodes): it cannot be restored onto another node set")
    if len(cfg.nodes) == args.nodes and not args.snapshot:  # with --snapshot: a retry, answered by its restore
        raise Refused(f"the cluster of {data_dir} already has {args.nodes} nodes")
    return data_dir, cfg, app


def _kept_total(cfg: cluster_config.ClusterConfig, document: dict) -> dict:
    """`document` with the bank's total kept (services/app/bank.py BR4: a rescale keeps the
    total, while its default, initial_balance x nodes, follows the node count): a bank
    whose file names none gets the one it had, in its [app] table."""
    params = hosted(cfg).params
    if not runs_bank(cfg.app) or "total" in params:
        return document
    table = dict(document.get("app", {}))
    table.setdefault("module", "bank")
    table["total"] = int(params["initial_balance"]) * len(cfg.nodes)
    return {**document, "app": table}


def _identity(data_dir: Path, cfg: cluster_config.ClusterConfig):
    from snapmesh.settings import target

    return target.find(None, data_dir, None).identity if cfg.tls is not None else None


def _stub(address: str, identity) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    from snapmesh.serving import credentials

    channel = credentials.open_channel(address, identity)
    return channel, pb_grpc.ControllerStub(channel)


def _stop(address: str, identity) -> str:
    """A stop snapshot's id ("" after saying why there is none)."""
    channel, stub = _stub(address, identity)
    with channel:
        try:
            stopped = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=STOP_TIMEOUT_S)
        except grpc.RpcError as exc:
            print(f"{PROG}: the stop snapshot failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return ""
    if stopped.status != pb.Snapshot.COMPLETE:
        print(f"{PROG}: the stop snapshot {stopped.snapshot_id} is not COMPLETE: {stopped.reason}", file=sys.stderr)
        return ""
    print(f"{PROG}: stopped with snapshot {stopped.snapshot_id}", file=sys.stderr, flush=True)
    return stopped.snapshot_id


def _restore(data_dir: Path, cfg: cluster_config.ClusterConfig, snapshot_id: str, nodes: list[str]) -> None:
    """RestoreSnapshot onto `nodes` once the controller answers; its outcome said in one line."""
    identity = _identity(data_dir, cfg)
    request = pb.RestoreSnapshotRequest(snapshot_id=snapshot_id, request_id=f"rescale {snapshot_id} onto {len(nodes)}",
                                        nodes=nodes)
    stop = threading.Event()
    while True:
        try:
            channel, stub = _stub(cfg.controller.address, identity)
            with channel:
                done = stub.RestoreSnapshot(request, timeout=RESTORE_TIMEOUT_S, wait_for_ready=True)
            break
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                stop.wait(POLL_S)  # the controller is still starting
                continue
            print(f"{PROG}: the restore of {snapshot_id} was refused: {exc.code().name}: {exc.details()}",
                  file=sys.stderr, flush=True)
            return
    if done.status != pb.Restore.RESTORED:
        print(f"{PROG}: the restore of {snapshot_id} {pb.Restore.Status.Name(done.status)}: {done.reason}",
              file=sys.stderr, flush=True)
        return
    print(f"rescaled: {snapshot_id} onto {len(nodes)} nodes ({', '.join(nodes)}) in epoch {done.epoch}", flush=True)
