"""One snapshot on a large simulated cluster with a latency model: how long it takes, what it costs the controller.

The nodes are the Chandy-Lamport machine (`snapmesh.protocol.node.core.Process`)
and the controller is the production machine (`snapmesh.protocol.controller.machine`,
its tracker, with the bank app's checker), as everywhere else in the simulator;
only the timing is new. The core records; each node's balance is this run's own,
and its report is sent as a bank app node sends it (the balance at its cut as the
state bytes, each amount as its payload, decimal ASCII: services/app/bank.py), so
the controller checks it as it checks a bank cluster's. One
event heap is the clock: an event happens at its time, and the clock jumps to the
next one. Times come from `LatencyModel` (snapmesh/sim/latency.py) and the one
`random.Random(seed)`; the same arguments give the same run, figure for figure
(all but `controller_cpu_s`, which is measured).

The run: every node sends `traffic` transfers to random neighbours, at random
times in the first `window_s`; halfway through, the controller triggers a
snapshot at a random node. Its StartAt, the markers, the transfers and each
node's report travel with the model's delays; each send costs the sender
`send_ms`, and a finished part waits one log round before it is reported. The
snapshot's duration is from the trigger to the controller's COMPLETE.

What the controller handles is counted per snapshot: its calls (`steps`), the
effects they return, the reports' bytes as sent, and the channels the reports
list (only those that recorded messages: `only_recorded_channels`), against
the channels the COMPLETE answer lists (every one, as v1 answers keep).
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
import dataclasses
from dataclasses import asdict, dataclass

from snapmesh.app import load_app, v1fields
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller import machine
from snapmesh.protocol.controller.tracker import COMPLETE, Now, Tracker
from snapmesh.protocol.node import core
from snapmesh.protocol.reports import report_message
from snapmesh.protocol.topology import Topology
from snapmesh.settings import topologies
from snapmesh.sim.latency import LatencyModel

WALL0 = 1_800_000_000.0  # the controller's wall clock at simulated time 0 (ids and statistics only)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleResult:
    topology: str
    nodes: int
    channels: int
    diameter: int
    seed: int
    duration_s: float  # trigger to COMPLETE at the controller
    markers: int
    transfers: int
    recorded_channels: int  # channels whose recording holds at least one transfer
    recorded_items: int
    steps: int  # the controller machine's calls for this snapshot: the trigger and each report
    effects: int  # the effects those calls returned
    report_bytes: int  # every report, serialized as sent
    report_channels: int  # channel entries the reports list (recorded ones only)
    answer_channels: int  # channels the COMPLETE snapshot lists (all of them)
    controller_cpu_s: float  # measured: the controller's calls, reports and completion (not reproducible)
    completion_cpu_s: float  # measured: the last report's call, which assembles the answer

    def row(self) -> dict:
        return asdict(self)


def build_channels(shape: str, ids: list[str], seed: int) -> list[tuple[str, str]]:
    """The topology's channels (topologies.channels; the mesh spelled out)."""
    chans = topologies.channels(shape, ids, seed)
    return [(a, b) for a in ids for b in ids if a != b] if chans is None else chans


def diameter(ids: list[str], outgoing: dict[str, list[str]]) -> int:
    """The longest shortest path, in hops (one BFS per node; a complete graph is 1)."""
    n = len(ids)
    if n < 2:
        return 0
    if all(len(outgoing[i]) == n - 1 for i in ids):
        return 1
    longest = 0
    for root in ids:
        depth = {root: 0}
        queue = deque([root])
        while queue:
            node = queue.popleft()
            for nxt in outgoing[node]:
                if nxt not in depth:
                    depth[nxt] = depth[node] + 1
                    queue.append(nxt)
        longest = max(longest, max(depth.values()))
    return longest


def bank_checker(total: int) -> AppChecker:
    """The controller's side of a bank cluster whose snapshots must hold `total` (the
    bank app's checker, as `snapmesh controller` makes it for a cluster file without [app])."""
    params = {"total": total}
    app = load_app("bank")
    return AppChecker("bank", app, params=params, fields=v1fields.for_app(app, params))


