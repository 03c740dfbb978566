"""`snapmesh cluster up|down|status`: a whole cluster as local processes on loopback.

    snapmesh cluster up [--config FILE | --nodes N [--topology NAME [--topology-seed N]]] [--data-dir DIR]
                        [--tls] [--ui HOST:PORT] [--app MODULE:ATTR]
    snapmesh cluster down|status [--data-dir DIR]
    snapmesh cluster rescale --data-dir DIR --nodes N [--snapshot ID]   (snapmesh.processes.rescaler)

The cluster lives in its data dir D, which holds the cluster file it runs,
`D/cluster.toml`; the client commands find the controller there (`--data-dir D`,
snapmesh.settings.target). With no arguments D is ./data and the cluster is the
shipped 4-node full mesh (snapmesh/configs/local-4.toml, controller on
127.0.0.1:50050), copied into D. `--nodes N` (N >= 2) writes an N-node
full-mesh config on free loopback ports into D (a new temporary directory
unless --data-dir is given); with `--topology ring` or `random-regular:K` (K
channels out of and into every node, drawn from `--topology-seed N`, default 0:
snapmesh.settings.topologies) its `channels` are those instead (exit 2 with one
line, nothing written, for an unknown name, K < 1 or K >= N, or a --topology
that differs from the channels of D's own file); `--config FILE` copies FILE into D (its data dir,
or --data-dir). A D that already holds a cluster.toml is started again from it,
on the same ports, so every address stays put across restarts; a port of it
that another process listens on is said plainly (exit 1) before anything starts.
`cluster down` and `cluster status` find the running launcher by D
(snapmesh.processes.cluster_admin), from any shell.

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
cluster file's [app] (default: the bank); $SNAPMESH_APP, which the children
would inherit, counts as --app. It is tried here first on every node, from the
working directory or PYTHONPATH (snapmesh.app.preflight, what `snapmesh node`
asks too): an app that does not load, whose `new` raises, whose machine lacks a
method or whose `snapshot()` is not bytes exits 2 with one line, before the data
dir is made, locked or written.

A data dir remembers its security and its app: D/cluster.toml gets [tls] and
[auth] (the files in D/tls/) with `--tls`, and [app] module (`bank` for the
bank). Started again with neither flag, D runs what its file says; a start that
names another (--tls on a plaintext D, an app that differs by name) is refused
with one line saying which and how to change it on purpose (exit 2). A D
written before it remembered counts D/tls/ca.pem as TLS and takes the app asked
for when its file has no [app], and both are written in.

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

from snapmesh.app import AppError
from snapmesh.protocol.topology import Topology
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security, topologies
from snapmesh.settings.appsettings import same_app
from snapmesh.settings.argparsing import parse_args, positive_float
from snapmesh.settings.config import ConfigError, TlsSettings, write_cluster
from snapmesh.serving.datalock import CONTROLLER, DataDirLocked, acquire_all, release_all
from snapmesh.processes.foreground import serve_until_stopped
from snapmesh.settings.appsettings import app_words
from snapmesh.settings.ports import NoFreePorts, port_is_free
from snapmesh.settings.target import CLUSTER_FILE
from snapmesh.processes import rescaler
from snapmesh.processes.cluster_admin import hold_launcher
from snapmesh.processes.supervisor import Cluster, SupervisorError


TLS_DIR = "tls"  # `--tls`: the certificates and the token, in the data dir
BANK = "bank"  # [app] module of a bank cluster: written out, so that its data dir remembers it


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh cluster: {message}\n")


class _StopRequested(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh cluster", description="Run a local cluster on loopback.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                     help="up, down, status or rescale; `snapmesh cluster COMMAND --help` for its flags")
    up = commands.add_parser("up", help="start the controller and every node; Ctrl-C stops them")
    source = up.add_mutually_exclusive_group()
    source.add_argument("--config", metavar="FILE", help="cluster file (default: the shipped 4-node mesh)")
    source.add_argument("--nodes", type=int, metavar="N",
                        help="an N-node full mesh (N >= 2) on free loopback ports (default: the shipped 4-node mesh)")
    up.add_argument("--topology", metavar="NAME",
                    help="with --nodes: the channels written into the cluster file: mesh (default), ring, or "
                    "random-regular:K (every node K channels out and K in, 1 <= K < N; docs/cluster-file.md)")
    up.add_argument("--topology-seed", type=int, metavar="N",
                    help="with --topology random-regular:K: the seed N that draws the graph (default 0)")
    up.add_argument("--data-dir", metavar="DIR",
                    help="where cluster.toml, logs and snapshots go; a D holding a cluster.toml starts that "
                    "cluster again on its ports (default: ./data; with --nodes: a new temporary dir)")
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS and a control-plane token, dev certificates made into <data_dir>/tls/; "
                    "a data dir remembers it")
    up.add_argument("--hosts", action="store_true",
                    help="one host per process: each in its own network namespace (root; see docs/hosts.md)")
    up.add_argument("--ui", default="127.0.0.1:8080", metavar="HOST:PORT",
                    help="serve the snapshot page here (default 127.0.0.1:8080; off: no page)")
    up.add_argument("--app", metavar="MODULE:ATTR",
                    help="the app every node runs (snapmesh.app), imported from the working directory or "
                    "PYTHONPATH; default: $SNAPMESH_APP, else the cluster file's [app], else the bank; a data dir "
                    "remembers it")
    up.add_argument("--mode", choices=cluster_config.SNAPSHOT_MODES, metavar="MODE",
                    help="snapshot_mode written into the cluster file: classic, overtake or hybrid "
                    "(default: the file's, else classic; docs/modes.md)")
    up.add_argument("--align-timeout-ms", type=_non_negative_ms, metavar="T",
                    help="hybrid mode: ms a marker keeps its FIFO place before it overtakes (default: the file's, "
                    f"else {cluster_config.ALIGN_TIMEOUT_MS:g}; only with --mode hybrid)")
    for name, help_ in (("down", "stop the cluster `cluster up` runs on a data dir (from any shell)"),
                        ("status", "whether the cluster of a data dir runs: its launcher and each process's health")):
        sub = commands.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        sub.add_argument("--data-dir", metavar="DIR", help="the cluster's data dir (default: ./data, or "
                         "$SNAPMESH_DATA_DIR: where `snapmesh cluster up` with no arguments runs)")
        sub.add_argument("--timeout", type=positive_float, default=30.0, metavar="S",
                         help="down: wait S seconds for the stop; status: give each health check S seconds (default: 30)")
    rescaler.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.command in ("down", "status", "rescale"):
        from snapmesh.processes import cluster_admin

        return rescaler.main(args, up=main) if args.command == "rescale" else cluster_admin.main(args)
    if args.nodes is not None and args.nodes < 2:
        print(f"snapmesh cluster: --nodes must be at least 2 (a snapshot needs a channel), got {args.nodes}",
              file=sys.stderr)
        return 2
    problem = _topology_problem(args)
    if problem:
        print(f"snapmesh cluster: {problem}", file=sys.stderr)
        return 2
    if args.ui != "off":
        from snapmesh.ui.server import parse_listen

        try:
            parse_listen(args.ui)
        except ValueError as exc:
            print(f"snapmesh cluster: --ui: {exc}", file=sys.stderr)
            return 2

    if args.align_timeout_ms is not None and args.mode != "hybrid":
        print(f"snapmesh cluster: --align-timeout-ms applies to --mode hybrid only, not to "
              f"{'--mode ' + args.mode if args.mode else 'the cluster file mode'}", file=sys.stderr)
        return 2
    if args.app is not None:
        problem = app_problem(args.app)
        if problem:
            print(f"snapmesh cluster: {problem}", file=sys.stderr)
            return 2

    if args.hosts:
        from snapmesh.hosts.launch import up as up_on_hosts

        if args.mode or args.align_timeout_ms is not None or args.topology:  # it writes its own cluster file
            print("snapmesh cluster: --mode, --align-timeout-ms and --topology do not apply with --hosts yet",
                  file=sys.stderr)
            return 2

        return up_on_hosts(args)

    def request_stop(signum, frame) -> None:
        raise _StopRequested(signal.Signals(signum).name)

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster: Cluster | None = None
    running = None
    try:
        data_dir, source = _data_dir_and_source(args)
        asked = _asked_app(args)
        locks = None
        if source is None:  # D's own cluster: a live one is said first (D exists: only its lock files are new)
            existing = cluster_config.load(data_dir / CLUSTER_FILE, env={})
            node_ids = [n.id for n in existing.nodes]
            locks = _lock(data_dir, node_ids)
        try:
            if source is None:  # with the security and the app it remembers
                app = _remembered_app(existing, asked)
                tls = _remembered_tls(existing, args.tls)
                channels, params = existing.topology.channels, existing.app.params
            elif isinstance(source, int):
                node_ids = [f"p{i}" for i in range(1, source + 1)]
                channels, params = _channels(args, node_ids) or Topology.build(node_ids).channels, {}
                app, tls = asked[0] if asked else BANK, args.tls
            else:
                given = cluster_config.load(source, env={})  # the file's own [app]: $SNAPMESH_APP is `asked`
                node_ids = [n.id for n in given.nodes]
                channels, params = given.topology.channels, given.app.params
                app, tls = asked[0] if asked else given.app.module or BANK, args.tls
            _preflight(app or BANK, node_ids, channels, params)  # the bank too: it is an app like any other
            if data_dir is None:  # made only now: a refusal above leaves nothing behind
                data_dir = Path(tempfile.mkdtemp(prefix="snapmesh-"))
            config_path = data_dir / CLUSTER_FILE
            tls_dir = data_dir / TLS_DIR if tls else None
            if locks is None:  # every lock of the cluster about to start, before a byte is written in D
                locks = _lock(data_dir, node_ids)
            if source is None and args.nodes is not None and args.nodes != len(node_ids):
                raise ConfigError(f"data dir {data_dir} holds a {len(node_ids)}-node cluster ({config_path}); give "
                                  f"--nodes {len(node_ids)}, or rescale it: snapmesh cluster rescale --data-dir "
                                  f"{data_dir} --nodes {args.nodes}")
            if source is None and args.topology is not None:
                _same_topology(existing, args, config_path)
            mode = _mode_keys(args)
            if isinstance(source, int):
                write_cluster(config_path, nodes=node_ids, data_dir=data_dir, settings=mode, topology=channels)
                _remember(config_path, app, tls, f"Written by snapmesh cluster up{_topology_words(args)}")
            elif source is not None:
                cluster_config.write(config_path, _remembering({**runnable_copy(source, data_dir), **mode}, app, tls),
                                     comment=f"Written by snapmesh cluster up from {source}")
            else:
                if mode:
                    _same_mode(existing, mode, config_path)
                if (tls and existing.tls is None) or app != existing.app.module:  # from before its file remembered
                    _remember(config_path, app, tls, f"Written by snapmesh cluster up from {config_path}")
            if args.config is None:  # D's own ports, or the shipped ones: say plainly when one is taken
                taken_ports(cluster_config.load(config_path, env={}))
            if tls_dir is not None and not (tls_dir / cluster_config.CA_FILE).is_file():
                try:  # a restart keeps its certificates: the clients' copies stay good
                    security.write_certs(cluster_config.load(config_path, env={}), tls_dir)
                except OSError as exc:
                    raise ConfigError(f"cannot write certificates into {tls_dir}: {exc}") from None
            running = hold_launcher(data_dir)  # `cluster down/status --data-dir D` find this process by it
        finally:
            if locks is not None:
                release_all(locks)  # the children take them again, each its own
        cluster = Cluster(config_path, data_dir=data_dir, tls_dir=tls_dir)
        print(f"snapmesh cluster: starting {len(cluster.config.nodes)} nodes of app {app_words(cluster.config.app.module)} "
              f"in data dir {data_dir} (clients: "
              f"--data-dir {data_dir}; `snapmesh cluster down --data-dir {data_dir}` stops them); logs in "
              f"{cluster.log_dir}", file=sys.stderr, flush=True)
        cluster.start()
        serve_until_stopped(cluster, cluster.config, tls_dir, args.ui)
    except (ConfigError, DataDirLocked, AppError) as exc:
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
        if running is not None:
            running.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _data_dir_and_source(args) -> tuple[Path | None, Path | int | None]:
    """The data dir D (None: a new temporary one, made once the start is sure), and what to write into
    D/cluster.toml before the start: None (D's own file, as it is: its ports stay), an int N (an N-node
    mesh on free ports) or a cluster file (copied, with D as its data dir)."""
    env = dict(os.environ)
    if args.data_dir is not None:
        env["SNAPMESH_DATA_DIR"] = str(Path(args.data_dir).resolve())
    if args.config is not None:
        source = Path(args.config).resolve()
        data_dir = cluster_config.load(source, env=env).data_dir
        return data_dir, None if (data_dir / CLUSTER_FILE).resolve() == source else source
    if args.nodes is not None:
        if not args.data_dir:
            return None, args.nodes
        data_dir = Path(args.data_dir).resolve()
    else:
        data_dir = cluster_config.load(cluster_config.DEFAULT_CONFIG, env=env).data_dir
    if (data_dir / CLUSTER_FILE).is_file():
        return data_dir, None
    return data_dir, args.nodes if args.nodes is not None else cluster_config.DEFAULT_CONFIG


def _lock(data_dir: Path, node_ids: list[str]) -> list:
    """Every data-dir lock of the cluster (snapmesh.serving.datalock): a second `cluster
    up` on a live data dir is refused before it changes anything there."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        return acquire_all(data_dir, [CONTROLLER, *node_ids])
    except OSError as exc:
        raise ConfigError(f"cannot lock data dir {data_dir}: {exc}") from None


