"""`snapmesh health HOST:PORT`: ask a server's gRPC health service whether it serves.

A client of the standard gRPC health checking protocol (grpc.health.v1), used
by the Docker Compose healthchecks. Exit status: 0 only when the server answers
SERVING; 1 when it answers anything else, cannot be reached, or does not answer
in time; 2 for bad arguments or a bad certificate file. It prints one line either
way. `--tls-dir DIR` (default: $SNAPMESH_TLS_DIR) checks a TLS server with the
client certificate in DIR.
"""

from __future__ import annotations

import argparse
import sys

from snapmesh.settings import security, target
from snapmesh.serving import credentials
from snapmesh.settings.argparsing import parse_args


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 on errors; keep that, one line
        self.exit(2, f"snapmesh health: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="snapmesh health",
        description="Exit 0 when the gRPC server at HOST:PORT reports SERVING (grpc.health.v1).",
    )
    parser.add_argument("target", metavar="HOST:PORT", help="address of the gRPC server")
    parser.add_argument(
        "--service",
        default="",
        metavar="NAME",
        help="service name to check (default: '' = the server as a whole)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        metavar="S",
        help="give up after S seconds (default: 3)",
    )
    parser.add_argument("--tls-dir", metavar="DIR", help="client certificate of a TLS cluster (default: $SNAPMESH_TLS_DIR)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        target.check_address(args.target, "the address")
    except target.TargetError as exc:
        print(f"snapmesh health: {exc}", file=sys.stderr)
        return 2
    if not args.timeout > 0:
        print(f"snapmesh health: --timeout must be positive, got {args.timeout}", file=sys.stderr)
        return 2

    try:
        identity = security.client_identity(args.tls_dir)
    except security.SecurityError as exc:
        print(f"snapmesh health: {exc}", file=sys.stderr)
        return 2

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    name = f"{args.target} service {args.service!r}" if args.service else args.target
    try:
        with credentials.open_channel(args.target, identity) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service),
                timeout=args.timeout,
            )
    except grpc.RpcError as error:
        code = error.code()
        fix = ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            detail = f"no answer within {args.timeout:g}s"
        elif code == grpc.StatusCode.UNAVAILABLE:
            from snapmesh.commands.client_errors import another_ca_line, hint, other_ca

            if other_ca(error, identity):  # one line: the certificates, not the TLS library's words
                print(f"{name}: NOT SERVING ({another_ca_line(args.target)})")
                return 1
            detail = f"unreachable: {error.details()}"
            fix = hint(error, args.target, identity, service="")  # TLS on one side only: say so
        elif code == grpc.StatusCode.NOT_FOUND:
            detail = "unknown service"
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            detail = "the server has no gRPC health service"
        else:
            detail = f"{code.name}: {error.details()}"
        print(f"{name}: NOT SERVING ({detail})" + (f"\n{fix}" if fix else ""))
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{name}: {status}")
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
