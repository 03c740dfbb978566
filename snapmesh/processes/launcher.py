"""`snapmesh cluster up`: a whole cluster as local processes on loopback.

    snapmesh cluster up [--config FILE] [--nodes N] [--data-dir DIR] [--tls] [--app MODULE:ATTR]

With no arguments it runs the shipped 4-node full mesh (snapmesh/configs/local-4.toml).
`--nodes N` writes an N-node full-mesh config on free loopback ports into the data
dir (a new temporary directory unless --data-dir is given) and runs that.
It starts the controller and every node through the supervisor
(`snapmesh.processes.supervisor.Cluster`), which waits until each one answers SERVING on
gRPC health; prints the line `controller: HOST:PORT` on stdout first, then
(after the `grpcurl:` line of a TLS cluster) one line per process with its
addresses, `controller metrics: http://HOST:PORT/metrics` and
`node ID: HOST:PORT metrics: http://HOST:PORT/metrics`, then the page's `ui:` line
(below); and on
SIGINT/SIGTERM stops them all (SIGTERM, then SIGKILL after a grace period).
Children's output goes to `<data_dir>/logs/<name>.log`; they die with the
launcher even when it is SIGKILLed (see the supervisor).
`--tls` makes dev certificates and a token into `<data_dir>/tls/` (`ca.pem`,
`client.pem`, `client-key.pem`, `token`, one certificate per process), runs
every connection over mutual TLS with the token on the control plane, and
prints a second line `grpcurl: ...` with the command to trigger a snapshot.
It also serves the snapshot page (`snapmesh ui`, read-only) on `--ui HOST:PORT`
(default 127.0.0.1:8080, a free loopback port when that one is taken; `--ui off`:
none) and prints its URL last: `ui: http://HOST:PORT/`.
`--app module:attr` runs that app (snapmesh.app) on every node in place of the
cluster file's [app] (default: the bank); the children get it as SNAPMESH_APP.
It is imported here first, from the working directory or PYTHONPATH: an app that
does not load exits 2 with one line, before anything starts.

Before it writes anything into the data dir (cluster.toml, certificates, logs) it
takes the controller's and every node's data-dir lock (snapmesh.serving.datalock), so
`cluster up` on a live cluster's data dir exits 2 naming the dir and the holder's
pid, and changes nothing there. It prints `controller:` only once every child it
started answers SERVING itself (its per-run instance id: snapmesh.processes.supervisor); a
child that exits first fails the start with its log's last lines, and the others
are stopped.

Exit status: 0 after a clean stop, 1 when the cluster cannot start, 2 for bad
arguments, a malformed cluster file (the message names the field) or a data dir
in use.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.settings.argparsing import parse_args
from snapmesh.settings.config import ConfigError, write_cluster
from snapmesh.serving.datalock import CONTROLLER, DataDirLocked, acquire_all, release_all
from snapmesh.processes.foreground import serve_until_stopped
from snapmesh.settings.ports import NoFreePorts
from snapmesh.processes.supervisor import Cluster, SupervisorError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh cluster: {message}\n")


class _StopRequested(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh cluster", description="Run a local cluster on loopback.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    up = commands.add_parser("up", help="start the controller and every node; Ctrl-C stops them")
    source = up.add_mutually_exclusive_group()
    source.add_argument("--config", metavar="FILE", help="cluster file (default: the shipped 4-node mesh)")
    source.add_argument("--nodes", type=int, metavar="N", help="an N-node full mesh on free loopback ports")
    up.add_argument("--data-dir", metavar="DIR", help="where logs, snapshots and node logs go")
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS and a control-plane token, dev certificates made into <data_dir>/tls/")
    up.add_argument("--hosts", action="store_true",
                    help="one host per process: each in its own network namespace (root; see docs/hosts.md)")
    up.add_argument("--ui", default="127.0.0.1:8080", metavar="HOST:PORT",
                    help="serve the snapshot page here (default 127.0.0.1:8080; off: no page)")
    up.add_argument("--app", metavar="MODULE:ATTR",
                    help="the app every node runs (snapmesh.app), imported from the working directory or "
                    "PYTHONPATH; default: the cluster file's [app], else the bank")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.nodes is not None and args.nodes < 1:
        print(f"snapmesh cluster: --nodes must be at least 1, got {args.nodes}", file=sys.stderr)
        return 2
    if args.ui != "off":
        from snapmesh.ui.server import parse_listen

        try:
            parse_listen(args.ui)
        except ValueError as exc:
            print(f"snapmesh cluster: --ui: {exc}", file=sys.stderr)
            return 2

    if args.app is not None:
        problem = app_problem(args.app)
        if problem:
            print(f"snapmesh cluster: {problem}", file=sys.stderr)
            return 2

    if args.hosts:
        from snapmesh.hosts.launch import up as up_on_hosts

        return up_on_hosts(args)

    def request_stop(signum, frame) -> None:
        raise _StopRequested(signal.Signals(signum).name)

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster: Cluster | None = None
    try:
        env = dict(os.environ)
        if args.nodes is not None:
            data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="snapmesh-"))
            config_path = data_dir / "cluster.toml"
            config_dir = None
            node_ids = [f"p{i}" for i in range(1, args.nodes + 1)]
        else:
            config_path = Path(args.config or cluster_config.DEFAULT_CONFIG)
            config_dir = args.data_dir
            if config_dir is not None:
                env["SNAPMESH_DATA_DIR"] = str(Path(config_dir).resolve())
            plain = cluster_config.load(config_path, env=env)
            data_dir, node_ids = plain.data_dir, [n.id for n in plain.nodes]
        tls_dir = data_dir.resolve() / "tls" if args.tls else None
        # Every lock of the cluster about to start, before anything is written in its
        # data dir: a second `cluster up` on a live one changes nothing there.
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            locks = acquire_all(data_dir, [CONTROLLER, *node_ids])
        except OSError as exc:
            raise ConfigError(f"cannot lock data dir {data_dir}: {exc}") from None
        try:
            if args.nodes is not None:
                write_cluster(config_path, nodes=node_ids, data_dir=data_dir)
            if tls_dir is not None:
                try:
                    security.write_certs(cluster_config.load(config_path, env=env), tls_dir)
                except OSError as exc:
                    raise ConfigError(f"cannot write certificates into {tls_dir}: {exc}") from None
        finally:
            release_all(locks)  # the children take them again, each its own
        cluster = Cluster(config_path, data_dir=config_dir, tls_dir=tls_dir, app=args.app)
        if args.app is None and not cluster_config.runs_bank(cluster.config.app):  # the file's [app]
            problem = app_problem(cluster.config.app.module)
            if problem:
                raise ConfigError(f"{cluster.config_path}: [app]: {problem}")
        print(f"snapmesh cluster: starting {len(cluster.config.nodes)} nodes; logs in {cluster.log_dir}",
              file=sys.stderr, flush=True)
        cluster.start()
        serve_until_stopped(cluster, cluster.config, tls_dir, args.ui)
    except (ConfigError, DataDirLocked) as exc:
        print(f"snapmesh cluster: {exc}", file=sys.stderr)
        return 2
    except (SupervisorError, NoFreePorts) as exc:
        print(f"snapmesh cluster: cannot start: {exc}", file=sys.stderr)
        return 1
    except _StopRequested as stop:
        print(f"snapmesh cluster: {stop}: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def app_problem(spec: str) -> str:
    """Why `--app spec` cannot run ("" when it loads), in one line."""
    from snapmesh.app import AppError, load_app

    try:
        cluster_config.check_app_spec(spec, lambda problem: ConfigError(f"--app: {problem}"))
        load_app(spec)
    except (ConfigError, AppError) as exc:
        return str(exc)
    return ""


if __name__ == "__main__":
    sys.exit(main())
