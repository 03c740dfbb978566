"""An app's views and figures computed on the executors, so the driver holds no state.

The app's `views` functions and its `describe` take a whole `View`: every node's
state of one snapshot (the bank's expected total counts the nodes, kvshard finds a
key at whichever node holds it). So the unit of work is one COMPLETE app snapshot:

V1. The driver holds neither a state nor a manifest's hash list: the snapshots'
    rows are spread by snapshot as one head row (its in-flight channels and start
    time) and a row per (node, block) (`blockstates.through_blocks`'s rows, in the
    export's node order), sorted within each task; each task folds one snapshot at
    a time, each manifest read block by block through its hashes
    (`blockstates.assemble_read`: a local data dir's blocks opened by the executor's
    Python, another scheme's read by Spark's binaryFile source and joined by name).
V2. With every state whole the task makes the View (`invariants.view_of`'s View,
    byte for byte) and returns only what the driver needs of it: each of the given
    app's views' rows, or what the view function raised, and the snapshot's figures
    (`figures.figures_of`, by the app the driver chose for it). A snapshot with a
    block it cannot read whole returns nothing, as it had no View on the driver
    (the app checks, `apps.checked`, name the block).
V3. The driver sorts what it gets by start time then id, the order of
    `invariants.app_views`, so the SQL invariants run over the same rows in the
    same order (`invariants.verdicts_of`) as over Views assembled on the driver.

The executors unpickle the apps: a built-in is snapmesh's own, an `--app` module is
shipped first (`invariants.ship_module`).
"""

from __future__ import annotations

import base64
import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from snapmesh.app import App, View
from snapmesh.reconcile import blockstates
from snapmesh.reconcile.apps import is_app_complete
from snapmesh.reconcile.figures import Figures, figures_of

S = "snapshot_id"
COLUMNS = (S, "npos", "node", "manifest", "idx", "text", "state", "content", "started_at", "channels")


@dataclass(frozen=True, kw_only=True)
class Computed:
    """One snapshot's views (V2): table -> its rows, or the view function's error text."""

    snapshot_id: str
    started_at: Any = None
    rows: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)
    figures: Figures | None = None


@dataclass(frozen=True, kw_only=True)
class Job:
    """What each task needs: the app whose views it computes (None: no views), each
    snapshot's app and claims for its figures, and the params of every View."""

    app: App | None
    figured: Mapping[str, tuple[App, Mapping[str, int | None]]]
    params: Mapping[str, Any]


def computed(spark: SparkSession, data_dir: str, raw: DataFrame, job: Job, *,
             hadoop: bool | None = None) -> list[Computed]:
    """Every COMPLETE app snapshot of `raw` (schema.APP_SNAPSHOT) whose states read whole,
    its views and figures computed on the executors (V1, V2), by start time then id (V3).
    ``hadoop``: read the blocks through Spark's binaryFile source (default: only when the
    data dir is not local)."""
    snaps = raw.filter(is_app_complete())
    channels_type = snaps.schema["channels"].dataType
    none = F.lit(None)
    head = snaps.select(S, F.lit(-1).alias("npos"), none.cast("string").alias("node"), none.cast("boolean").alias("manifest"),
                        none.cast("int").alias("idx"), none.cast("string").alias("text"),
                        none.cast("string").alias("state"), "started_at", "channels")
    n = F.col("n")
    manifest = n.state.isNull() & n.state_blocks.hashes.isNotNull()
    nodes = (
        snaps.select(S, F.posexplode(F.coalesce("nodes", F.array())).alias("npos", "n"))
        .select(S, "npos", n.node_id.alias("node"), manifest.alias("manifest"), n.state.alias("state"),
                F.when(manifest, n.state_blocks.hashes).alias("hashes"))
        # A manifest of no hash still gets its row (idx null): its state is b"".
        .select(S, "npos", "node", "manifest", F.posexplode_outer("hashes").alias("idx", "text"), "state")
        .select(S, "npos", "node", "manifest", "idx", "text", "state", none.cast("string").alias("started_at"),
                none.cast(channels_type).alias("channels"))
    )
    where, local = blockstates.blocks_dir(data_dir), blockstates.local_dir(data_dir)
    if hadoop or local is None:
        name = F.lower(F.hex(F.try_to_binary("text", F.lit("base64"))))
        files = blockstates.block_files(spark, where)
        nodes = nodes.withColumn("name", name).join(files, "name", "left").drop("name")
        head = head.withColumn("content", none.cast("binary"))
        local = None
    else:
        nodes = nodes.withColumn("content", none.cast("binary"))
        head = head.withColumn("content", none.cast("binary"))
    rows = head.select(*COLUMNS).unionByName(nodes.select(*COLUMNS))
    ordered = rows.repartition(S).sortWithinPartitions(S, "npos", "idx")
    got = ordered.select(*COLUMNS).rdd.mapPartitions(functools.partial(_fold, job, local, where)).collect()
    return sorted(got, key=lambda c: (c.started_at is None, c.started_at or "", c.snapshot_id))


def _fold(job: Job, directory: str | None, where: str, rows: Iterable[Any]) -> Iterator[Computed]:
    """On an executor: COLUMNS rows sorted by (snapshot, npos, idx) -> one Computed per
    snapshot whose states read whole (V1, V2)."""
    read = blockstates.local_reader(directory) if directory is not None else None
    for snapshot_id, group in itertools.groupby(rows, key=lambda r: r[0]):
        head = next(group)
        states: dict[str, bytes] | None = {}
        for _, node_rows in itertools.groupby(group, key=lambda r: r[1]):
            first = next(node_rows)
            if not first[3]:  # inline (or neither: b"", as the driver read it)
                states[first[2]] = base64.b64decode(first[6] or "")
                continue
            blocks = (
                (name, text, None if name is None else read(name) if read is not None else row[7])
                for row in itertools.chain([first], node_rows) if row[4] is not None
                for name, text in blockstates.names([row[5]])
            )
            got = blockstates.assemble_read(blocks, snapshot_id, first[2], keep=True, where=where)
            if got.state is None:  # no View (V2); groupby skips the snapshot's rows left
                states = None
                break
            states[first[2]] = got.state
        if states is None:
            continue
        yield _views(job, View(snapshot_id=snapshot_id, states=states, in_flight=_in_flight(head[9]),
                               params=job.params), head[8])


def _in_flight(channels: Iterable[Any] | None) -> list[tuple[str, str, int, bytes]]:
    """The View's in-flight messages, per channel in seq order (as `invariants.view_of`)."""
    out = []
    for c in channels or ():
        entries = sorted(c["in_flight"] or (), key=lambda m: int(m["seq"] or 0))
        out += [(c["src"], c["dst"], int(m["seq"] or 0), base64.b64decode(m["payload"] or "")) for m in entries]
    return out


def _views(job: Job, view: View, started_at: Any) -> Computed:
    rows: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    for table, fn in (job.app.views.items() if job.app is not None else ()):
        try:
            rows[table] = [dict(r) for r in fn(view)]
        except Exception as e:  # the app's code: a crash is a verdict, not a crash of the job
            errors[table] = f"view {table!r} raised {type(e).__name__}: {e}"
    figured = job.figured.get(view.snapshot_id)
    shown = figures_of(figured[0], view, figured[1]) if figured is not None else None
    return Computed(snapshot_id=view.snapshot_id, started_at=started_at, rows=rows, errors=errors, figures=shown)
