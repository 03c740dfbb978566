"""An app's figures in the verdict rows: what its own description says a snapshot holds.

The bank run natively keeps its money in the framework's tallies, so the checks sum
the logs' tallies (``checksums``, ``snapshot_checks``). An app keeps its figures in
its bytes, which only its code reads: an app's snapshot has no tallies
(``parse.typed_snapshot_columns``). So for each COMPLETE snapshot of an app the job
has (``--app``, or a built-in the export names: snapmesh's own code, nothing the
data dir chooses), its ``describe(view)`` is read for three keys, each optional (in
the reconciliation on the executors, where the View's states are read: ``appviews``):

* ``expected_total`` (an int): what the snapshot must hold in all, the "expected" column;
* ``total`` (an int): what it holds, the "observed" column;
* ``in_flight`` (an int, or a mapping of ints, summed): what of it is in flight,
  the figure in the "in flight" column.

F1. A total other than the expected total is a discrepancy (FIGURES_TOTAL).
F2. An export that claims a ``total`` or ``expected_total`` other than the app's
    reading of its bytes is one too (FIGURES_CLAIMED): the figures a controller's
    adapter filled must be the app's.
F3. describe raising, or giving a total without an expected total (or the other way
    round), is a discrepancy naming it; an app whose describe gives neither has no
    figures, and its rows show none.

The bank app's describe gives all three, from its own code (services/app/bank.py):
its conservation, which the native bank's rows show from the tallies. The framework
reads keys, never the bank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from snapmesh.app import BUILT_IN, App, AppError, View, load_app, resolve_spec
from snapmesh.reconcile import messages as M
from snapmesh.reconcile.apps import is_app_complete
from snapmesh.reconcile.schema import SCOPE_SNAPSHOT


@dataclass(frozen=True, kw_only=True)
class Figures:
    """One snapshot's figures by its app's describe (None: not given), and what is wrong."""

    expected: int | None = None
    observed: int | None = None
    in_flight: int | None = None
    problems: tuple[tuple[int, str], ...] = ()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _in_flight(value: Any) -> int | None:
    if isinstance(value, Mapping):
        parts = [_int(v) for v in value.values()]
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]
    return _int(value)


def figures_of(app: App, view: View, claimed: Mapping[str, int | None]) -> Figures:
    """The figures of one view by `app`'s describe (F1-F3); `claimed` the export's total and expected_total."""
    if app.describe is None:
        return Figures()
    try:
        described = app.describe(view)
    except Exception as e:  # the app's code: a crash is a discrepancy, not a crash of the job
        return Figures(problems=(M.FIGURES_RAISED.format(app.name, f"{type(e).__name__}: {e}"),))
    if not isinstance(described, Mapping):
        return Figures()
    expected, observed = _int(described.get("expected_total")), _int(described.get("total"))
    in_flight = _in_flight(described.get("in_flight")) if observed is not None else None
    problems = []
    if (expected is None) != (observed is None):
        problems.append(M.FIGURES_TOTAL.format(app.name, observed, expected))
    elif observed is not None and observed != expected:
        problems.append(M.FIGURES_TOTAL.format(app.name, observed, expected))
    for key, mine in (("total", observed), ("expected_total", expected)):
        if mine is not None and claimed.get(key) is not None and claimed[key] != mine:
            problems.append(M.FIGURES_CLAIMED.format(key, claimed[key], app.name, mine))
    return Figures(expected=expected, observed=observed, in_flight=in_flight, problems=tuple(sorted(problems)))


def app_for(spec: str, name: str, given: App | None, given_spec: str) -> App | None:
    """The app whose describe reads a snapshot of app `spec` (named `name`): the one given
    (``--app``, its spec `given_spec`, else its name) when it is that app, else a built-in
    that `spec` names; None otherwise (no figures)."""
    if given is not None and (resolve_spec(given_spec) == resolve_spec(spec) if given_spec else given.name == name):
        return given
    if resolve_spec(spec) in BUILT_IN.values():
        try:
            return load_app(spec)
        except AppError:
            return None
    return None


def claims(raw: DataFrame) -> dict[str, tuple[str, str, dict[str, int | None]]]:
    """snapshot id -> (its app's spec and name, its claimed total and expected_total) of COMPLETE app snapshots."""
    rows = raw.filter(is_app_complete()).select(
        "snapshot_id", F.col("app.spec").alias("spec"), F.coalesce("app.name", F.lit("")).alias("name"),
        F.col("total").try_cast("long").alias("total"), F.col("expected_total").try_cast("long").alias("expected_total"),
    ).collect()
    return {r["snapshot_id"]: (r["spec"], r["name"], {"total": r["total"], "expected_total": r["expected_total"]})
            for r in rows}


def apps_of(claimed: Mapping[str, tuple[str, str, Mapping[str, int | None]]], given: App | None,
            given_spec: str) -> dict[str, tuple[App, Mapping[str, int | None]]]:
    """snapshot id -> the app whose describe gives its figures (``app_for``) and its claims,
    for each snapshot whose app the job has: what a task computing its figures needs."""
    apps: dict[tuple[str, str], App | None] = {}
    out = {}
    for snapshot_id, (spec, name, claim) in claimed.items():
        if (spec, name) not in apps:
            apps[(spec, name)] = app_for(spec, name, given, given_spec)
        app = apps[(spec, name)]
        if app is not None:
            out[snapshot_id] = (app, claim)
    return out


def of_views(views: list[View], claimed: Mapping[str, tuple[str, str, Mapping[str, int | None]]],
             given: App | None, given_spec: str) -> dict[str, Figures]:
    """snapshot id -> its figures, for each view whose app the job has (``app_for``)."""
    figured = apps_of(claimed, given, given_spec)
    out = {}
    for view in views:
        if view.snapshot_id in figured:
            app, claim = figured[view.snapshot_id]
            out[view.snapshot_id] = figures_of(app, view, claim)
    return out


def fold(rows: list[dict[str, Any]], figures: Mapping[str, Figures]) -> list[dict[str, Any]]:
    """The verdict rows with each snapshot's figures in its expected and observed columns,
    and its problems counted (the first named when no other check found one)."""
    out = []
    for row in rows:
        got = figures.get(row["snapshot_id"]) if row["scope"] == SCOPE_SNAPSHOT else None
        if got is not None and row["consistent"] is not None:
            row = {**row, "expected_total": got.expected, "observed_total": got.observed}
            if got.problems:
                row["discrepancies"] = (row["discrepancies"] or 0) + len(got.problems)
                if row["consistent"]:
                    row.update(consistent=False, first_discrepancy=got.problems[0][1])
        out.append(row)
    return out
