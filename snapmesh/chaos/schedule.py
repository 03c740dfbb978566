"""The fault schedule: which fault, on which nodes, for how long, drawn from a seed.

Pure: no processes, no clock. The campaign applies the faults one after the
other, each followed by its recovery, so the schedule says only what comes
next and how long a fault holds; the same seed and node ids give the same
schedule, which is how a failing run is replayed (`snapmesh chaos --seed N`).

The first faults are every kind once, in a seeded order, so even a short run
covers them all; after that kinds are drawn by weight, node kills the most
frequent (several per minute).

On the multi-host bench (`snapmesh chaos --hosts`, `network=True`) the network
faults of snapmesh.hosts.plan join them: partitions both ways and one way, a
node cut off from its peers, a minority/majority split (the controller with
the majority), a bandwidth limit and a one-way delay on a node's link.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from snapmesh.hosts import plan as net

# kind -> weight after the first round. The kinds, as the table names them:
KILL = "kill"  # SIGKILL of one node, restarted on its log
KILL_TWO = "kill_two"  # SIGKILL of two nodes at once
KILL_INITIATOR = "kill_initiator"  # SIGKILL of a snapshot's initiator right after the trigger
PAUSE = "pause"  # SIGSTOP, SIGCONT after `hold`
CUT = "cut_streams"  # every channel stream into a node reset by its proxy
PARTITION = "partition"  # a node's proxy refuses every connection for `hold`
FULL_DISK = "full_disk"  # the node's data dir (a tmpfs) full: the node must stop, then restart
KILL_CONTROLLER = "kill_controller"  # SIGKILL of the controller with a snapshot in progress
SECOND_INSTANCE = "second_instance"  # another `snapmesh node` on a running node's data dir: exit 2
RETRY = "retry"  # a transfer sent again with the same request_id, across a node kill

WEIGHTS: dict[str, int] = {
    KILL: 6,
    KILL_TWO: 2,
    KILL_INITIATOR: 3,
    PAUSE: 3,
    CUT: 3,
    PARTITION: 2,
    FULL_DISK: 1,
    KILL_CONTROLLER: 2,
    SECOND_INSTANCE: 1,
    RETRY: 2,
}
KINDS: tuple[str, ...] = tuple(WEIGHTS)
NETWORK_WEIGHTS: dict[str, int] = {
    net.PARTITION: 2,  # two nodes, both ways
    net.PARTITION_ONE_WAY: 2,  # what nodes[0] sends nodes[1] is lost
    net.ISOLATE: 1,  # nodes[0] from every other node, not from the controller
    net.SPLIT: 1,  # `nodes` the minority, the others and the controller the majority
    net.BANDWIDTH: 1,  # nodes[0]'s link at BANDWIDTH_KBIT
    net.DELAY: 1,  # nodes[0]'s link DELAY_MS late
}
BANDWIDTH_KBIT = 400
DELAY_MS = 30


def kinds(network: bool = False) -> tuple[str, ...]:
    return (*KINDS, *NETWORK_WEIGHTS) if network else KINDS


class Fault(NamedTuple):
    index: int
    kind: str
    nodes: tuple[str, ...]  # the nodes it hits (none for the controller)
    hold: float  # seconds the fault lasts before it is repaired (pause, partition)
    gap: float  # seconds of plain load before the fault


def faults(seed: int, nodes: Sequence[str], *, disk_node: str, network: bool = False) -> Iterator[Fault]:
    """An endless schedule for `nodes`; full-disk faults hit `disk_node`, the one on a small disk;
    `network`: the network faults too (the same seed without them gives today's schedule)."""
    if len(nodes) < 2:
        raise ValueError("a fault campaign needs at least two nodes")
    rng = random.Random(seed)
    weights = {**WEIGHTS, **(NETWORK_WEIGHTS if network else {})}
    first = list(weights)
    rng.shuffle(first)
    index = 0
    while True:
        kind = first[index] if index < len(first) else rng.choices(list(weights), weights=list(weights.values()))[0]
        if kind == KILL_TWO:
            targets = tuple(sorted(rng.sample(list(nodes), 2)))
        elif kind in (net.PARTITION, net.PARTITION_ONE_WAY):
            targets = tuple(rng.sample(list(nodes), 2))  # ordered: the first's packets to the second are lost
        elif kind == net.SPLIT:
            targets = tuple(sorted(rng.sample(list(nodes), max(1, (len(nodes) - 1) // 2))))
        elif kind == KILL_CONTROLLER:
            targets = ()
        elif kind == FULL_DISK:
            targets = (disk_node,)
        else:
            targets = (rng.choice(list(nodes)),)
        hold = round(rng.uniform(0.5, 3.0), 2) if kind in (PAUSE, PARTITION, *NETWORK_WEIGHTS) else 0.0
        yield Fault(index, kind, targets, hold, round(rng.uniform(0.5, 3.0), 2))
        index += 1


def disk_node(seed: int, nodes: Sequence[str]) -> str:
    """The node whose data dir is the small disk."""
    return random.Random(f"disk:{seed}").choice(list(nodes))
