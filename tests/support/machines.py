"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

from snapmesh.app import load_app
from snapmesh.protocol.node import core, recovery
from snapmesh.protocol import wal
from snapmesh.protocol.node.machine import Node
from snapmesh.protocol.node.effects import Ack, Append, EndStreams, Finished, Report, Seal, Submitted, Transmit


BANK = load_app("bank")  # every node hosts an app (node rule N10): these host the bank, loaded as the sim loads it


def pay(node: Node, dst: str, amount: int, request_id: str = "", **kw) -> Submitted:
    """`node` pays `amount` to `dst`: the bank app's compact command (b"N NODE")."""
    return node.submit(b"%d %s" % (amount, dst.encode()), request_id, **kw)


def balance(node: Node) -> int:
    """The bank app's balance at `node` (its state: decimal ASCII)."""
    return int(node.app_state())


class Machines:
    """Nodes over in-memory links, each hosting the bank app (`balances`: each one's
    initial_balance); each node's log is a list of records, a prefix of
    which is durable. `settle()` makes everything durable and delivers everything."""

    node_class = Node

    def __init__(self, balances: dict[str, int], **node_kw) -> None:
        self.ids = list(balances)
        self.balances = balances
        self.node_kw = node_kw
        self.logs: dict[str, list[list[wal.Record]]] = {n: [[]] for n in self.ids}  # segments
        self.durable = dict.fromkeys(self.ids, 0)
        self.wires: dict[tuple[str, str], list] = {}
        self.conn_nos: dict[tuple[str, str], int] = {}
        self.reports: list[core.FullState] = []
        self.finished: dict[tuple[str, str], core.FullState] = {}  # (snapshot id, node) -> part, until Report
        self.handed_out: list[Finished] = []
        self.nodes: dict[str, Node] = {}
        for n in self.ids:
            self.start(n)

    def others(self, n: str) -> list[str]:
        return [m for m in self.ids if m != n]

    def start(self, n: str) -> None:
        lines = [(f"{n}.log.jsonl:{i}", wal.parse(wal.encode(r, n), "x", node_id=n))
                 for i, r in enumerate(self.logs[n][-1], start=1)]
        params = {"initial_balance": self.balances[n]}
        state = recovery.recover(
            lines, node_id=n, incoming=self.others(n), outgoing=self.others(n), app=BANK,
            app_params=params,
        )
        self.nodes[n] = self.node_class(node_id=n, incoming=self.others(n), outgoing=self.others(n), recovered=state, app=BANK,
                             app_params=params, **self.node_kw)
        self.route(n)

    def crash(self, n: str) -> None:
        """Lose what is not durable."""
        log = [r for seg in self.logs[n] for r in seg]
        kept = [r for r in log if r.lsn <= self.durable[n]]
        while sum(map(len, self.logs[n])) > len(kept):
            self.logs[n][-1].pop()
            if not self.logs[n][-1] and len(self.logs[n]) > 1:
                self.logs[n].pop()
        del self.nodes[n]
        for channel in list(self.wires):
            if n in channel:
                del self.wires[channel]

    def route(self, n: str) -> None:
        for effect in self.nodes[n].drain():
            if isinstance(effect, Append):
                self.logs[n][-1].append(effect.record)
            elif isinstance(effect, Seal):
                self.logs[n].append([effect.checkpoint])
            elif isinstance(effect, Transmit):
                self.wires.setdefault((n, effect.dst), []).append(("data", effect.conn_no, effect.entries))
            elif isinstance(effect, Ack):
                self.wires.setdefault((effect.src, n), []).append(("ack", effect.conn_no, effect.seq))
            elif isinstance(effect, Finished):
                self.finished[effect.state.snapshot_id, n] = effect.state
                self.handed_out.append(effect)
            elif isinstance(effect, Report):
                self.reports.append(self.finished.pop((effect.snapshot_id, n)))
            elif isinstance(effect, EndStreams):  # the older epoch's wires end with what is on them
                for channel in [*((n, dst) for dst in effect.outgoing), *((src, n) for src in effect.incoming)]:
                    self.wires.pop(channel, None)

    def records(self, n: str) -> list[wal.Record]:
        return [r for seg in self.logs[n] for r in seg]

    def flush(self, n: str) -> None:
        self.durable[n] = self.records(n)[-1].lsn if self.records(n) else 0
        self.nodes[n].durable(self.durable[n])
        self.route(n)

    def connect_all(self) -> None:
        for src in self.nodes:
            for dst in self.nodes:
                if src != dst and (src, dst) not in self.wires:
                    conn_no = self.conn_nos[(src, dst)] = self.conn_nos.get((src, dst), 0) + 1
                    self.wires[(src, dst)] = []
                    self.nodes[dst].opened(src, conn_no, epoch=self.nodes[src].epoch)
                    self.route(dst)
                    self.nodes[src].connect(dst, conn_no)
                    self.route(src)

    def settle(self) -> None:
        for _ in range(100):
            self.connect_all()
            for n in self.nodes:
                self.flush(n)
            moved = False
            for (src, dst), wire in list(self.wires.items()):
                while wire:
                    moved = True
                    kind, conn_no, body = wire.pop(0)
                    if kind == "data":
                        for e in body:
                            self.nodes[dst].received(src, conn_no, e.seq, last_seq=e.last_seq, snapshot_id=e.snapshot_id,
                                                     payload=e.payload)
                        self.nodes[dst].end_frame()
                        self.route(dst)
                    else:
                        self.nodes[src].acked(dst, conn_no, body)
                        self.route(src)
            if not moved:
                return
        raise AssertionError("never settled")


def kinds(records: list[wal.Record]) -> list[str]:
    return [type(r).KIND for r in records]


def _snapshot_with_one_in_flight(m: Machines) -> dict[str, core.FullState]:
    pay(m.nodes["a"], "b", 30)
    m.nodes["b"].start_snapshot("s1")  # b records before the transfer reaches it: 30 in flight a->b
    m.route("a")
    m.route("b")
    m.settle()
    return {s.node_id: s for s in m.reports}


def _restore_all(m: Machines, parts: dict[str, core.FullState], epoch: int) -> None:
    for n, part in parts.items():
        in_flight = [(src, t.msg_id, t.seq, 0, t.payload) for src, ts in part.channels.items() for t in ts]
        m.nodes[n].restore(snapshot_id=part.snapshot_id, epoch=epoch, in_flight=in_flight, state=part.state)
        m.route(n)


def bank_restore(node: Node, *, snapshot_id: str, epoch: int, balance: int, in_flight=(), reply_to: object = None) -> bool:
    """`node.restore` for the bank app: `balance` its recorded state, each of `in_flight`
    (src, msg_id, seq, amount) a recorded message of the amount as decimal ASCII."""
    deliveries = [(src, msg_id, seq, 0, b"%d" % amount) for src, msg_id, seq, amount in in_flight]
    return node.restore(snapshot_id=snapshot_id, epoch=epoch, state=b"%d" % balance, in_flight=deliveries,
                        reply_to=reply_to)
