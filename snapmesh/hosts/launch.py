"""`snapmesh cluster up --hosts`: the cluster with one host (network namespace) per process.

Everything else as `snapmesh cluster up`: the `controller:` line (the
controller's address on its host, which this machine reaches), `--tls` (and
its `grpcurl:` line), then a line per process with its gRPC and metrics
addresses (its host's), then the snapshot page's `ui:` line (`--ui`, `off`:
none); `--nodes` (default 4), `--data-dir` (default: a new temporary dir; a
live cluster's data dir exits 2 and changes nothing there, as without
`--hosts`); it holds `D/cluster.pid` as `cluster up` does, so `cluster down
--data-dir D` stops it; Ctrl-C or SIGTERM stops every process and removes the network.
Exit 2, with one line naming it, when the machine lacks the rights.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from snapmesh.settings.config import ConfigError
from snapmesh.serving.datalock import CONTROLLER, DataDirLocked, acquire_all, release_all
from snapmesh.hosts.cluster import HostsCluster
from snapmesh.hosts.net import SUBNET_PREFIX, MissingRights, NetworkError, missing_rights
from snapmesh.processes.cluster_admin import hold_launcher
from snapmesh.processes.foreground import serve_until_stopped
from snapmesh.settings.appsettings import app_words
from snapmesh.processes.supervisor import SupervisorError


# The addresses of a run's subnet, less the network's, the broadcast's, the gateway's and the controller's.
MAX_NODES = 2 ** (32 - SUBNET_PREFIX) - 4


class _StopRequested(Exception):
    pass


def up(args: argparse.Namespace) -> int:
    if args.config is not None:
        print("snapmesh cluster: --hosts writes its own cluster file (one host per process); use --nodes, "
              "not --config", file=sys.stderr)
        return 2
    if args.nodes is not None and args.nodes > MAX_NODES:
        print(f"snapmesh cluster: --hosts --nodes {args.nodes}: a run's /24 has room for {MAX_NODES} nodes "
              "and the controller", file=sys.stderr)
        return 2
    if problem := missing_rights():
        print(f"snapmesh cluster: --hosts {problem}", file=sys.stderr)
        return 2

    def request_stop(signum, frame) -> None:
        raise _StopRequested(signal.Signals(signum).name)

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    hosts: HostsCluster | None = None
    locks = []
    running = None
    try:
        work = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="snapmesh-hosts-"))
        nodes = args.nodes or 4
        # Every lock of the cluster about to start, before anything is written (cluster.toml,
        # certificates): `cluster up --hosts` on a live cluster's data dir changes nothing there.
        try:
            (work / "data").mkdir(parents=True, exist_ok=True)
            locks = acquire_all(work / "data", [CONTROLLER, *(f"p{i}" for i in range(1, nodes + 1))])
        except OSError as exc:
            raise ConfigError(f"cannot lock data dir {work / 'data'}: {exc}") from None
        # D/cluster.pid, as `cluster up` holds it: `cluster down/status --data-dir D` find this
        # process, and a second launcher on D is refused (DataDirLocked, exit 2).
        running = hold_launcher(work)
        app = getattr(args, "app", None)  # --app: the cluster file's [app] (the launcher loaded it already)
        hosts = HostsCluster(work, nodes=nodes, tls=args.tls, settings={"app": {"module": app}} if app else None)
        print(f"snapmesh cluster: starting {len(hosts.node_ids)} nodes of app {app_words(app or '')} on "
              f"hosts (run {hosts.run_id}); logs in "
              f"{work / 'data' / 'logs'}", file=sys.stderr, flush=True)
        hosts.start(before=lambda cluster: release_all(locks))  # the children take them again, each its own
        serve_until_stopped(hosts.cluster, hosts.addressed_config(), work / "tls" if args.tls else None, args.ui)
    except (ConfigError, DataDirLocked) as exc:
        print(f"snapmesh cluster: {exc}", file=sys.stderr)
        return 2
    except MissingRights as exc:
        print(f"snapmesh cluster: --hosts {exc}", file=sys.stderr)
        return 2
    except (SupervisorError, NetworkError) as exc:
        print(f"snapmesh cluster: cannot start: {exc}", file=sys.stderr)
        return 1
    except _StopRequested as stop:
        print(f"snapmesh cluster: {stop}: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        release_all(locks)
        if hosts is not None:
            if left := hosts.stop():
                print(f"snapmesh cluster: left behind: {', '.join(left)}", file=sys.stderr)
        if running is not None:  # after the children stopped: `cluster down` waits for this
            running.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
