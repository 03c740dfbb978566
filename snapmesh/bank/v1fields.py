"""The bank's adapter on the controller's side: its v1 fields from its state bytes.

Through the app contract the bank's nodes record their balance as state bytes
(decimal ASCII, services/app/bank.py) and each transfer in flight as a payload
(the amount, decimal ASCII). Clients of the v1 API read the bank's figures
instead: each node's `balance`, each in-flight item's `amount`, the snapshot's
`total`, `expected_total` and `conserved`, and a restore's balance per node. This
module fills them (snapmesh/protocol/controller/v1fields.py, rules F1-F5), for
the bank only: the bank app names it (`App.v1_fields`) and the controller makes it
by that name (snapmesh/app/v1fields.py). A snapshot the bank took natively (before the app contract) already
carries them, from the nodes' tally: what it has is kept.

The sums and the expected total are the bank app's own (`decimal`,
`expected_total`): one implementation of its rules. Pure: messages in, fields set.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from snapmesh.app import View
from snapmesh.bank.wire import as_app_report
from snapmesh.services.app.bank import decimal, expected_total
from snapmesh.v1 import snapmesh_pb2 as pb


class BankFields:
    """The bank's V1Fields; `params` the cluster file's [app] table (its initial_balance, total)."""

    def __init__(self, params: Mapping[str, Any] = MappingProxyType({})) -> None:
        self.params = MappingProxyType(dict(params))

    def fill(self, snapshot: pb.Snapshot) -> None:
        try:
            balances = [_balance(n) for n in snapshot.nodes]
            amounts = [[_amount(t, c) for t in c.in_flight] for c in snapshot.channels]
            expected = expected_total(View(snapshot_id=snapshot.snapshot_id,
                                           states={n.node_id: b"" for n in snapshot.nodes}, in_flight=[],
                                           params=self.params))
        except (ValueError, TypeError):
            return  # F1: not the bank's bytes; its invariant `conserved` names what is wrong
        for node, balance in zip(snapshot.nodes, balances, strict=True):
            node.balance = balance
        for channel, column in zip(snapshot.channels, amounts, strict=True):
            for item, amount in zip(channel.in_flight, column, strict=True):
                item.amount = amount
        total = sum(balances) + sum(map(sum, amounts))
        snapshot.total, snapshot.expected_total, snapshot.conserved = total, expected, total == expected

    def node(self, entry: pb.NodeBalance, state: pb.FullState) -> None:
        """F4: the node's balance from the state its part carries (in blocks: left to `fill`)."""
        if state.HasField("state"):
            try:
                entry.balance = decimal(state.state, f"the state of {state.node_id}")
            except ValueError:
                return

    def restore_part(self, request: pb.RestoreStateRequest, entry: pb.NodeBalance) -> None:
        """F3: the node gets the bank app's bytes only. A part the bank recorded natively
        (a balance, amounts, no bytes) is given them here: its balance as the state, each
        amount as its message, both decimal ASCII, so every node restores one way."""
        if not request.HasField("state") and not entry.HasField("state"):
            request.state = str(entry.balance).encode()
        for channel in request.channels:
            for item in channel.in_flight:
                if not item.HasField("payload"):
                    item.payload = str(item.amount).encode()
                item.ClearField("amount")

    def old_report(self, state: pb.FullState) -> pb.FullState:
        """F5: a report the bank's native nodes sent (an older controller's journal
        holds them) as the bank app's nodes send it (snapmesh/bank/wire.py)."""
        return as_app_report(state)

    def restored(self, entry: pb.NodeBalance, request: pb.RestoreStateRequest) -> None:
        """The node's balance right after the restore: its recorded balance plus the
        amounts replayed to it (left absent when the part is not the bank's bytes)."""
        if not request.HasField("state"):
            return
        try:
            balance = decimal(request.state, f"the state of {entry.node_id}")
            replayed = sum(_amount(t, c) for c in request.channels for t in c.in_flight)
        except ValueError:
            return
        entry.balance = balance + replayed


def _balance(node: pb.NodeBalance) -> int:
    if node.HasField("state"):
        return decimal(node.state, f"the state of {node.node_id}")
    return node.balance  # recorded natively: the tally it carries


def _amount(item: pb.InFlightTransfer, channel: pb.ChannelState) -> int:
    if item.HasField("payload"):
        return decimal(item.payload, f"the message {channel.src}->{channel.dst} seq {item.seq}")
    return item.amount  # sent natively: its tally
