"""The fault simulator: whole node machines and the controller machine on one seeded scheduler.

Each case builds a random cluster (2 to 5 nodes, a random strongly connected
topology: in a bank case a random-regular:K a quarter of the time, a ring a tenth, else a
ring in a random order with random chords, which an app's case always draws; `--topology NAME` runs every case on
one of snapmesh.settings.topologies, with more nodes when K needs them; small balances, small channel bounds and segments) of
`snapmesh.protocol.node.machine.Node` machines, the code the gRPC node runs, each over a
simulated disk (sim/disk.py), joined by a simulated network (sim/network.py),
and the `snapmesh.protocol.controller.machine.Controller` machine, the code the gRPC
controller runs, with its restore plan (sim/controller.py); sim/world.py holds
them together. One `random.Random(seed)` chooses every step: client transfers
(some with a request_id, some retried), snapshots, connections opening, frames
and acks delivered, the disk making a prefix of what is buffered durable, time
passing, and the faults:

  crash       a node loses what is not durable; part of what was being written
              may reach the disk, the last record torn mid-line; restart it
              from its log (the active segment only, through wal and recovery)
  cut         a connection drops what is on the wire (or leaves it to arrive
              later, stale: its number must fence it, and its open the epoch)
  partition   the nodes split in two until heal; no connection crosses
  delay       durability comes late and in parts (every disk step is random), the
              controller's journal too in half the cases (sim/journal.py): what
              the controller shows or sends waits until its record is durable
  controller  crash and restart: the journal is replayed; unfinished snapshots
              fail "controller restarted" unless their reports come in. Each
              case draws an admission limit (or none) that triggers must keep;
              a report sent again may arrive after a restore began (refused: a
              stale epoch); a FAILED snapshot must bring an abort for every node;
              each case draws a `--keep` (or none) whose Retire effects must
              follow the rule (sim/retention.py)
  deadline    time passes: the controller fails late snapshots and aborts them,
              nodes drop recordings past their ttl
  restore     the controller rolls the cluster back to a COMPLETE snapshot in a
              new epoch: snapshots in progress fail "restored to S", then the
              nodes take their parts one by one, some crashing right after
              theirs (a part is answered once durable, else sent again);
              a connection opened in another epoch is refused by the receiving
              node's machine (`opened` raises EpochFenced), as on the gRPC node
  restore calls  clients call RestoreSnapshot on the controller machine (its
              gate is snapmesh.protocol.controller.restoregate): bursts of concurrent
              calls, new keys joining the running restore (also once it has
              ended and before its outcome is durable), retries with the
              same idempotency key (while it runs, after it ended, after a
              controller restart), a key reused for another snapshot,
              snapshots that cannot be restored; mostly of COMPLETE snapshots,
              so calls start, join, get answers, Busy and key-reuse refusals.
              Most snapshots complete only once faults stop, so the settling
              phase also runs rounds of calls, each round moving the running
              restore on by one node, sometimes restarting the controller.
              At most one restore runs, and a key that started or joined a
              restore never rolls back again, across controller restarts too
              (the journal keeps every restore and every key that joined one).
              These calls come from their own generator (restore_rng).
  blocks      reports go as content-addressed blocks (sim/blockstore.py): lost,
              repeated and late as any report, refused when they name a block the
              controller lacks (retired, never filed, or its memory lost in a crash);
              every COMPLETE snapshot is filed as blocks and each node's state
              rebuilt from its references must be the one it recorded at its cut
              (SB1-SB3); the pins, references and block disk are exactly what live
              reports and kept snapshots need (SB4, sim/blockaudit.py); restores go
              by block too, only what the controller believes a node lacks, a node
              keeping its held blocks through a crash (SB5, sim/blockrestores.py)
  wait        some triggers wait for the snapshot's end (TriggerSnapshot with
              wait, controller rule W1; drawn from their own generator): each
              is answered once, with the status the snapshot finished with,
              after that record is durable; one whose controller crashed, never
              (sim/trigger_answers.py)

After every step `invariants.Checker` judges; then faults stop, everything is
healed, restarted and delivered, and the quiescent invariants are checked.
A case is one seed: `snapmesh sim fuzz --seed N --cases 1` replays it exactly.
Even seeds run the nodes in classic snapshot mode, odd seeds in overtake mode
(snapmesh/protocol/overtake.py), so every run covers both; `--mode hybrid
--align-timeout-ms T` runs every case in hybrid mode (snapmesh/protocol/hybrid.py),
and `--broadcast` starts every snapshot at every node (controller rule B1).

The nodes host an app (node rule N10): the bank (services/app/bank.py, loaded by
its built-in name, its [app] table drawn by the case: sim/world.py `bank_params`),
or the one named (`snapmesh sim fuzz --app kvshard`, `run_case(seed, app)`); the
clients send its workload's commands, under every fault; the checker holds the
app's rules (A1-A6 of sim/apps.py: payloads, state digests, the app's invariants
on every COMPLETE snapshot and at the end, its state against its log). The bank
is bytes here as any app is: its conservation is its invariant `conserved`.

Version steps (`--steps upgrade`, `--steps rescale`): these steps, then a stop with a
snapshot restored into a version 2 of the app or onto another node set, then these
steps again: snapmesh/fuzzer/steps.py and rescale_steps.py.
"""

