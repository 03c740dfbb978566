"""A snapshot of an older version of the app, upgraded for this code, pure (snapmesh.app, Versions).

The controller restores a COMPLETE snapshot into the code it loaded (as
`--app` does). Each node's part says which version of the app recorded it
(`NodeBalance.app_version`, from its report; 0: a node from before versions,
read as 1). Before any node hears of a restore, `upgraded` makes the snapshot
this code's:

U1. Every part at this code's version: the snapshot goes as it is.
U2. A part newer than the code: refused, naming both versions. A version
    never goes backwards, since the older code cannot know the newer encoding.
U3. A part older than the code: its state goes through `App.upgrade(state,
    from_version)` and each payload its node sent that was in flight through
    `App.upgrade_message(payload, from_version)` (unchanged without one).
    Without `upgrade` the restore is refused, naming both versions.
U4. An `upgrade` or `upgrade_message` that raises, or returns something not
    bytes, refuses the restore, naming the node or channel and the exception.
U5. The upgraded states and payloads must keep the app's invariants (the
    checks the controller runs on every COMPLETE snapshot): a broken one
    refuses the restore, naming it.
U6. A snapshot of another app (by name) than the code is refused.

A refusal is `UpgradeRefused`, one line; the controller turns it into the
restore's refusal (FAILED_PRECONDITION) before the epoch moves, so nothing
changes anywhere. The upgrade is a pure function of the snapshot and the code:
a restore resumed after a controller restart runs it again and gets the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapmesh.app import App, check_invariants
from snapmesh.protocol.appstate import AppChecker, digest, view_of
from snapmesh.v1 import snapmesh_pb2 as pb


class UpgradeRefused(Exception):
    """The snapshot cannot be made this code's (U2-U6): one line saying why."""


def version_of(entry: pb.NodeBalance) -> int:
    """The version of the app that recorded a node's part (0, an old node's: 1)."""
    return entry.app_version or 1


def for_side(side: Any, snapshot: pb.Snapshot) -> pb.Snapshot:
    """`snapshot` as the code the controller loaded holds it: the side of an app it
    loaded upgrades it (U1-U6); the bank, or an app it could not load (appstate V1:
    no version to upgrade to), leaves it as it is."""
    if isinstance(side, AppChecker) and side.app is not None:
        return upgraded(snapshot, side.app, side.params)
    return snapshot


def upgraded(snapshot: pb.Snapshot, app: App, params: Mapping[str, Any]) -> pb.Snapshot:
    """`snapshot` as this code's version holds it (U1-U6): itself when nothing is older, else an upgraded copy."""
    sid = snapshot.snapshot_id
    names = {n.app_name for n in snapshot.nodes if n.app_name} | ({snapshot.app.name} if snapshot.app.name else set())
    if names - {app.name}:
        raise UpgradeRefused(f"snapshot {sid} was recorded by app {sorted(names)[0]!r}; this code is app {app.name!r}")
    versions = {n.node_id: version_of(n) for n in snapshot.nodes}
    newer = sorted({v for v in versions.values() if v > app.version})
    if newer:
        raise UpgradeRefused(
            f"snapshot {sid} was recorded by app {app.name!r} version {newer[-1]}, newer than this code's version"
            f" {app.version}: a version never goes backwards; restore it with the code of version {newer[-1]}"
        )
    older = sorted({v for v in versions.values() if v < app.version})
    if not older:
        return snapshot
    if app.upgrade is None:
        raise UpgradeRefused(
            f"snapshot {sid} holds app {app.name!r} version {older[0]}; this code is version {app.version} and has no"
            f" upgrade(state, from_version): give the App one, or restore the snapshot with the code of version {older[0]}"
        )
    copy = pb.Snapshot()
    copy.CopyFrom(snapshot)
    for entry in copy.nodes:
        if versions[entry.node_id] < app.version and entry.HasField("state"):
            entry.state = _call(app.upgrade, entry.state, versions[entry.node_id], f"upgrade(the state of {entry.node_id}")
            entry.state_digest = digest(entry.state)
        entry.app_name, entry.app_version = app.name, app.version
    if app.upgrade_message is not None:
        for channel in copy.channels:
            sender = versions.get(channel.src, app.version)
            if sender < app.version:
                for item in channel.in_flight:
                    if item.HasField("payload"):
                        what = f"upgrade_message(the message {item.msg_id} on {channel.src}->{channel.dst}"
                        item.payload = _call(app.upgrade_message, item.payload, sender, what)
    copy.app.name, copy.app.version = app.name, app.version
    broken = {name: problems for name, problems in check_invariants(app, view_of(copy, params)).items() if problems}
    if broken:
        listed = " | ".join(f"{name}: {'; '.join(problems)}" for name, problems in broken.items())
        raise UpgradeRefused(f"snapshot {sid} upgraded from version {older[0]} to {app.version} breaks the app's"
                             f" invariant(s): {listed}")
    return copy


def _call(function: Any, data: bytes, from_version: int, what: str) -> bytes:
    try:
        out = function(bytes(data), from_version)
    except Exception as exc:  # the app's code: any failure refuses the restore (U4)
        text = " ".join(str(exc).split())
        raise UpgradeRefused(f"{what}, from_version={from_version}) raised {type(exc).__name__}: {text}") from None
    if not isinstance(out, bytes | bytearray):
        raise UpgradeRefused(f"{what}, from_version={from_version}) returned {type(out).__name__}, not bytes")
    return bytes(out)
