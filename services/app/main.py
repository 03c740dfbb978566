"""`snapmesh app --controller HOST:PORT [--duration S] [--transfer-interval S]
[--snapshot-every S] [--seed N] [--max-amount N] [--tls-dir DIR]`: the bank workload.

`--tls-dir DIR` (default: $SNAPMESH_TLS_DIR): a TLS cluster's client certificate
and token, as `snapmesh certs` or `cluster up --tls` wrote them.

Exit status: 0 when every snapshot finished and was conserved, 1 otherwise,
2 when the controller cannot be reached or an argument is bad.
"""

from __future__ import annotations

import argparse
import sys

from snapmesh.settings import security
from snapmesh.bank.workload import ControllerUnreachable, WorkloadParams, run_workload
from snapmesh.settings.argparsing import parse_args


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh app: {message}\n")


def _parser() -> argparse.ArgumentParser:
    defaults = WorkloadParams()
    parser = _Parser(prog="snapmesh app", description="Move money between nodes and take snapshots.")
    parser.add_argument("--controller", required=True, metavar="HOST:PORT", help="the controller's address")
    parser.add_argument("--duration", type=float, default=defaults.duration, metavar="S",
                        help=f"run for S seconds (default: {defaults.duration:g})")
    parser.add_argument("--transfer-interval", type=float, default=defaults.transfer_interval, metavar="S",
                        help="each node makes one transfer every S seconds")
    parser.add_argument("--snapshot-every", type=float, default=defaults.snapshot_every, metavar="S",
                        help="a snapshot at a random node every S seconds (0: none)")
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="seed of every random choice")
    parser.add_argument("--max-amount", type=int, default=defaults.max_amount, metavar="N",
                        help=f"each transfer pays 1..N (default: {defaults.max_amount})")
    parser.add_argument("--tls-dir", metavar="DIR", help="client certificate and token of a TLS cluster "
                        "(default: $SNAPMESH_TLS_DIR; none: plaintext)")
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
        identity = security.client_identity(args.tls_dir)
    except security.SecurityError as exc:
        print(f"snapmesh app: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run_workload(args.controller, params, out=sys.stdout, identity=identity)
    except ControllerUnreachable as exc:
        print(f"snapmesh app: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main())
