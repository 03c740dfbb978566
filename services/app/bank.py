"""The bank as an App: money moves between nodes, and a snapshot must find all of it.

The bank is what a cluster file without [app] runs (snapmesh.settings.appsettings
`hosted`: the file's top-level `initial_balance` becomes this app's), on the
generic path like any app: its v1 RPCs (`Transfer`, `TransferBatch`, `GetState`)
are an adapter over the node's edge (snapmesh/bank/edge.py), `Submit` takes
its commands, and the same Machine runs in snapmesh.app.testing. A log or a
snapshot the bank's former native nodes wrote (int64 tallies, no bytes) is read
as this app's.

State: the balance, as decimal ASCII (b"1000"). Message: an amount, as decimal
ASCII. Command: JSON {"to": NODE, "amount": N} pays N to NODE, answered with
{"balance": ...}; {"op": "balance"} reads it. The compact form, what the node's
v1 adapter (`snapmesh.v1.Node/Transfer`, snapmesh/bank/edge.py) sends:
b"N NODE" (the amount as a decimal integer, one space, the node) pays N to NODE,
answered with the balance after it as decimal ASCII (b"970"); its refusals are
the v1 Transfer's texts and codes. A query (on_query, any bytes) answers the
balance as decimal ASCII.

params (the cluster file's [app] table):
  initial_balance  each node's balance at the start (default 1000; a file that names the
                   bank by its own names, no [app] or module "bank", gives its top-level
                   `initial_balance` here unless this table names one)
  total            what the snapshot must hold in all; default initial_balance x nodes
  max_amount       the workload pays 1..max_amount (default 100)
Invariant "conserved": the balances plus the amounts in flight add up to the total.

Rescale (`rescale(view, nodes)`, onto another node set; the channels start empty)
BR1. A surviving account keeps its balance, plus every amount in flight to it.
BR2. A removed account's balance, and every amount in flight to it, goes to its heir:
     params "heirs" (a table removed node -> surviving node) names it; without one,
     the first surviving node in the new set's order. An heir that is not in the new
     set refuses the rescale.
BR3. An amount in flight from a removed account to a survivor reaches the survivor
     (BR1); one between two removed accounts goes to the receiver's heir. Nothing is
     lost or made: the balances after are the balances plus the amounts in flight
     before, so the total is kept.
BR4. A new account (not in the snapshot) starts at 0.
A rescale keeps the total, while the default expected total (initial_balance x nodes)
changes with the node count: set params "total" in the [app] table of a cluster that
rescales, or the rescaled states are refused ("conserved").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from snapmesh.app import App, Context, NodeInfo, View

DEFAULT_INITIAL_BALANCE = 1000
# A transfer as json.dumps writes it ({"to": "p2", "amount": 1}), a node id of plain characters and a
# positive amount: what json.loads would give, read in a fifth of its time. Any other text (spacing,
# key order, escapes, a zero or huge amount) goes through json.loads and its checks, as before.
_PLAIN_TRANSFER = re.compile(rb'\{"to": "([A-Za-z0-9_.:-]{1,128})", "amount": ([1-9][0-9]{0,17})\}')


def decimal(data: bytes, what: str) -> int:
    """A non-negative decimal ASCII integer, or ValueError naming `what`."""
    if not data.isdigit():
        raise ValueError(f"{what} is not decimal ASCII: {data[:40]!r}")
    return int(data)


class Bank:
    """One account (the rules of snapmesh/protocol/node/core.py's transfer, through the contract)."""

    def __init__(self, info: NodeInfo):
        self.me = info.node_id
        self.peers_out = info.peers_out
        self.balance = int(info.params.get("initial_balance", DEFAULT_INITIAL_BALANCE))
        # The compact command's node, as bytes -> its id: one dict lookup in place of a decode and a tuple scan.
        self._peer_of = {peer.encode(): peer for peer in self.peers_out}
        if self.balance < 0:
            raise ValueError(f"initial_balance must be >= 0, got {self.balance}")

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        if command[:1] != b"{":
            return self._pay(command, ctx)
        plain = _PLAIN_TRANSFER.fullmatch(command)
        if plain is not None:
            return self._transfer(plain[1].decode("ascii"), int(plain[2]), ctx)
        try:
            request = json.loads(command)
        except ValueError:
            ctx.refuse("INVALID_ARGUMENT", 'a command is JSON: {"to": NODE, "amount": N} or {"op": "balance"}')
        if request == {"op": "balance"}:
            return b'{"balance": %d}' % self.balance  # json.dumps's bytes, without it
        if not isinstance(request, dict) or set(request) != {"to", "amount"}:
            ctx.refuse("INVALID_ARGUMENT", 'a transfer is {"to": NODE, "amount": N}')
        return self._transfer(request["to"], request["amount"], ctx)

    def _transfer(self, dst: Any, amount: Any, ctx: Context) -> bytes:
        """The JSON form's transfer, its fields as json.loads gave them."""
        if dst not in self.peers_out:
            ctx.refuse("INVALID_ARGUMENT", f"no channel {self.me} -> {dst}; {self.me} pays {', '.join(self.peers_out)}")
        if type(amount) is not int or amount <= 0:
            ctx.refuse("INVALID_ARGUMENT", f"amount must be a positive integer, got {amount!r}")
        if amount > self.balance:
            ctx.refuse("FAILED_PRECONDITION", f"insufficient funds: {self.me} has {self.balance}, asked {amount}")
        ctx.send(dst, b"%d" % amount)
        self.balance -= amount
        return b'{"balance": %d}' % self.balance  # json.dumps({"balance": ...})'s bytes, without it

    def _pay(self, command: bytes, ctx: Context) -> bytes:
        """The compact form: b"N NODE" -> the balance after it (b"970"), refused as v1's Transfer is."""
        text, _, dst_bytes = command.partition(b" ")
        dst = self._peer_of.get(dst_bytes)
        # The common command: a peer, an amount in canonical decimal (no sign, spacing, underscore or
        # leading zero, so it is b"%d" % amount and is sent as it came) within the balance. Anything
        # else takes the checks below, which refuse it as before.
        if dst is not None and text.isdigit() and text[:1] != b"0":
            amount = int(text)
            if amount <= self.balance:
                ctx.send(dst, text)
                self.balance -= amount
                return b"%d" % self.balance
        return self._pay_checked(text, dst_bytes, ctx)

    def _pay_checked(self, text: bytes, dst_bytes: bytes, ctx: Context) -> bytes:
        """`_pay` of a command off its common path: every check, each refusal with v1's text."""
        try:
            amount, dst = int(text), dst_bytes.decode()
        except ValueError:  # UnicodeDecodeError too
            ctx.refuse("INVALID_ARGUMENT", 'a command is JSON: {"to": NODE, "amount": N} or {"op": "balance"},'
                                           ' or b"N NODE" (pay N to NODE)')
        me = self.me
        if not dst:
            ctx.refuse("INVALID_ARGUMENT", f"`to` is required: the node to pay ({', '.join(sorted(self.peers_out)) or 'none'})")
        if dst not in self.peers_out:
            if dst == me:
                ctx.refuse("INVALID_ARGUMENT", f"{me} cannot transfer to itself")
            ctx.refuse("INVALID_ARGUMENT", f"{me} has no channel to {dst!r}")
        if amount <= 0:
            ctx.refuse("INVALID_ARGUMENT", f"amount must be a positive integer, got {amount!r}")
        if amount > self.balance:
            ctx.refuse("FAILED_PRECONDITION", f"{me} cannot send {amount}: balance is {self.balance}")
        ctx.send(dst, b"%d" % amount)
        self.balance -= amount
        return b"%d" % self.balance

    def on_query(self, query: bytes) -> bytes:
        """Any query: the balance, as decimal ASCII."""
        return str(self.balance).encode()

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        if payload.isdigit():  # `decimal`'s check, without making its error text for every message
            self.balance += int(payload)
            return
        self.balance += decimal(payload, f"the amount from {src}")

    def snapshot(self) -> bytes:
        return str(self.balance).encode()

    def restore(self, state: bytes) -> None:
        self.balance = decimal(state, "a bank state")


def expected_total(view: View) -> int:
    """params["total"], else initial_balance (default 1000) times the number of nodes."""
    if "total" in view.params:
        return int(view.params["total"])
    return int(view.params.get("initial_balance", DEFAULT_INITIAL_BALANCE)) * len(view.states)


def _money(view: View) -> tuple[dict[str, int], list[tuple[str, str, int, int]]]:
    balances = {node: decimal(state, f"the state of {node}") for node, state in sorted(view.states.items())}
    moving = [(src, dst, seq, decimal(p, f"the message {src}->{dst} seq {seq}")) for src, dst, seq, p in view.in_flight]
    return balances, moving


def conserved(view: View) -> list[str]:
    balances, moving = _money(view)
    at_nodes, in_flight, total = sum(balances.values()), sum(m[3] for m in moving), expected_total(view)
    if at_nodes + in_flight == total:
        return []
    return [f"balances {at_nodes} + in flight {in_flight} = {at_nodes + in_flight}, not the total {total}"]


def describe(view: View) -> Mapping[str, Any]:
    balances, moving = _money(view)
    per_channel: dict[str, int] = {}
    for src, dst, _, amount in moving:
        per_channel[f"{src}->{dst}"] = per_channel.get(f"{src}->{dst}", 0) + amount
    return {"balances": balances, "in_flight": per_channel, "total": sum(balances.values()) + sum(per_channel.values()),
            "expected_total": expected_total(view)}


def balance_rows(view: View) -> list[Mapping[str, Any]]:
    balances, _ = _money(view)
    return [{"snapshot_id": view.snapshot_id, "node": node, "balance": b} for node, b in balances.items()]


def in_flight_rows(view: View) -> list[Mapping[str, Any]]:
    _, moving = _money(view)
    return [{"snapshot_id": view.snapshot_id, "src": s, "dst": d, "seq": q, "amount": a} for s, d, q, a in moving]


def total_rows(view: View) -> list[Mapping[str, Any]]:
    return [{"snapshot_id": view.snapshot_id, "expected_total": expected_total(view)}]


# A row per snapshot whose money does not add up.
CONSERVED = """
SELECT t.snapshot_id, t.expected_total, COALESCE(b.at_nodes, 0) + COALESCE(f.in_flight, 0) AS found
FROM bank_total t
LEFT JOIN (SELECT snapshot_id, SUM(balance) AS at_nodes FROM bank_balances GROUP BY snapshot_id) b
  ON b.snapshot_id = t.snapshot_id
LEFT JOIN (SELECT snapshot_id, SUM(amount) AS in_flight FROM bank_in_flight GROUP BY snapshot_id) f
  ON f.snapshot_id = t.snapshot_id
WHERE COALESCE(b.at_nodes, 0) + COALESCE(f.in_flight, 0) <> t.expected_total
"""


def heir(node: str, survivors: Sequence[str], params: Mapping[str, Any]) -> str:
    """BR2: who takes a removed account's money."""
    named = dict(params.get("heirs", {})).get(node)
    if named is None:
        return survivors[0]
    if named not in survivors:
        raise ValueError(f"params heirs[{node!r}] = {named!r} is not a node of the new set ({', '.join(survivors)})")
    return str(named)


def rescale(view: View, nodes: Sequence[NodeInfo]) -> dict[str, bytes]:
    """The new node set's balances (BR1-BR4), every amount in flight absorbed."""
    balances, moving = _money(view)
    ids = [info.node_id for info in nodes]
    survivors = [node for node in ids if node in balances] or ids
    new = dict.fromkeys(ids, 0)
    owed = [(node, amount) for node, amount in balances.items()] + [(dst, amount) for _, dst, _, amount in moving]
    for node, amount in owed:
        new[node if node in new else heir(node, survivors, view.params)] += amount
    return {node: str(balance).encode() for node, balance in new.items()}


def workload(nodes: Sequence[NodeInfo], rng: Any) -> Iterator[tuple[str, bytes]]:
    """Random transfers of 1..max_amount along random channels (some refused: insufficient funds)."""
    payers = [n for n in nodes if n.peers_out]
    top = int(payers[0].params.get("max_amount", 100)) if payers else 0
    while payers:
        node = rng.choice(payers)
        transfer = {"to": rng.choice(node.peers_out), "amount": rng.randint(1, top)}
        yield node.node_id, json.dumps(transfer).encode()  # {"to": ..., "amount": ...}: the node reads it without json.loads


app = App(
    name="bank",
    new=Bank,
    invariants={"conserved": conserved},
    describe=describe,
    views={"bank_balances": balance_rows, "bank_in_flight": in_flight_rows, "bank_total": total_rows},
    sql_invariants={"conserved": CONSERVED},
    workload=workload,
    rescale=rescale,
    v1_fields="snapmesh.bank.v1fields:BankFields",  # the v1 API's balances and totals, on the controller's side
    edge="snapmesh.bank.edge:BankEdge",  # its v1 calls (Transfer, TransferBatch, GetState) on its nodes
    old_logs="snapmesh.bank.oldlogs:NativeLogs",  # the logs of the bank's native nodes (commit 2b5e557's)
)