def _asked_app(args) -> tuple[str, str] | None:
    """The app this start names, and how (`--app X`, else $SNAPMESH_APP, which the
    children would inherit anyway); None when it names none."""
    if args.app:
        return args.app, "--app"
    if os.environ.get("SNAPMESH_APP"):
        return os.environ["SNAPMESH_APP"], "$SNAPMESH_APP"
    return None


def _remembered_app(existing: cluster_config.ClusterConfig, asked: tuple[str, str] | None) -> str:
    """The app D's file remembers; an app asked for that differs is refused, not run:
    the nodes' logs replay through their own app only. A file without [app] was
    written before data dirs remembered their app: the one asked for (if any) is
    taken, as it was then, and remembered from now on."""
    have = existing.app.module
    if not have:
        return asked[0] if asked else ""
    if asked is None or same_app(asked[0], have):
        return have
    spec, how = asked
    runs = "the bank" if cluster_config.runs_bank(existing.app) else f"the app {have}"
    raise ConfigError(f"data dir {existing.path.parent} runs {runs} ([app] in {existing.path}), not {how} {spec}: "
                      f"its logs replay through that app only; start it without {how}, or give another "
                      f"--data-dir for {spec}")


def _remembered_tls(existing: cluster_config.ClusterConfig, asked: bool) -> bool:
    """Whether D runs with the certificates `cluster up --tls` made in D/tls/: its file
    says so, or (a data dir from before the file said so) D/tls/ca.pem is there. A
    plaintext D is never turned to TLS by a flag on a restart, nor TLS to plaintext."""
    data_dir = existing.path.parent
    made_here = TlsSettings.in_dir(data_dir / TLS_DIR)
    if existing.tls is not None:
        return existing.tls == made_here  # else the file's own certificates (Cluster reads them)
    if (data_dir / TLS_DIR / cluster_config.CA_FILE).is_file():
        return True
    if asked:
        raise ConfigError(f"data dir {data_dir} runs in plaintext (no [tls] in {existing.path}), not --tls: start "
                          f"it without --tls, or turn TLS on for it deliberately: `snapmesh certs --config "
                          f"{existing.path} --tls-dir {data_dir / TLS_DIR}`, then `snapmesh cluster up --data-dir "
                          f"{data_dir}`")
    return False


