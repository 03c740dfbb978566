"""A new node's log of an init and a stop, so it starts fenced until a rescale's restore.

    python -m snapmesh.processes.fencelog --config FILE --id NODE --snapshot ID

A node added by a rescale has no log. Started on an empty data dir it would take
commands at once, which the restore that follows then replaces: acknowledged
writes lost. With a log of an init and a `stop` for the snapshot being restored,
it starts fenced (fence.py F4: health, Fence and RestoreState only), as the kept
nodes do on their stopped logs, until the restore gives it its state. A node
that has a log keeps it, untouched (a restarted pod, a node added again): the
command is safe to run before every start. `snapmesh cluster rescale` does this
for a local cluster; the Helm chart's node pods run it as an init container
while `rescale.snapshot` is set. Exit 0 (written, or a log already there), 2 on
bad input (one line: a cluster file that does not load, a node it does not name,
an app that does not load).
"""

from __future__ import annotations

import argparse
import os
import sys

from snapmesh.app import App, AppError, load_app
from snapmesh.protocol import wal
from snapmesh.settings import config as cluster_config
from snapmesh.settings.argparsing import parse_args

PROG = "snapmesh fencelog"


def write(cfg: cluster_config.ClusterConfig, nodes: list[str], app: App, snapshot_id: str) -> list[str]:
    """Each of `nodes`' fenced log, where it has none; the nodes written."""
    written = []
    for node in nodes:
        path = cfg.log_path(node)
        if path.exists() or any(path.parent.glob(f"{node}.log.*")):
            continue
        lines = [wal.encode(wal.Init(lsn=1, app=app.name, version=app.version), node),
                 wal.encode(wal.Stop(lsn=2, snapshot_id=snapshot_id), node)]
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:
            out.write("".join(lines))
            out.flush()
            os.fsync(out.fileno())
        written.append(node)
    return written


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Give a node added by a rescale a fenced log "
                                     "(an init and a stop for the snapshot), unless it has a log.")
    parser.add_argument("--config", required=True, metavar="FILE", help="the cluster file (no default)")
    parser.add_argument("--id", required=True, metavar="NODE", help="the node's id (no default)")
    parser.add_argument("--snapshot", required=True, metavar="ID", help="the snapshot being restored (no default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        cfg = cluster_config.load(args.config)
        if args.id not in cfg.topology.nodes:
            raise cluster_config.ConfigError(f"{args.config} names no node {args.id!r}")
        app = load_app(cfg.app.module)
    except (cluster_config.ConfigError, AppError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    done = write(cfg, [args.id], app, args.snapshot)
    print(f"{PROG}: {args.id}: " + (f"fenced for {args.snapshot}" if done else "has a log: kept"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