from __future__ import annotations

import random
from typing import Any

from snapmesh.app import App
from snapmesh.protocol.hybrid import DEFAULT_ALIGN_TIMEOUT_S
from snapmesh.sim import apps
from snapmesh.sim.apps import AppViolation
from snapmesh.sim.controller import DEADLINE
from snapmesh.sim.invariants import Violation
from snapmesh.sim.world import TTL, World

def step(world: World) -> None:
    """One step of the schedule: a client call, a delivery, time, or a fault."""
    control = world.controller
    control.journal_step()
    control.restore_calls()
    rng = world.rng
    if rng.random() < 0.03:
        if control.restoring is None:
            control.start_restore(rng)
        else:
            control.restore_one(rng)
        return
    roll = rng.random()
    live = [i for i in world.ids if world.nodes[i] is not None]
    if roll < 0.22:
        command(world)
    elif roll < 0.27 and world.unanswered:
        world.call(*world.unanswered.pop(rng.randrange(len(world.unanswered))))
    elif roll < 0.42 and live:
        node_id = rng.choice(live)
        world.durable(node_id, rng.randint(1, 1 + len(world.disks[node_id].pending)))
    elif roll < 0.62:
        world.network.deliver_one(rng)
    elif roll < 0.70:
        world.network.connect(rng.choice(world.channels))
    elif roll < 0.75:
        control.start_snapshot(rng)
    elif roll < 0.80 and control.reports:
        control.deliver_report()
    elif roll < 0.86:
        world.tick(rng.uniform(0.1, 1.5))
    elif roll < 0.89:
        world.network.cut(rng.choice(world.channels), keep_wire=rng.random() < 0.5)
    elif roll < 0.92 and live:
        world.crash(rng.choice(live), rng)
    elif roll < 0.95:
        down = [i for i in world.ids if world.nodes[i] is None]
        if down:
            world.start_node(rng.choice(down))
            world.faults["node restart"] += 1
    elif roll < 0.97:
        world.network.split(rng, world.ids)
    elif roll < 0.985:
        control.crash()
    elif not control.up:
        control.restart()


def command(world: World) -> None:
    """A client's command from the app's workload, with a request_id or not."""
    node_id, data = next(world.commands)
    rid = ""
    if world.rng.random() < 0.3:
        world.next_request += 1
        rid = f"r{world.next_request}"
    world.submit(node_id, data, rid)


def settle_restore_calls(world: World) -> None:
    """Once snapshots have completed: rounds of calls, each round moving the restore on by one node."""
    control = world.controller
    rng = control.restore_rng
    for _ in range(rng.randint(0, 8)):
        control.restore_calls(always=True)
        if control.restoring is not None:
            control.restore_one(rng)
        if rng.random() < 0.1:  # the controller crashes and comes back: rebuilt from the journal
            control.crash()
            control.restart()
        world.restart_down_nodes()
        drain_all(world)