def _remembering(document: dict, app: str, tls: bool) -> dict:
    """The cluster document with the app and the security of this start written in, so
    that a restart of its data dir runs them again without being told."""
    if app:
        document["app"] = {**document.get("app", {}), "module": app}
    if tls:  # relative to the file, so the data dir can move
        document["tls"] = {"ca": f"{TLS_DIR}/{cluster_config.CA_FILE}", "cert": f"{TLS_DIR}/{{name}}.pem",
                           "key": f"{TLS_DIR}/{{name}}-key.pem",
                           "client_cert": f"{TLS_DIR}/{cluster_config.CLIENT_NAME}.pem",
                           "client_key": f"{TLS_DIR}/{cluster_config.CLIENT_NAME}-key.pem"}
        document["auth"] = {**document.get("auth", {}), "token_file": f"{TLS_DIR}/{cluster_config.TOKEN_FILE}"}
    return document


def _remember(path: Path, app: str, tls: bool, comment: str) -> None:
    import tomllib

    document = tomllib.loads(path.read_text(encoding="utf-8"))
    cluster_config.write(path, _remembering(document, app, tls), comment=comment)


def _preflight(app: str, node_ids: list[str], channels, params) -> None:
    """The app tried on every node of the cluster about to start (snapmesh.app.preflight):
    a fault is one line and exit 2 before any process starts or a file is written."""
    from snapmesh.app import preflight
    from snapmesh.services.app.drive import node_infos

    preflight(app, node_infos(node_ids, channels, params))


