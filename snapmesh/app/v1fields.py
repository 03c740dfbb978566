"""Which adapter fills an app's v1 fields on the controller's side, by the app's name.

The v1 messages carry the bank's figures (a node's `balance`, an item's
`amount`, a snapshot's `total`, `expected_total`, `conserved`). They belong to the
app, not to the framework: the controller's shell asks `for_app` with the name of
the app its cluster runs and hands what it gets to the snapshot checker
(snapmesh/protocol/appstate.py V3, snapmesh/protocol/controller/v1fields.py). The
adapter is imported here, by its module:attr, so no framework module imports an
app (tests/checking/test_layers.py); an app without an entry gets none and its
snapshots leave the fields absent.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

# app name -> the module:attr of a class taking the app's [app] params.
ADAPTERS = {"bank": "snapmesh.bank.v1fields:BankFields"}


def for_app(name: str, params: Mapping[str, Any]) -> Any | None:
    """The v1 fields' adapter of the app named `name`, made with its params; None when it has none."""
    spec = ADAPTERS.get(name)
    if spec is None:
        return None
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)(params)
