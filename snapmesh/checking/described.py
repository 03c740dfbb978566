"""What an app's `describe` says about one of its snapshots, for the page, `snapmesh
snapshot get` and the trace picture (snapmesh.app: `App.describe(view)`, a JSON-able
summary).

A bank snapshot has no `Snapshot.app` and is not described here: its readers keep
their own tables. An app snapshot is described by loading the app its `app.spec`
names (in this process: from the working directory or PYTHONPATH, as `--app`
does) and calling `describe` on its view. None of what can go wrong is an error
for the reader: an app that does not load, has no `describe`, raises in it or
returns something that is not a JSON object becomes a note saying so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from snapmesh.app import App, AppError, load_app
from snapmesh.protocol.appstate import view_of
from snapmesh.v1 import snapmesh_pb2 as pb

MAX_LINE = 200  # characters of one rendered value: a summary, not a dump


@dataclass(frozen=True, slots=True)
class Described:
    spec: str  # the app's module:attr (or built-in name)
    summary: Mapping[str, Any] | None  # what describe returned; None: see note
    note: str  # why there is no summary ("" when there is one)


def is_app(snapshot: pb.Snapshot) -> bool:
    return snapshot.HasField("app")


def describe(snapshot: pb.Snapshot, load: Callable[[str], App] = load_app,
             params: Mapping[str, Any] | None = None) -> Described | None:
    """The app's description of a COMPLETE app snapshot (`params`: the app's [app]
    params, in its view); None for a bank snapshot (or one not COMPLETE: there is no
    state to describe yet)."""
    if not is_app(snapshot) or snapshot.status != pb.Snapshot.COMPLETE:
        return None
    spec = snapshot.app.spec
    if snapshot.states_omitted:  # a bounded answer (protocol/controller/answers.py A2): no states to describe
        return Described(spec, None, "the states are left out of this answer (over the controller's "
                         "answer_state_bytes): `snapmesh snapshot get --json` fetches them")
    try:
        app = load(spec)
    except AppError as exc:
        return Described(spec, None, f"the app does not load here: {exc}")
    if app.describe is None:
        return Described(spec, None, f"app {app.name!r} has no describe")
    try:
        summary = app.describe(view_of(snapshot, params or {}))
    except Exception as exc:  # the app's code: say what it raised, never fail the reader
        return Described(spec, None, f"app {app.name!r}: describe raised {type(exc).__name__}: {exc}")
    if not isinstance(summary, Mapping):
        return Described(spec, None, f"app {app.name!r}: describe returned {type(summary).__name__}, not a mapping")
    return Described(spec, dict(summary), "")


def rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, value) per top-level entry, each value in one line: a string as it is,
    anything else as compact JSON (lists and maps too), cut at MAX_LINE."""
    out = []
    for name, value in summary.items():
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str, separators=(", ", ": "))
        out.append((str(name), text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."))
    return out


def verdicts(snapshot: pb.Snapshot) -> list[tuple[str, str]]:
    """(invariant, "ok" or its problems) as the controller judged the snapshot."""
    if snapshot.app.status == pb.AppCheck.UNCHECKED:
        return [("(unchecked)", snapshot.reason or "the controller could not load the app")]
    return [(r.name, "ok" if r.ok else "; ".join(r.problems) or "does not hold") for r in snapshot.app.invariants]


def caption(about: Described | None) -> tuple[str, ...]:
    """The lines under an app snapshot's trace picture (the page's and `snapmesh
    trace`'s): what its describe says; none for the bank."""
    if about is None:
        return ()
    if about.summary is None:
        return (f"app {about.spec}: {about.note}",)
    return (f"app {about.spec}:", *(f"{name}: {value}" for name, value in rows(about.summary)))
