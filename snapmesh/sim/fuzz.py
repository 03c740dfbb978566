"""The fault simulator: whole node machines and a controller on one seeded scheduler.

Each case builds a random cluster (2 to 5 nodes, a random strongly connected
topology, small balances, small channel bounds and segments) of
`snapmesh.protocol.node.Node` machines, the code the gRPC node runs, each over a
simulated disk, plus a small simulated controller. One `random.Random(seed)`
chooses every step: client transfers (some with a request_id, some retried),
snapshots, connections opening, frames and acks delivered, the disk making a
prefix of what is buffered durable, time passing, and the faults:

  crash       a node loses what is not durable; part of what was being written
              may reach the disk, the last record torn mid-line; restart it
              from its log (the active segment only, through wal and recovery)
  cut         a connection drops what is on the wire (or leaves it to arrive
              later, stale: epochs must fence it)
  partition   the nodes split in two until heal; no connection crosses
  delay       durability comes late and in parts (every disk step is random)
  controller  crash and restart: unfinished snapshots fail "controller restarted"
  deadline    time passes: the controller fails late snapshots and aborts them,
              nodes drop recordings past their ttl
  restore     the controller rolls the cluster back to a COMPLETE snapshot in a
              new epoch (issue 10): snapshots in progress fail "restored to S",
              then the nodes take the restore one by one, some crashing right
              after theirs; connections are fenced by epoch as the gRPC node
              fences them (a frame or ack of another epoch is refused)
  restore calls  clients call RestoreSnapshot through the controller's own gate
              (snapmesh.protocol.restoregate): bursts of concurrent calls, retries with
              the same idempotency key, a key reused for another snapshot,
              snapshots that cannot be restored; mostly of COMPLETE snapshots,
              so calls start, join, get answers, Busy and key-reuse refusals.
              Most snapshots complete only once faults stop, so the settling
              phase also runs rounds of calls, each round moving the running
              restore on by one node, sometimes restarting the controller.
              At most one restore runs, and a key never rolls back twice in one
              controller lifetime (after a controller restart the gate knows
              the journal's newest restore only, as the real controller does).
              These calls come from their own generator (restore_rng).

After every step `invariants.Checker` judges; then faults stop, everything is
healed, restarted and delivered, and the quiescent invariants are checked.
A case is one seed: `snapmesh sim fuzz --seed N --cases 1` replays it exactly.
Even seeds run the nodes in classic snapshot mode, odd seeds in overtake mode
(snapmesh/protocol/overtake.py), so every run covers both.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field

from snapmesh.protocol import core, link, overtake, recovery, restoregate, wal
from snapmesh.protocol import node as node_mod
from snapmesh.sim.invariants import Checker, Violation

DEADLINE = 3.0  # the controller's snapshot deadline (simulated seconds)
TTL = 2 * DEADLINE  # a node drops a recording after this, as the real node does


@dataclass(slots=True)
class Disk:
    """One node's data dir: durable segments (lines) and what is buffered."""

    node_id: str
    segments: list[list[str]] = field(default_factory=lambda: [[]])
    torn: str = ""  # a partial last line of the active segment
    pending: deque = field(default_factory=deque)  # wal.Record or node.Seal, in order
    durable_lsn: int = 0
    encoder: wal.Encoder | None = None

    def flush(self, count: int) -> None:
        """Make the first `count` buffered items durable (a Seal takes its checkpoint with it)."""
        if self.encoder is None:
            self.encoder = wal.Encoder(self.node_id)
        encode = self.encoder.record
        while count > 0 and self.pending:
            item = self.pending.popleft()
            if isinstance(item, node_mod.Seal):
                self.segments.append([])
                item = self.pending.popleft()  # the checkpoint, atomically with its seal
            self.segments[-1].append(encode(item))
            self.durable_lsn = item.lsn
            count -= 1

    def read_active(self) -> list[tuple[str, wal.Record]]:
        """What a restart reads: the active segment, a torn tail cut off."""
        path = f"{self.node_id}.log.jsonl"
        data = ("".join(self.segments[-1]) + self.torn).encode()
        lines, torn_at = wal.split_lines(data, path)
        if torn_at is not None:
            self.torn = ""
        return [(where, wal.parse(raw, where, node_id=self.node_id)) for where, raw in lines]


