"""`snapmesh app [--controller HOST:PORT] [--data-dir DIR] [--duration S] [--transfer-interval S]
[--snapshot-every S] [--seed N] [--max-amount N] [--tls-dir DIR]`: the bank workload.

The controller: `--controller`, else $SNAPMESH_CONTROLLER, else `--data-dir D`'s
cluster.toml, else 127.0.0.1:50050 (snapmesh.settings.target). `--tls-dir DIR`
(default: $SNAPMESH_TLS_DIR, else D/tls/): a TLS cluster's client certificate
and token, as `snapmesh certs` or `cluster up --tls` wrote them.

Exit status: 0 when every snapshot finished and was conserved, 1 otherwise or
when the controller cannot be reached (as every client command), 2 when an
argument is bad.
"""

from __future__ import annotations

import argparse
import sys

from snapmesh.settings import target
from snapmesh.bank.workload import ControllerUnreachable, WorkloadParams, run_workload
from snapmesh.settings.argparsing import parse_args


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh app: {message}\n")


def _parser() -> argparse.ArgumentParser:
    defaults = WorkloadParams()
    parser = _Parser(prog="snapmesh app", description="Move money between nodes and take snapshots.")
    parser.add_argument("--controller", metavar="HOST:PORT", help=target.CONTROLLER_HELP)
    parser.add_argument("--data-dir", metavar="DIR", help=target.DATA_DIR_HELP)
    parser.add_argument("--duration", type=float, default=defaults.duration, metavar="S",
                        help=f"run for S seconds (default: {defaults.duration:g})")
    parser.add_argument("--transfer-interval", type=float, default=defaults.transfer_interval, metavar="S",
                        help=f"each node makes one transfer every S seconds (default: {defaults.transfer_interval:g})")
    parser.add_argument("--snapshot-every", type=float, default=defaults.snapshot_every, metavar="S",
                        help=f"a snapshot at a random node every S seconds (0: none; default: {defaults.snapshot_every:g})")
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="seed of every random choice "
                        "(default: a random one, printed)")
    parser.add_argument("--max-amount", type=int, default=defaults.max_amount, metavar="N",
                        help=f"each transfer pays 1..N (default: {defaults.max_amount})")
    parser.add_argument("--tls-dir", metavar="DIR", help="client certificate and token of a TLS cluster "
                        "(default: $SNAPMESH_TLS_DIR, else --data-dir's tls/, else plaintext)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    params = WorkloadParams(
        duration=args.duration,
        transfer_interval=args.transfer_interval,
        snapshot_every=args.snapshot_every,
        seed=args.seed,
        max_amount=args.max_amount,
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
    try:
        summary = run_workload(found.address, params, out=sys.stdout, identity=found.identity)
    except ControllerUnreachable as exc:
        print(f"snapmesh app: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main())
