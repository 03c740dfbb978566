"""An app's workload driven through `Node.Submit`: `snapmesh app --app X`, and the fault campaign's load.

`App.workload(nodes, rng)` yields endless (node id, command bytes); `Driver`
sends each to its node as one `Submit` with a request id of its own. A node
that is down or busy (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED) gets
the same request id again until it answers or `give_up_s` passes: the node's
exactly-once window answers a retry with the first reply, so a command runs
once however often it is sent. Per node it counts replies, refusals by status
(a refusal is the app's answer, not a failure: the workload guesses where keys
are, and guesses wrong) and commands given up on (their outcome unknown).

One thread, one command at a time: the workload's own guesses follow its
commands in order. `on_answer(node, command, reply or None, status)` sees every
outcome (the campaign tallies kvshard's keys from it).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from snapmesh.app import App, NodeInfo, View, check_invariants
from snapmesh.protocol.topology import Topology
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings import security
from snapmesh.serving import credentials
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                     grpc.StatusCode.RESOURCE_EXHAUSTED})
RETRY_PAUSE_S = 0.1


@dataclass(slots=True)
class NodeCounts:
    replies: int = 0
    refusals: Counter[str] = field(default_factory=Counter)  # gRPC status name -> commands
    given_up: int = 0  # no answer within give_up_s: the outcome is unknown


@dataclass(slots=True)
class DriveStats:
    nodes: dict[str, NodeCounts] = field(default_factory=dict)
    retries: int = 0  # sends of a request id after the first
    replayed: int = 0  # answers that were the first reply of a request id sent again
    last_error: str = ""

    @property
    def accepted(self) -> int:
        return sum(c.replies for c in self.nodes.values())

    @property
    def refused(self) -> int:
        return sum(sum(c.refusals.values()) for c in self.nodes.values())

    @property
    def failed(self) -> int:
        return sum(c.given_up for c in self.nodes.values())

    def lines(self) -> list[str]:
        """One line per node: replies, refusals by status, commands given up on."""
        out = []
        for node, c in sorted(self.nodes.items()):
            refusals = ", ".join(f"{n} {code}" for code, n in sorted(c.refusals.items())) or "none"
            out.append(f"  {node}: {c.replies} replies; refusals: {refusals}; {c.given_up} given up")
        return out


Answer = Callable[[str, bytes, "bytes | None", str], None]


def node_infos(nodes: Sequence[str], channels: Sequence[tuple[str, str]],
               params: Mapping[str, object]) -> list[NodeInfo]:
    """Each node's NodeInfo as the nodes themselves get it (their channels and the [app] table)."""
    return [NodeInfo(node_id=n, peers_out=tuple(d for s, d in channels if s == n),
                     peers_in=tuple(s for s, d in channels if d == n), params=params) for n in nodes]


def mesh_infos(count: int) -> list[NodeInfo]:
    """Nodes p1..pN of a full mesh with no [app] params: the cluster `cluster up --nodes N`,
    `demo` and `chaos` write, known before its file is written."""
    ids = [f"p{i}" for i in range(1, count + 1)]
    return node_infos(ids, Topology.build(ids).channels, {})


class Driver:
    """`targets`: node id -> address dialled; `nodes`: their NodeInfo, given to the workload."""

    def __init__(self, app: App, targets: Mapping[str, str], nodes: Sequence[NodeInfo], *, seed: int,
                 identity: security.Identity | None = None, interval: float = 0.0, timeout: float = 5.0,
                 give_up_s: float = 60.0, on_answer: Answer | None = None) -> None:
        if app.workload is None:
            raise ValueError(f"app {app.name!r} has no workload")
        self.app = app
        self.nodes = list(nodes)
        self.seed = seed
        self.interval = interval
        self.timeout = timeout
        self.give_up_s = give_up_s
        self.on_answer = on_answer
        self.prefix = f"{app.name}-{seed}-{uuid.uuid4().hex[:8]}"  # unique per run: ids never meet an old window
        self.stats = DriveStats(nodes={n.node_id: NodeCounts() for n in self.nodes})
        self._channels = {n: credentials.open_channel(a, identity, options=CLIENT_OPTIONS) for n, a in targets.items()}
        self._stubs = {n: pb_grpc.NodeStub(c) for n, c in self._channels.items()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, duration: float | None = None) -> DriveStats:
        """Send commands until `duration` seconds pass (None: until `stop`)."""
        commands = self.app.workload(self.nodes, random.Random(self.seed))
        end = None if duration is None else time.monotonic() + duration
        for index, (node, command) in enumerate(commands):
            if self._stop.is_set() or (end is not None and time.monotonic() >= end):
                break
            self.submit(node, command, f"{self.prefix}-{index}")
            if self.interval:
                self._stop.wait(self.interval)
        return self.stats

    def submit(self, node: str, command: bytes, request_id: str) -> pb.SubmitResponse | None:
        """One command, retried under the same request id; the answer, or None (refused or given up)."""
        counts = self.stats.nodes.setdefault(node, NodeCounts())
        request = pb.SubmitRequest(request_id=request_id, command=command)
        deadline = time.monotonic() + self.give_up_s
        while True:
            try:
                answer = self._stubs[node].Submit(request, timeout=self.timeout)
            except grpc.RpcError as error:
                code = error.code()
                self.stats.last_error = f"{node}: {code.name}: {error.details()}"
                if code in RETRIED and time.monotonic() < deadline:
                    self.stats.retries += 1
                    time.sleep(RETRY_PAUSE_S)
                    continue
                if code in RETRIED:
                    counts.given_up += 1
                else:
                    counts.refusals[code.name] += 1
                self._tell(node, command, None, code.name)
                return None
            counts.replies += 1
            self.stats.replayed += answer.replayed
            self._tell(node, command, answer.reply, "OK")
            return answer

    def _tell(self, node: str, command: bytes, reply: bytes | None, status: str) -> None:
        if self.on_answer is not None:
            self.on_answer(node, command, reply, status)

    # -- on a thread of its own (the campaign)

    def __enter__(self) -> Driver:
        self._thread = threading.Thread(target=self.run, name="app-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """No new command; the one under way is answered (or given up on) first. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(self.give_up_s + 2 * self.timeout)
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


# -- a snapshot's verdict, as the controller gave it and as this client checks it again

def snapshot_view(snapshot: pb.Snapshot, params: Mapping[str, object] | None = None) -> View:
    """A controller Snapshot as the app's checks see it: each node's state, each in-flight payload."""
    return View(snapshot_id=snapshot.snapshot_id, states={n.node_id: n.state for n in snapshot.nodes},
                in_flight=[(c.src, c.dst, t.seq, t.payload) for c in snapshot.channels for t in c.in_flight],
                params=params or {})


def snapshot_problems(app: App, snapshot: pb.Snapshot, params: Mapping[str, object] | None = None) -> list[str]:
    """What is wrong with a COMPLETE app snapshot: the controller's verdict (a failed
    invariant, or none checked) and this client's own `check_invariants` over it."""
    sid = snapshot.snapshot_id
    problems = []
    verdict = snapshot.app
    if verdict.status == pb.AppCheck.CHECKED:
        problems += [f"{sid}: the controller found {i.name!r} broken: {'; '.join(i.problems[:3])}"
                     for i in verdict.invariants if not i.ok]
    else:
        problems.append(f"{sid}: the controller did not check the app's invariants "
                        f"({pb.AppCheck.Status.Name(verdict.status)})")
    for name, found in check_invariants(app, snapshot_view(snapshot, params)).items():
        if found:
            problems.append(f"{sid}: {name!r} broken (checked again here): {'; '.join(found[:3])}")
    return problems
