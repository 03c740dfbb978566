"""`snapmesh reconcile --app module:attr`: the app's SQL invariants over its views.

Each COMPLETE app snapshot of the export becomes the app's `View` on an executor
(``appviews``: one task per snapshot, so the driver holds no state; ``view_of`` and
``app_views`` make the same View on the driver, for callers that have it there)
(its nodes' state bytes, its in-flight payloads per channel in seq order, the
params of $SNAPMESH_APP_PARAMS, else of ``<data_dir>/cluster.toml``'s [app] table when it is there, with
the file's initial_balance for the bank). Each of the
app's ``views`` turns every View into rows (where the View is); the rows of all snapshots make one
DataFrame, registered under the view's name, and each of ``sql_invariants`` runs
once over them. Every row a query returns is a violation: the rows are grouped by
their ``snapshot_id`` column (the apps' views carry it; a query without it is
one verdict for every snapshot) into one verdict per invariant and snapshot, in the
verdict rows of the bank's checks (scope "invariant", consistent false: exit 1).
An invariant that holds everywhere is one row, consistent true.

A view with no row in any snapshot has no schema to give its DataFrame: a query
that reads it is skipped, with a row saying so (consistent null). A view function
that raises, or a query Spark refuses, is a violation naming what happened.

The app's module is shipped to the executors (``addPyFile``: the module file, or
its top-level package zipped), so a standalone cluster can unpickle whatever the
app's rows hold.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from snapmesh.app import App, View

from snapmesh.reconcile.apps import is_app_complete
from snapmesh.reconcile.blockstates import Reader, assemble
from snapmesh.reconcile.common import InputError
from snapmesh.reconcile.schema import SCOPE_INVARIANT, VERDICT
from snapmesh.settings.appsettings import PARAMS_ENV, AppSettings, env_params, hosted

MAX_ROWS_SHOWN = 5  # violation rows a verdict names (the count says how many there are)


# ------------------------------------------------------------------ shipping


def ship_module(spark: SparkSession, module_name: str) -> str | None:
    """Add the app's module (its top-level package, zipped) to the session's Python
    files; the path shipped, or None when there is nothing to ship (a built-in)."""
    if module_name.split(".")[0] == "snapmesh":  # the bank and kvshard: the executors run snapmesh already
        return None
    top = sys.modules.get(module_name.split(".")[0]) or importlib.import_module(module_name.split(".")[0])
    path = getattr(top, "__file__", None)
    if path is None:
        return None
    if os.path.basename(path) == "__init__.py":
        path = _zip_package(os.path.dirname(path))
    try:
        spark.sparkContext.addPyFile(path)
    except Py4JJavaError as e:  # the same name shipped from another path in this session: that one stays
        if "already registered" not in str(e):
            raise
    return path


def check_shipped(spark: SparkSession, module_name: str) -> None:
    """On a cluster (not local mode), import the app's module on an executor once:
    InputError naming the module and the executor's error when it does not import."""
    if spark.sparkContext.master.startswith("local"):
        return

    def probe(_: object) -> str:
        try:
            importlib.import_module(module_name)
            return ""
        except Exception as e:  # reported, not raised: the driver words it
            return f"{type(e).__name__}: {e}"

    problem = spark.sparkContext.parallelize([0], 1).map(probe).first()
    if problem:
        raise InputError(f"the app's module {module_name} does not import on the executors: {problem}")


def _zip_package(directory: str) -> str:
    """The package's .py files in a zip (under the temp dir, named by their contents)."""
    root = os.path.dirname(directory)
    files = sorted(
        os.path.join(d, f) for d, _, names in os.walk(directory) for f in names if f.endswith(".py")
    )
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as handle:
            digest.update(f.encode() + b"\0" + handle.read())
    target = os.path.join(tempfile.gettempdir(), "snapmesh-pyfiles", digest.hexdigest()[:16],
                          os.path.basename(directory) + ".zip")
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zipfile.ZipFile(target + ".tmp", "w") as z:
            for f in files:
                z.write(f, os.path.relpath(f, root))
        os.replace(target + ".tmp", target)
    return target


# ------------------------------------------------------------------ views


def cluster_params(data_dir: str) -> dict[str, Any]:
    """The app's params as its nodes got them: $SNAPMESH_APP_PARAMS (a JSON object; a
    deployment's containers), else the [app] table of ``<data_dir>/cluster.toml`` minus
    "module" ({}: no such file, or not local). A bad $SNAPMESH_APP_PARAMS is an InputError."""
    from_env = env_params(os.environ, lambda problem: InputError(f"${PARAMS_ENV}: {problem}"))
    if from_env is not None:
        return from_env
    path = os.path.join(data_dir, "cluster.toml")
    if "://" in data_dir or not os.path.isfile(path):
        return {}
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    table = raw.get("app", {})
    if not isinstance(table, dict):
        return {}
    app = AppSettings(module=str(table.get("module", "")), params={k: v for k, v in table.items() if k != "module"})
    balance = raw.get("initial_balance")  # the bank's, when the file names no other app (hosted)
    return dict((hosted(app, balance) if isinstance(balance, int) else app).params)


def app_views(raw: DataFrame, params: Mapping[str, Any], read: Reader | None = None) -> list[View]:
    """The View of every COMPLETE app snapshot (collected), by start time then id. A
    state its export holds as a manifest is read through `read` (``blockstates``); a
    snapshot with a block it cannot read whole has no View (the app checks name it)."""
    rows = (
        raw.filter(is_app_complete())
        .select("snapshot_id", "started_at", "nodes", "channels")
        .orderBy(F.col("started_at").asc_nulls_last(), "snapshot_id")
        .collect()
    )
    views = (view_of(r.asDict(recursive=True), params, read) for r in rows)
    return [view for view in views if view is not None]


