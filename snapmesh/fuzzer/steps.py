"""The fuzzer's version steps: a run of the app, a stop with a snapshot, an upgrade on restore, a run of the new code.

`snapmesh sim fuzz --steps upgrade` (the bank app) or `--app kvshard --steps upgrade`
runs each case in three parts,
one seed choosing all of it (the case's world, as fuzz.py's, and a generator of
its own for the steps, so fuzz.py's seeds replay as before):

  run      fuzz.py's random steps with every fault, then the cluster settles
           (healed, restarted, any restore finished)
  stop     TriggerSnapshot stop on the controller machine (stopping.py ST1-ST5):
           its Fence calls reach each node's fence (protocol/node/fence.py), as the
           node's shell holds it; some nodes crash and restart before their FENCE
           reaches them; clients keep sending commands, and a fenced node refuses
           them (they are retried); the stop snapshot runs and completes; some
           nodes crash and restart before their STOP reaches them (they come back
           open, and stop by fence.py F7); every
           node logs its `stop`, the call is answered COMPLETE; then every node
           exits, as the real node does once stopped
  upgrade  the controller restarts on version 2 of the app (sim/versioned.py: a
           changed state encoding), every node restarts under it, fenced on its
           stopped log (some twice), and a RestoreSnapshot of the stop snapshot
           upgrades every state on the controller (upgrade.py U1-U6) before any
           node hears of it; nodes crash and restart while it runs
  run      fuzz.py's random steps again, under version 2, with every fault
           (older snapshots restored into version 2 are upgraded again), then
           fuzz.py's settle and its quiescent checks

Checked besides fuzz.py's invariants after every step (sim/invariants.py, A1-A6
with each log folded by the code of the version it names):
  V1 the stop's call is answered with the snapshot COMPLETE, and every node's log
     ends in its `stop`; a node restarted after it starts fenced (STOPPED), and a
     command sent to it is refused;
  V2 the restore of the stop snapshot into version 2 is not refused, and ends RESTORED;
  V3 each node's part of the restore (the controller's plan, before any node takes
     it) holds every field of its recorded state, with the same value (read back
     through sim/versioned.py's `fields`): an upgrade that drops or changes one is
     named with the node and the field. (The nodes' restore records are held to
     the plan by A3.)
A case is one seed: `snapmesh sim fuzz --app kvshard --steps upgrade --seed N --cases 1`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from snapmesh.app import App
from snapmesh.fuzzer import fuzz
from snapmesh.protocol import wal
from snapmesh.protocol.controller.tracker import COMPLETE
from snapmesh.protocol.node.fence import STOPPED, FenceRefused
from snapmesh.protocol.retry import Failed
from snapmesh.sim import versioned
from snapmesh.sim.apps import AppViolation
from snapmesh.sim.invariants import Violation
from snapmesh.sim.controller import DEADLINE
from snapmesh.sim.world import TTL, World
from snapmesh.v1 import snapmesh_pb2 as pb

STEPS = ("upgrade",)


def run_case(seed: int, app: App | None = None, app_params: dict[str, Any] | None = None, *, drop: str = "") -> World:
    """One case of the version steps (see the module doc; `app` None: the bank); `drop`: version 2's upgrade
    drops that field (a wrong upgrade, which V3 must catch). Raises Violation."""
    world = World(seed, app, app_params)
    rng = random.Random(seed * 104_729 + 11)  # the steps' own generator
    try:
        for _ in range(world.steps // 2):
            fuzz.step(world)
            world.check()
        quiet(world)
        in_flight(world, rng)
        sid = stop(world, rng)
        restore_into(world, versioned.second(world.app, drop=drop), sid, rng)
        for _ in range(world.steps // 2):
            fuzz.step(world)
            world.check()
        fuzz.settle(world)
    except (Violation, AppViolation) as exc:
        raise Violation(f"{exc} [{world.describe()}, steps upgrade, t={world.now:g}]") from None
    return world


def quiet(world: World) -> None:
    """The cluster settles: healed, everything up, delivered, and no restore running."""
    control = world.controller
    world.network.heal()
    if not control.up:
        control.restart()
    world.restart_down_nodes()
    for _ in range(1000):
        if control.restoring is None:
            break
        control.restore_one(world.rng, crash=False)
        control.journal.flush()
        world.restart_down_nodes()
        fuzz.drain_all(world)
    for _ in range(3):  # every snapshot in progress ends, so the stop's is admitted
        fuzz.drain_all(world)
        world.tick(TTL + DEADLINE)
    fuzz.drain_all(world)


def in_flight(world: World, rng: random.Random) -> None:
    """Commands answered just before the stop: the messages they send are on the wire at its cut."""
    for _ in range(rng.randint(2, 10)):
        fuzz.command(world)
    for node_id in world.ids:
        world.durable(node_id, len(world.disks[node_id].pending))


def stop(world: World, rng: random.Random) -> str:
    """TriggerSnapshot stop, carried to the end (V1); returns the stop snapshot's id."""
    control = world.controller
    call = control.triggers.call("")
    sid = control.machine.stop("", control.now(), rng.randbytes(8), call=call)
    control.triggers.waiting[call] = sid
    control.carry_out()
    restarts = random.Random(world.seed * 7_919 + 23)  # its own generator: the cases before it replay as they did
    for _ in range(100):
        if not control.fence_calls and control.machine.stopping.under_way != sid:
            break
        for _ in range(rng.randint(0, 3)):  # clients keep calling: a fenced node refuses them
            fuzz.command(world)
        deliver_fences(world, rng, restarts)
        if control.up:
            control.journal.flush()  # the stop's snapshot starts at every node before the network moves
        fuzz.drain_all(world)
        if control.machine.stopping.under_way == sid and not control.fence_calls:
            world.tick(1.0)  # the snapshot's reports are in: its deadline is the only thing left to move it
    else:
        raise Violation(f"stop {sid}: never ended")
    if control.machine.status(sid) != COMPLETE:
        raise Violation(f"V1: stop snapshot {sid} ended {pb.Snapshot.Status.Name(control.machine.status(sid))}")
    world.faults["stop snapshot complete"] += 1
    for node_id in world.ids:
        records = world.disks[node_id].read_active()
        if not records or type(records[-1][1]) is not wal.Stop or records[-1][1].snapshot_id != sid:
            raise Violation(f"V1: {node_id}'s log does not end in the stop of {sid}: {records[-1:]}")
    return sid


