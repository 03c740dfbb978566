"""An app's snapshot on the wire and its verdict, pure (snapmesh.app).

The node machine records an app's state as its `snapshot()` bytes and every
message in flight as its payload; this module is where those meet the public
messages: a node's report carries them (`in_flight_item`), the tracker keeps
them in the COMPLETE snapshot (`NodeBalance.state`, `InFlightTransfer.payload`),
and `AppChecker.judge` runs the app's invariants over it.

Rules
-----
V1. A COMPLETE snapshot of an app cluster says which app (`Snapshot.app.spec`) and
    whether it was checked: CHECKED with one InvariantResult per invariant (ok,
    or the app's problems), or UNCHECKED when the controller could not load the
    app's module: it completes all the same, and nothing is claimed.
V2. A check that raises or returns something other than a list is a failed
    invariant naming what happened (snapmesh.app.check_invariants), never a
    crash of the controller.
V3. The v1 figures (a node's, an in-flight item's, `total`, `expected_total`,
    `conserved`) are an app's only when it has an adapter (`fields`, the class the
    app names, `App.v1_fields`: snapmesh/protocol/controller/v1fields.py); else they stay absent,
    and whether a snapshot may be restored is its invariants' call
    (snapmesh.protocol.controller.restoreplan.problem).
V5. A COMPLETE snapshot says which app and version recorded it: each node's entry
    its report's (`app_name`, `app_version`), and `Snapshot.app` the nodes' one
    name and their version (the oldest, when they differ: a restore upgrades each
    part from its own). A restore into other code upgrades it first
    (snapmesh/protocol/upgrade.py).
V6. A snapshot whose nodes ran another version than the app the controller loaded
    (`Snapshot.app.version`, the oldest, is not the app's) is not judged by the
    loaded version's invariants, which read that version's encoding: it completes
    UNCHECKED, its reason naming both versions. Its invariants are checked at its
    restore, on the upgraded states (snapmesh/protocol/upgrade.py). So a controller
    restarted on version 2 that rebuilds a version 1 snapshot from its journal (not
    from its file, which keeps version 1's verdict) does not call it broken.
V4. Which side checks a cluster's snapshots (`side_for`): the app's, the bank's
    too (it runs as an app; the tracker has no default side). An app the controller cannot
    load is a refusal when it was asked for by name (`--app`: the AppError goes
    up); else its snapshots complete UNCHECKED (V1), and the controller says why once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from snapmesh.app import App, AppError, View, check_invariants
from snapmesh.protocol.controller.appside import PartRefused
from snapmesh.protocol.controller.v1fields import V1Fields
from snapmesh.protocol.lazystates import NodeStates
from snapmesh.v1 import snapmesh_pb2 as pb

CHECKED = pb.AppCheck.CHECKED
UNCHECKED = pb.AppCheck.UNCHECKED


def digest(state: bytes) -> str:
    """"sha256:<hex>" of an app's state bytes: the whole form (statedigest.py SD1), what
    GetState shows and what the controller computes for a state a report did not digest."""
    return "sha256:" + hashlib.sha256(state).hexdigest()


def in_flight_item(transfer: Any) -> pb.InFlightTransfer:
    """A recorded message (core.Transfer) as the report carries it: its id, seq and
    payload. The v1 figure stays absent: it is an adapter's reading of the payload (V3)."""
    return pb.InFlightTransfer(msg_id=transfer.msg_id, seq=transfer.seq, payload=transfer.payload)


def view_of(snapshot: pb.Snapshot, params: Mapping[str, Any] = MappingProxyType({})) -> View:
    """The app's `View` of a COMPLETE snapshot: each node's state bytes, read when
    asked for (lazystates.NodeStates: no copy of them all), and every in-flight
    payload as (src, dst, seq, payload), channel by channel in seq order."""
    return View(
        snapshot_id=snapshot.snapshot_id,
        states=NodeStates(snapshot),
        in_flight=[
            (channel.src, channel.dst, item.seq, item.payload)
            for channel in snapshot.channels
            for item in channel.in_flight
        ],
        params=params,
    )


