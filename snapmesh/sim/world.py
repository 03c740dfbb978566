"""One simulated cluster: node machines on simulated disks, a network, the controller, clients.

Every piece of logic that decides something is production code: the node
machines (`snapmesh.protocol.node.machine.Node`, recovered through `wal` and
`recovery`) and the controller machine (`snapmesh.protocol.controller.machine`). The
world only routes their effects (`route` for a node's, `SimController.carry_out`
for the controller's) to the simulated disk, network and clients, and tells
the invariant checker what happened; a client's answer is the node's `Reply`
effect, carried to the client. The schedule that drives it is
snapmesh/fuzzer/fuzz.py's. With an app the nodes host it and the clients send its
commands (snapmesh/sim/apps.py); without one named, the app is the bank
(`snapmesh.services.app.bank:app`, loaded by its built-in name), on the same path
as any other app: bytes through the node's AppHost, its invariants the checks.
"""

from __future__ import annotations

import random
from collections import Counter

from typing import Any

from snapmesh.app import App, load_app
from snapmesh.protocol.node import core, link, recovery
from snapmesh.protocol import hybrid, wal
from snapmesh.protocol.node import machine as node_mod
from snapmesh.protocol.node.fence import Fence
from snapmesh.settings import topologies
from snapmesh.sim import apps
from snapmesh.sim.controller import DEADLINE, SimController
from snapmesh.sim.disk import Disk
from snapmesh.sim.invariants import Checker, Violation
from snapmesh.sim.network import Network

TTL = 2 * DEADLINE  # a node drops a recording after this, as the real node does
DRAWN = "drawn"  # the fuzzer's own random strongly connected topology (`_topology`)


