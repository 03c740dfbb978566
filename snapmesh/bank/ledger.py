"""The bank's side of the controller (snapmesh.protocol.controller.appside), pure.

The bank is the default app, and its fields are the v1 messages' own: a node
reports its balance (FullState.balance) and every transfer in flight with its
amount (InFlightTransfer.amount, OutboxRun.amounts); a COMPLETE snapshot shows
each node's balance, its `total` and whether it is `conserved`; a restore hands
each node its balance and answers with the balances after it. This module reads
and fills those fields for the tracker and the controller machine, which know
none of them. It sits in the pure layer (tests/checking/test_layers.py): the
tracker falls back to it, so it does no I/O either.

Rules (the tracker's T2 and T3 for the bank)
--------------------------------------------
L1. A report's balance is not negative, and every transfer it carries, recorded
    or in its outbox, has a positive amount; a report with an app's state bytes
    is refused (its node runs another app than the controller).
L2. The tally is money: total = recorded balances + in-flight amounts, and the
    snapshot is conserved when total == expected_total (the initial balances).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

from snapmesh.protocol.controller.appside import PartRefused
from snapmesh.v1 import snapmesh_pb2 as pb

_AMOUNT = operator.attrgetter("amount")


class BankSide:
    """The bank's AppSide; `expected_total` is what every snapshot must hold (L2)."""

    def __init__(self, expected_total: int = 0) -> None:
        self.expected_total = expected_total

    def part(self, state: pb.FullState, items: Mapping[str, list[pb.InFlightTransfer]]) -> dict[str, int]:
        node = state.node_id
        if state.HasField("state"):
            raise PartRefused(f"node {node!r} reported an app's state; the controller runs the bank")
        if state.balance < 0:
            raise PartRefused(f"node {node!r} reported a negative balance {state.balance}")
        tallies = {}
        for src, channel in items.items():
            amounts = list(map(_AMOUNT, channel))
            if min(amounts, default=1) <= 0:
                item = next(t for t in channel if t.amount <= 0)
                raise PartRefused(f"channel {src}->{node}: transfer {item.msg_id!r} has amount {item.amount}")
            tallies[src] = sum(amounts)
        for outbox in state.outbox:
            if min(map(_AMOUNT, outbox.in_flight), default=1) <= 0:
                item = next(t for t in outbox.in_flight if t.amount <= 0)
                raise PartRefused(f"outbox {node}->{outbox.dst}: transfer {item.msg_id!r} has amount {item.amount}")
        for run in state.outbox_runs:
            name = f"outbox_runs {node}->{run.dst}"
            if len(run.seqs) != len(run.amounts):
                raise PartRefused(f"{name}: {len(run.seqs)} seqs but {len(run.amounts)} amounts")
            if run.amounts and min(run.amounts) <= 0:
                raise PartRefused(f"{name}: amount {min(run.amounts)} is not positive")
        return tallies

    def node(self, entry: pb.NodeBalance, state: pb.FullState) -> int:
        entry.balance = state.balance
        return state.balance

    def item_columns(self, items: Sequence[pb.InFlightTransfer]) -> tuple[Sequence, ...]:
        return (list(map(_AMOUNT, items)),)

    def run_columns(self, run: pb.OutboxRun) -> tuple[Sequence, ...]:
        return (run.amounts,)

    def tally(self, items: Sequence[pb.InFlightTransfer]) -> int:
        return sum(map(_AMOUNT, items))

    def add(self, in_flight, src: str, dst: str, seqs: Sequence[int], columns: tuple[Sequence, ...],
            start: int, stop: int) -> int:
        (amounts,) = columns
        make = in_flight.add
        for seq, amount in zip(seqs[start:stop], amounts[start:stop], strict=True):
            make(msg_id=f"{src}:{dst}:{seq}", amount=amount, seq=seq)
        return sum(amounts[start:stop])

    def judge(self, snapshot: pb.Snapshot, tally: int) -> None:
        snapshot.total = tally
        snapshot.conserved = tally == self.expected_total
        snapshot.reason = "" if snapshot.conserved else f"total {tally} != expected {self.expected_total}"

    def restore_part(self, request: pb.RestoreStateRequest, entry: pb.NodeBalance) -> None:
        request.balance = entry.balance

    def restored(self, entry: pb.NodeBalance, answer: pb.RestoreStateResponse, request: pb.RestoreStateRequest) -> None:
        entry.balance = answer.balance