def carries_v1(snapshot: pb.Snapshot) -> bool:
    """Whether a snapshot carries the v1 fields (V3): one the bank took natively (no
    `app`), or an app's whose adapter filled them; else they are absent."""
    return not snapshot.HasField("app") or snapshot.HasField("conserved")


def clear_old_figures(snapshot: pb.Snapshot) -> None:
    """An app's snapshot stored before V3 carries the placeholders every app's had then
    (`total` and `expected_total` 0, `conserved` true, each node's and item's figure 0):
    clear them once it is read (after its checksum), so it reads as an app's taken
    now. Figures an adapter filled are never all zero with `conserved` (the bank's
    expected total is positive), except a bank of empty accounts, which loses nothing."""
    if not (snapshot.HasField("app") and snapshot.conserved and not snapshot.total and not snapshot.expected_total):
        return
    items = [t for c in snapshot.channels for t in c.in_flight]
    if any(getattr(n, NODE_FIGURE) for n in snapshot.nodes) or any(getattr(t, ITEM_FIGURE) for t in items):
        return
    for name in ("total", "expected_total", "conserved"):
        snapshot.ClearField(name)
    for node in snapshot.nodes:
        node.ClearField(NODE_FIGURE)
    for item in items:
        item.ClearField(ITEM_FIGURE)


NODE_FIGURE = pb.NodeBalance.DESCRIPTOR.fields_by_number[2].name  # the v1 figure of a node (snapmesh.proto)
ITEM_FIGURE = pb.InFlightTransfer.DESCRIPTOR.fields_by_number[2].name  # and of an in-flight item


def without_figures(part):  # noqa: ANN001, ANN201 - a NodeBalance or a ChannelState
    """`part` without the v1 figures an app's adapter read from its state bytes or
    payloads at the verdict (V3): what a repeat of the node's report can be compared with."""
    if isinstance(part, pb.NodeBalance):
        if not part.HasField("state"):
            return part
        bare = pb.NodeBalance()
        bare.CopyFrom(part)
        bare.ClearField(NODE_FIGURE)
        return bare
    if not any(t.HasField("payload") and t.HasField(ITEM_FIGURE) for t in part.in_flight):
        return part
    bare = type(part)()
    bare.CopyFrom(part)
    for item in bare.in_flight:
        if item.HasField("payload"):
            item.ClearField(ITEM_FIGURE)
    return bare


def failed_invariants(snapshot: pb.Snapshot) -> list[pb.InvariantResult]:
    """The invariants a checked snapshot found broken (none for the bank or an unchecked one)."""
    return [result for result in snapshot.app.invariants if not result.ok]