@dataclass(slots=True)
class Conn:
    conn_no: int  # the connection's number on its channel, each newer than the last
    # eager: the sender resends from its own last ack at once; otherwise it waits for the
    # receiver's first ack (its resume point), as the gRPC node does.
    eager: bool
    forward: deque = field(default_factory=deque)  # ("open",) / ("data", entries) to dst
    back: deque = field(default_factory=deque)  # acks to src
    resumed: bool = False
    cluster_epoch: int = 1  # the sender's epoch when it opened (ChannelOpen.epoch)


@dataclass(slots=True)
class Snapshot:
    status: str  # IN_PROGRESS, COMPLETE, FAILED
    deadline: float
    reports: dict[str, core.FullState] = field(default_factory=dict)
    epoch: int = 1


class World:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.mode = "overtake" if seed % 2 else "classic"
        rng = self.rng = random.Random(seed)
        n = rng.randint(2, 5)
        self.ids = [f"n{i}" for i in range(n)]
        self.channels = _topology(rng, self.ids)
        self.incoming = {i: tuple(s for s, d in self.channels if d == i) for i in self.ids}
        self.outgoing = {i: tuple(d for s, d in self.channels if s == i) for i in self.ids}
        self.balances = {i: rng.randint(0, 60) for i in self.ids}
        self.mark = rng.choice([2, 4, 1000])
        self.bound = rng.choice([3, 6, 1000])
        self.segment_records = rng.choice([8, 20, 10**6])
        self.steps = rng.randint(50, 250)
        # The request-id window (snapmesh/protocol/requests.py), from its own generator so
        # the rest of a seed's case is what it was before it was modelled.
        window_rng = random.Random(seed * 7919 + 1)
        self.request_ttl = window_rng.choice([0.5, 2.0, 900.0])
        self.request_capacity = window_rng.choice([4, 64, 200_000])
        self.first_sent: dict[str, float] = {}  # request_id -> the client's wall time of its first attempt
        self.now = 0.0
        self.disks = {i: Disk(i) for i in self.ids}
        self.nodes: dict[str, node_mod.Node | None] = {}
        self.conns: dict[tuple[str, str], Conn | None] = dict.fromkeys(self.channels)
        self.stale: list[tuple[tuple[str, str], Conn]] = []  # cut connections whose wires still deliver
        self.next_conn_no = dict.fromkeys(self.channels, 0)
        self.partition: dict[str, int] | None = None
        self.controller_up = True
        self.snapshots: dict[str, Snapshot] = {}
        self.reports: deque = deque()  # (node, FullState) on the way to the controller
        # Answers a client waits for: (node, answer, request_id, dst, amount).
        self.replies: list[tuple[str, node_mod.Accepted, str, str, int]] = []
        self.unanswered: list[tuple[str, str, int, str]] = []  # (node, dst, amount, request_id) to retry
        self.next_request = 0
        self.checker = Checker(self.balances, self.channels, TTL)
        self.faults: Counter[str] = Counter()  # what happened, so tests can see every kind was exercised
        self.epoch = 1  # the controller's
        self.restoring: str | None = None  # the snapshot being restored in `epoch`, until every node has it
        # RestoreSnapshot calls through the controller's gate, from their own generator (see the module doc).
        self.restore_rng = random.Random(seed * 104_729 + 2)
        self.gate = restoregate.RestoreGate()
        self.restore_key = ""  # the key of the restore running or last run
        self.last_restore: tuple[str, str, int] | None = None  # (snapshot, key, epoch), as journaled
        self.key_snapshot: dict[str, str] = {}  # key -> the snapshot its first call named
        self.rolled_back: Counter[str] = Counter()  # key -> restores it started, this controller lifetime
        self.next_restore_key = 0
        for i in self.ids:
            self._start_node(i)

    @property
    def wall(self) -> float:
        """The wall clock the nodes' request-id windows and the clients share (never 0)."""
        return 1000.0 + self.now

    def describe(self) -> str:
        return (
            f"nodes {self.balances} channels {len(self.channels)} mark {self.mark} bound {self.bound} "
            f"segment {self.segment_records} steps {self.steps} mode {self.mode} "
            f"requests {self.request_capacity}/{self.request_ttl:g}s"
        )

    # -- nodes

    def _start_node(self, node_id: str) -> None:
        records = self.disks[node_id].read_active()
        if records and isinstance(records[0][1], wal.Checkpoint):
            self.faults["restart from a checkpoint"] += 1
        state = recovery.recover(
            records,
            node_id=node_id,
            initial_balance=self.balances[node_id],
            incoming=self.incoming[node_id],
            outgoing=self.outgoing[node_id],
        )
        self.nodes[node_id] = node_mod.Node(
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
        )
        self._route(node_id)

    def _route(self, node_id: str) -> None:
        node = self.nodes[node_id]
        assert node is not None
        disk = self.disks[node_id]
        for effect in node.drain():
            kind = type(effect)
            if kind is node_mod.Append:
                disk.pending.append(effect.record)
                self.checker.appended(node_id, effect.record, self.now)
            elif kind is node_mod.Transmit:
                conn = self.conns[(node_id, effect.dst)]
                if conn is not None and conn.conn_no == effect.conn_no:
                    conn.forward.append(("data", effect.entries))
            elif kind is node_mod.Ack:
                conn = self.conns[(effect.src, node_id)]
                if conn is not None and conn.conn_no == effect.conn_no:
                    conn.back.append(effect.seq)
            elif kind is node_mod.Report:
                self.reports.append((node_id, effect.state))
            elif kind is node_mod.Finished:
                pass  # no pending-report store is simulated: the part is reported on Report, once durable
            elif kind is node_mod.Seal:
                disk.pending.append(effect)
                self.faults["segment sealed"] += 1
            elif kind is node_mod.ReportCancelled:
                pass
            else:  # pragma: no cover
                raise TypeError(f"unrouted effect {effect!r}")

    def crash(self, node_id: str, rng: random.Random) -> None:
        disk = self.disks[node_id]
        # The write in progress may have reached the disk in part.
        disk.flush(rng.randint(0, len(disk.pending)))
        if disk.pending and rng.random() < 0.5:
            item = disk.pending[0]
            if isinstance(item, wal.Record):
                line = wal.encode(item, node_id)
                disk.torn = line[: rng.randint(1, len(line) - 1)]
                self.faults["torn write"] += 1
        self.faults["crash"] += 1
        disk.pending.clear()
        self.nodes[node_id] = None
        self.checker.crashed(node_id, disk.durable_lsn)
        # Clients waiting on this node see the call fail; those with a request_id retry later.
        self.unanswered += [(n, dst, amount, rid) for n, _, rid, dst, amount in self.replies if n == node_id and rid]
        self.replies = [r for r in self.replies if r[0] != node_id]
        for channel in self.channels:
            if node_id in channel:
                self.cut(channel, keep_wire=False)

    def durable(self, node_id: str, count: int) -> None:
        disk = self.disks[node_id]
        node = self.nodes[node_id]
        if node is None:
            return
        disk.flush(count)
        node.durable(disk.durable_lsn)
        self._route(node_id)
        still = []
        for reply in self.replies:
            who, answer, rid = reply[:3]
            if who == node_id and answer.lsn <= disk.durable_lsn:
                self.checker.replied_transfer(who, answer.msg_id, rid)
            else:
                still.append(reply)
        self.replies = still

    # -- connections

    def reachable(self, a: str, b: str) -> bool:
        if self.nodes[a] is None or self.nodes[b] is None:
            return False
        return self.partition is None or self.partition[a] == self.partition[b]

    def connect(self, channel: tuple[str, str]) -> None:
        src, dst = channel
        if self.conns[channel] is not None or not self.reachable(src, dst):
            return
        a, b = self.nodes[src], self.nodes[dst]
        if a.restore_incomplete or b.fence(a.epoch):  # type: ignore[union-attr]
            return  # the receiver refuses the open (stale) or asks to wait (not restored yet)
        self.next_conn_no[channel] += 1
        conn = self.conns[channel] = Conn(self.next_conn_no[channel], eager=self.rng.random() < 0.5)
        conn.cluster_epoch = a.epoch  # type: ignore[union-attr]
        conn.forward.append(("open",))
        if conn.eager:
            self.nodes[src].connect(dst, conn.conn_no)  # type: ignore[union-attr]
            self._route(src)

    def cut(self, channel: tuple[str, str], keep_wire: bool) -> None:
        conn = self.conns[channel]
        if conn is None:
            return
        self.conns[channel] = None
        self.faults["connection cut"] += 1
        if keep_wire and (conn.forward or conn.back):
            self.stale.append((channel, conn))
        src = self.nodes[channel[0]]
        if src is not None:
            src.disconnect(channel[1])

    def deliver_forward(self, channel: tuple[str, str], conn: Conn) -> None:
        src, dst = channel
        item = conn.forward.popleft()
        node = self.nodes[dst]
        if node is None:
            return
        if node.fence(conn.cluster_epoch):
            self.faults["stale epoch refused"] += 1
            return
        try:
            if item[0] == "open":
                node.opened(src, conn.conn_no)
            else:
                for entry in item[1]:
                    node.received(src, conn.conn_no, entry.seq, amount=entry.amount, snapshot_id=entry.snapshot_id)
                node.end_frame()
        except core.ProtocolError as exc:
            self._route(dst)
            raise Violation(f"{dst}: protocol error on {src}->{dst}: {exc}") from None
        self._route(dst)

    def deliver_back(self, channel: tuple[str, str], conn: Conn) -> None:
        src, dst = channel
        seq = conn.back.popleft()
        node = self.nodes[src]
        if node is None:
            return
        if node.fence(conn.cluster_epoch):
            self.faults["stale epoch refused"] += 1
            return
        try:
            if not conn.eager and not conn.resumed and self.conns[channel] is conn:
                conn.resumed = True
                node.connect(dst, conn.conn_no, resume=seq)
            else:
                node.acked(dst, conn.conn_no, seq)
        except core.ProtocolError as exc:
            raise Violation(f"{src}: protocol error on the acks of {src}->{dst}: {exc}") from None
        self._route(src)

    # -- the controller

    def start_snapshot(self, rng: random.Random) -> None:
        if not self.controller_up:
            return
        sid = f"s{len(self.snapshots) + 1}"
        initiator = rng.choice(self.ids)
        snap = self.snapshots[sid] = Snapshot("IN_PROGRESS", self.now + DEADLINE, epoch=self.epoch)
        node = self.nodes[initiator]
        if node is None or node.fence(self.epoch):
            snap.status = "FAILED"  # StartSnapshot failed: nothing was recorded
            return
        node.start_snapshot(sid)
        self._route(initiator)

    def deliver_report(self) -> None:
        node_id, state = self.reports.popleft()
        snap = self.snapshots.get(state.snapshot_id)
        if not self.controller_up or snap is None or snap.status != "IN_PROGRESS" or node_id in snap.reports:
            return
        snap.reports[node_id] = state
        if len(snap.reports) == len(self.ids):
            snap.status = "COMPLETE"
            self.faults["snapshot complete"] += 1
            self.checker.check_complete(state.snapshot_id, snap.reports, snap.epoch)
            if self.mode == "overtake" and self._overtaken(snap.reports):
                self.faults["overtaken transfers recorded"] += 1

    def _overtaken(self, reports: dict[str, core.FullState]) -> bool:
        """Did an early marker close a channel ahead of transfers the snapshot holds?"""
        return any(
            len(overtake.channel_state(reports, src, dst)) > len(reports[dst].channels.get(src, ()))
            for src, dst in self.channels
        )

    def fail(self, sid: str, reason: str) -> None:
        self.snapshots[sid].status = "FAILED"
        self.faults[f"snapshot failed: {reason}"] += 1
        for node_id, node in self.nodes.items():
            if node is not None:
                node.abort_snapshot(sid, reason)
                self._route(node_id)

    def tick(self, dt: float) -> None:
        self.now += dt
        if self.controller_up:
            for sid, snap in self.snapshots.items():
                if snap.status == "IN_PROGRESS" and self.now >= snap.deadline:
                    self.fail(sid, "deadline")
        for node_id, node in self.nodes.items():
            if node is not None:
                node.tick(self.now)
                self._route(node_id)

    def restart_controller(self) -> None:
        self.controller_up = True
        # The gate is rebuilt from the journal's newest restore (resumed if it was running).
        self.gate = restoregate.RestoreGate()
        if self.last_restore is not None:
            sid, key, epoch = self.last_restore
            self.gate.taken_back(sid, key, (sid, epoch), running=self.restoring is not None)
        self.rolled_back = Counter({k: n for k, n in self.rolled_back.items() if self.last_restore and k == self.last_restore[1]})
        for sid, snap in self.snapshots.items():
            if snap.status == "IN_PROGRESS":
                self.fail(sid, "controller restarted")

    # -- restore (issue 10)

    def start_restore(self, rng: random.Random) -> None:
        complete = [sid for sid, snap in self.snapshots.items() if snap.status == "COMPLETE"]
        if not self.controller_up or self.restoring is not None or not complete:
            return
        sid = rng.choice(complete)
        if isinstance(self.gate.request(sid, "", self.now), restoregate.Start):
            self._begin_restore(sid, "")

    def _begin_restore(self, sid: str, key: str) -> None:
        """The gate said Start: roll back to `sid` in a new epoch."""
        if self.restoring is not None:
            raise Violation(f"restore: a second restore ({sid}) started while the restore of {self.restoring} runs")
        if key:
            self.rolled_back[key] += 1
            if self.rolled_back[key] > 1:
                raise Violation(f"restore: request_id {key!r} rolled back a second time (to {sid})")
        self.epoch += 1
        self.restoring = sid
        self.restore_key = key
        self.last_restore = (sid, key, self.epoch)
        self.faults["restore"] += 1
        for other, snap in self.snapshots.items():
            if snap.status == "IN_PROGRESS":
                self.fail(other, f"restored to {sid}")

    def restore_one(self, rng: random.Random, crash: bool = True) -> None:
        """The controller's RestoreState reaches one node that does not have it yet."""
        sid = self.restoring
        if sid is None or not self.controller_up:
            return
        behind = [i for i, n in self.nodes.items() if n is not None and (n.epoch < self.epoch or n.restore_incomplete)]
        if not behind:
            if all(n is not None for n in self.nodes.values()):
                self.restoring = None  # every node has it: RESTORED
                self.gate.finished((sid, self.epoch))
            return
        node_id = rng.choice(behind)
        node = self.nodes[node_id]
        reports = self.snapshots[sid].reports
        in_flight = [(src, t.msg_id, t.seq, t.amount) for src, t in overtake.in_flight_towards(reports, node_id)]
        node.restore(snapshot_id=sid, epoch=self.epoch, balance=reports[node_id].balance, in_flight=in_flight)  # type: ignore[union-attr]
        self._route(node_id)
        # Every stream of the older epoch ends, with what is on its wires.
        for channel in self.channels:
            if node_id in channel:
                self.cut(channel, keep_wire=False)
        self.stale = [(c, conn) for c, conn in self.stale if node_id not in c]
        if crash and rng.random() < 0.25:
            self.faults["crash during a restore"] += 1
            self.crash(node_id, rng)

    def restore_calls(self, *, always: bool = False) -> None:
        """Clients call RestoreSnapshot: one call, a retry, or a burst of concurrent calls."""
        rng = self.restore_rng
        if (not always and rng.random() >= 0.04) or not self.controller_up or not self.snapshots:
            return
        for _ in range(rng.choice([1, 1, 2, 3])):
            keys = list(self.key_snapshot)
            roll = rng.random()
            if keys and roll < 0.4:  # a retry of an earlier call
                key = rng.choice(keys)
                sid = self.key_snapshot[key]
            elif keys and roll < 0.5:  # an earlier key, another snapshot
                key, sid = rng.choice(keys), self._restore_target(rng)
            else:
                sid = self._restore_target(rng)
                key = ""
                if rng.random() < 0.7:
                    self.next_restore_key += 1
                    key = f"k{self.next_restore_key}"
            self.restore_call(sid, key)

    def _restore_target(self, rng: random.Random) -> str:
        """Mostly a COMPLETE snapshot (so calls start, join, get answers and Busy), sometimes any."""
        complete = sorted(sid for sid, snap in self.snapshots.items() if snap.status == "COMPLETE")
        if complete and rng.random() < 0.85:
            return rng.choice(complete)
        return rng.choice(sorted(self.snapshots))

    def settle_restore_calls(self) -> None:
        """Once snapshots have completed: rounds of calls, each round moving the restore on by one node."""
        rng = self.restore_rng
        for _ in range(rng.randint(0, 8)):
            self.restore_calls(always=True)
            if self.restoring is not None:
                self.restore_one(rng)
            if rng.random() < 0.1:  # the controller crashes and comes back: the gate is rebuilt from the journal
                self.faults["controller crash"] += 1
                self.restart_controller()
            for node_id in self.ids:
                if self.nodes[node_id] is None:
                    self._start_node(node_id)
            self._drain_all()

    def restore_call(self, sid: str, key: str) -> None:
        status = self.snapshots[sid].status
        problem = "" if status == "COMPLETE" else f"snapshot {sid} is {status}, not COMPLETE"
        known = self.key_snapshot.get(key) if key else None
        decision = self.gate.request(sid, key, self.now, problem)
        kind = type(decision)
        if kind is restoregate.Start:
            if key:
                self.key_snapshot.setdefault(key, sid)
            self._begin_restore(sid, key)
            self.faults["restore call started a restore"] += 1
        elif kind is restoregate.Join:
            if self.restoring != sid:
                raise Violation(f"restore: a call for {sid} joined the restore of {self.restoring}")
            self.faults["restore call joined the running restore"] += 1
        elif kind is restoregate.Answer:
            if decision.result is None or decision.result[0] != sid:
                raise Violation(f"restore: a retry of {key!r} for {sid} was answered {decision.result!r}")
            self.faults["restore retry answered, not rolled back"] += 1
        elif kind is restoregate.Busy:
            if self.restoring is None or self.restoring == sid:
                raise Violation(f"restore: a call for {sid} refused busy while {self.restoring} runs")
            self.faults["restore refused: another restore runs"] += 1
        elif decision.code == "INVALID_ARGUMENT":
            if known is None or known == sid:
                raise Violation(f"restore: {key!r} for {sid} refused: {decision.message}")
            self.faults["restore refused: key of another snapshot"] += 1
        else:
            self.faults["restore refused: not restorable"] += 1

    # -- clients

    def transfer(self, node_id: str, dst: str, amount: int, request_id: str) -> None:
        node = self.nodes[node_id]
        if node is None or node.fence_clients():  # UNAVAILABLE: the client retries
            self.unanswered.append((node_id, dst, amount, request_id))
            return
        # Every retry says when it was first sent: one older than the node's window
        # is refused (requests.RequestExpired), never paid again.
        first = self.first_sent.setdefault(request_id, self.wall) if request_id else 0.0
        try:
            answer = node.transfer(dst, amount, request_id, wall=self.wall, first_sent_unix_ms=int(first * 1000))
        except link.ChannelFull:
            self.faults["transfer refused: channel full"] += 1
            self._route(node_id)
            return
        except core.LocalProtocolError as exc:
            if exc.kind in (core.Refusal.REQUESTS_FULL, core.Refusal.REQUEST_UNKNOWN):
                self.faults[f"request refused: {exc.kind.value}"] += 1
            self._route(node_id)
            return
        self._route(node_id)
        if answer.repeated:
            self.faults["retry answered, not paid"] += 1
        self.replies.append((node_id, answer, request_id, dst, amount))
        if request_id and self.rng.random() < 0.3:
            self.unanswered.append((node_id, dst, amount, request_id))  # the client will retry it

    # -- the schedule

    def step(self) -> None:
        self.restore_calls()
        rng = self.rng
        if rng.random() < 0.03:
            if self.restoring is None:
                self.start_restore(rng)
            else:
                self.restore_one(rng)
            return
        roll = rng.random()
        live = [i for i in self.ids if self.nodes[i] is not None]
        if roll < 0.22 and live:
            src = rng.choice(live)
            if self.outgoing[src]:
                dst = rng.choice(self.outgoing[src])
                amount = rng.randint(1, max(1, self.nodes[src].balance // 2 + 2))  # type: ignore[union-attr]
                rid = ""
                if rng.random() < 0.3:
                    self.next_request += 1
                    rid = f"r{self.next_request}"
                self.transfer(src, dst, amount, rid)
        elif roll < 0.27 and self.unanswered:
            self.transfer(*self.unanswered.pop(rng.randrange(len(self.unanswered))))
        elif roll < 0.42 and live:
            node_id = rng.choice(live)
            self.durable(node_id, rng.randint(1, 1 + len(self.disks[node_id].pending)))
        elif roll < 0.62:
            self._deliver_one(rng)
        elif roll < 0.70:
            self.connect(rng.choice(self.channels))
        elif roll < 0.75:
            self.start_snapshot(rng)
        elif roll < 0.80 and self.reports:
            self.deliver_report()
        elif roll < 0.86:
            self.tick(rng.uniform(0.1, 1.5))
        elif roll < 0.89:
            self.cut(rng.choice(self.channels), keep_wire=rng.random() < 0.5)
        elif roll < 0.92 and live:
            self.crash(rng.choice(live), rng)
        elif roll < 0.95:
            down = [i for i in self.ids if self.nodes[i] is None]
            if down:
                self._start_node(rng.choice(down))
                self.faults["node restart"] += 1
        elif roll < 0.97:
            if self.partition is None and len(self.ids) > 1:
                side = {i: rng.randint(0, 1) for i in self.ids}
                self.partition = side
                self.faults["partition"] += 1
                for channel in self.channels:
                    if side[channel[0]] != side[channel[1]]:
                        self.cut(channel, keep_wire=rng.random() < 0.5)
            else:
                self.partition = None
        elif roll < 0.985:
            self.faults["controller crash"] += self.controller_up
            self.controller_up = False
            self.reports.clear()
        else:
            if not self.controller_up:
                self.restart_controller()

    def _deliver_one(self, rng: random.Random) -> None:
        if self.stale and rng.random() < 0.3:
            index = rng.randrange(len(self.stale))
            channel, conn = self.stale[index]
            self.faults["stale frame delivered"] += 1
            if conn.forward:
                self.deliver_forward(channel, conn)
            elif conn.back:
                self.deliver_back(channel, conn)
            if not conn.forward and not conn.back:
                self.stale.pop(index)
            return
        busy = [(c, conn) for c, conn in self.conns.items() if conn is not None and (conn.forward or conn.back)]
        if not busy:
            return
        channel, conn = rng.choice(busy)
        if conn.forward and (not conn.back or rng.random() < 0.5):
            self.deliver_forward(channel, conn)
        else:
            self.deliver_back(channel, conn)

    def check(self) -> None:
        live = {i: n for i, n in self.nodes.items() if n is not None}
        self.checker.check_step(live, self.now)

    def settle(self) -> None:
        """Faults stop: heal, restart, deliver everything, let every deadline pass."""
        self.partition = None
        self.stale.clear()
        if not self.controller_up:
            self.restart_controller()
        for node_id in self.ids:
            if self.nodes[node_id] is None:
                self._start_node(node_id)
        self._drain_all()
        self.settle_restore_calls()
        if self.rng.random() < 0.5:  # one more restore, with crashes in it, once snapshots have completed
            self.start_restore(self.rng)
        for _ in range(1000):
            if self.restoring is None:
                break
            self.restore_one(self.rng)
            for node_id in self.ids:
                if self.nodes[node_id] is None:
                    self._start_node(node_id)
        for unanswered in self.unanswered:
            self.transfer(*unanswered)
        self.unanswered.clear()
        for _ in range(3):
            self._drain_all()
            self.tick(TTL + DEADLINE)
        self._drain_all()
        live = {i: n for i, n in self.nodes.items() if n is not None}
        self.checker.check_step(live, self.now)
        self.checker.check_quiescent(live, {sid: s.status for sid, s in self.snapshots.items()})

    def _drain_all(self) -> None:
        for _ in range(10_000):
            moved = False
            for node_id in self.ids:
                if self.disks[node_id].pending:
                    self.durable(node_id, len(self.disks[node_id].pending))
                    moved = True
            for channel in self.channels:
                if self.conns[channel] is None:
                    self.connect(channel)
                    moved = moved or self.conns[channel] is not None
            for channel, conn in list(self.conns.items()):
                while conn is not None and (conn.forward or conn.back):
                    if conn.forward:
                        self.deliver_forward(channel, conn)
                    else:
                        self.deliver_back(channel, conn)
                    moved = True
                    conn = self.conns[channel]
            while self.reports:
                self.deliver_report()
                moved = True
            self.check()
            if not moved:
                return
        raise Violation("quiescent: the cluster never settled")


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


def run_case(seed: int) -> World:
    """One case; raises Violation (with the world's description) when an invariant breaks."""
    world = World(seed)
    try:
        for _ in range(world.steps):
            world.step()
            world.check()
        world.settle()
    except Violation as exc:
        raise Violation(f"{exc} [{world.describe()}, t={world.now:g}]") from None
    return world


def replay_command(seed: int) -> str:
    return f"snapmesh sim fuzz --seed {seed} --cases 1"


def fuzz(seed: int, cases: int) -> tuple[int, tuple[int, str] | None]:
    """Run `cases` cases from `seed` on; returns (cases run, (failing seed, why) or None)."""
    for index in range(cases):
        try:
            run_case(seed + index)
        except Violation as exc:
            return index + 1, (seed + index, str(exc))
        except Exception as exc:  # a crash of the code under test is a failure too
            return index + 1, (seed + index, f"{type(exc).__name__}: {exc}")
    return cases, None
