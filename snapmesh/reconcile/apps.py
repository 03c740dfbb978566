"""An app's snapshots (snapmesh.app) against the logs: what the bank's checks do not see.

The bank's checks already hold every COMPLETE snapshot of an app cluster to the
rules (docs/reconcile.md "The rules"): each channel's in-flight messages are exactly
the ones sent before the sender's cut and received after the receiver's cut, in seq
order, by msg_id and seq (an app's amount is 0). What they do not read is the
app's bytes; these checks do, with no app code:

* each in-flight message's payload, by digest, against the payload its sender
  logged for that seq, in the epoch of the sender's cut (the last send of that seq
  on that channel before the cut and after the sender's last restore before it);
* each node's state: the export's ``state_digest`` and its state bytes hashed in
  that digest's form (snapmesh/protocol/statedigest.py: the whole bytes, or the
  blocks form of a large state) against the ``digest`` of the node's ``cut`` record. A state the export
  holds as a manifest (large states) is read through the data dir's blocks
  (``blockstates``, on the executors), each checked against its hash: a missing or corrupt block is
  a discrepancy naming (snapshot, node, hash), and that state's digest is not
  checked then.

A snapshot is an app's when its export names the app (``Snapshot.app.spec``). The
logs are read again from their JSONL (the bank's columns carry no payload), the
send, cut and restore records only; nothing is read when no snapshot is an app's.
``app_discrepancies`` is the check, DataFrames to DataFrame; ``fold`` adds what it
finds to the snapshots' verdict rows (their messages come after the bank's).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from snapmesh.protocol import statedigest
from snapmesh.reconcile import blockstates
from snapmesh.reconcile import messages as M
from snapmesh.reconcile.common import COMPLETE, found, message
from snapmesh.reconcile.schema import SCOPE_SNAPSHOT
from snapmesh.reconcile.segments import list_logs, read_text_logs

S = "snapshot_id"

# The fields of a log record these checks read (snapmesh.protocol.wal: send, cut, restore).
APP_LOG = T.StructType(
    [
        T.StructField(name, type_)
        for name, type_ in (
            ("node", T.StringType()), ("lsn", T.LongType()), ("kind", T.StringType()), ("src", T.StringType()),
            ("dst", T.StringType()), ("seq", T.LongType()), ("snapshot_id", T.StringType()),
            ("digest", T.StringType()), ("payload", T.StringType()),
        )
    ]
)
APP_KINDS = ("send", "cut", "restore")


def sha256_of_base64(text: Column) -> Column:
    """sha256 (hex) of the bytes a base64 text holds; null for null or text that is not base64."""
    return F.sha2(F.try_to_binary(text, F.lit("base64")), 256)


def _blocks_hex(data: bytes | None) -> str | None:
    return None if data is None else statedigest.blocks_form(bytes(data))[len(statedigest.BLOCKS):]


# The blocks form's hex of a state's bytes (statedigest.py SD1): no built-in function
# hashes a grid of blocks, and only a state whose digest is in that form needs it.
_BLOCKS_HEX = F.udf(_blocks_hex, T.StringType())


def state_hex(state: Column, digest: Column) -> Column:
    """The hex of a state's (base64) bytes hashed in the form of `digest` (statedigest.py SD2)."""
    data = F.try_to_binary(state, F.lit("base64"))
    return F.when(F.coalesce(digest, F.lit("")).startswith(statedigest.BLOCKS), _BLOCKS_HEX(data)).otherwise(
        F.sha2(data, 256))


def said(cut_digest: Column) -> Column:
    """A cut record's digest in its prefixed form (statedigest.py SD4)."""
    return F.when(cut_digest.contains(":"), cut_digest).otherwise(F.concat(F.lit(statedigest.WHOLE), cut_digest))


def _short(digest: Column) -> Column:
    return F.substring(digest, 1, 12)


def is_app_complete() -> Column:
    """A snapshot row (schema.APP_SNAPSHOT) that is an app's and COMPLETE."""
    return (F.coalesce(F.col("app.spec"), F.lit("")) != "") & (F.col("status") == COMPLETE)


# ------------------------------------------------------------------ reading