def settle(world: World) -> None:
    """Faults stop: heal, restart, deliver everything, let every deadline pass."""
    control = world.controller
    world.network.heal()
    if not control.up:
        control.restart()
    world.restart_down_nodes()
    drain_all(world)
    settle_restore_calls(world)
    if world.rng.random() < 0.5:  # one more restore, with crashes in it, once snapshots have completed
        control.start_restore(world.rng)
    for _ in range(1000):
        if control.restoring is None:
            break
        for _ in range(world.rng.randint(0, 3)):  # commands racing the restore: one answered after it is taken back, and retried
            command(world)
        control.restore_one(world.rng)
        control.journal.flush()
        world.restart_down_nodes()
        for node_id in world.ids:
            world.durable(node_id, len(world.disks[node_id].pending))
    for _ in range(100):  # retried in rounds: a node that never ends its restore refuses them for ever (Q2 names it)
        retries, world.unanswered = world.unanswered, []
        for unanswered in retries:
            world.call(*unanswered)
    world.unanswered.clear()
    for _ in range(3):
        drain_all(world)
        world.tick(TTL + DEADLINE)
    drain_all(world)
    control.answers.settled()
    control.triggers.settled()
    control.report_calls.settled()
    control.blocks.check_kept()
    live = world.live()
    world.checker.check_step(live, world.now)
    world.checker.check_quiescent(live, control.statuses())


def drain_all(world: World) -> None:
    """Make every log durable, open every connection, deliver every frame and report, until nothing moves."""
    control = world.controller
    for _ in range(10_000):
        moved = False
        for node_id in world.ids:
            if world.disks[node_id].pending:
                world.durable(node_id, len(world.disks[node_id].pending))
                moved = True
        moved = world.network.drain() or moved
        if control.up and control.journal.pending:
            control.journal.flush()
            moved = True
        while control.reports:
            control.deliver_report()
            moved = True
        world.check()
        if not moved:
            return
    raise Violation("quiescent: the cluster never settled")


def run_case(seed: int, app: App | None = None, app_params: dict[str, Any] | None = None, *,
             broadcast: bool = False, mode: str | None = None, align_timeout: float = DEFAULT_ALIGN_TIMEOUT_S,
             batching: bool = False, topology: str | None = None) -> World:
    """One case (of the bank app, or of `app`); raises Violation (with the world's description) when an
    invariant breaks. `broadcast`: every snapshot starts at every node at once; `mode`: every node's
    snapshot_mode (None: by the seed), `align_timeout` hybrid's (seconds); `batching`: frames merged
    on the wire and early markers applied first, as the gRPC node does (sim/network.py); `topology`: a
    name of snapmesh.settings.topologies (None: drawn). Flags, not draws, so every seed without them
    replays as before."""
    world = World(seed, app, app_params, mode=mode, align_timeout=align_timeout, topology=topology)
    world.controller.broadcast = broadcast
    if batching:
        world.network.batching = random.Random(seed)
    try:
        first = {i: node.app_state() for i, node in world.live().items()}  # A5 before the first step
        apps.check_quiescent(world.app, first, world.app_params, where="at the start")  # type: ignore[arg-type]
        for _ in range(world.steps):
            step(world)
            world.check()
        settle(world)
    except (Violation, AppViolation) as exc:
        raise Violation(f"{exc} [{world.describe()}, t={world.now:g}]") from None
    return world


def replay_command(seed: int, app: str = "", *, broadcast: bool = False, mode: str | None = None,
                   align_timeout: float = DEFAULT_ALIGN_TIMEOUT_S, topology: str | None = None) -> str:
    """The command that replays case `seed` (`app`: the --app it ran)."""
    return (f"snapmesh sim fuzz --seed {seed} --cases 1" + (f" --app {app}" if app else "")
            + (" --broadcast" if broadcast else "") + (f" --mode {mode}" if mode else "")
            + (f" --align-timeout-ms {align_timeout * 1e3:g}" if mode == "hybrid" else "")
            + (f" --topology {topology}" if topology else ""))


def fuzz(
    seed: int, cases: int, app: App | None = None, app_params: dict[str, Any] | None = None, *,
    broadcast: bool = False, mode: str | None = None, align_timeout: float = DEFAULT_ALIGN_TIMEOUT_S,
    batching: bool = False, topology: str | None = None,
) -> tuple[int, tuple[int, str] | None]:
    """Run `cases` cases from `seed` on; returns (cases run, (failing seed, why) or None)."""
    for index in range(cases):
        try:
            run_case(seed + index, app, app_params, broadcast=broadcast, mode=mode, align_timeout=align_timeout,
                     batching=batching, topology=topology)
        except Violation as exc:
            return index + 1, (seed + index, str(exc))
        except Exception as exc:  # a crash of the code under test is a failure too
            return index + 1, (seed + index, f"{type(exc).__name__}: {exc}")
    return cases, None