class World:
    """One case. `app` (a snapmesh.app.App, `app_params` its [app] table): the nodes
    host it and clients send its workload's commands (sim/apps.py); None: the bank app,
    its [app] table drawn by the case (`bank_params`)."""

    def __init__(self, seed: int, app: App | None = None, app_params: dict[str, Any] | None = None, *,
                 mode: str | None = None, align_timeout: float = hybrid.DEFAULT_ALIGN_TIMEOUT_S,
                 topology: str | None = None, rescaled: tuple[list[str], str] | None = None) -> None:
        """`mode`: the nodes' snapshot_mode (None: by the seed, overtake when odd); `align_timeout`: hybrid's;
        `topology`: a name of snapmesh.settings.topologies every case runs on (None: drawn, see `_shape`);
        `rescaled`: (node ids, stop snapshot id): the cluster `snapmesh cluster rescale` starts on a new
        node set, a full mesh, each node's log an init and that stop (the fuzzer's rescale steps)."""
        self.seed = seed
        bank = app is None
        if bank:
            app = load_app("bank")
        self.app, self.app_params = app, dict(app_params or {})
        self.mode = mode or ("overtake" if seed % 2 else "classic")
        self.align_timeout = align_timeout
        rng = self.rng = random.Random(seed)
        n = rng.randint(2, 5)
        self.shape = topology or (_shape(seed, n) if bank else DRAWN)  # an app's pinned seeds keep their graphs
        k = 0 if self.shape == DRAWN else topologies.parse(self.shape)[1] or 0
        self.ids = [f"n{i}" for i in range(n if k < n else k + n - 1)]  # random-regular:K needs K < N
        self.channels = _topology(rng, self.ids)  # drawn always, so that the draws after it stay the seed's
        if self.shape != DRAWN:
            self.channels = sorted(topologies.channels(self.shape, self.ids, seed) or
                                   [(a, b) for a in self.ids for b in self.ids if a != b])
        if rescaled is not None:
            self.ids = list(rescaled[0])
            self.channels = [(a, b) for a in self.ids for b in self.ids if a != b]
        self.incoming = {i: tuple(s for s, d in self.channels if d == i) for i in self.ids}
        self.outgoing = {i: tuple(d for s, d in self.channels if s == i) for i in self.ids}
        drawn = [rng.randint(0, 60) for _ in self.ids]  # drawn in every case: an app's pinned seeds replay as before
        if bank:  # the bank's [app] table, drawn: a total set, so that a rescale keeps it (services/app/bank.py)
            self.app_params = {**bank_params(drawn[0], len(self.ids), random.Random(seed * 7919 + 3)), **self.app_params}
        self.mark = rng.choice([2, 4, 1000])
        self.bound = rng.choice([3, 6, 1000])
        self.segment_records = rng.choice([8, 20, 10**6])
        self.steps = rng.randint(50, 250)
        # The request-id window (snapmesh/protocol/node/requests.py), from its own generator.
        window_rng = random.Random(seed * 7919 + 1)
        self.request_ttl = window_rng.choice([0.5, 2.0, 900.0])
        self.request_capacity = window_rng.choice([4, 64, 200_000])
        self.first_sent: dict[str, float] = {}  # request_id -> the client's wall time of its first attempt
        self.now = 0.0
        self.faults: Counter[str] = Counter()  # what happened, so tests can see every kind was exercised
        self.disks = {i: Disk(i) for i in self.ids}
        self.nodes: dict[str, node_mod.Node | None] = {}
        self.fences: dict[str, Fence] = {}  # each node's shell's fence (protocol/node/fence.py), as the engine holds it
        self.network = Network(self.channels, self.nodes, self.route, rng, self.faults)
        # Calls waiting for their node's Reply. A call is the arguments of `call`:
        # (node, dst, amount, request_id), or (node, command, request_id); the node's `reply_to`.
        self.replies: list[tuple] = []
        # Finished parts not yet reported: node -> snapshot id -> the Finished effect (kept, sent at Report).
        self.finished: dict[str, dict[str, node_mod.Finished]] = {}
        self.unanswered: list[tuple] = []  # calls to retry
        self.next_request = 0
        self.checker = Checker(self.ids, self.channels, TTL, app=app, app_params=self.app_params)
        self.controller = SimController(self, seed)
        for i in self.ids:
            if rescaled is not None:
                self._stopped_log(i, rescaled[1])
            self.start_node(i)
        nodes = apps.infos(self.ids, self.channels, self.app_params).values()
        self.commands = apps.commands(app, list(nodes), random.Random(rng.getrandbits(64)))

    @property
    def wall(self) -> float:
        """The wall clock the nodes' request-id windows, the clients and the controller share (never 0)."""
        return 1000.0 + self.now

    def describe(self) -> str:
        return (
            f"nodes {self.ids} channels {len(self.channels)} topology {self.shape} mark {self.mark} bound {self.bound} "
            f"segment {self.segment_records} steps {self.steps} mode {self.mode} "
            f"requests {self.request_capacity}/{self.request_ttl:g}s admission {self.controller.max_concurrent or 'off'}"
            + f" app {self.app.name} {self.app_params}"
        )

    # -- nodes

    def start_node(self, node_id: str) -> None:
        records = self.disks[node_id].read_active()
        if records and isinstance(records[0][1], wal.Checkpoint):
            self.faults["restart from a checkpoint"] += 1
        state = recovery.recover(
            records,
            node_id=node_id,
            incoming=self.incoming[node_id],
            outgoing=self.outgoing[node_id],
            app=self.app,
            app_params=self.app_params,
        )
        hybrid_mode = {"align_timeout": self.align_timeout} if self.mode == "hybrid" else {}
        self.nodes[node_id] = (hybrid.HybridNode if hybrid_mode else node_mod.Node)(
            **hybrid_mode,
            node_id=node_id,
            incoming=self.incoming[node_id],
            outgoing=self.outgoing[node_id],
            recovered=state,
            now=self.now,
            mark=self.mark,
            bound=self.bound,
            recording_ttl=TTL,
            segment_records=self.segment_records,
            snapshot_mode=self.mode,
            wall=self.wall,
            request_ttl_s=self.request_ttl,
            request_capacity=self.request_capacity,
            app=self.app,
            app_params=self.app_params,
        )
        self.nodes[node_id].log_reports = True  # type: ignore[union-attr]  # as the real node runs (embedded.py)
        self.fences[node_id] = Fence(node_id, stopped=self.nodes[node_id].stopped)  # type: ignore[union-attr]
        self.route(node_id)

    def _stopped_log(self, node_id: str, snapshot_id: str) -> None:
        """A node's log as `cluster rescale` writes a new node's: an init and the stop (it starts fenced)."""
        stamp = {"app": self.app.name, "version": self.app.version}
        for record in (wal.Init(lsn=1, **stamp), wal.Stop(lsn=2, snapshot_id=snapshot_id)):
            self.disks[node_id].pending.append(record)
            self.checker.appended(node_id, record, self.now)
        self.disks[node_id].flush(2)

    def restart_down_nodes(self) -> None:
        for node_id in self.ids:
            if self.nodes[node_id] is None:
                self.start_node(node_id)

    def route(self, node_id: str) -> None:
        """Carry out a node machine's effects: its disk, its wires, its reports."""
        node = self.nodes[node_id]
        assert node is not None
        disk = self.disks[node_id]
        restored = []  # answered after the step's other effects: the controller may call nodes back
        for effect in node.drain():
            kind = type(effect)
            if kind is node_mod.Append:
                disk.pending.append(effect.record)
                self.checker.appended(node_id, effect.record, self.now)
            elif kind is node_mod.Transmit:
                self.network.transmit(node_id, effect)
            elif kind is node_mod.Ack:
                self.network.ack(node_id, effect)
            elif kind is node_mod.Reply:
                self.replies.remove(effect.to)
                self._answer(effect)
            elif kind is node_mod.Report:
                part = self.finished[node_id].pop(effect.snapshot_id)
                _check_report(node_id, node, part, disk.durable_lsn)
                self.controller.reports.append((node_id, part.state, part.epoch))
            elif kind is node_mod.Finished:
                # Its `report` record (log_reports) is logged without the state: a restart does not send
                # it again from the log (loggedreports.py), so a crash loses the part, as a lost record would.
                self.finished.setdefault(node_id, {})[effect.state.snapshot_id] = effect
            elif kind is node_mod.Seal:
                disk.pending += (effect, effect.checkpoint)  # the disk writes the checkpoint with its seal
                self.checker.appended(node_id, effect.checkpoint, self.now)
                self.faults["segment sealed"] += 1
            elif kind is node_mod.ReportCancelled:
                self.finished.get(node_id, {}).pop(effect.snapshot_id, None)
            elif kind is node_mod.RestoreReply:
                restored.append(effect)
            elif kind is node_mod.EndStreams:
                self.network.end_streams(node_id, effect)
            else:  # pragma: no cover
                raise TypeError(f"unrouted effect {effect!r}")
        for effect in restored:
            self.controller.restored(node_id, effect)

    def crash(self, node_id: str, rng: random.Random) -> None:
        disk = self.disks[node_id]
        if disk.crash(rng):
            self.faults["torn write"] += 1
        self.faults["crash"] += 1
        self.nodes[node_id] = None
        self.finished.pop(node_id, None)
        self.checker.crashed(node_id, disk.durable_lsn)
        self.controller.crashed(node_id)
        # Clients waiting on this node see the call fail; those with a request_id retry later.
        self.unanswered += [call for call in self.replies if call[0] == node_id and call[-1]]
        self.replies = [call for call in self.replies if call[0] != node_id]
        self.network.cut_all(node_id)

    def durable(self, node_id: str, count: int) -> None:
        disk = self.disks[node_id]
        node = self.nodes[node_id]
        if node is None:
            return
        disk.flush(count)
        node.durable(disk.durable_lsn)
        self.route(node_id)  # its Reply effects answer the clients, its RestoreReply the controller

    def tick(self, dt: float) -> None:
        """Time passes: the controller fails late snapshots, nodes drop recordings past their ttl."""
        self.now += dt
        self.controller.tick()
        for node_id, node in self.nodes.items():
            if node is not None:
                node.tick(self.now, self.wall)
                self.route(node_id)

    # -- clients

    def submit(self, node_id: str, command: bytes, request_id: str) -> None:
        """A client's command to the app at `node_id` (Node.submit), answered as a transfer is."""
        self.call(node_id, command, request_id)

    def call(self, *call: Any) -> None:
        """A client's call (or its retry): (node, command, request_id), a command to the app."""
        node_id, request_id = call[0], call[-1]
        node = self.nodes[node_id]
        if node is None or self.fences[node_id].refusal("Submit", self.now):
            self.unanswered.append(call)  # UNAVAILABLE (down, or fenced for a stop): the client retries
            return
        # Every retry says when it was first sent: one older than the node's window
        # is refused (requests.RequestExpired), never paid again.
        new = bool(request_id) and request_id not in self.first_sent
        first = self.first_sent.setdefault(request_id, self.wall) if request_id else 0.0
        when = {"wall": self.wall, "first_sent_unix_ms": int(first * 1000), "reply_to": call}
        self.replies.append(call)
        try:
            answer = node.submit(call[1], request_id, **when)
        except core.LocalProtocolError as exc:
            self.replies.remove(call)
            if exc.kind is core.Refusal.RESTORING:  # UNAVAILABLE: never taken, so its retry is the first sent
                if new:
                    del self.first_sent[request_id]
                self.unanswered.append(call)
                return
            self._refused(node_id, exc)
            return
        self.route(node_id)  # a Reply for an answer durable already (a retry's) answers the client at once
        if answer.repeated:
            self.faults["retry answered, not run again"] += 1
        if request_id and self.rng.random() < 0.3:
            self.unanswered.append(call)  # the client will retry it

    def _refused(self, node_id: str, exc: core.LocalProtocolError) -> None:
        """The node refused a call: nothing changed (counted by why)."""
        if isinstance(exc, link.ChannelFull):
            self.faults["command refused: channel full"] += 1
        elif isinstance(exc, core.AppRefusal):
            self.faults[f"command refused by the app: {exc.code}"] += 1
        elif exc.kind in (core.Refusal.REQUESTS_FULL, core.Refusal.REQUEST_UNKNOWN):
            self.faults[f"request refused: {exc.kind.value}"] += 1
        self.route(node_id)

    def _answer(self, reply: node_mod.Reply) -> None:
        """The node's durable answer goes back: "paid" (the app's reply), unless it
        says a restore took it back (ABORTED, as the real node answers; the client retries)."""
        call, answer = reply.to, reply.answer
        node_id, rid = call[0], call[-1]
        if not reply.taken_back:
            self.faults["command answered"] += 1
            self.checker.replied_command(node_id, answer.lsn, wal.pack(answer.reply), rid)
            return
        self.faults["command taken back by a restore"] += 1
        if rid:
            self.unanswered.append(call)

    # -- invariants

    def live(self) -> dict[str, node_mod.Node]:
        return {i: n for i, n in self.nodes.items() if n is not None}

    def check(self) -> None:
        self.checker.check_step(self.live(), self.now)