def read_app_log(spark: SparkSession, data_dir: str, located: DataFrame | None = None) -> DataFrame:
    """(node, lsn, kind, src, dst, seq, snapshot_id, digest, payload) of every send, cut
    and restore record in the data dir's JSONL logs (lines that do not parse are the
    bank's checks' bad input, reported there).

    Read within the bound (``longlines``): a line over it is a placeholder, read as
    nothing here. A restore carries the app's state, so its line may be one: given the
    job's ``located`` log (every record recovered in its place), the restores, of which
    only node and lsn are read, come from there."""
    lines = read_text_logs(spark, list_logs(spark, data_dir))
    records = lines.select(F.from_json("value", APP_LOG).alias("r")).select("r.*")
    kinds = APP_KINDS if located is None else tuple(k for k in APP_KINDS if k != "restore")
    text = records.filter(F.col("kind").isin(*kinds) & F.col("node").isNotNull() & F.col("lsn").isNotNull())
    if located is None:
        return text
    restores = located.filter((F.col("kind") == "restore") & F.col("node").isNotNull() & F.col("lsn").isNotNull())
    return text.unionByName(restores.select(
        *(F.col(f.name) if f.name in ("node", "lsn", "kind") else F.lit(None).cast(f.dataType).alias(f.name)
          for f in APP_LOG.fields)))


def app_nodes(raw: DataFrame) -> DataFrame:
    """Snapshots (schema.APP_SNAPSHOT) -> (snapshot_id, node, state_sha, state_digest, hashes, block_problem)
    of COMPLETE app snapshots; ``hashes``: a manifest's (null for an inline state), whose
    state_sha and block problems ``through_blocks`` fills in."""
    n = F.col("n")
    return (
        raw.filter(is_app_complete())
        .select(S, F.explode(F.coalesce("nodes", F.array())).alias("n"))
        .select(S, n.node_id.alias("node"), state_hex(n.state, n.state_digest).alias("state_sha"),
                n.state_digest.alias("state_digest"),
                F.when(n.state.isNull(), n.state_blocks.hashes).alias("hashes"),
                F.lit(None).cast("string").alias("block_problem"))
    )


def through_blocks(spark: SparkSession, data_dir: str, nodes: DataFrame) -> DataFrame:
    """``app_nodes`` with each manifest's state read through the data dir's blocks
    on the executors (``blockstates.through_blocks``): its sha256, or a row per bad
    block naming it."""
    return blockstates.through_blocks(spark, data_dir, nodes)


def app_in_flight(raw: DataFrame) -> DataFrame:
    """Snapshots (schema.APP_SNAPSHOT) -> (snapshot_id, src, dst, seq, payload_sha) of COMPLETE app snapshots."""
    m = F.col("m")
    return (
        raw.filter(is_app_complete())
        .select(S, F.explode(F.coalesce("channels", F.array())).alias("c"))
        .select(S, "c.src", "c.dst", F.explode(F.coalesce("c.in_flight", F.array())).alias("m"))
        .select(S, "src", "dst", m.seq.try_cast("long").alias("seq"), sha256_of_base64(m.payload).alias("payload_sha"))
    )


# ------------------------------------------------------------------ the check


