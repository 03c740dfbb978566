"""What the controller asks of the app the nodes run, pure (the tracker's T6).

The tracker and the machine know what every app has in common: nodes, channels,
seqs, positions, outboxes, an app's state bytes and the topology. Whatever else a
report or a snapshot carries for the app, and what makes a COMPLETE snapshot
right, is the app's side's: it checks and reads those fields of a report, fills
them in the snapshot and in a restore, and judges the snapshot once it is whole.
The controller's side is snapmesh.protocol.appstate.AppChecker (an app through the
contract, snapmesh.app), the bank's too: the bank's v1 figures are filled from
its state bytes by its adapter (snapmesh/protocol/controller/v1fields.py).

The side speaks of states and payloads only: it returns no number for the
tracker to add up, and what a whole snapshot holds (a sum the app keeps, the v1
fields) the side reads from the states and payloads at `judge`. Reports carry
thousands of items, so the tracker calls a side once per report, node, outbox or
run of items, never once per item: a side reads and writes items a column at a
time (protobuf's C-level iteration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from snapmesh.v1 import snapmesh_pb2 as pb


class PartRefused(Exception):
    """A report whose app fields are wrong: the tracker refuses it (InvalidReport), naming this text."""


class AppSide(Protocol):
    def part(self, state: pb.FullState, items: Mapping[str, list[pb.InFlightTransfer]]) -> None:
        """Check the app's fields of a report the tracker found well formed
        (raise PartRefused): the node's own, its incoming channels' items
        (`items`, by src) and its outbox."""
        ...

    def node(self, entry: pb.NodeBalance, state: pb.FullState) -> None:
        """Fill a snapshot's entry for a node from its report (the tracker keeps its state bytes)."""
        ...

    def item_columns(self, items: Sequence[pb.InFlightTransfer]) -> tuple[Sequence, ...]:
        """The app's columns of outbox items sent one message each (FullState.outbox)."""
        ...

    def run_columns(self, run: pb.OutboxRun) -> tuple[Sequence, ...]:
        """The app's columns of a packed outbox (OutboxRun), as item_columns gives them."""
        ...

    def add(self, in_flight, src: str, dst: str, seqs: Sequence[int], columns: tuple[Sequence, ...],
            start: int, stop: int) -> None:
        """Add to `in_flight` the outbox items at [start, stop) of `seqs` and the
        columns (msg_id "src:dst:seq")."""
        ...

    def judge(self, snapshot: pb.Snapshot) -> None:
        """The snapshot is whole: fill its verdict, the v1 fields every client reads
        (`total`, `expected_total`, `conserved`, where the app has them, read from its
        states and payloads: restoreplan.problem restores no snapshot they call not
        conserved) and any of its own, and its reason ("" when it is right)."""
        ...

    def restore_part(self, request: pb.RestoreStateRequest, entry: pb.NodeBalance) -> None:
        """Fill a node's restore request with the app's fields of its snapshot entry."""
        ...

    def restored(self, entry: pb.NodeBalance, answer: pb.RestoreStateResponse, request: pb.RestoreStateRequest) -> None:
        """Fill a Restore's entry for a node from the node's answer to its part (`request`)."""
        ...

    def old_report(self, state: pb.FullState) -> pb.FullState:
        """A report an older controller journaled before the app's nodes had state
        bytes (its v1 figures only), as the app's nodes send it now; any other report
        as it is. The journal's replay maps each report once, as it reads it back."""
        ...
