"""`snapmesh restore [--controller HOST:PORT] ID`: roll the cluster back to a snapshot.

Calls `Controller.RestoreSnapshot` and prints the result as a table: the
snapshot, the new epoch, the status, then each node as its app sees it. The
bank: each node's balance right after the restore (its recorded balance plus
the in-flight transfers replayed to it) and their total. An app (the restored
nodes report no balance, so the snapshot is read, GetSnapshotChunks): each
node's recorded state bytes and the in-flight messages replayed to it, the
app's invariants as the controller judged the snapshot and what its `describe`
says (snapmesh.checking.described), in the app's words, never the bank's.
`--nodes A,B,...` restores onto that node set with the app's rescale (docs/apps.md,
"Rescale"), `--request-id KEY` makes a retry answer the restore it started.
Exit status: 0 when RESTORED; 1 when FAILED, refused (NOT_FOUND,
FAILED_PRECONDITION) or the controller cannot be reached; 2 for bad arguments
or a bad certificate file. The controller: `--controller`, else
$SNAPMESH_CONTROLLER, else `--data-dir D`'s cluster.toml, else 127.0.0.1:50050
(snapmesh.settings.target). `--tls-dir DIR` (default: $SNAPMESH_TLS_DIR, else
D/tls/): the client certificate and token of a TLS cluster. On a terminal it asks for
confirmation first (anything but y/yes changes nothing, exit 1); `--yes` skips
that, and scripts (stdin not a terminal) are not asked.
"""

from __future__ import annotations

import argparse
import sys

from snapmesh.serving import credentials
from snapmesh.settings import target
from snapmesh.settings.argparsing import parse_args, positive_float


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 on bad arguments, one line
        self.exit(2, f"snapmesh restore: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh restore", description="Roll the whole cluster back to a COMPLETE snapshot.")
    parser.add_argument("snapshot_id", metavar="ID", help="the snapshot to restore")
    parser.add_argument("--controller", metavar="HOST:PORT", help=target.CONTROLLER_HELP)
    parser.add_argument("--data-dir", metavar="DIR", help=target.DATA_DIR_HELP)
    parser.add_argument("--timeout", type=positive_float, default=120.0, metavar="S",
                        help="give up after S seconds (default: 120)")
    parser.add_argument("--tls-dir", metavar="DIR", help="client certificate of a TLS cluster "
                        "(default: $SNAPMESH_TLS_DIR, else --data-dir's tls/, else plaintext)")
    parser.add_argument("--nodes", metavar="ID,ID,...", default="",
                        help="restore onto this node set, with the app's rescale (the nodes the controller runs, or "
                        "those its cluster file names; default: the snapshot's own node set)")
    parser.add_argument("--request-id", metavar="KEY", default="",
                        help="idempotency key: run again with it, the same restore answers (default: none)")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation on a terminal")
    return parser


