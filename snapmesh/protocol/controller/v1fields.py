"""An app's v1 fields, what the controller fills beside its invariants (appstate.AppChecker).

The v1 messages carry one app's figures of its own (field 2 of NodeBalance and
of InFlightTransfer, a snapshot's `total`, `expected_total` and whether it is
`conserved`, a restore's figure per node: snapmesh.proto). They are optional:
absent for an app that has no adapter, whose snapshots say only what its
invariants found (`Snapshot.app`). An adapter reads an app's state bytes and payloads and fills
them; the app names its class ("module:attr", `App.v1_fields`) and the controller's
shell makes it by that name (snapmesh/app/v1fields.py `for_app`), never importing
it, so nothing below the edge knows the app.

Rules
-----
F1. `fill` runs once a snapshot is COMPLETE and its invariants are judged; what
    it cannot read (a state or payload the app would not write) it leaves absent,
    and never raises: the app's invariants say what is wrong with it.
F2. The invariants remain the check: a restore is refused for a broken invariant
    whatever the fields say, and for a snapshot the fields call not `conserved`.
F3. A node's part of a restore carries the app's bytes only (`restore_part`): a
    part recorded before the app had bytes (its figures only: a snapshot of the
    bank's native nodes) is given them from its figures, so every node restores
    through its app.
F4. A node's own figure is filled as its part arrives (`node`), so a snapshot in
    progress shows it for the nodes that reported, as the bank's always did; the
    rest wait for `fill`. What it cannot read it leaves absent (F1).
F5. A report an older controller journaled before the app's nodes had bytes
    (its figures only) is mapped by the adapter, once, as the journal is read
    back (`old_report`): the tracker then reads it as the app's nodes send it
    now. The framework keeps no figure to read it by.
"""

from __future__ import annotations

from typing import Protocol

from snapmesh.v1 import snapmesh_pb2 as pb


class V1Fields(Protocol):
    def fill(self, snapshot: pb.Snapshot) -> None:
        """Fill a just COMPLETE snapshot's v1 fields from its nodes' states and its payloads (F1)."""
        ...

    def node(self, entry: pb.NodeBalance, state: pb.FullState) -> None:
        """Fill a node's own figure from its part as the part arrives (F4)."""
        ...

    def restore_part(self, request: pb.RestoreStateRequest, entry: pb.NodeBalance) -> None:
        """Clear the figures `fill` set from a node's part of a restore: the node takes
        the app's bytes only, as they were recorded (`entry`: the node's in the
        snapshot; a part recorded before the app had bytes is given them from it)."""
        ...

    def old_report(self, state: pb.FullState) -> pb.FullState:
        """A report journaled before the app's nodes had bytes, as they send it now;
        any other report as it is (F5)."""
        ...

    def restored(self, entry: pb.NodeBalance, request: pb.RestoreStateRequest) -> None:
        """Fill a Restore's entry for a node from the part it took (`request`: its
        recorded state and the in-flight messages replayed to it)."""
        ...
