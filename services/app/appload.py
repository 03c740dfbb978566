"""`snapmesh app --app X`: an app's workload against a running cluster, with snapshots.

The controller is found as every client command finds it (snapmesh.settings.target);
the nodes and channels are the controller's (GetCluster), the [app] params
$SNAPMESH_APP_PARAMS (a JSON object), else those of `--data-dir`'s cluster file,
else none. One command at a time goes through
`Node.SubmitBatch` (the one load generator, snapmesh/load/generator.py, with one
stream over the whole cluster); a snapshot at a random node every
`--snapshot-every` seconds, each judged by the controller and checked again here.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading

import grpc

from snapmesh.load.background import BackgroundLoad
from snapmesh.load.generator import LoadGenerator
from snapmesh.services.app.drive import node_infos, snapshot_problems
from snapmesh.app import App, AppError, load_app, preflight
from snapmesh.settings.appsettings import PARAMS_ENV, app_words, env_params, same_app
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings import target
from snapmesh.settings.config import hosted
from snapmesh.serving import credentials
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 5.0
SNAPSHOT_TIMEOUT_S = 60.0


def _say(line: str = "") -> None:
    print(line, flush=True)


def run_app(args: argparse.Namespace, spec: str, how: str) -> int:
    """The exit status: 0 clean, 1 a snapshot failed or broke an invariant (or the cluster is unreachable), 2 bad input.

    `spec` is the app to drive and `how` where it was named (`--app`, the cluster
    file, `$SNAPMESH_APP`): the only module this command imports. A node that
    reports another app is refused, never loaded: a rogue node, or anyone at its
    address on a plaintext cluster, does not choose what runs here."""
    def usage(problem: str) -> int:
        print(f"snapmesh app: {problem}", file=sys.stderr)
        return 2

    bank_only = [flag for flag, value in (("--transfer-interval", args.transfer_interval),
                                          ("--max-amount", args.max_amount)) if value is not None]
    if bank_only:
        return usage(f"{' and '.join(bank_only)}: the bank's only, not with {how} {spec}")
    if not args.duration > 0 or args.snapshot_every < 0:
        return usage("--duration must be positive and --snapshot-every >= 0")
    try:
        app = load_app(spec)
    except AppError as exc:
        return usage(str(exc))
    if app.workload is None:
        return usage(f"{how} {spec}: the app {app.name!r} has no workload to drive")
    try:
        found = target.find(args.controller, args.data_dir, args.tls_dir)
        params = _params(args.data_dir)
    except (target.TargetError, ValueError) as exc:
        return usage(str(exc))
    with credentials.open_channel(found.address, found.identity, options=CLIENT_OPTIONS) as channel:
        controller = pb_grpc.ControllerStub(channel)
        try:
            cluster = controller.GetCluster(pb.GetClusterRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as error:
            from snapmesh.commands.client_errors import explain

            print(f"snapmesh app: cannot reach the controller at {found.address}: "
                  f"{explain(error, found.address, found.identity)}", file=sys.stderr)
            return 1
        targets = {n.node_id: n.address for n in cluster.nodes}
        infos = node_infos(sorted(targets), [(c.src, c.dst) for c in cluster.channels], params)
        try:  # the pre-flight every command shares: the app's faults before its first command
            preflight(spec, infos)
        except AppError as exc:
            return usage(str(exc))
        if problem := _runs_other_app(spec, how, targets, found.identity):
            return usage(problem)
        return _drive(app, args, params, cluster, targets, controller, found.identity, spec=spec)


def _params(data_dir: str | None) -> dict:
    """The app's params as the nodes get them: $SNAPMESH_APP_PARAMS, else --data-dir's [app], else none."""
    from_env = env_params(os.environ, lambda problem: ValueError(f"${PARAMS_ENV}: {problem}"))
    if from_env is not None:
        return from_env
    return dict(hosted(target.cluster_file(data_dir)).params) if data_dir else {}


def _runs_other_app(spec: str, how: str, targets: dict[str, str], identity) -> str:
    """Why a node cannot take this app's commands ("" when every node that answers runs it).
    Compared by name only: what a node reports is never imported."""
    for node, address in sorted(targets.items()):
        with credentials.open_channel(address, identity, options=CLIENT_OPTIONS) as channel:
            try:
                state = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError:
                continue  # a node down: its Submit will say so, and is retried
        if not same_app(state.app, spec):
            return (f"node {node} at {address} reports {_named(state.app)}, not {_named(spec)} ({how}): "
                    "refusing to drive a cluster that runs another app")
    return ""


def bank_problem(how: str, found: target.Target) -> str:
    """Why the bank's workload cannot run on the cluster at `found` ("" when it can, or
    when the controller does not answer: the workload says that in its own words)."""
    with credentials.open_channel(found.address, found.identity, options=CLIENT_OPTIONS) as channel:
        try:
            cluster = pb_grpc.ControllerStub(channel).GetCluster(pb.GetClusterRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            return ""
    return _runs_other_app("", how, {n.node_id: n.address for n in cluster.nodes}, found.identity)


def _named(spec: str) -> str:
    return "the bank" if spec.strip() in ("", "bank") else f"the app {spec!r}"


def _drive(app: App, args, params, cluster: pb.Cluster, targets, controller, identity, *, spec: str = "") -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    channels = [(c.src, c.dst) for c in cluster.channels]
    infos = node_infos(sorted(targets), channels, params)
    _say(f"{app.name} workload: seed {seed} (rerun with --seed {seed}); {len(targets)} nodes, {len(channels)} "
         f"channels; commands through Node.Submit one at a time; a snapshot every {args.snapshot_every:g}s; "
         f"{args.duration:g}s in all")
    _say(f"  app {app_words(spec or app.name, app.name, app.version)}")  # the module and version this command loaded
    taken: list[pb.Snapshot] = []
    errors: list[str] = []
    stop = threading.Event()

    def snapshots() -> None:
        rng = random.Random(f"snapshots:{seed}")
        while args.snapshot_every and not stop.wait(args.snapshot_every):
            initiator = rng.choice(sorted(targets))
            try:
                snap = controller.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator=initiator, wait=True),
                                                  timeout=SNAPSHOT_TIMEOUT_S)
            except grpc.RpcError as error:
                errors.append(f"snapshot at {initiator}: {error.code().name}: {error.details()}")
                _say(f"  ! {errors[-1]}")
                continue
            taken.append(snap)
            _say(_snapshot_line(app, snap, params))

    trigger = threading.Thread(target=snapshots, name="snapshots", daemon=True)
    load = BackgroundLoad(LoadGenerator(app, targets, infos, seed=seed, per_node=False, identity=identity,
                                        timeout=RPC_TIMEOUT_S), callers=1)
    trigger.start()
    try:
        with load:
            stop.wait(args.duration)
    except KeyboardInterrupt:
        _say("  stopped by a signal")
        load.stop()
    finally:
        stop.set()
        trigger.join(SNAPSHOT_TIMEOUT_S + 5)
    stats = load.stats
    complete = [s for s in taken if s.status == pb.Snapshot.COMPLETE]
    broken = [p for s in complete for p in snapshot_problems(app, s, params)]
    failed = [s for s in taken if s.status != pb.Snapshot.COMPLETE]
    _say()
    _say(f"summary (seed {seed}):")
    _say(f"  commands: {stats.accepted} replies, {stats.refused} refused, {stats.failed} given up; "
         f"{stats.retries} retries of a request id")
    for line in stats.lines():
        _say(line)
    _say(f"  snapshots: {len(complete)} complete, {len(failed)} failed, {len(errors)} not finished; "
         f"invariants broken: {len(broken)}")
    for snap in failed:
        _say(f"    FAILED {snap.snapshot_id}: {snap.reason}")
    for problem in broken[:20]:
        _say(f"    BROKEN {problem}")
    ok = not (failed or errors or broken or stats.failed)
    _say(f"  every snapshot complete with its invariants holding: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


def _snapshot_line(app: App, snap: pb.Snapshot, params) -> str:
    status = pb.Snapshot.Status.Name(snap.status)
    if snap.status != pb.Snapshot.COMPLETE:
        return f"  snapshot {snap.snapshot_id}: {status}: {snap.reason}"
    in_flight = sum(len(c.in_flight) for c in snap.channels)
    verdicts = ", ".join(f"{i.name} {'ok' if i.ok else 'BROKEN'}" for i in snap.app.invariants) or "unchecked"
    again = "ok" if not snapshot_problems(app, snap, params) else "BROKEN"
    return f"  snapshot {snap.snapshot_id}: COMPLETE, {in_flight} in flight; invariants: {verdicts} (checked again: {again})"
