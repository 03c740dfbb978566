"""The cluster file's [app] table: which app (snapmesh.app) the nodes run, and its parameters.

    [app]
    module = "token_ring:app"   # module:attr, or a built-in name (snapmesh.app.BUILT_IN)
    holder = "p2"               # every other key: the app's NodeInfo.params

No [app]: the bank, as an app like any other (services/app/bank.py, through the
node's AppHost; `hosted` names it, the file's top-level `initial_balance` in its
params). SNAPMESH_APP=module:attr stands in for `module` (how `cluster
up --app` tells its children, and how a container is given its app), and
SNAPMESH_APP_PARAMS (a JSON object) for the params; without it the params stay the
file's. Only the form is checked here; importing the module is
snapmesh.app.load_app's, in the process that runs it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AppSettings", "BANK", "PARAMS_ENV", "app_named", "app_words", "check_app_spec", "env_params", "hosted",
           "parse_app", "runs_bank", "same_app"]

BANK = "bank"  # the bank app's built-in name (snapmesh.app.BUILT_IN), what a file without [app] runs
PARAMS_ENV = "SNAPMESH_APP_PARAMS"  # the [app] params as a JSON object, in place of the file's


@dataclass(frozen=True, slots=True)
class AppSettings:
    module: str = ""  # "module:attr" (snapmesh.app.load_app); "": the bank
    params: Mapping[str, Any] = field(default_factory=dict)  # NodeInfo.params: every other key of [app]


def parse_app(raw: Mapping[str, Any], env: Mapping[str, str], error: Callable[[str, str], Exception]) -> AppSettings:
    """[app] of the parsed file `raw`, SNAPMESH_APP in place of its module and
    SNAPMESH_APP_PARAMS of its params; `error(key, problem)` is the exception for a bad key."""
    app_raw = raw.get("app", {})
    if not isinstance(app_raw, dict):
        raise error("app", "must be a table")
    params = env_params(env, lambda problem: error(PARAMS_ENV, problem))
    if params is None:
        params = {key: value for key, value in app_raw.items() if key != "module"}
    key, module = ("SNAPMESH_APP", env["SNAPMESH_APP"]) if env.get("SNAPMESH_APP") else ("app.module", app_raw.get("module"))
    if "app" in raw or key == "SNAPMESH_APP":
        if not isinstance(module, str) or not module:
            raise error(key, "missing" if module is None else f"must be a non-empty string, got {module!r}")
        check_app_spec(module, lambda problem: error(key, problem))
    return AppSettings(module=module or "", params=params)


def env_params(env: Mapping[str, str], error: Callable[[str], Exception] = ValueError) -> dict[str, Any] | None:
    """The app's params from $SNAPMESH_APP_PARAMS (None: unset or empty); not a JSON
    object raises error(problem), one line that says what is wrong."""
    text = env.get(PARAMS_ENV, "").strip()
    if not text:
        return None
    try:
        params = json.loads(text)
    except ValueError as exc:
        raise error(f"not JSON ({exc}): {_clip(text)}") from None
    if not isinstance(params, dict):
        raise error(f"must be a JSON object of the app's params, got {type(params).__name__}: {_clip(text)}")
    return params


def _clip(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return repr(line if len(line) <= limit else line[: limit - 3] + "...")


def check_app_spec(spec: str, error: Callable[[str], Exception] = ValueError) -> str:
    """`spec` if it has the form module:attr, or is a bare name (a built-in app);
    else raises error(problem)."""
    module, colon, attr = spec.partition(":")
    names = [*module.split("."), *attr.split(".")] if colon else [spec]
    if not all(part.isidentifier() for part in names):
        raise error(f"must be module:attr (a Python module and an attribute in it) or a built-in app, got {spec!r}")
    return spec


def runs_bank(app: AppSettings) -> bool:
    """Whether the file names the bank by its own names (no [app], or module "bank"): the
    nodes run the bank app and answer the v1 bank RPCs as the bank always has."""
    return app.module in ("", BANK)


def hosted(app: AppSettings, initial_balance: int) -> AppSettings:
    """The app the nodes run and its params: the file's, or for the bank (runs_bank) the
    bank app with the file's top-level `initial_balance` in its params (unless the
    params name one: an [app] table or SNAPMESH_APP_PARAMS)."""
    if not runs_bank(app):
        return app
    return AppSettings(module=BANK, params={"initial_balance": int(initial_balance), **app.params})


def same_app(one: str, other: str) -> bool:
    """Whether two app specs run the same app, by name only (nothing is imported): the
    bank's two spellings alike, a built-in's name and its module:attr alike."""
    from snapmesh.app import resolve_spec

    banks = [spec.strip() in ("", "bank") for spec in (one, other)]
    if any(banks):
        return all(banks)
    return resolve_spec(one) == resolve_spec(other)


def app_named(module: str) -> str:
    """The app a process runs, in words: its module:attr, or "the bank" for the
    default (GetState's empty `app`, a cluster file without [app])."""
    return module or "the bank"


def app_words(module: str, name: str = "", version: int = 0) -> str:
    """The app the nodes run ([app] module), as a user reads it: "bank", or its
    module:attr (a built-in's name first: "kvshard (snapmesh.services.app.kvshard:app)"),
    then the loaded app's name and version when known (GetCluster's app_name,
    app_version): "kvshard (snapmesh.services.app.kvshard:app), kvshard version 1".
    Nothing is imported."""
    from snapmesh.app import resolve_spec

    spec = module.strip()
    if spec in ("", "bank"):
        return "bank"
    resolved = resolve_spec(spec)
    words = resolved if resolved == spec else f"{spec} ({resolved})"
    return f"{words}, {name} version {version or 1}" if name else words
