"""What the bench's phases share with the phase on hosts: the cluster's money, its
callers per node, and back-to-back snapshots timed from the client and the controller.

Its own module so that `bench.lab` (which starts the phase on hosts) and
`bench.hosts` (which measures with these) do not import each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from snapmesh.checking.snapshots import duration_s
from snapmesh.v1 import snapmesh_pb2 as pb

INITIAL_BALANCE = 10**12  # nobody runs out of money: refusals would not be load
DEADLINE_S = 10.0


def paced_callers(nodes: int) -> int:
    """Paced callers per node: enough that the pacing, not round trips, sets the rate."""
    return 4 if nodes <= 4 else 2


def latency_run(controller, count: int, cap_s: float, statuses: dict[str, int], complete: list | None = None,
                broadcast: bool = False, every_s: float = 0.0, sleep: Callable[[float], None] = time.sleep):
    """Snapshots one after another with wait=true: client and controller durations (ms).
    `complete` gets each COMPLETE snapshot (its statistics split the latency by hop);
    `broadcast` asks the controller to start each at every node at once. `every_s` 0:
    back to back; else each starts `every_s` after the one before started (or when that
    one ends, if later), so the snapshots' own CPU is a stated load, not whatever their
    latency allows: back to back, a snapshot costs the machine its CPU over its latency."""
    client, server, in_flight, failed = [], [], [], 0
    until = time.perf_counter() + cap_s
    due = time.perf_counter()
    for _ in range(count):
        if every_s > 0 and (wait := due - time.perf_counter()) > 0:
            sleep(wait)
        if time.perf_counter() > until:
            break
        t0 = time.perf_counter()
        due = t0 + every_s
        try:
            snapshot = controller.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True, broadcast=broadcast),
                                                  timeout=DEADLINE_S + 10)
        except grpc.RpcError:
            failed += 1
            continue
        elapsed = time.perf_counter() - t0
        statuses[snapshot.snapshot_id] = snapshot.status
        if snapshot.status != pb.Snapshot.COMPLETE:
            failed += 1
            continue
        if complete is not None:
            complete.append(snapshot)
        client.append(elapsed * 1e3)
        server.append(duration_s(snapshot) * 1e3)
        in_flight.append(sum(len(c.in_flight) for c in snapshot.channels))
    return client, server, failed, in_flight