def app_discrepancies(log: DataFrame, nodes: DataFrame, in_flight: DataFrame) -> DataFrame:
    """(snapshot_id, d: struct<priority, text>) for every app-specific discrepancy.

    ``log``: APP_LOG rows; ``nodes``: ``app_nodes`` (``block_problem`` may be left out:
    none); ``in_flight``: ``app_in_flight``.
    A node without a cut record, or an in-flight message with no send of its seq in
    the window, is left to the bank's checks (NO_CUT, IN_FLIGHT_*), which name it.
    """
    cuts = (
        log.filter(F.col("kind") == "cut")
        .groupBy(S, "node")
        .agg(F.min(F.struct("lsn", "digest")).alias("c"))
        .select(S, "node", F.col("c.lsn").alias("cut_lsn"), F.col("c.digest").alias("digest"))
    )
    if "block_problem" not in nodes.columns:
        nodes = nodes.withColumn("block_problem", F.lit(None).cast("string"))
    has_cut = F.col("cut_lsn").isNotNull()
    has_digest = has_cut & (F.coalesce(F.col("digest"), F.lit("")) != "")
    hex_of = F.substring_index(F.col("digest"), ":", -1)  # either form's hex (statedigest.py SD4)
    node_found = found(
        nodes.join(cuts, [S, "node"], "left"),
        [S],
        [
            (has_cut & ~has_digest, message(M.NO_CUT_DIGEST, "node")),
            (F.col("block_problem").isNotNull(), message(M.STATE_BLOCK, "block_problem")),
            (F.col("state_sha").isNull() & F.col("block_problem").isNull(), message(M.NO_STATE, "node")),
            (
                has_digest & ~F.coalesce(F.col("state_digest") == said(F.col("digest")), F.lit(False)),
                message(M.STATE_DIGEST, "node", F.coalesce(F.substring("state_digest", 1, 19), F.lit("none")),
                        _short(hex_of)),
            ),
            (
                has_digest & (F.col("state_sha") != hex_of),
                message(M.STATE_BYTES, "node", _short(F.col("state_sha")), _short(hex_of)),
            ),
        ],
    )

    # The sender's window per snapshot: (its last restore before the cut, the cut).
    restores = log.filter(F.col("kind") == "restore").select(F.col("node").alias("src"), F.col("lsn").alias("r_lsn"))
    windows = (
        cuts.select(S, F.col("node").alias("src"), "cut_lsn")
        .join(restores, ["src"], "left")
        .groupBy(S, "src", "cut_lsn")
        .agg(F.coalesce(F.max(F.when(F.col("r_lsn") < F.col("cut_lsn"), F.col("r_lsn"))), F.lit(0)).alias("lo"))
    )
    entries = in_flight.filter(F.col("payload_sha").isNotNull()).join(windows, [S, "src"], "inner")
    sends = log.filter(F.col("kind") == "send").select(
        F.col("node").alias("src"),
        "dst",
        "seq",
        F.col("lsn").alias("s_lsn"),
        sha256_of_base64(F.coalesce(F.col("payload"), F.lit(""))).alias("log_sha"),  # b"" is logged as no payload
    )
    logged = (
        sends.join(F.broadcast(entries), ["src", "dst", "seq"], "inner")
        .filter((F.col("s_lsn") > F.col("lo")) & (F.col("s_lsn") < F.col("cut_lsn")))
        .groupBy(S, "src", "dst", "seq", "payload_sha")
        .agg(F.max(F.struct("s_lsn", "log_sha")).alias("s"))
        .select(S, "src", "dst", "seq", "payload_sha", F.col("s.log_sha").alias("log_sha"))
    )
    payload_found = found(
        logged,
        [S],
        [
            (
                F.col("log_sha") != F.col("payload_sha"),
                message(M.IN_FLIGHT_PAYLOAD, "src", "dst", "seq", _short(F.col("payload_sha")), "src",
                        _short(F.col("log_sha"))),
            )
        ],
    )
    unpaid = found(in_flight, [S], [(F.col("payload_sha").isNull(), message(M.NO_PAYLOAD, "src", "dst", "seq"))])
    return node_found.unionByName(payload_found).unionByName(unpaid)


def per_snapshot(found_: DataFrame) -> DataFrame:
    """(snapshot_id, discrepancies, first): the discrepancies' count and the first one's text."""
    return found_.groupBy(S).agg(F.count(F.lit(1)).alias("discrepancies"), F.min("d").alias("first")).select(
        S, "discrepancies", F.col("first.text").alias("first")
    )


def checked(spark: SparkSession, data_dir: str, raw: DataFrame, located: DataFrame | None = None) -> dict[str, tuple[int, str]]:
    """snapshot id -> (discrepancies, the first one) of the COMPLETE app snapshots with any
    (``located``: the job's log, its restores read from there: ``read_app_log``)."""
    nodes = through_blocks(spark, data_dir, app_nodes(raw))
    found_ = app_discrepancies(read_app_log(spark, data_dir, located), nodes, app_in_flight(raw))
    return {r[S]: (r["discrepancies"], r["first"]) for r in per_snapshot(found_).collect()}


def fold(rows: list[dict[str, Any]], found_: dict[str, tuple[int, str]]) -> list[dict[str, Any]]:
    """The verdict rows with the app checks' discrepancies added to their snapshots'
    rows: counted, and the first one named when the bank's checks found none."""
    out = []
    for row in rows:
        got = found_.get(row[S]) if row["scope"] == SCOPE_SNAPSHOT and row["consistent"] is not None else None
        if got is not None:
            n, first = got
            row = {**row, "discrepancies": (row["discrepancies"] or 0) + n}
            if row["consistent"]:
                row.update(consistent=False, first_discrepancy=first)
        out.append(row)
    return out