def deliver_fences(world: World, rng: random.Random, restarts: random.Random | None = None) -> None:
    """Each pending Fence call reaches its node's fence (the node's shell, fence.py F1-F3),
    a node now and then crashing and restarting first: before its FENCE (`rng`), and before
    its STOP (`restarts`: it comes back with its fence open, F7); STOP is answered once its
    record is durable."""
    control = world.controller
    calls, control.fence_calls = control.fence_calls, []
    for effect in calls:
        node_id = effect.node
        if world.nodes[node_id] is not None and effect.step == pb.FenceRequest.FENCE and rng.random() < 0.2:
            world.crash(node_id, rng)  # the node restarts before the call reaches it
            world.faults["crash before a fence"] += 1
        elif (restarts is not None and world.nodes[node_id] is not None and effect.step == pb.FenceRequest.STOP
              and restarts.random() < 0.25):
            world.crash(node_id, restarts)  # fenced, it restarts open before its STOP (F7)
            world.faults["crash before a stop"] += 1
        if world.nodes[node_id] is None:
            world.start_node(node_id)
        node, fence = world.nodes[node_id], world.fences[node_id]
        answer: object = pb.FenceResponse()
        try:
            if effect.step == pb.FenceRequest.FENCE:
                fence.close(effect.snapshot_id, now=world.now, lift_after=effect.lift_after)
            elif effect.step == pb.FenceRequest.LIFT:
                fence.lift(effect.snapshot_id)
            elif fence.stop(effect.snapshot_id, now=world.now, quiet=node.quiet_since_cut(effect.snapshot_id)):  # type: ignore[union-attr]
                node.stop(effect.snapshot_id)  # type: ignore[union-attr]
                world.route(node_id)
                world.durable(node_id, len(world.disks[node_id].pending))
        except FenceRefused as exc:
            answer = Failed("FAILED_PRECONDITION", str(exc))
        control.machine.called(effect, answer, control.now())
        control.carry_out()