def _check_report(node_id: str, node: node_mod.Node, part: node_mod.Finished, durable_lsn: int) -> None:
    """Node rule N2: a part leaves only once what it rests on is durable, and in the epoch it finished in
    (a restore in between cancels it)."""
    sid = part.state.snapshot_id
    if durable_lsn < part.lsn:
        raise Violation(f"{node_id}: snapshot {sid} reported resting on lsn {part.lsn}, durable only to {durable_lsn}")
    if part.epoch != node.epoch:
        raise Violation(f"{node_id}: snapshot {sid}'s part of epoch {part.epoch} reported in epoch {node.epoch}")


def bank_params(initial: int, nodes: int, rng: random.Random) -> dict[str, int]:
    """The bank's [app] table for a case: small balances, so that transfers are refused for
    want of funds too, and the total set (what a rescale onto another node count keeps)."""
    return {"initial_balance": initial, "total": initial * nodes, "max_amount": rng.choice([5, 30])}


def _shape(seed: int, n: int) -> str:
    """The topology a bank case draws, from its own generator: a random-regular:K in a quarter
    of the cases, a ring in a tenth, else DRAWN (a ring in a random order plus random chords).
    An app's case keeps DRAWN unless --topology says otherwise: the app tests pin seeds to cases."""
    rng = random.Random(seed * 7919 + 2)
    roll = rng.random()
    if roll < 0.25 and n > 2:
        return f"{topologies.RANDOM_REGULAR}:{rng.randint(1, n - 1)}"
    return topologies.RING if roll < 0.35 else DRAWN


def _topology(rng: random.Random, ids: list[str]) -> list[tuple[str, str]]:
    """A random strongly connected topology: a ring in random order plus chords."""
    order = ids[:]
    rng.shuffle(order)
    n = len(order)
    edges = {(order[i], order[(i + 1) % n]) for i in range(n)} if n > 1 else set()
    for a in ids:
        for b in ids:
            if a != b and rng.random() < 0.3:
                edges.add((a, b))
    return sorted(edges)
