"""`snapmesh chaos`: a seeded fault campaign on a real cluster, then the checks and the table.

Local processes by default; the Docker compose stack of deploy/compose with `--compose`;
one host (network namespace) per process, and network faults, with `--hosts`.

Exit 0: every check passed; 1: a check failed (the seed and the command that
replays the schedule are printed), or SIGINT/SIGTERM stopped the run before the
checks (the cluster is stopped and, with `--hosts`, its network removed first);
2: bad arguments or no cluster could start.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

# Before gRPC loads. The campaign forks node processes while its own gRPC
# threads run; gRPC's fork handlers then run in a child that has not exec'd yet,
# and the longest run saw such a restart die of SIGSEGV (exit -11) before
# serving. The children never use the parent's gRPC, so the handlers are off.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from snapmesh.settings import topologies  # noqa: E402
from snapmesh.settings.argparsing import parse_args  # noqa: E402
from snapmesh.chaos import checks as verdicts  # noqa: E402
from snapmesh.chaos.appchecks import app_checks  # noqa: E402
from snapmesh.chaos.campaign import Campaign, Options  # noqa: E402
from snapmesh.chaos import compose  # noqa: E402
from snapmesh.chaos.local import LocalBackend  # noqa: E402
from snapmesh.processes.supervisor import SupervisorError  # noqa: E402


STACK_NODES = 4  # deploy/compose as committed


class _Stopped(BaseException):  # not an Exception: no `except Exception` in the campaign swallows it
    """SIGINT or SIGTERM: the campaign unwinds through its teardown (nothing left behind)."""


def _stop(signum, frame) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the teardown runs to its end, whatever comes next
        signal.signal(sig, signal.SIG_IGN)
    raise _Stopped(signal.Signals(signum).name)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _topology_problem(args) -> str:
    """Why --topology cannot run ("" when it can), in one line."""
    if args.compose or args.hosts:
        return f"--topology with --{'compose' if args.compose else 'hosts'}: that cluster's file sets its channels; " \
            "--topology is for local processes"
    try:
        topologies.check(args.topology, args.nodes or STACK_NODES)
    except topologies.ShapeError as exc:
        return f"--topology: {exc}"
    return ""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="snapmesh chaos", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, metavar="N", help="draws the fault schedule (default: a random one, printed)")
    p.add_argument("--duration", type=_positive, default=120.0, metavar="S", help="seconds of faults (default 120)")
    p.add_argument("--nodes", type=int, choices=range(2, 10), metavar="N",
                   help="nodes (default 4; with --compose the stack's, deploy/compose/generate.py sets it)")
    p.add_argument("--compose", action="store_true",
                   help="the Docker compose stack of deploy/compose instead of local processes")
    p.add_argument("--hosts", action="store_true",
                   help="one host per process (the multi-host bench, root) and network faults in the schedule")
    p.add_argument("--app", metavar="NAME|module:attr", help="every node runs this app and the load is its "
                   "workload (a built-in such as kvshard, or module:attr; with --compose, in the image "
                   "$SNAPMESH_IMAGE; default: $SNAPMESH_APP, else the bank)")
    p.add_argument("--mode", choices=("classic", "overtake", "hybrid"),
                   help="every node's snapshot_mode (local processes only; default: the cluster file's, classic)")
    p.add_argument("--topology", metavar="NAME",
                   help="the cluster's channels: mesh, ring or random-regular:K, drawn from --seed (local processes "
                        "only; default: mesh)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figures and the checks as JSON (default: none)")
    p.add_argument("--data-dir", "--dir", dest="data_dir", type=Path, metavar="DIR",
                   help="where the run's cluster file, logs and snapshots go (default: a temporary dir, "
                        "kept when a check fails); --dir is its old name")
    p.add_argument("--no-reconcile", action="store_true", help="skip the Spark reconciliation (faster)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse_args(parser(), argv)
    if isinstance(args, int):
        return args
    if args.compose and args.nodes is not None and args.nodes != STACK_NODES:
        print(f"snapmesh chaos: --nodes {args.nodes} with --compose: the compose stack has {STACK_NODES} nodes "
              "(`python3 deploy/compose/generate.py --nodes N` writes another)", file=sys.stderr)
        return 2
    if args.hosts and args.compose:
        print("snapmesh chaos: --hosts and --compose: one cluster at a time", file=sys.stderr)
        return 2
    if args.mode and (args.compose or args.hosts):
        print(f"snapmesh chaos: --mode with --{'compose' if args.compose else 'hosts'}: that cluster's file sets "
              "its mode; --mode is for local processes", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    if args.topology and (problem := _topology_problem(args)):
        print(f"snapmesh chaos: {problem}", file=sys.stderr)
        return 2
    if not args.app and os.environ.get("SNAPMESH_APP", "").strip() not in ("", "bank"):
        args.app = os.environ["SNAPMESH_APP"]  # the app a deployment is given: the campaign runs and drives it
    if args.app:
        from snapmesh.app import AppError, preflight
        from snapmesh.protocol.topology import Topology
        from snapmesh.settings.appsettings import PARAMS_ENV, env_params
        from snapmesh.services.app.drive import node_infos

        ids = [f"p{i}" for i in range(1, (args.nodes or STACK_NODES) + 1)]
        channels = topologies.channels(args.topology or topologies.MESH, ids, seed) or Topology.build(ids).channels
        try:  # the nodes of the campaign's topology, tried before anything starts (as `cluster up` does),
            # with the params every node would be given ($SNAPMESH_APP_PARAMS, which they inherit)
            params = env_params(os.environ, lambda problem: AppError(f"${PARAMS_ENV}: {problem}")) or {}
            app = preflight(args.app, node_infos(ids, channels, params))
        except AppError as exc:
            print(f"snapmesh chaos: {exc}", file=sys.stderr)
            return 2
        if app.workload is None:
            print(f"snapmesh chaos: --app {args.app}: the app {app.name!r} has no workload to run", file=sys.stderr)
            return 2
    if args.hosts:
        from snapmesh.hosts.net import missing_rights

        if problem := missing_rights():
            print(f"snapmesh chaos: --hosts {problem}", file=sys.stderr)
            return 2
    if args.compose and (problem := compose.engine_problem()):
        print(f"snapmesh chaos: --compose: {problem}", file=sys.stderr)
        return 2
    nodes = STACK_NODES if args.compose or args.nodes is None else args.nodes
    cluster = "the Docker compose stack" if args.compose else "one host each" if args.hosts else "local processes"
    replay = f"snapmesh chaos --seed {seed} --duration {args.duration:g}" + (" --compose" if args.compose else
                                                                             f" --nodes {nodes}")
    if args.hosts:
        replay += " --hosts"
    if args.app:
        replay += f" --app {args.app}"
    if args.mode:
        replay += f" --mode {args.mode}"
    if args.topology:
        replay += f" --topology {args.topology}"
    if args.no_reconcile:
        replay += " --no-reconcile"
    workdir = args.data_dir or Path(tempfile.mkdtemp(prefix=f"snapmesh-chaos-{seed}-"))
    load = f", the app {args.app}'s workload" if args.app else ""
    mode = (f", {args.mode} mode" if args.mode else "") + (f", topology {args.topology}" if args.topology else "")
    print(f"snapmesh chaos: seed {seed}, {args.duration:g} s of faults, {nodes} nodes ({cluster}){load}{mode}, "
          f"in {workdir}", flush=True)
    options = Options(seed=seed, duration=args.duration, nodes=nodes, workdir=workdir, compose=args.compose,
                      hosts=args.hosts, app=args.app or "", mode=args.mode or "", topology=args.topology or "")
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        backend = compose.ComposeBackend if args.compose else LocalBackend
        if args.hosts:
            from snapmesh.chaos.hosts import HostsBackend

            backend = HostsBackend
        outcome = Campaign(options, backend, say=lambda line: print(line, flush=True)).run()
    except SupervisorError as exc:
        print(f"snapmesh chaos: the cluster failed: {exc}\nseed {seed}; replay: {replay}")
        return 2 if not workdir.exists() or not any(workdir.iterdir()) else 1
    except _Stopped as stop:
        print(f"snapmesh chaos: {stop}: stopped before the checks; the cluster is stopped and removed. "
              f"seed {seed}; replay: {replay}; the run's files: {workdir}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if outcome.app is not None:  # ok None: a check skipped, its detail says why
        results = app_checks(outcome, reconcile=not args.no_reconcile)
    else:
        results = verdicts.checks(outcome, reconcile=not args.no_reconcile)
    figures = verdicts.figures(outcome)
    print()
    for name, ok, detail in results:
        print(f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}  {name}: {detail}")
    print()
    print(verdicts.table(figures))
    if args.json:
        verdicts.write_json(args.json, figures, results, replay)
    passed = all(ok is not False for _, ok, _ in results)  # None: skipped, and said so
    if not passed:
        print(f"\nFAILED. seed {seed}; replay the fault schedule: {replay}"
              f"\nthe run's files: {workdir}")
        return 1
    if args.data_dir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