def restore_into(world: World, new: App, sid: str, rng: random.Random) -> None:
    """Every node exits; the controller and the nodes start on `new`, the nodes fenced;
    the stop snapshot is restored into it (V1-V3)."""
    control = world.controller
    recorded = control.recorded[sid]
    for node_id in world.ids:  # the nodes stop once their log ends in the stop
        if world.nodes[node_id] is not None:
            world.crash(node_id, rng)
    control.files = [control.machine.get(sid)]  # its file, which the controller reads as it starts
    control.crash()
    world.app = new
    world.checker.new_code(new)
    control.restart()
    for node_id in world.ids:
        world.start_node(node_id)
        if rng.random() < 0.3:  # and again, still stopped
            world.crash(node_id, rng)
            world.start_node(node_id)
            world.faults["restart while stopped"] += 1
        if world.fences[node_id].state != STOPPED:
            raise Violation(f"V1: {node_id} restarted on its stopped log, and its fence is {world.fences[node_id].state}")
    before = len(world.unanswered)
    fuzz.command(world)
    if len(world.unanswered) == before:
        raise Violation("V1: a stopped node took a command")
    decision = control.restore_onto(sid, [], f"upgrade {sid}")
    if control.restoring != sid:
        said = getattr(decision, "message", "") or type(decision).__name__
        raise Violation(f"V2: the restore of {sid} into version {new.version} was refused: {said}")
    world.faults["restore with an upgrade"] += 1
    for node_id, part in sorted(control.parts.items()):  # V3, on the plan, before any node takes its part
        had, has = versioned.fields(recorded[node_id].state or b""), versioned.fields(part.state)
        for field in sorted(set(had) | set(has)):
            if had.get(field) != has.get(field):
                raise Violation(f"V3: {node_id}: the restore of {sid} into version {new.version} gives field {field!r}"
                                f" as {str(has.get(field, '(none)'))[:80]}; the stop snapshot recorded"
                                f" {str(had.get(field, '(none)'))[:80]}")
    last = run_restore(world, control, rng)
    if last is None or last.snapshot_id != sid or last.status != pb.Restore.RESTORED:
        raise Violation(f"V2: the restore of {sid} into version {new.version} ended {last}")
    fuzz.drain_all(world)


def run_restore(world: World, control: Any, rng: random.Random) -> pb.Restore | None:
    """Carry the controller's running restore to its end, nodes restarted and made durable
    between its steps (the upgrade's and the rescale's alike); the last restore."""
    for _ in range(1000):
        if control.restoring is None:
            break
        control.restore_one(rng)
        control.journal.flush()
        world.restart_down_nodes()
        for node_id in world.ids:
            world.durable(node_id, len(world.disks[node_id].pending))
    return control.machine.last_restore


def fuzz_steps(seed: int, cases: int, app: App | None = None, app_params: dict[str, Any] | None = None,
               case: Callable[..., object] | None = None) -> tuple[int, tuple[int, str] | None]:
    """Run `cases` cases (`case`, default this module's) from `seed` on; returns (cases run, (failing seed, why) or None)."""
    for index in range(cases):
        try:
            (case or run_case)(seed + index, app, app_params)
        except Violation as exc:
            return index + 1, (seed + index, str(exc))
        except Exception as exc:  # a crash of the code under test is a failure too
            return index + 1, (seed + index, f"{type(exc).__name__}: {exc}")
    return cases, None
