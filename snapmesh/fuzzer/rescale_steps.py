"""The fuzzer's rescale steps: a run, a stop with a snapshot, a restore onto another node set, a run on it.

`snapmesh sim fuzz --steps rescale` (the bank app, its [app] total drawn with its
balances, so that the new node count keeps it) or `--app kvshard --steps rescale`
runs each case as the offline
path (`snapmesh cluster rescale`, snapmesh/processes/rescaler.py) does, one seed
choosing all of it (a generator of its own for the steps, so fuzz.py's seeds
replay as before):

  run      fuzz.py's random steps with every fault, the cluster settles, and a few
           commands are answered just before the stop, so messages (kvshard's
           handoffs) are on the wire at its cut
  stop     TriggerSnapshot stop (steps.py: fences, nodes crashing before theirs,
           the snapshot COMPLETE, every log ending in its stop); every node exits
  new set  the simulator's world cannot change its node set, so a second world
           is built as the rescaler writes the new cluster: N' nodes (2 to 6, not
           N; the first ones keep their ids), a full mesh, each node's log an init
           and the stop, so every node starts fenced; its controller starts on the
           new node set and reads the stop snapshot from its file
  rescale  RestoreSnapshot of the stop snapshot with the target node set: the
           app's `rescale` runs on the controller (rescale.py RS1-RS7) before any
           node hears of it; nodes crash and restart, stopped and during the restore
  run      fuzz.py's random steps on the new node set, with every fault, then its
           settle and its quiescent checks (the app's invariants on the final states)

What the simulator does not do here: the nodes kept from the old set start
from a fresh stopped log, not from their old log read on the new node set (that
reading is stoplog.py's, held by tests/protocol/test_stop_log_rescale.py).

Checked besides fuzz.py's invariants after every step, and steps.py's V1:
  R1 the rescale is not refused, and ends RESTORED on the new node set;
  R2 each new node's part (the controller's plan) is the app's `rescale` of the
     stop snapshot's whole view (states and in-flight payloads, as the nodes
     reported them), onto the new node set, with nothing in flight;
  R3 the app's invariants hold on the new states (quiescent, before any step).
A case is one seed: `snapmesh sim fuzz --app kvshard --steps rescale --seed N --cases 1`.
"""

from __future__ import annotations

import random
from typing import Any

from snapmesh.app import App, NodeInfo
from snapmesh.fuzzer import fuzz, steps
from snapmesh.protocol.controller import restoregate
from snapmesh.protocol.node.fence import STOPPED
from snapmesh.sim import apps
from snapmesh.sim.apps import AppViolation
from snapmesh.sim.invariants import Violation
from snapmesh.sim.world import World
from snapmesh.v1 import snapmesh_pb2 as pb


def run_case(seed: int, app: App | None = None, app_params: dict[str, Any] | None = None) -> World:
    """One case of the rescale steps (see the module doc); `app` None: the bank. Raises Violation."""
    world = World(seed, app, app_params)
    rng = random.Random(seed * 104_729 + 12)  # the steps' own generator
    where = world
    try:
        for _ in range(world.steps // 2):
            fuzz.step(world)
            world.check()
        steps.quiet(world)
        steps.in_flight(world, rng)
        sid = steps.stop(world, rng)
        snapshot = world.controller.machine.get(sid)
        reports = world.controller.recorded[sid]
        for node_id in world.ids:  # the nodes stop once their log ends in the stop
            if world.nodes[node_id] is not None:
                world.crash(node_id, rng)
        count = rng.choice([k for k in range(2, 7) if k != len(world.ids)])
        # the new set runs the same app with the same [app] table (the bank's total, drawn by the first world)
        where = rescaled = World(seed, world.app, world.app_params, rescaled=([f"n{i}" for i in range(count)], sid))
        rescale_onto(rescaled, snapshot, reports, world.channels, rng)
        for _ in range(rescaled.steps // 2):
            fuzz.step(rescaled)
            rescaled.check()
        fuzz.settle(rescaled)
    except (Violation, AppViolation) as exc:
        raise Violation(f"{exc} [{where.describe()}, steps rescale, t={where.now:g}]") from None
    return rescaled


def rescale_onto(world: World, snapshot: pb.Snapshot, reports: Any, old_channels: list, rng: random.Random) -> None:
    """The new node set's controller reads the stop snapshot, its nodes start fenced, and the
    snapshot is restored onto them with the app's rescale (R1-R3)."""
    sid, control, app = snapshot.snapshot_id, world.controller, world.app
    assert app is not None
    control.files = [snapshot]  # the snapshot's file, which the controller reads as it starts
    control.crash()
    control.restart()
    for node_id in world.ids:
        if rng.random() < 0.3:  # a node restarts while stopped
            world.crash(node_id, rng)
            world.start_node(node_id)
            world.faults["restart while stopped"] += 1
        if world.fences[node_id].state != STOPPED:
            raise Violation(f"V1: {node_id} started on its stopped log, and its fence is {world.fences[node_id].state}")
    decision = control.restore_onto(sid, list(world.ids), f"rescale {sid} onto {len(world.ids)}")
    if not isinstance(decision, restoregate.Start):
        said = getattr(decision, "message", "") or type(decision).__name__
        raise Violation(f"R1: the rescale of {sid} onto {len(world.ids)} nodes was refused: {said}")
    world.faults["rescale"] += 1
    if any(t.payload for state in reports.values() for items in state.channels.values() for t in items):
        world.faults["rescale with messages in flight"] += 1
    params = world.app_params
    view = apps.view(sid, reports, old_channels, params)
    infos = [NodeInfo(node_id=n, peers_out=world.outgoing[n], peers_in=world.incoming[n], params=params) for n in world.ids]
    expected = dict(app.rescale(view, infos))  # type: ignore[misc]
    for node_id, part in sorted(control.parts.items()):  # R2
        if part.state != expected[node_id] or part.channels:
            raise Violation(f"R2: {node_id}'s part of the rescale of {sid} is not the app's rescale of the stop snapshot")
    apps.check_quiescent(app, expected, params, where=f"R3: the rescale of {sid}")
    last = steps.run_restore(world, control, rng)
    if last is None or last.snapshot_id != sid or last.status != pb.Restore.RESTORED:
        raise Violation(f"R1: the rescale of {sid} onto {len(world.ids)} nodes ended {last}")
    fuzz.drain_all(world)


def fuzz_steps(
    seed: int, cases: int, app: App | None = None, app_params: dict[str, Any] | None = None,
) -> tuple[int, tuple[int, str] | None]:
    """Run `cases` rescale cases from `seed` on; returns (cases run, (failing seed, why) or None)."""
    return steps.fuzz_steps(seed, cases, app, app_params, case=run_case)
