"""The adapter that fills an app's v1 fields on the controller's side, as the app names it.

The v1 messages carry the bank's figures (a node's `balance`, an item's
`amount`, a snapshot's `total`, `expected_total`, `conserved`). They belong to the
app, not to the framework: an app that has them names the class that reads them
from its states and payloads (`App.v1_fields`, "module:attr"), and the
controller's shell asks `for_app` for it and hands it to the snapshot checker
(snapmesh/protocol/appstate.py V3, snapmesh/protocol/controller/v1fields.py). It
is imported here by that name, so no framework module imports an app
(tests/checking/test_layers.py), and any app can name one; an app that names
none gets none, and its snapshots leave the fields absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapmesh.app import App, AppError, named_object


def for_app(app: App, params: Mapping[str, Any]) -> Any | None:
    """The v1 fields' adapter `app` names, made with its [app] params; None when it
    names none. An adapter that cannot be imported or made is an AppError naming it."""
    spec = app.v1_fields
    if spec is None:
        return None
    try:
        return named_object(spec)(params)
    except Exception as exc:  # the app's own code, or a wrong name: one line that names both
        raise AppError(f"app {app.name!r}: its v1_fields {spec!r} cannot be made: {type(exc).__name__}: {exc}") from exc
