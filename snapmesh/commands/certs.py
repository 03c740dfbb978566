"""`snapmesh certs --config FILE --tls-dir DIR`: dev certificates (snapmesh.settings.devcerts) with
`cryptography`: a CA, one certificate per node and for the controller (SANs: the
name, its host, localhost, 127.0.0.1), a client certificate and a random token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from snapmesh.settings import config as cluster_config
from snapmesh.settings.argparsing import parse_args
from snapmesh.settings.config import CA_FILE, TOKEN_FILE, ConfigError
from snapmesh.settings.security import expected_files, grpcurl_line, write_certs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh certs: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="snapmesh certs",
        description="Make dev certificates: a CA, one per node and for the controller, a client one, and a token.",
    )
    parser.add_argument("--config", metavar="FILE", help="cluster file (default: the shipped 4-node config)")
    parser.add_argument("--tls-dir", "--out", dest="out", required=True, metavar="DIR",
                        help="where the files go (created if missing): the --tls-dir of the clients; "
                        "--out is its old name")
    parser.add_argument("--keep", action="store_true",
                        help="do nothing when DIR already holds every file (for deploy scripts run on each start)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        cfg = cluster_config.load(args.config)
    except ConfigError as exc:
        print(f"snapmesh certs: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    if args.keep and all(path.is_file() for path in expected_files(cfg, out)):
        print(f"snapmesh certs: {out} already holds every file; kept")
        return 0
    try:
        written = write_certs(cfg, args.out)
    except OSError as exc:
        print(f"snapmesh certs: cannot write into {args.out}: {exc}", file=sys.stderr)
        return 2
    print(f"snapmesh certs: wrote {len(written)} files into {out}")
    print("\nFor the cluster file (or set SNAPMESH_TLS_DIR=" + str(out) + "):\n")
    print(f'[tls]\nca = "{out / CA_FILE}"\ncert = "{out}/{{name}}.pem"\nkey = "{out}/{{name}}-key.pem"')
    print(f'client_cert = "{out / "client.pem"}"\nclient_key = "{out / "client-key.pem"}"\n')
    print(f'[auth]\ntoken_file = "{out / TOKEN_FILE}"\n')
    print("grpcurl: " + grpcurl_line(cfg.controller.address, out, out / TOKEN_FILE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
