"""The simulated network between node machines: connections that drop, arrive late or split.

Each channel has at most one live connection. A connection carries frames
forward (an open, then data) and acks back, one item at a time as the
schedule delivers them. Faults:

  cut         a connection drops what is on the wire, or leaves it to arrive
              later (stale): the connection's number must fence it (link L6)
  partition   the nodes split in two until heal; no connection crosses
  crash       a node's connections all drop (the world calls `cut` for each)

An eager connection's sender resends from its own last ack at once; otherwise
it waits for the receiver's first ack (its resume point), as the gRPC node does.

Epochs (node rule N8) are the node machine's: a connection opens in its
sender's epoch, and the receiver's `opened` refuses it (EpochFenced, changing
nothing) when the fence does, stale or not restored yet. The network only acts
on the refusal, as the gRPC node's Channel stream is aborted: the connection
ends with what is on its wire, and the sender dials again later. A node
redoing a restore cut short dials too, as the gRPC node does: its links started
over at the restore record, so all it can send is what the redo sends again (an
app's replies to the replays logged), and the receiver's fence decides. At a restore
the node machine's `EndStreams` names the connections to end (`end_streams`),
as the gRPC engine ends those streams.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from snapmesh.protocol.node import core
from snapmesh.protocol.node import machine as node_mod
from snapmesh.sim.invariants import Violation

Channel = tuple[str, str]


@dataclass(slots=True)
class Conn:
    conn_no: int  # the connection's number on its channel, each newer than the last
    eager: bool
    forward: deque = field(default_factory=deque)  # ("open",) / ("data", entries) to dst
    back: deque = field(default_factory=deque)  # acks to src
    resumed: bool = False
    cluster_epoch: int = 1  # the sender's epoch when it opened (ChannelOpen.epoch)


class Network:
    def __init__(
        self,
        channels: list[Channel],
        nodes: Mapping[str, node_mod.Node | None],
        route: Callable[[str], None],
        rng: random.Random,
        faults: Counter[str],
    ) -> None:
        self.channels = channels
        self.nodes = nodes  # the world's: a node is None while it is down
        self.route = route  # carry out a node's effects after each event
        self.rng = rng
        self.faults = faults
        self.conns: dict[Channel, Conn | None] = dict.fromkeys(channels)
        self.stale: list[tuple[Channel, Conn]] = []  # cut connections whose wires still deliver
        self.next_conn_no = dict.fromkeys(channels, 0)
        self.partition: dict[str, int] | None = None
        # Smart batching and receive-side marker priority (services/node/channels.py and
        # servicer.py: they cut a snapshot's latency under load), when set: a delivery
        # sometimes merges the data frames queued behind it on the wire into one, and the
        # receiver applies a frame's early markers (seq 0) first. Its own generator: the
        # world's draws stay as they were.
        self.batching: random.Random | None = None

    # -- effects of the node machines

    def transmit(self, src: str, effect: node_mod.Transmit) -> None:
        conn = self.conns[(src, effect.dst)]
        if conn is not None and conn.conn_no == effect.conn_no:
            conn.forward.append(("data", effect.entries))

    def ack(self, dst: str, effect: node_mod.Ack) -> None:
        conn = self.conns[(effect.src, dst)]
        if conn is not None and conn.conn_no == effect.conn_no:
            conn.back.append(effect.seq)

    # -- connections

    def reachable(self, a: str, b: str) -> bool:
        if self.nodes[a] is None or self.nodes[b] is None:
            return False
        return self.partition is None or self.partition[a] == self.partition[b]

    def connect(self, channel: Channel) -> None:
        src, dst = channel
        if self.conns[channel] is not None or not self.reachable(src, dst):
            return
        a = self.nodes[src]
        self.next_conn_no[channel] += 1
        conn = self.conns[channel] = Conn(self.next_conn_no[channel], eager=self.rng.random() < 0.5)
        conn.cluster_epoch = a.epoch  # type: ignore[union-attr]
        conn.forward.append(("open",))
        if conn.eager:
            a.connect(dst, conn.conn_no)  # type: ignore[union-attr]
            self.route(src)

    def cut(self, channel: Channel, keep_wire: bool) -> None:
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

    def cut_all(self, node_id: str) -> None:
        """Every connection of `node_id` ends, with what is on its wires."""
        for channel in self.channels:
            if node_id in channel:
                self.cut(channel, keep_wire=False)

    def end_streams(self, node_id: str, effect: node_mod.EndStreams) -> None:
        """The node's EndStreams: those channels' connections end, with what is on their wires (stale ones too)."""
        named = {(node_id, dst) for dst in effect.outgoing} | {(src, node_id) for src in effect.incoming}
        for channel in self.channels:
            if channel in named:
                self.cut(channel, keep_wire=False)
        self.stale = [(c, conn) for c, conn in self.stale if c not in named]

    def split(self, rng: random.Random, ids: list[str]) -> None:
        """A partition starts (nodes on two sides, connections across cut), or heals."""
        if self.partition is None and len(ids) > 1:
            side = {i: rng.randint(0, 1) for i in ids}
            self.partition = side
            self.faults["partition"] += 1
            for channel in self.channels:
                if side[channel[0]] != side[channel[1]]:
                    self.cut(channel, keep_wire=rng.random() < 0.5)
        else:
            self.partition = None

    def heal(self) -> None:
        self.partition = None
        self.stale.clear()

    # -- delivery

    def _refused(self, channel: Channel, conn: Conn) -> None:
        """The receiver's machine refused the open (EpochFenced): the connection
        ends with what is on its wire; the sender dials again later."""
        self.faults["stale epoch refused"] += 1
        conn.forward.clear()
        conn.back.clear()
        if self.conns[channel] is conn:
            self.conns[channel] = None
            src = self.nodes[channel[0]]
            if src is not None:
                src.disconnect(channel[1])

    def deliver_forward(self, channel: Channel, conn: Conn) -> bool:
        """One item to the receiver; False when its machine refused the open (nothing moved)."""
        src, dst = channel
        item = conn.forward.popleft()
        node = self.nodes[dst]
        if node is None:
            return True
        try:
            if item[0] == "open":
                try:
                    node.opened(src, conn.conn_no, epoch=conn.cluster_epoch)  # the node's own fence (N8)
                except node_mod.EpochFenced:
                    self._refused(channel, conn)
                    return False
            else:
                entries = item[1] if self.batching is None else self._merged(conn, item[1])
                for entry in entries:
                    node.received(
                        src, conn.conn_no, entry.seq, last_seq=entry.last_seq, snapshot_id=entry.snapshot_id,
                        payload=entry.payload,
                    )
                node.end_frame()
        except core.ProtocolError as exc:  # an app's AppFailed too: a FIFO lossless channel cannot skip a message
            self.route(dst)
            raise Violation(f"{dst}: protocol error on {src}->{dst}: {exc}") from None
        self.route(dst)
        return True

    def _merged(self, conn: Conn, entries: tuple) -> list:
        """The frame the gRPC node applies for the data frame `entries` (batching on): the sender
        may merge it with the data frames written after it (stopping at anything else), and the
        receiver applies early markers first, every other entry in its place."""
        merged = list(entries)
        if self.batching is not None and self.batching.random() < 0.5:
            while conn.forward and conn.forward[0][0] == "data":
                merged += conn.forward.popleft()[1]
        early = [e for e in merged if e.seq == 0 and e.snapshot_id]
        if early:
            self.faults["early marker applied first"] += int(any(e.seq or not e.snapshot_id for e in merged[: len(early)]))
            merged = early + [e for e in merged if not (e.seq == 0 and e.snapshot_id)]
        return merged

    def deliver_back(self, channel: Channel, conn: Conn) -> None:
        src, dst = channel
        seq = conn.back.popleft()
        node = self.nodes[src]
        if node is None:
            return
        try:
            if not conn.eager and not conn.resumed and self.conns[channel] is conn:
                conn.resumed = True
                node.connect(dst, conn.conn_no, resume=seq)
            else:
                node.acked(dst, conn.conn_no, seq)
        except core.ProtocolError as exc:
            raise Violation(f"{src}: protocol error on the acks of {src}->{dst}: {exc}") from None
        self.route(src)

    def deliver_one(self, rng: random.Random) -> None:
        """One item off one wire: sometimes a stale connection's, else a live one's."""
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

    def drain(self) -> bool:
        """Open what can open and deliver everything on the live wires; True if anything moved
        (an open the receiver refused is no move: it is dialed again at the next drain)."""
        moved = False
        for channel in self.channels:
            if self.conns[channel] is None:
                self.connect(channel)
        for channel, conn in list(self.conns.items()):
            while conn is not None and (conn.forward or conn.back):
                if conn.forward:
                    moved = self.deliver_forward(channel, conn) or moved
                else:
                    self.deliver_back(channel, conn)
                    moved = True
                conn = self.conns[channel]
        return moved