def confirmed(controller: str, snapshot_id: str) -> bool:
    """Ask on the terminal; True for y or yes."""
    try:
        answer = input(f"Roll the whole cluster of {controller} back to snapshot {snapshot_id}? Every node's "
                       "state is replaced and what happened since then is undone. [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def may_be_app(restore) -> bool:
    """Whether the restored snapshot may be an app's: its nodes carry no balance
    (only the bank's do), so the snapshot itself must say (an older controller's
    answer whose every balance is 0 costs one more call and prints the bank's table)."""
    return bool(restore.nodes) and not any(n.HasField("balance") for n in restore.nodes)


def render(restore, snapshot=None, unread: str = "") -> str:
    """The table the command prints: the bank's balances, or with `snapshot` an
    app's (render_app). `unread`: why the snapshot of a restore that may be an
    app's could not be read (the nodes are listed, nothing else)."""
    from snapmesh.checking import described
    from snapmesh.v1 import snapmesh_pb2 as pb

    status = pb.Restore.Status.Name(restore.status)
    lines = [f"snapshot {restore.snapshot_id}  epoch {restore.epoch}  {status}"]
    if restore.reason:
        lines.append(f"reason: {restore.reason}")
    if not restore.nodes:
        return "\n".join(lines)
    if snapshot is not None and described.is_app(snapshot) and not any(n.HasField("balance") for n in restore.nodes):
        return "\n".join([*lines, *render_app(restore, snapshot, described.describe(snapshot))])
    if unread:
        return "\n".join([*lines, *(f"node {n.node_id}" for n in restore.nodes), f"(the snapshot could not be read: {unread})"])
    width = max(len("node"), *(len(n.node_id) for n in restore.nodes))
    lines.append(f"{'node':<{width}}  {'balance':>12}")
    lines += [f"{n.node_id:<{width}}  {n.balance:>12}" for n in restore.nodes]
    lines.append(f"{'total':<{width}}  {sum(n.balance for n in restore.nodes):>12}")
    return "\n".join(lines)


def render_app(restore, snapshot, about) -> list[str]:
    """An app's restore: each node's recorded state and the in-flight messages
    replayed to it, the app's invariants as the controller judged the snapshot,
    and its describe (or why there is none)."""
    from snapmesh.checking import described

    by = f" ({snapshot.app.name} version {snapshot.app.version or 1})" if snapshot.app.name else ""
    lines = [f"app {snapshot.app.spec}{by}"]
    if {n.node_id for n in restore.nodes} != {n.node_id for n in snapshot.nodes}:  # a rescale: no per-node replay
        in_flight = sum(len(c.in_flight) for c in snapshot.channels)
        lines += [f"rescaled from {len(snapshot.nodes)} nodes ({', '.join(n.node_id for n in snapshot.nodes)}) onto "
                  f"{len(restore.nodes)}: the app's rescale made each node's state, the {in_flight} message(s) in "
                  "flight absorbed", *_table(["node", "epoch"], [[n.node_id, str(restore.epoch)] for n in restore.nodes])]
    else:
        recorded = {n.node_id: len(n.state) for n in snapshot.nodes}
        replayed = {n.node_id: 0 for n in restore.nodes}
        for channel in snapshot.channels:
            replayed[channel.dst] = replayed.get(channel.dst, 0) + len(channel.in_flight)
        rows = [[n.node_id, str(restore.epoch), str(recorded.get(n.node_id, 0)), str(replayed[n.node_id])]
                for n in restore.nodes]
        lines += _table(["node", "epoch", "state bytes", "messages replayed"], rows)
    lines += ["", *_table(["invariant", "verdict"], [list(v) for v in described.verdicts(snapshot)])]
    if about is not None and about.summary is None:
        lines += ["", f"describe: {about.note}"]
    elif about is not None:
        lines += ["", "describe:", *_table(["name", "value"], [list(r) for r in described.rows(about.summary)])]
    return lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if not args.snapshot_id.strip():
        print("snapmesh restore: ID is empty", file=sys.stderr)
        return 2
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    if args.nodes and len(nodes) != len(args.nodes.split(",")):
        print(f"snapmesh restore: --nodes has an empty node id: {args.nodes!r}", file=sys.stderr)
        return 2
    try:
        found = target.find(args.controller, args.data_dir, args.tls_dir)
    except target.TargetError as exc:
        print(f"snapmesh restore: {exc}", file=sys.stderr)
        return 2
    identity = found.identity

    if not args.yes and sys.stdin.isatty() and not confirmed(found.address, args.snapshot_id):
        print("snapmesh restore: not confirmed; nothing changed", file=sys.stderr)
        return 1

    import grpc

    from snapmesh.checking.snapshots import fetch
    from snapmesh.commands import client_errors
    from snapmesh.v1 import snapmesh_pb2 as pb
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    snapshot, unread = None, ""
    try:
        with credentials.open_channel(found.address, identity) as channel:
            stub = pb_grpc.ControllerStub(channel)
            request = pb.RestoreSnapshotRequest(snapshot_id=args.snapshot_id, request_id=args.request_id, nodes=nodes)
            restore = stub.RestoreSnapshot(request, timeout=args.timeout)
            if may_be_app(restore):
                try:
                    snapshot = fetch(stub, restore.snapshot_id, args.timeout)
                except grpc.RpcError as error:  # the restore is done: say it, and why there is no more
                    unread = client_errors.explain(error, found.address, identity)
    except grpc.RpcError as error:
        print(f"snapmesh restore: {client_errors.explain(error, found.address, identity)}", file=sys.stderr)
        return 1
    print(render(restore, snapshot, unread))
    return 0 if restore.status == pb.Restore.RESTORED else 1


if __name__ == "__main__":
    sys.exit(main())
