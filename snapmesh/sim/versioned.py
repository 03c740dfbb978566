"""Version 2 of an app whose state is JSON: the same machine, another state encoding.

The fuzzer's version steps (snapmesh/fuzzer/steps.py) upgrade a running app
into this. Version 1 writes its state as the app does (JSON: an object, such as
kvshard's, or a value, such as the bank's balance); version 2 writes an object
as b"v2o" followed by a JSON list of [field, value] pairs in field order, and
any other value as b"v2v" and its JSON. Messages keep their encoding. The machine is the
app's own, so the commands and their replies stay the same.

`second(app)` is version 2 with the right `upgrade`: every field of the old
object as a pair. `second(app, drop=F)` has a wrong one that drops field F.
`fields(state)` reads either version's state back as the object it holds, so
the fuzzer can check that an upgraded state holds what the old one held.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from snapmesh.app import App, NodeInfo, View

PREFIX = b"v2"
OBJECT, VALUE = b"o", b"v"  # after PREFIX: a JSON object's [field, value] pairs, or any other JSON value


def fields(state: bytes) -> dict[str, Any]:
    """What a state holds, in either version's encoding: a JSON object's fields, or {"value": v}."""
    if state.startswith(PREFIX + OBJECT):
        return {name: value for name, value in json.loads(state[len(PREFIX) + 1:])}
    if state.startswith(PREFIX + VALUE):
        return {"value": json.loads(state[len(PREFIX) + 1:])}
    decoded = json.loads(state)
    return decoded if isinstance(decoded, dict) else {"value": decoded}


def _v1(state: bytes) -> bytes:
    """A state in the app's own encoding (version 1): a sorted JSON object, or the JSON value."""
    if not state.startswith(PREFIX):
        return state
    if state.startswith(PREFIX + VALUE):
        return state[len(PREFIX) + 1:]
    return json.dumps(fields(state), sort_keys=True, separators=(",", ":")).encode()


def _v2(decoded: Any) -> bytes:
    if isinstance(decoded, dict):
        return PREFIX + OBJECT + json.dumps(sorted(decoded.items()), separators=(",", ":")).encode()
    return PREFIX + VALUE + json.dumps(decoded, separators=(",", ":")).encode()


class _Machine:
    """The app's machine, its state read and written in version 2's encoding."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def on_command(self, command: bytes, ctx: Any) -> bytes:
        return self.inner.on_command(command, ctx)

    def on_message(self, src: str, payload: bytes, ctx: Any) -> None:
        self.inner.on_message(src, payload, ctx)

    def snapshot(self) -> bytes:
        return _v2(json.loads(self.inner.snapshot()))

    def restore(self, state: bytes) -> None:
        self.inner.restore(_v1(state))

    def __getattr__(self, name: str) -> Any:  # on_query and any other method the app's machine has
        if name == "snapshot_blocks":  # the inner app's parts are version 1's encoding: snapshot() above instead
            raise AttributeError(name)
        return getattr(self.inner, name)


def second(app: App, *, drop: str = "") -> App:
    """Version app.version + 1 of `app` in the version-2 encoding; `drop`: a wrong
    upgrade that leaves that field out of every state it upgrades."""

    def new(info: NodeInfo) -> _Machine:
        return _Machine(app.new(info))

    def upgrade(state: bytes, from_version: int) -> bytes:
        decoded = json.loads(state)
        if isinstance(decoded, dict):
            decoded.pop(drop, None)
        return _v2(decoded)

    def read_back(check: Any) -> Any:
        def judged(view: View) -> list[str]:
            states = {node: _v1(state) for node, state in view.states.items()}
            return check(dataclasses.replace(view, states=states))
        return judged

    return dataclasses.replace(
        app, version=app.version + 1, new=new, upgrade=upgrade, upgrade_message=None,
        invariants={name: read_back(check) for name, check in app.invariants.items()},
        describe=None, views={}, sql_invariants={}, rescale=None,
    )
