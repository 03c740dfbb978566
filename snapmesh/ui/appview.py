"""What an app's `describe` says of a snapshot, for the page.

The controller judges an app's invariants (Snapshot.app); what the app wants shown
of a snapshot (`App.describe(view)`, a JSON-able summary) is app code, so whoever
renders it imports the app named by the snapshot's `app.spec`: from the working
directory or PYTHONPATH, as `--app` does (`cluster up` serves the page from the
directory it loaded the app from). An app that does not load, has no `describe`,
or whose `describe` raises or returns something JSON cannot hold is a note on the
page, never an error page: the snapshot is worth more than its summary.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from snapmesh.app import App, AppError, load_app
from snapmesh.protocol.appstate import view_of
from snapmesh.v1 import snapmesh_pb2 as pb


@dataclass(frozen=True, slots=True)
class Described:
    text: str | None  # describe(view) as indented JSON; None: not described (`note` says why)
    note: str = ""


class Describer:
    """Loads each app spec once (a failed load too: this process's path does not change)
    and describes COMPLETE snapshots of it; `params` is the cluster file's [app] table."""

    def __init__(self, params: Mapping[str, Any] = MappingProxyType({})) -> None:
        self.params = MappingProxyType(dict(params))
        self._apps: dict[str, App | str] = {}  # spec -> the App, or why it did not load
        self._lock = threading.Lock()  # the page answers from several threads

    def _app(self, spec: str) -> App | str:
        with self._lock:
            if spec not in self._apps:
                try:
                    self._apps[spec] = load_app(spec)
                except AppError as exc:
                    self._apps[spec] = str(exc)
            return self._apps[spec]

    def __call__(self, snapshot: pb.Snapshot) -> Described:
        spec = snapshot.app.spec
        if not spec:
            return Described(None, "not an app's snapshot")
        if snapshot.status != pb.Snapshot.COMPLETE:
            return Described(None, "described once the snapshot is COMPLETE")
        app = self._app(spec)
        if isinstance(app, str):
            return Described(None, f"not described: {app}")
        if app.describe is None:
            return Described(None, f"app {app.name!r} has no describe")
        try:
            said = app.describe(view_of(snapshot, self.params))
            return Described(json.dumps(said, indent=2, sort_keys=True))
        except Exception as exc:  # the app's code: its failure is a note, not a broken page
            return Described(None, f"app {app.name!r}: describe failed: {type(exc).__name__}: {exc}")
