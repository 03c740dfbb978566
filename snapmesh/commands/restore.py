"""`snapmesh restore [--controller HOST:PORT] ID`: roll the cluster back to a snapshot.

Calls `Controller.RestoreSnapshot` and prints the result as a table: the
snapshot, the new epoch, the status and each node's balance right after the
restore (its recorded balance plus the in-flight transfers replayed to it).
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
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation on a terminal")
    return parser


def confirmed(controller: str, snapshot_id: str) -> bool:
    """Ask on the terminal; True for y or yes."""
    try:
        answer = input(f"Roll the whole cluster of {controller} back to snapshot {snapshot_id}? Every node's "
                       "balance is replaced and transfers since then are undone. [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def render(restore) -> str:
    """The table the command prints."""
    from snapmesh.v1 import snapmesh_pb2 as pb

    status = pb.Restore.Status.Name(restore.status)
    lines = [f"snapshot {restore.snapshot_id}  epoch {restore.epoch}  {status}"]
    if restore.reason:
        lines.append(f"reason: {restore.reason}")
    if restore.nodes:
        width = max(len("node"), *(len(n.node_id) for n in restore.nodes))
        lines.append(f"{'node':<{width}}  {'balance':>12}")
        lines += [f"{n.node_id:<{width}}  {n.balance:>12}" for n in restore.nodes]
        lines.append(f"{'total':<{width}}  {sum(n.balance for n in restore.nodes):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if not args.snapshot_id.strip():
        print("snapmesh restore: ID is empty", file=sys.stderr)
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

    from snapmesh.commands import client_errors
    from snapmesh.v1 import snapmesh_pb2 as pb
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    try:
        with credentials.open_channel(found.address, identity) as channel:
            restore = pb_grpc.ControllerStub(channel).RestoreSnapshot(
                pb.RestoreSnapshotRequest(snapshot_id=args.snapshot_id), timeout=args.timeout
            )
    except grpc.RpcError as error:
        print(f"snapmesh restore: {client_errors.explain(error, found.address, identity)}", file=sys.stderr)
        return 1
    print(render(restore))
    return 0 if restore.status == pb.Restore.RESTORED else 1


if __name__ == "__main__":
    sys.exit(main())