def _topology_problem(args) -> str:
    """Why --topology / --topology-seed cannot apply ("" when they can), in one line."""
    if args.topology is None and args.topology_seed is None:
        return ""
    if args.nodes is None:
        return "--topology and --topology-seed apply with --nodes N (a cluster file keeps its own channels)"
    try:
        topologies.check(args.topology or topologies.MESH, args.nodes)
    except topologies.ShapeError as exc:
        return f"--topology: {exc}"
    return ""


def _channels(args, node_ids: list[str]) -> list[tuple[str, str]] | None:
    """The channels --topology names on `node_ids` (None: the mesh)."""
    return topologies.channels(args.topology or topologies.MESH, node_ids, args.topology_seed or 0)


def _topology_words(args) -> str:
    """How the file's channels were asked for, for its first comment line."""
    if args.topology is None:
        return ""
    seed = f" --topology-seed {args.topology_seed or 0}" if args.topology.startswith(topologies.RANDOM_REGULAR) else ""
    return f" --nodes {args.nodes} --topology {args.topology}{seed}"


def _same_topology(existing, args, path: Path) -> None:
    """A data dir started again keeps its channels: a --topology that names others is refused."""
    node_ids = [n.id for n in existing.nodes]
    if set(_channels(args, node_ids) or Topology.build(node_ids).channels) != set(existing.topology.channels):
        raise ConfigError(f"data dir {path.parent} holds a cluster with other channels ({path}); "
                          f"give another --data-dir for --topology {args.topology}")