def view_of(snapshot: Mapping[str, Any], params: Mapping[str, Any], read: Reader | None = None) -> View | None:
    """One raw export row (protobuf JSON: bytes as base64, seqs as strings) as the app's
    View; None when a manifest's state cannot be read whole through `read`."""
    def unpack(text: str | None) -> bytes:
        return base64.b64decode(text or "")

    states = {}
    for n in snapshot["nodes"] or ():
        hashes = (n.get("state_blocks") or {}).get("hashes")
        if n["state"] is not None or hashes is None:
            states[n["node_id"]] = unpack(n["state"])
            continue
        got = assemble(read, snapshot["snapshot_id"], n["node_id"], hashes, keep=True) if read else None
        if got is None or got.state is None:
            return None
        states[n["node_id"]] = got.state
    in_flight = []
    for c in snapshot["channels"] or ():
        entries = sorted(c["in_flight"] or (), key=lambda m: int(m["seq"] or 0))
        in_flight += [(c["src"], c["dst"], int(m["seq"] or 0), unpack(m["payload"])) for m in entries]
    return View(snapshot_id=snapshot["snapshot_id"], states=states, in_flight=in_flight, params=params)


# ------------------------------------------------------------------ verdicts


def _row(name: str, snapshot_id: str | None, consistent: bool | None, n: int, text: str) -> dict[str, Any]:
    return {
        **dict.fromkeys(VERDICT.fieldNames()),
        "scope": SCOPE_INVARIANT,
        "snapshot_id": snapshot_id,
        "status": "COMPLETE" if snapshot_id else "-",
        "consistent": consistent,
        "discrepancies": n,
        "first_discrepancy": text,
    }


def _shown(rows: list[dict[str, Any]]) -> str:
    head = "; ".join(json.dumps(r, default=str, sort_keys=False) for r in rows[:MAX_ROWS_SHOWN])
    return head + (f"; ... {len(rows) - MAX_ROWS_SHOWN} more" if len(rows) > MAX_ROWS_SHOWN else "")


def invariant_verdicts(spark: SparkSession, app: App, views: list[View]) -> list[dict[str, Any]]:
    """The verdict rows of the app's SQL invariants over `views` (see the module's doc)."""
    tables = []
    for view in views:
        rows: dict[str, list[dict[str, Any]]] = {}
        errors: dict[str, str] = {}
        for table, fn in app.views.items():
            try:
                rows[table] = [dict(r) for r in fn(view)]
            except Exception as e:  # the app's code: a crash is a verdict, not a crash of the job
                errors[table] = f"view {table!r} raised {type(e).__name__}: {e}"
        tables.append((view.snapshot_id, rows, errors))
    return verdicts_of(spark, app, tables)


def verdicts_of(spark: SparkSession, app: App,
                tables: Sequence[tuple[str, Mapping[str, list[dict[str, Any]]], Mapping[str, str]]]) -> list[dict[str, Any]]:
    """The verdict rows of the app's SQL invariants over its views' rows already computed:
    (snapshot id, table -> rows, table -> what its view function raised) per snapshot, in
    the Views' order (on the driver by ``invariant_verdicts``, or on the executors by
    ``appviews``: the same rows in the same order either way)."""
    out: list[dict[str, Any]] = []
    empty: list[str] = []
    registered: list[str] = []
    try:
        for table in app.views:
            rows: list[dict[str, Any]] = []
            for snapshot_id, by_table, errors in tables:
                if table in errors:
                    out.append(_row(f"view {table}", snapshot_id, False, 1, errors[table]))
                else:
                    rows += by_table.get(table, [])
            if not rows:
                empty.append(table)
                continue
            spark.createDataFrame(rows).createOrReplaceTempView(table)
            registered.append(table)
        for name, sql in app.sql_invariants.items():
            out += _run(spark, name, sql, empty, len(tables))
    finally:
        for table in registered:
            spark.catalog.dropTempView(table)
    return out


def _failed(name: str, e: Exception) -> dict[str, Any]:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return _row(name, None, False, 1, f"invariant {name!r}: the query failed: {first}")


def _run(spark: SparkSession, name: str, sql: str, empty: list[str], snapshots: int) -> list[dict[str, Any]]:
    try:
        found = [r.asDict(recursive=True) for r in spark.sql(sql).collect()]
    except AnalysisException as e:
        text = str(e).lower()
        missing = [t for t in empty if "table_or_view_not_found" in text and f"`{t.lower()}`" in text]
        if missing:
            return [_row(name, None, None, 0, f"invariant {name!r} skipped: view(s) {', '.join(missing)} "
                                              "had no rows in any snapshot (no schema to give them)")]
        return [_failed(name, e)]
    except Exception as e:  # noqa: BLE001  (a query that fails as it runs: the app's SQL, a verdict)
        return [_failed(name, e)]
    if not found:
        return [_row(name, None, True, 0, f"invariant {name!r} holds in {snapshots} snapshot(s)")]
    by_snapshot: dict[str | None, list[dict[str, Any]]] = {}
    for r in found:
        by_snapshot.setdefault(r.get("snapshot_id"), []).append(r)
    return [
        _row(name, sid, False, len(rows), f"invariant {name!r} violated in snapshot {sid or '(every snapshot)'}: "
                                          f"{len(rows)} row(s): {_shown(rows)}")
        for sid, rows in sorted(by_snapshot.items(), key=lambda kv: (kv[0] is None, str(kv[0])))
    ]
