"""How a server process starts, the same for the node and the controller.

Its arguments are parsed (a usage error is one line naming the program, exit 2);
the cluster file is read with `--app` over its [app], and what the server needs
before anything runs is loaded (a bad cluster file, certificate or app: one
line, exit 2, nothing started); then its async main runs on the chosen event
loop (`runtime.run_service`: 1 when it cannot bind).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable

from snapmesh.app import AppError
from snapmesh.serving.runtime import run_service
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.settings.argparsing import parse_args

# What a server is handed once loaded: its name in the log lines, and its async main.
Prepared = tuple[str, Callable[[], Awaitable[int]]]


class OneLineParser(argparse.ArgumentParser):
    """argparse's exit 2 on a usage error, in one line naming the program."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: {message}\n")


def server_main(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    prepare: Callable[[argparse.Namespace, cluster_config.ClusterConfig], Prepared],
) -> int:
    """Parse `argv`, read the cluster file (`--config`, `--app`), `prepare` the
    server (it raises ConfigError, SecurityError or AppError for what it refuses),
    then run it."""
    args = parse_args(parser, argv)
    if isinstance(args, int):
        return args
    try:
        cfg = cluster_config.with_app(cluster_config.load(args.config), args.app)
        name, body = prepare(args, cfg)
    except (cluster_config.ConfigError, security.SecurityError, AppError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    return run_service(name, body)