def _non_negative_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if 0 <= value < float("inf"):
        return value
    raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")


def _mode_keys(args: argparse.Namespace) -> dict:
    """The cluster file's keys --mode and --align-timeout-ms set (none when not given)."""
    keys: dict = {"snapshot_mode": args.mode} if args.mode else {}
    if args.align_timeout_ms is not None:
        keys["align_timeout_ms"] = args.align_timeout_ms
    return keys


def _same_mode(existing, keys: dict, path: Path) -> None:
    """A data dir started again keeps its file: a --mode that differs is refused, not applied."""
    have = {"snapshot_mode": existing.snapshot_mode, "align_timeout_ms": existing.align_timeout_ms}
    for key, value in keys.items():
        if have[key] != value:
            raise ConfigError(f"data dir {path.parent} holds a cluster with {key} = {have[key]!r} ({path}); "
                              f"give another --data-dir for {key} = {value!r}")


def runnable_copy(source: Path, data_dir: Path) -> dict:
    """The document of cluster file `source` with `data_dir` as its data dir and its
    certificate paths made absolute, so that the copy runs from inside the data dir."""
    import tomllib

    document = tomllib.loads(source.read_text(encoding="utf-8"))
    document["data_dir"] = str(data_dir)
    base = source.parent
    for section, keys in (("tls", ("ca", "cert", "key", "client_cert", "client_key")), ("auth", ("token_file",))):
        table = document.get(section)
        for key in keys if isinstance(table, dict) else ():
            if isinstance(table.get(key), str) and not Path(table[key]).is_absolute():
                table[key] = str(base / table[key])
    return document


def taken_ports(cfg: cluster_config.ClusterConfig) -> None:
    """SupervisorError naming the first port of the cluster file that something else listens on."""
    endpoints = [("the controller", cfg.controller), *((f"node {n.id}", n) for n in cfg.nodes)]
    for owner, endpoint in endpoints:
        listen = getattr(endpoint, "listen_port", None) or endpoint.port
        for kind, port in (("gRPC", listen), ("metrics", endpoint.metrics_port)):
            host = cfg.bind_host or endpoint.host
            if not port_is_free(host, port):
                raise SupervisorError(f"{host}:{port}, the {kind} port of {owner} in {cfg.path}, is taken by "
                                      "another process: stop that process, or edit the port in the file")


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