class AppChecker:
    """The controller's side of an app cluster (appside.AppSide; V1-V3): `spec` the
    app's module:attr, `app` the loaded App (None: the controller could not load
    it, and `why` says why), `params` the cluster file's [app] table. An app's
    fields are its state bytes (the tracker keeps them) and its messages'
    payloads, and what it checks is the app's invariants."""

    def __init__(
        self, spec: str, app: App | None, *, why: str = "", params: Mapping[str, Any] = MappingProxyType({}),
        fields: V1Fields | None = None,
    ) -> None:
        self.spec = spec
        self.app = app
        self.why = why
        self.params = MappingProxyType(dict(params))
        self.fields = fields  # the app's v1 fields' adapter (V3); None: they stay absent

    def part(self, state: pb.FullState, items: Mapping[str, list[pb.InFlightTransfer]]) -> None:
        for run in state.outbox_runs:
            if len(run.payloads) not in (0, len(run.seqs)):
                raise PartRefused(f"outbox_runs {state.node_id}->{run.dst}: {len(run.seqs)} seqs but "
                                  f"{len(run.payloads)} payloads")

    def node(self, entry: pb.NodeBalance, state: pb.FullState) -> None:
        """The state bytes are the tracker's to keep, the app's name and version the
        entry's (V5); its v1 figure is the adapter's (V3), else absent."""
        entry.app_name, entry.app_version = state.app_name, state.app_version
        if self.fields is not None:
            self.fields.node(entry, state)  # its figure, shown while the snapshot is in progress (F4)

    def item_columns(self, items: Sequence[pb.InFlightTransfer]) -> tuple[Sequence, ...]:
        return ([t.payload if t.HasField("payload") else None for t in items],)

    def run_columns(self, run: pb.OutboxRun) -> tuple[Sequence, ...]:
        return (run.payloads,)

    def add(self, in_flight, src: str, dst: str, seqs: Sequence[int], columns: tuple[Sequence, ...],
            start: int, stop: int) -> None:
        (payloads,) = columns
        make = in_flight.add
        for k in range(start, stop):
            make(msg_id=f"{src}:{dst}:{seqs[k]}", seq=seqs[k], payload=payloads[k] if payloads else None)

    def old_report(self, state: pb.FullState) -> pb.FullState:
        """A report journaled before the app's nodes had state bytes is its adapter's to
        map (V3: only an app with v1 figures had such reports); any other is as it is."""
        return state if self.fields is None else self.fields.old_report(state)

    def restore_part(self, request: pb.RestoreStateRequest, entry: pb.NodeBalance) -> None:
        """The state bytes and the payloads travel in the fields every app has; the v1
        figures an adapter filled (V3) are the controller's reading, not the node's input."""
        if self.fields is not None:
            self.fields.restore_part(request, entry)

    def restored(self, entry: pb.NodeBalance, answer: pb.RestoreStateResponse, request: pb.RestoreStateRequest) -> None:
        if self.fields is not None:
            self.fields.restored(entry, request)

    def judge(self, snapshot: pb.Snapshot) -> None:
        """Fill in a just COMPLETE snapshot's app fields (V1-V3)."""
        verdict = snapshot.app
        verdict.Clear()
        verdict.spec = self.spec
        names = sorted({n.app_name for n in snapshot.nodes if n.app_name})
        verdict.name = names[0] if names else (self.app.name if self.app is not None else "")
        verdict.version = min((n.app_version or 1 for n in snapshot.nodes), default=1)
        if self.fields is not None:
            self.fields.fill(snapshot)
        if self.app is None:
            verdict.status = UNCHECKED
            snapshot.reason = f"unchecked: {self.why}" if self.why else "unchecked"
            return
        if verdict.version != self.app.version:  # V6
            verdict.status = UNCHECKED
            snapshot.reason = (f"unchecked: recorded by version {verdict.version} of the app, and the controller runs "
                               f"version {self.app.version}: a restore checks the invariants on the upgraded states")
            return
        verdict.status = CHECKED
        results = check_invariants(self.app, view_of(snapshot, self.params))
        for name, problems in results.items():
            verdict.invariants.add(name=name, ok=not problems, problems=problems)
        broken = [f"{name}: {'; '.join(problems)}" for name, problems in results.items() if problems]
        snapshot.reason = ("invariant broken: " + " | ".join(broken)) if broken else ""


def side_for(
    spec: str, params: Mapping[str, Any], *, load: Callable[[str], App], explicit: bool,
    fields_for: Callable[[App, Mapping[str, Any]], V1Fields | None] = lambda app, params: None,
) -> tuple[AppChecker, str | None]:
    """V4: the side that checks the snapshots of a cluster running `spec` (the bank
    too: it runs as an app), with `load` the app loader and `fields_for` the v1
    fields' adapter the app names, made with its params (V3); and the warning to log,
    if any. An app, or the adapter it names, that does not load raises its AppError
    when `explicit`."""
    try:
        app = load(spec)
        fields = fields_for(app, params)
    except AppError as exc:
        if explicit:
            raise
        return (AppChecker(spec, None, why=str(exc), params=params),
                f"cannot load the app {spec} ({exc}): its snapshots complete unchecked")
    return AppChecker(spec, app, params=params, fields=fields), None
