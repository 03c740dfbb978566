"""The bank app as the controller sees it, for tests that drive the controller's machines.

The controller has no native bank: every app, the bank included, reports its
state as bytes and its messages as payloads, and the controller's checker
(snapmesh/protocol/appstate.py AppChecker, with the bank's v1 fields'
adapter, snapmesh/bank/v1fields.py) judges a COMPLETE snapshot and fills the v1
figures (`balance`, `amount`, `total`, `expected_total`, `conserved`) from them.
Here: the bank's checker, and its reports as a bank node sends them (the
balance as decimal ASCII state bytes, each amount in flight as a decimal ASCII
payload, the app's name and version), so a test states balances and amounts
and reads the same figures back from the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from snapmesh.app import load_app, v1fields
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller.tracker import Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

SPEC = "bank"  # the built-in name of snapmesh.services.app.bank:app
APP = load_app(SPEC)


def checker(total: int | None = None, **params: Any) -> AppChecker:
    """The controller's side of a bank cluster; `total` what every snapshot must hold
    (the [app] table's `total`; else initial_balance x nodes, the app's default)."""
    if total is not None:
        params["total"] = total
    return AppChecker(SPEC, APP, params=params, fields=v1fields.for_app(APP, params))


def tracker(topology: Topology, *, expected_total: int, deadline_s: float, **kwargs: Any) -> Tracker:
    """A Tracker of a bank cluster whose snapshots must hold `expected_total`."""
    return Tracker(topology=topology, deadline_s=deadline_s,
                   checker=checker(expected_total), **kwargs)


def money(amount: int) -> bytes:
    """A balance or an amount as the bank app writes it: decimal ASCII."""
    return str(amount).encode()


def item(msg_id: str, amount: int, seq: int) -> pb.InFlightTransfer:
    """A transfer in flight as a bank node reports it: its amount is its payload."""
    return pb.InFlightTransfer(msg_id=msg_id, seq=seq, payload=money(amount))


def items(src: str, dst: str, amounts: Iterable[int], first_seq: int = 1) -> list[pb.InFlightTransfer]:
    """Transfers src->dst with seqs from `first_seq` on, msg_id "src:dst:seq"."""
    return [item(f"{src}:{dst}:{seq}", a, seq) for seq, a in enumerate(amounts, first_seq)]


def outbox_run(src: str, dst: str, seqs: Sequence[int], amounts: Sequence[int], **fields: Any) -> pb.OutboxRun:
    """An overtake outbox, packed: the amounts as payloads."""
    return pb.OutboxRun(src=src, dst=dst, seqs=seqs, payloads=[money(a) for a in amounts], **fields)


def report(snapshot_id: str, node: str, balance: int,
           channels: Mapping[str, Sequence[pb.InFlightTransfer]] | Iterable[pb.ChannelState] = (),
           **fields: Any) -> pb.FullState:
    """A bank node's FullState: `balance` as its state bytes; `channels` its ChannelStates,
    or its recorded items by source."""
    if isinstance(channels, Mapping):
        channels = [pb.ChannelState(src=src, dst=node, in_flight=list(recorded)) for src, recorded in channels.items()]
    return pb.FullState(snapshot_id=snapshot_id, node_id=node, state=money(balance), app_name=APP.name,
                        app_version=APP.version, channels=list(channels), **fields)


def pair_report(snapshot_id: str, node: str, balance: int) -> pb.FullState:
    """Node a's or b's FullState in a two-node cluster (a <-> b), nothing in flight to it."""
    other = "b" if node == "a" else "a"
    return report(snapshot_id, node, balance, channels=[pb.ChannelState(src=other, dst=node)])
