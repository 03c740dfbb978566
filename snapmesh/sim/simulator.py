"""The deterministic simulator: one `core.Process` per node over in-memory channels.

The core records; the balances are the simulator's own (the bank's, its message
an amount as decimal ASCII, as services/app/bank.py writes it).

Channels are FIFO and lossless (one `collections.deque` per directed channel),
exactly the model the algorithm assumes. The only randomness is one
`random.Random(seed)`, used by the `run` step to choose which non-empty channel
delivers next, so the same scenario and seed always give the same run and
byte-identical output.

Besides the output (docs/scenarios.md), the simulator records a trace: a plain
list of event dicts that snapmesh/checking/logcheck.py checks without looking at anything
else. Every event that happens at a node carries that node's local position
(0, 1, 2, ... in the order things happened there):

    {"event": "node", "node": N, "balance": B}                  initial balance
    {"event": "channel", "src": S, "dst": D}                    one per topology channel
    {"event": "send", "node": S, "pos": P, "dst": D, "msg": M, "amount": A}
    {"event": "receive", "node": D, "pos": P, "src": S, "msg": M, "amount": A}
    {"event": "marker_sent", "node": S, "pos": P, "dst": D, "snapshot": I}
    {"event": "marker_received", "node": D, "pos": P, "src": S, "snapshot": I}
    {"event": "cut", "node": N, "pos": P, "snapshot": I, "balance": B}
    {"event": "channel_recorded", "snapshot": I, "src": S, "dst": D,
     "msgs": [M, ...], "amounts": [A, ...]}
    {"event": "completed", "node": N, "snapshot": I}
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from snapmesh.protocol.node import core
from snapmesh.sim.scenario import Deliver, Run, Scenario, ScenarioError, Send, StartSnapshot, Step
from snapmesh.protocol.topology import Channel, channel_name

Event = dict[str, Any]


@dataclass(slots=True)
class _SnapshotLog:
    """What the output says about one snapshot, filled in from the effects."""

    snapshot_id: str
    initiators: list[str] = field(default_factory=list)
    balances: dict[str, int] = field(default_factory=dict)
    channels: dict[Channel, list[int]] = field(default_factory=dict)
    completed: set[str] = field(default_factory=set)
    markers: int = 0


class Simulator:
    """Runs a scenario step by step. `on_delivery(sim)` (optional) is called after
    every delivery, inside `run` steps too, so tests can check invariants there."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        *,
        on_delivery: Callable[[Simulator], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.topology = scenario.topology
        self._rng = random.Random(seed)
        self._on_delivery = on_delivery
        topo = self.topology
        self._processes = {
            node: core.Process(node_id=node, incoming=topo.incoming(node), outgoing=topo.outgoing(node))
            for node in topo.nodes
        }
        self._balances = {node: scenario.balances[node] for node in topo.nodes}
        self._queues: dict[Channel, deque[core.Message]] = {c: deque() for c in topo.channels}
        self._channel_index = {c: i for i, c in enumerate(topo.channels)}
        self._nonempty: list[int] = []  # indices of non-empty channels, sorted
        self._positions = dict.fromkeys(topo.nodes, 0)
        self._next_msg = 0
        self._snapshots: dict[str, _SnapshotLog] = {}
        self.trace: list[Event] = [
            {"event": "node", "node": node, "balance": scenario.balances[node]} for node in topo.nodes
        ]
        self.trace += [{"event": "channel", "src": src, "dst": dst} for src, dst in topo.channels]

    # -- queries

    def balance(self, node: str) -> int:
        return self._balances[node]

    def pending(self, channel: Channel) -> tuple[core.Message, ...]:
        return tuple(self._queues[channel])

    def nonempty_channels(self) -> list[Channel]:
        return [self.topology.channels[i] for i in self._nonempty]

    # -- running

    def run_all(self) -> None:
        for index, step in enumerate(self.scenario.steps):
            self.apply(step, index)

    def apply(self, step: Step, index: int | None = None) -> None:
        """Apply one step. `index` names the step in errors (None: not from a file)."""
        if isinstance(step, Send):
            self._send(step, index)
        elif isinstance(step, StartSnapshot):
            self._start(step)
        elif isinstance(step, Deliver):
            channel = (step.src, step.dst)
            if not self._queues[channel]:
                raise self._error(index, step, f"channel {channel_name(*channel)} is empty")
            self._deliver(channel)
        elif isinstance(step, Run):
            while self._nonempty:
                self._deliver(self.topology.channels[self._rng.choice(self._nonempty)])
        else:  # pragma: no cover - the loader only builds the types above
            raise TypeError(f"unknown step {step!r}")

    def _send(self, step: Send, index: int | None) -> None:
        held = self._balances[step.src]
        if step.amount > held:
            raise self._error(index, step, f"insufficient funds: {step.src} has {held}, cannot send {step.amount}")
        self._balances[step.src] = held - step.amount  # the scenario loader checked the channel and the amount
        self._next_msg += 1
        transfer = core.Transfer(msg_id=f"m{self._next_msg}", seq=self._next_msg, payload=b"%d" % step.amount)
        self._handle(step.src, [core.MessageSent(dst=step.dst, message=transfer)])

    def _start(self, step: StartSnapshot) -> None:
        log = self._snapshots.setdefault(step.snapshot_id, _SnapshotLog(step.snapshot_id))
        effects = self._processes[step.node].start_snapshot(step.snapshot_id)
        if any(isinstance(e, core.LocalStateRecorded) for e in effects):
            log.initiators.append(step.node)
        self._handle(step.node, effects)

    def _deliver(self, channel: Channel) -> None:
        src, dst = channel
        queue = self._queues[channel]
        message = queue.popleft()
        if not queue:
            self._nonempty.remove(self._channel_index[channel])
        if isinstance(message, core.Transfer):
            self._balances[dst] += int(message.payload)
            self._at(dst, "receive", src=src, msg=message.msg_id, amount=int(message.payload))
        else:
            self._at(dst, "marker_received", src=src, snapshot=message.snapshot_id)
        self._handle(dst, self._processes[dst].receive(src=src, message=message))
        if self._on_delivery is not None:
            self._on_delivery(self)

    def _handle(self, node: str, effects: list[core.Effect]) -> None:
        for effect in effects:
            if isinstance(effect, core.MessageSent):
                channel = (node, effect.dst)
                queue = self._queues[channel]
                if not queue:
                    bisect.insort(self._nonempty, self._channel_index[channel])
                queue.append(effect.message)
                message = effect.message
                if isinstance(message, core.Transfer):
                    self._at(node, "send", dst=effect.dst, msg=message.msg_id, amount=int(message.payload))
                else:
                    self._snapshots[message.snapshot_id].markers += 1
                    self._at(node, "marker_sent", dst=effect.dst, snapshot=message.snapshot_id)
            elif isinstance(effect, core.LocalStateRecorded):
                self._snapshots[effect.snapshot_id].balances[node] = self._balances[node]
                self._at(node, "cut", snapshot=effect.snapshot_id, balance=self._balances[node])
            elif isinstance(effect, core.ChannelRecorded):
                transfers = effect.transfers
                amounts = [int(t.payload) for t in transfers]
                self._snapshots[effect.snapshot_id].channels[(effect.src, node)] = amounts
                self.trace.append(
                    {
                        "event": "channel_recorded",
                        "snapshot": effect.snapshot_id,
                        "src": effect.src,
                        "dst": node,
                        "msgs": [t.msg_id for t in transfers],
                        "amounts": amounts,
                    }
                )
            elif isinstance(effect, core.SnapshotCompleted):
                self._snapshots[effect.state.snapshot_id].completed.add(node)
                self.trace.append({"event": "completed", "node": node, "snapshot": effect.state.snapshot_id})
            else:
                # StaleMarkerDropped cannot happen: scenarios have no abort step.
                raise AssertionError(f"unexpected effect {effect!r}")

    def _at(self, node: str, event: str, **fields: Any) -> None:
        position = self._positions[node]
        self._positions[node] = position + 1
        self.trace.append({"event": event, "node": node, "pos": position, **fields})

    def _error(self, index: int | None, step: Step, problem: str) -> ScenarioError:
        where = self.scenario.step_label(index) if index is not None else f"step {step!r}"
        return ScenarioError(where, problem, step=index)

    # -- output

    def output(self) -> dict[str, Any]:
        """The result as docs/scenarios.md specifies it; dict keys in topology order."""
        topo = self.topology
        snapshots = []
        for log in self._snapshots.values():
            complete = len(log.completed) == len(topo.nodes)
            snapshots.append(
                {
                    "id": log.snapshot_id,
                    "initiators": list(log.initiators),
                    "complete": complete,
                    "nodes": {n: log.balances[n] for n in topo.nodes if n in log.balances},
                    "channels": {channel_name(*c): list(log.channels[c]) for c in topo.channels if c in log.channels},
                    "markers": log.markers,
                }
            )
        return {
            "seed": self.seed,
            "snapshots": snapshots,
            "final": {node: self._balances[node] for node in topo.nodes},
        }


def simulate(
    scenario: Scenario, seed: int = 0, *, on_delivery: Callable[[Simulator], None] | None = None
) -> Simulator:
    """Run every step of `scenario`; returns the simulator (output() and trace)."""
    sim = Simulator(scenario, seed, on_delivery=on_delivery)
    sim.run_all()
    return sim