class ScaleRun:
    def __init__(self, shape: str, n: int, seed: int = 0, *, model: LatencyModel | None = None,
                 traffic: int = 4, window_s: float = 0.2) -> None:
        self.shape, self.seed, self.traffic, self.window_s = shape, seed, traffic, window_s
        self.model = model or LatencyModel()
        self.rng = random.Random(seed)
        self.ids = [f"n{i}" for i in range(n)]
        self.index = {node: i for i, node in enumerate(self.ids)}
        self.channels = build_channels(shape, self.ids, seed)
        self.outgoing: dict[str, list[str]] = {i: [] for i in self.ids}
        self.incoming: dict[str, list[str]] = {i: [] for i in self.ids}
        for src, dst in self.channels:
            self.outgoing[src].append(dst)
            self.incoming[dst].append(src)
        topology = Topology.build(self.ids, None if topologies.parse(shape)[0] == topologies.MESH else self.channels)
        balance = traffic  # each node can pay every one of its transfers
        self.controller = machine.Controller(
            Tracker(topology=topology, deadline_s=3600.0, snapshot_mode="classic", checker=bank_checker(balance * n)))
        self.processes = {
            i: core.Process(node_id=i, incoming=self.incoming[i], outgoing=self.outgoing[i]) for i in self.ids
        }
        self.balances = dict.fromkeys(self.ids, balance)
        self.at_cut: dict[str, int] = {}  # node -> its balance at its cut
        self.busy = dict.fromkeys(self.ids, 0.0)  # when each node's CPU is free again
        self.last_arrival: dict[tuple[str, str], float] = {}  # FIFO: no message overtakes the one before it
        self.heap: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        self.now = 0.0
        self.counts = {"markers": 0, "transfers": 0, "steps": 0, "effects": 0, "report_bytes": 0, "report_channels": 0}
        self.cpu = 0.0
        self.completion_cpu = 0.0
        self.completed_at: float | None = None
        self.answer: object = None

    # -- the clock

    def _at(self, when: float, kind: str, *args: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, kind, args))

    def run(self) -> ScaleResult:
        rng = self.rng
        for node in self.ids:
            for _ in range(self.traffic):
                if self.outgoing[node]:
                    self._at(rng.uniform(0, self.window_s), "send", node, rng.choice(self.outgoing[node]))
        trigger_at = self.window_s / 2
        self._at(trigger_at, "trigger", rng.choice(self.ids))
        while self.heap:
            self.now, _, kind, args = heapq.heappop(self.heap)
            getattr(self, "_" + kind)(*args)
        assert self.completed_at is not None, "the snapshot did not complete"
        answer = self.answer
        recorded = [c for c in answer.channels if len(c.in_flight)]  # type: ignore[attr-defined]
        return ScaleResult(
            topology=self.shape, nodes=len(self.ids), channels=len(self.channels),
            diameter=diameter(self.ids, self.outgoing), seed=self.seed,
            duration_s=round(self.completed_at - trigger_at, 6),
            recorded_channels=len(recorded), recorded_items=sum(len(c.in_flight) for c in recorded),
            answer_channels=len(answer.channels),  # type: ignore[attr-defined]
            controller_cpu_s=round(self.cpu, 6), completion_cpu_s=round(self.completion_cpu, 6),
            **self.counts,
        )

    # -- events

    def _send(self, node: str, dst: str) -> None:
        self.seq += 1
        self.balances[node] -= 1  # each node can pay every one of its transfers
        self._transmit(node, dst, core.Transfer(msg_id=f"m{self.seq}", seq=self.seq, payload=b"1"))

    def _trigger(self, initiator: str) -> None:
        started = time.process_time()
        self.controller.trigger("s1", initiator, Now(mono=self.now, wall=WALL0 + self.now))
        effects = self.controller.drain()
        self.cpu += time.process_time() - started
        self.counts["steps"] += 1
        self.counts["effects"] += len(effects)
        for effect in effects:
            if type(effect) is machine.StartAt:
                self._at(self.now + self._delay(self.ids[0], effect.node), "start", effect.node, effect.snapshot_id)

    def _start(self, node: str, snapshot_id: str) -> None:
        self._effects(node, self.processes[node].start_snapshot(snapshot_id))

    def _deliver(self, src: str, dst: str, message: core.Message) -> None:
        if type(message) is core.Transfer:
            self.balances[dst] += int(message.payload)
        self._effects(dst, self.processes[dst].receive(src=src, message=message))

    def _report(self, state: core.FullState) -> None:
        message = report_message(state)  # as the bank app's node sends it
        self.counts["report_bytes"] += message.ByteSize()
        self.counts["report_channels"] += len(message.channels)
        started = time.process_time()
        snapshot, _ = self.controller.reported(message, Now(mono=self.now, wall=WALL0 + self.now))
        effects = self.controller.drain()
        spent = time.process_time() - started
        self.cpu += spent
        self.counts["steps"] += 1
        self.counts["effects"] += len(effects)
        if snapshot is not None and snapshot.status == COMPLETE:
            self.completed_at, self.answer, self.completion_cpu = self.now, snapshot, spent

    # -- a node's effects, timed

    def _effects(self, node: str, effects: list[core.Effect]) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is core.MessageSent:
                self._transmit(node, effect.dst, effect.message)
            elif kind is core.LocalStateRecorded:
                self.at_cut[node] = self.balances[node]
            elif kind is core.SnapshotCompleted:
                done = self.busy[node] = max(self.now, self.busy[node]) + self.model.log_round_s
                state = dataclasses.replace(effect.state, state=b"%d" % self.at_cut[node], app="bank", version=1)
                self._at(done + self._delay(node, self.ids[0]), "report", state)

    def _transmit(self, src: str, dst: str, message: core.Message) -> None:
        self.counts["markers" if type(message) is core.Marker else "transfers"] += 1
        left = self.busy[src] = max(self.now, self.busy[src]) + self.model.send_s
        channel = (src, dst)
        arrival = max(left + self._delay(src, dst), self.last_arrival.get(channel, 0.0))
        self.last_arrival[channel] = arrival
        self._at(arrival, "deliver", src, dst, message)

    def _delay(self, a: str, b: str) -> float:
        return self.model.delay(self.index[a], self.index[b], self.rng)


def run_scale(shape: str, n: int, seed: int = 0, **kwargs: object) -> ScaleResult:
    """One snapshot on `shape` over `n` nodes (see ScaleRun); its figures."""
    return ScaleRun(shape, n, seed, **kwargs).run()  # type: ignore[arg-type]
