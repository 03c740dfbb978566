"""`snapmesh app [--app NAME|module:attr] [--controller HOST:PORT] [--data-dir DIR] [--duration S]
[--transfer-interval S] [--snapshot-every S] [--seed N] [--max-amount N] [--tls-dir DIR]`: a workload.

The app is `--app` (a built-in such as kvshard, or module:attr), else
$SNAPMESH_APP, else the [app] of `--data-dir`'s cluster file (which `cluster up`
writes), else the bank's transfers between the nodes. It is the only app module
this command imports: a node that reports another app (GetState) is refused in
one line (exit 2), never loaded. An app's `workload`, the bank's transfers too,
is sent through `Node.SubmitBatch` (snapmesh/load/), counting replies and refusals;
each COMPLETE snapshot's invariants are the controller's verdict and are checked
again here (the [app] params: --data-dir's cluster file, else none).

The controller: `--controller`, else $SNAPMESH_CONTROLLER, else `--data-dir D`'s
cluster.toml, else 127.0.0.1:50050 (snapmesh.settings.target). `--tls-dir DIR`
(default: $SNAPMESH_TLS_DIR, else D/tls/): a TLS cluster's client certificate
and token, as `snapmesh certs` or `cluster up --tls` wrote them.

Exit status: 0 when every snapshot finished and was conserved (an app: COMPLETE
with every invariant holding, and no command given up on), 1 otherwise or
when the controller cannot be reached (as every client command), 2 when an
argument is bad.
"""

from __future__ import annotations

import argparse
import os
import sys

from snapmesh.settings import target
from snapmesh.bank.workload import ControllerUnreachable, WorkloadParams, run_workload
from snapmesh.settings.argparsing import parse_args


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh app: {message}\n")


def _parser() -> argparse.ArgumentParser:
    defaults = WorkloadParams()
    parser = _Parser(prog="snapmesh app", description="Drive an app's workload against a running "
                     "cluster and take snapshots (the bank's: transfers between the nodes).")
    parser.add_argument("--app", metavar="NAME|module:attr", help="drive this app's workload through "
                        "Node.SubmitBatch (a built-in: bank, kvshard; default: the bank's transfers)")
    parser.add_argument("--controller", metavar="HOST:PORT", help=target.CONTROLLER_HELP)
    parser.add_argument("--data-dir", metavar="DIR", help=target.DATA_DIR_HELP)
    parser.add_argument("--duration", type=float, default=defaults.duration, metavar="S",
                        help=f"run for S seconds (default: {defaults.duration:g})")
    parser.add_argument("--transfer-interval", type=float, default=None, metavar="S",
                        help=f"the bank: each node makes one transfer every S seconds (default: {defaults.transfer_interval:g})")
    parser.add_argument("--snapshot-every", type=float, default=defaults.snapshot_every, metavar="S",
                        help=f"a snapshot at a random node every S seconds (0: none; default: {defaults.snapshot_every:g})")
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="seed of every random choice "
                        "(default: a random one, printed)")
    parser.add_argument("--max-amount", type=int, default=None, metavar="N",
                        help=f"the bank: each transfer pays 1..N (default: {defaults.max_amount})")
    parser.add_argument("--tls-dir", metavar="DIR", help="client certificate and token of a TLS cluster "
                        "(default: $SNAPMESH_TLS_DIR, else --data-dir's tls/, else plaintext)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        spec, how = _app_to_drive(args)
    except target.TargetError as exc:
        print(f"snapmesh app: {exc}", file=sys.stderr)
        return 2
    if spec.strip() not in ("", "bank"):
        from snapmesh.services.app.appload import run_app

        return run_app(args, spec, how)
    defaults = WorkloadParams()
    params = WorkloadParams(
        duration=args.duration,
        transfer_interval=defaults.transfer_interval if args.transfer_interval is None else args.transfer_interval,
        snapshot_every=args.snapshot_every,
        seed=args.seed,
        max_amount=defaults.max_amount if args.max_amount is None else args.max_amount,
    )
    try:
        params.check()
    except ValueError as exc:
        print(f"snapmesh app: {exc}", file=sys.stderr)
        return 2
    try:
        found = target.find(args.controller, args.data_dir, args.tls_dir)
    except target.TargetError as exc:
        print(f"snapmesh app: {exc}", file=sys.stderr)
        return 2
    from snapmesh.services.app.appload import bank_problem

    if problem := bank_problem(how, found):
        print(f"snapmesh app: {problem}", file=sys.stderr)
        return 2
    try:
        summary = run_workload(found.address, params, out=sys.stdout, identity=found.identity)
    except ControllerUnreachable as exc:
        print(f"snapmesh app: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return summary.exit_code


def _app_to_drive(args: argparse.Namespace) -> tuple[str, str]:
    """The app to drive and where it was named: `--app`, else $SNAPMESH_APP, else the
    [app] of --data-dir's cluster file, else the bank (""). Never what a node reports."""
    if args.app is not None:
        return args.app, "--app"
    if os.environ.get("SNAPMESH_APP"):
        return os.environ["SNAPMESH_APP"], "$SNAPMESH_APP"
    if args.data_dir is not None:
        cfg = target.cluster_file(args.data_dir)
        return cfg.app.module, f"[app] of {cfg.path}"
    return "", "no --app given"


if __name__ == "__main__":
    sys.exit(main())
