"""The reconciliation as pure DataFrame -> DataFrame transformations.

Nothing here reads or writes files, collects rows or starts a session: ``main`` does
the I/O, these functions only build plans. Every check is a join or an aggregation
over the whole log, so the same code runs on a laptop and on a cluster, and the
driver only ever holds the verdict rows.

How "before the cut" is computed without a join per snapshot. Each node's cut
records split its log (ordered by lsn) into intervals ``[previous cut, this cut)``.
Every log record is assigned to its interval by an equi-join on (node, lsn bucket)
against the small table of intervals (an interval spans few buckets), so the join is
linear in the log size and independent of the number of snapshots. Per interval we
aggregate the balance delta and, per peer and direction, the number of records and
the highest seq; running sums over the (few) intervals give, for every cut, the
balance and the channel positions "before the cut". With FIFO channels and per-channel
seqs, the in-flight transfers of channel j->i in snapshot S are then the sends with
seq in (b, a], where a is the highest transfer seq j logged before its cut and b the
highest transfer seq i received before its cut; they are found by the same bucket
trick on seq.

Small intermediate tables that several checks read (per node, per cut, per channel;
never the log) go through ``_shared``, a ``localCheckpoint``: computing them once
keeps the final plan to a few dozen stages instead of ~150. That is the only place
these functions run Spark jobs while building a plan. The log itself is read and
parsed once by ``main`` into a narrow cached table (typed columns, no raw text).
"""

from __future__ import annotations

from functools import reduce
from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from . import messages as M
from .messages import Message
from .schema import CORRUPT_COLUMN, EVENT, LOG_RECORD, REQUIRED_FIELDS, SCOPE_LOGS, SCOPE_SNAPSHOT, VERDICT

COMPLETE = "COMPLETE"
# lsn/seq bucket width of the range joins: small enough that a record meets few
# intervals, large enough that the interval table stays tiny.
BUCKET = 1024

SENDS = ("send", "marker_sent")
RECEIPTS = ("recv", "marker_recv")
FLOW_KINDS = ("init",) + SENDS + RECEIPTS
CHANNEL_KINDS = SENDS + RECEIPTS


def _kind_in(kinds: tuple[str, ...]) -> Column:
    return F.col("kind").isin(*kinds)


def _first_when(cases: list[tuple[Column, Column]]) -> Column:
    """The value of the first case whose condition holds, else null."""
    (cond0, val0), rest = cases[0], cases[1:]
    return reduce(lambda acc, case: acc.when(*case), rest, F.when(cond0, val0))


# --------------------------------------------------------------------------- logs


def parse_log_lines(lines: DataFrame) -> DataFrame:
    """(file, block, mid, value) text lines -> typed records plus ``problem``.

    ``block``/``mid`` locate a line (see ``locate_lines``). ``problem`` is null for a
    well-formed record and says what is wrong otherwise: not JSON (a truncated line),
    a field of the wrong type, a required field missing, or a record that does not
    belong in this node's log. The raw ``value`` is dropped: only typed columns are
    kept (and cached by ``main``). Whether the record belongs to the file's node is
    decided in ``locate_lines``, once per file rather than once per row; until then
    ``problem`` holds the checks before it and ``_problem_after`` the ones after it.
    """
    record = F.from_json(
        "value", LOG_RECORD, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    )
    parsed = lines.select("file", "block", "mid", "value", record.alias("r")).select(
        "file", "block", "mid", "value", "r.*"
    )

    corrupt = F.col(CORRUPT_COLUMN).isNotNull()
    before: list[tuple[Column, Column]] = [
        (F.trim("value") == "", F.lit("empty line")),
        (corrupt & F.try_parse_json("value").isNull(), F.lit("not valid JSON (truncated line?)")),
        (corrupt, F.lit("a field has the wrong type, or the line is not a JSON object")),
    ]
    before += [(F.col(f).isNull(), F.lit(f"missing field '{f}'")) for f in ("node", "lsn", "kind")]
    before += [
        ((F.col("kind") == kind) & F.col(f).isNull(), F.lit(f"{kind} record without '{f}'"))
        for kind, fields in REQUIRED_FIELDS.items()
        for f in fields
    ]
    after: list[tuple[Column, Column]] = [
        (
            _kind_in(SENDS) & (F.col("src") != F.col("node")),
            F.format_string("%s with src %s in the log of %s", "kind", "src", "node"),
        ),
        (
            _kind_in(RECEIPTS) & (F.col("dst") != F.col("node")),
            F.format_string("%s with dst %s in the log of %s", "kind", "dst", "node"),
        ),
    ]
    return parsed.select(
        "*", _first_when(before).alias("problem"), _first_when(after).alias("_problem_after")
    ).drop("value", CORRUPT_COLUMN)


def locate_lines(parsed: DataFrame) -> DataFrame:
    """Add ``line``, the 1-based line number of each row in its file; finish ``problem``.

    ``block`` is the start offset of the file split a row was read from and ``mid``
    a monotonically increasing id taken right after the scan: the rows of one split
    have consecutive ids, so a row's line is the number of lines in the file's earlier
    splits plus its position in its split. One small aggregation (it only reads the
    text, not the parsed JSON), one broadcast join; the split table also carries the
    node the file is named after, so the file/node check runs once per file.
    """
    earlier = Window.partitionBy("file").orderBy("block").rowsBetween(Window.unboundedPreceding, -1)
    splits = (
        parsed.groupBy("file", "block")
        .agg(F.min("mid").alias("mid0"), F.count(F.lit(1)).alias("n"))
        .select(
            "file",
            "block",
            "mid0",
            F.coalesce(F.sum("n").over(earlier), F.lit(0)).alias("before"),
            F.url_decode(F.regexp_extract("file", r"([^/]*)\.log\.jsonl$", 1)).alias("file_node"),
        )
    )
    line = F.col("before") + F.col("mid") - F.col("mid0") + 1
    wrong_node = F.when(
        F.col("node") != F.col("file_node"),
        F.format_string("record of node %s in the log of %s", "node", "file_node"),
    )
    problem = F.coalesce("problem", wrong_node, "_problem_after")
    return (
        parsed.join(F.broadcast(splits), on=["file", "block"], how="inner")
        .withColumn("line", line)
        .withColumn("problem", problem)
        .drop("block", "mid", "mid0", "before", "file_node", "_problem_after")
    )


def bad_lines(located: DataFrame) -> DataFrame:
    """Lines that are not valid input: (file, line, problem)."""
    return located.filter(F.col("problem").isNotNull()).select("file", "line", "problem")


def events(located: DataFrame) -> DataFrame:
    """The well-formed records, in the EVENT schema the checks take."""
    return located.filter(F.col("problem").isNull()).select(*EVENT.fieldNames())


# ---------------------------------------------------------------------- snapshots


def _not_long(c: Column) -> Column:
    return c.isNotNull() & c.try_cast("long").isNull()


def _long0(c: Column) -> Column:
    # protobuf JSON omits zero values: a missing int64 is 0.
    return F.coalesce(c.try_cast("long"), F.lit(0).cast("long"))


def bad_snapshots(raw: DataFrame) -> DataFrame:
    """Snapshot files that are not valid input: (file, line=null, problem)."""
    stem = F.url_decode(F.regexp_extract("file", r"([^/]*)\.json$", 1))
    same_id = Window.partitionBy("snapshot_id")
    cases: list[tuple[Column, Column]] = [
        (F.col(CORRUPT_COLUMN).isNotNull(), F.lit("not a valid snapshot JSON document")),
        (F.col("snapshot_id").isNull(), F.lit("missing snapshot_id")),
        (
            F.col("snapshot_id") != stem,
            F.format_string("snapshot_id %s does not match the file name", "snapshot_id"),
        ),
        (F.count(F.lit(1)).over(same_id) > 1, F.format_string("snapshot_id %s is in more than one file", "snapshot_id")),
        (
            F.exists(F.coalesce("nodes", F.array()), lambda n: n.node_id.isNull() | _not_long(n.balance)),
            F.lit("a node without node_id or with a non-integer balance"),
        ),
        (
            F.exists(F.coalesce("channels", F.array()), lambda c: c.src.isNull() | c.dst.isNull()),
            F.lit("a channel without src or dst"),
        ),
        (
            F.exists(
                F.flatten(F.transform(F.coalesce("channels", F.array()), lambda c: F.coalesce(c.in_flight, F.array()))),
                lambda m: m.msg_id.isNull() | _not_long(m.amount) | _not_long(m.seq),
            ),
            F.lit("an in-flight transfer without msg_id or with a non-integer amount or seq"),
        ),
        (_not_long(F.col("total")) | _not_long(F.col("expected_total")), F.lit("a non-integer total")),
    ]
    return (
        raw.select("*", _first_when(cases).alias("problem"))
        .filter(F.col("problem").isNotNull())
        .select("file", F.lit(None).cast("long").alias("line"), "problem")
    )


def typed_snapshots(raw: DataFrame) -> DataFrame:
    """Snapshot files -> one typed row per snapshot (int64 strings become longs)."""
    nodes = F.transform(
        F.coalesce("nodes", F.array()),
        lambda n: F.struct(n.node_id.alias("node"), _long0(n.balance).alias("balance")),
    )
    channels = F.transform(
        F.coalesce("channels", F.array()),
        lambda c: F.struct(
            c.src.alias("src"),
            c.dst.alias("dst"),
            F.transform(
                F.coalesce(c.in_flight, F.array()),
                lambda m: F.struct(
                    m.msg_id.alias("msg_id"), _long0(m.amount).alias("amount"), _long0(m.seq).alias("seq")
                ),
            ).alias("in_flight"),
        ),
    )
    return raw.select(
        "snapshot_id",
        F.coalesce("status", F.lit("STATUS_UNSPECIFIED")).alias("status"),
        F.coalesce("reason", F.lit("")).alias("reason"),
        "started_at",
        nodes.alias("nodes"),
        channels.alias("channels"),
        F.col("total").try_cast("long").alias("claimed_total"),
        F.col("expected_total").try_cast("long").alias("claimed_expected_total"),
    )


# ------------------------------------------------------------------ discrepancies


def _message(m: Message, *args: str | Column) -> Column:
    return F.struct(
        F.lit(m.priority).alias("priority"),
        F.format_string(m.template, *args).alias("text"),
    )


def _found(df: DataFrame, keys: list[str], checks: list[tuple[Column, Column]]) -> DataFrame:
    """One row per (key, discrepancy) for every check whose condition holds."""
    found = F.array(*(F.when(cond, msg) for cond, msg in checks))
    return df.select(*keys, F.explode(F.filter(found, lambda d: d.isNotNull())).alias("d"))


def _shared(df: DataFrame) -> DataFrame:
    """Compute once a small intermediate table that several checks read.

    Without this every reader inlines (and recomputes) its whole plan: the verdict
    query grew to ~150 stages and its planning alone took seconds. The tables are
    tiny (per node, per cut, per channel), never the log itself; they live in the
    executors' block managers until garbage-collected. Measured on 1M records,
    local[2]: with none of them the verdict query ran 247 jobs in ~50 s (readers
    prune different columns, so Spark cannot reuse one exchange for them); with
    ``cache()`` instead, building the plan took 3-5 s and the run was no faster.
    Tables derived only from already shared ones (``channels``, ``facts``) and tables
    read once are not shared.
    """
    return df.localCheckpoint()


class LogSummary(NamedTuple):
    """Small per-node and per-channel aggregates of the whole log, shared by the checks."""

    per_node: DataFrame  # node, inits, init_lsn, init_balance
    seqs: DataFrame  # src, dst, side, seq, n  (one row per logged channel seq: log-sized)
    per_side: DataFrame  # src, dst, side, distinct, low, high, dup
    channels: DataFrame  # src, dst: every channel the logs show
    facts: DataFrame  # one row: log_nodes, log_channels, initial_total


def summarize_logs(evs: DataFrame) -> LogSummary:
    is_init = F.col("kind") == "init"
    per_node = _shared(
        evs.groupBy("node").agg(
            F.count(F.when(is_init, 1)).alias("inits"),
            F.min(F.when(is_init, F.col("lsn"))).alias("init_lsn"),
            F.sum(F.when(is_init, F.col("balance"))).alias("init_balance"),
        )
    )
    side = F.when(_kind_in(SENDS), F.lit("sender")).otherwise(F.lit("receiver"))
    seqs = (
        evs.filter(_kind_in(CHANNEL_KINDS))
        .groupBy("src", "dst", side.alias("side"), "seq")
        .agg(F.count(F.lit(1)).alias("n"))
    )
    per_side = _shared(
        seqs.groupBy("src", "dst", "side").agg(
            F.count(F.lit(1)).alias("distinct"),
            F.min("seq").alias("low"),
            F.max("seq").alias("high"),
            F.min(F.when(F.col("n") > 1, F.struct("seq", "n"))).alias("dup"),
        )
    )
    channels = per_side.select("src", "dst").distinct()
    facts = (
        per_node.agg(
            F.count(F.lit(1)).alias("log_nodes"),
            F.coalesce(F.sum("init_balance"), F.lit(0)).cast("long").alias("initial_total"),
        ).crossJoin(channels.agg(F.count(F.lit(1)).alias("log_channels")))
    )
    return LogSummary(per_node, seqs, per_side, channels, facts)


def log_discrepancies(evs: DataFrame, summary: LogSummary | None = None) -> DataFrame:
    """Whole-log checks -> (d: struct<priority, text>)."""
    summary = summary or summarize_logs(evs)
    nodes = _found(
        summary.per_node,
        [],
        [
            (F.col("inits") == 0, _message(M.NO_INIT, "node")),
            (F.col("inits") > 1, _message(M.MANY_INITS, "node", "inits")),
            (F.col("init_lsn") != 1, _message(M.INIT_NOT_FIRST, "node", "init_lsn")),
        ],
    )
    lsns = evs.filter(F.col("lsn") != F.col("line")).select(
        _message(M.LSN_NOT_LINE, "node", "line", "lsn").alias("d")
    )

    transfer = F.struct("src", "dst", "seq", "amount")
    is_send, is_recv = F.col("kind") == "send", F.col("kind") == "recv"
    per_msg = (
        evs.filter(_kind_in(("send", "recv")))
        .groupBy("msg_id")
        .agg(
            F.count(F.when(is_send, 1)).alias("sends"),
            F.count(F.when(is_recv, 1)).alias("recvs"),
            F.min(F.when(is_send, transfer)).alias("sent"),
            F.min(F.when(is_recv, transfer)).alias("got"),
            F.min(F.when(is_recv, F.col("node"))).alias("receiver"),
        )
    )

    def describe(c: str) -> Column:
        return F.format_string(M.TRANSFER, f"{c}.src", f"{c}.dst", f"{c}.seq", f"{c}.amount")

    msgs = _found(
        per_msg,
        [],
        [
            (F.col("sends") == 0, _message(M.RECV_NEVER_SENT, "msg_id", "receiver")),
            (F.col("sends") > 1, _message(M.SENT_TWICE, "msg_id", "sends")),
            (F.col("recvs") > 1, _message(M.RECEIVED_TWICE, "msg_id", "recvs")),
            (F.col("got") != F.col("sent"), _message(M.RECV_MISMATCH, "msg_id", describe("got"), describe("sent"))),
        ],
    )

    per_side = summary.per_side
    holey = (F.col("distinct") != F.col("high")) | (F.col("low") != 1)
    by_seq = Window.partitionBy("src", "dst", "side").orderBy("seq")
    gaps = (
        summary.seqs.join(F.broadcast(per_side.filter(holey).select("src", "dst", "side")), ["src", "dst", "side"], "inner")
        .select("src", "dst", "side", "seq", F.lag("seq", 1, 0).over(by_seq).alias("prev"))
        .filter(F.col("seq") > F.col("prev") + 1)
        .groupBy("src", "dst", "side")
        .agg(F.min(F.col("prev") + 1).alias("missing"))
    )
    who = F.when(F.col("side") == "sender", F.col("src")).otherwise(F.col("dst"))
    sides = _found(
        per_side.join(gaps, ["src", "dst", "side"], "left"),
        [],
        [
            (F.col("dup").isNotNull(), _message(M.SEQ_DUPLICATE, "src", "dst", "dup.seq", "dup.n", "side", who)),
            (F.col("missing").isNotNull(), _message(M.SEQ_MISSING, "src", "dst", "missing", "side", who)),
            (holey & F.col("missing").isNull(), _message(M.SEQ_NOT_1_TO_N, "src", "dst", "side", who)),
        ],
    )
    high = per_side.groupBy("src", "dst").agg(
        F.max(F.when(F.col("side") == "sender", F.col("high"))).alias("sent_high"),
        F.max(F.when(F.col("side") == "receiver", F.col("high"))).alias("got_high"),
    )
    sent_high = F.coalesce("sent_high", F.lit(0))
    beyond = _found(
        high,
        [],
        [(F.col("got_high") > sent_high, _message(M.RECV_BEYOND_SENT, "src", "dst", "dst", "got_high", "src", sent_high))],
    )
    return nodes.unionByName(lsns).unionByName(msgs).unionByName(sides).unionByName(beyond)


def _cuts(evs: DataFrame) -> DataFrame:
    """(snapshot_id, node, cuts, cut_lsn, cut_balance): a node's cut for a snapshot."""
    return (
        evs.filter(F.col("kind") == "cut")
        .groupBy("snapshot_id", "node")
        .agg(F.count(F.lit(1)).alias("cuts"), F.min(F.struct("lsn", "balance")).alias("c"))
        .select("snapshot_id", "node", "cuts", F.col("c.lsn").alias("cut_lsn"), F.col("c.balance").alias("cut_balance"))
    )


def _buckets(low: Column, high: Column, bucket: int) -> Column:
    return F.explode(F.sequence(F.floor(low / bucket), F.floor(high / bucket)))


def _before_cuts(evs: DataFrame, cuts: DataFrame, bucket: int) -> DataFrame:
    """Balances and channel positions before every cut.

    Returns (node, hi, dir, peer, delta_before, n_before, top_before, ttop_before)
    where hi is a cut's lsn and dir is "bal" (peer "": init), "out" (sends and
    markers sent to peer) or "in" (receipts from peer); delta is the balance change
    (a node's balance before a cut is the sum over its rows at that cut); n is the
    number of such records, top the highest seq and ttop the highest seq of a
    transfer. n == top says the records before the cut are exactly seqs 1..top
    (FIFO). ttop ignores markers, so it does not matter whether a node logs the
    marker of S before or after its cut for S.
    """
    by_lsn = Window.partitionBy("node").orderBy("hi")
    bounds = cuts.select("node", F.col("cut_lsn").alias("hi")).select(
        "node", "hi", F.lag("hi", 1, 0).over(by_lsn).alias("lo")
    )
    intervals = bounds.select("node", "lo", "hi", _buckets(F.col("lo"), F.col("hi") - 1, bucket).alias("bucket"))
    flow = evs.filter(_kind_in(FLOW_KINDS)).select(
        "node", "lsn", "kind", "balance", "amount", "seq", "src", "dst", F.floor(F.col("lsn") / bucket).alias("bucket")
    )
    matched = flow.join(F.broadcast(intervals), on=["node", "bucket"], how="inner").filter(
        (F.col("lsn") >= F.col("lo")) & (F.col("lsn") < F.col("hi"))
    )
    direction = F.when(_kind_in(SENDS), F.lit("out")).when(_kind_in(RECEIPTS), F.lit("in")).otherwise(F.lit("bal"))
    peer = F.when(_kind_in(SENDS), F.col("dst")).when(_kind_in(RECEIPTS), F.col("src")).otherwise(F.lit(""))
    delta = (
        F.when(F.col("kind") == "init", F.col("balance"))
        .when(F.col("kind") == "recv", F.col("amount"))
        .when(F.col("kind") == "send", -F.col("amount"))
        .otherwise(F.lit(0))
    )
    transfer_seq = F.when(_kind_in(("send", "recv")), F.col("seq"))
    per = (
        matched.groupBy("node", "hi", direction.alias("dir"), peer.alias("peer")).agg(
            F.sum(delta).alias("delta"),
            F.count(F.lit(1)).alias("n"),
            F.max("seq").alias("top"),
            F.max(transfer_seq).alias("ttop"),
        )
    )
    links = per.select("node", "dir", "peer").unionByName(
        bounds.select("node", F.lit("bal").alias("dir"), F.lit("").alias("peer"))
    ).distinct()
    upto = Window.partitionBy("node", "dir", "peer").orderBy("hi").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return _shared(
        bounds.select("node", "hi")
        .join(links, ["node"], "inner")
        .join(per, ["node", "hi", "dir", "peer"], "left")
        .select(
            "node",
            "hi",
            "dir",
            "peer",
            F.sum(F.coalesce("delta", F.lit(0))).over(upto).cast("long").alias("delta_before"),
            F.sum(F.coalesce("n", F.lit(0))).over(upto).alias("n_before"),
            F.max(F.coalesce("top", F.lit(0))).over(upto).alias("top_before"),
            F.max(F.coalesce("ttop", F.lit(0))).over(upto).alias("ttop_before"),
        )
    )


def snapshot_discrepancies(
    evs: DataFrame, complete: DataFrame, summary: LogSummary | None = None, bucket: int = BUCKET
) -> DataFrame:
    """Per-snapshot checks of COMPLETE snapshots -> (snapshot_id, d: struct<priority, text>)."""
    S = "snapshot_id"
    summary = summary or summarize_logs(evs)
    cuts = _shared(_cuts(evs))
    before = _before_cuts(evs, cuts, bucket)
    ids = complete.select(S)

    # 1 + 4 (nodes): completeness and balances.
    in_logs = ids.crossJoin(summary.per_node.select("node")).withColumn("in_logs", F.lit(True))
    recorded = (
        complete.select(S, F.explode("nodes").alias("n"))
        .groupBy(S, F.col("n.node").alias("node"))
        .agg(F.count(F.lit(1)).alias("listed"), F.min("n.balance").alias("recorded"))
    )
    balance_before = before.groupBy("node", F.col("hi").alias("cut_lsn")).agg(
        F.sum("delta_before").alias("balance_before")
    )
    nodes = (
        in_logs.join(recorded, [S, "node"], "full")
        .join(cuts, [S, "node"], "left")
        .join(balance_before, ["node", "cut_lsn"], "left")
    )
    listed, has_cut = F.col("listed").isNotNull(), F.col("cuts").isNotNull()
    node_found = _found(
        nodes,
        [S],
        [
            (F.col("in_logs") & ~listed, _message(M.MISSING_NODE, "node")),
            (F.col("in_logs").isNull(), _message(M.UNKNOWN_NODE, "node")),
            (F.col("listed") > 1, _message(M.NODE_LISTED_TWICE, "node", "listed")),
            (F.col("in_logs") & ~has_cut, _message(M.NO_CUT, "node")),
            (F.col("cuts") > 1, _message(M.MANY_CUTS, "node", "cuts")),
            (
                listed & has_cut & (F.col("recorded") != F.col("balance_before")),
                _message(M.BALANCE, "node", "recorded", "balance_before"),
            ),
            (
                has_cut & (F.col("cut_balance") != F.col("balance_before")),
                _message(M.CUT_BALANCE, "node", "cut_balance", "balance_before"),
            ),
        ],
    )

    # 2 + 4 (channels): completeness, cut positions, in-flight contents.
    seqs = F.transform("c.in_flight", lambda m: m.seq)
    recorded_channels = (
        complete.select(S, F.explode("channels").alias("c"))
        .select(S, "c.src", "c.dst", (seqs == F.array_sort(seqs)).alias("ordered"))
        .groupBy(S, "src", "dst")
        .agg(F.count(F.lit(1)).alias("listed"), F.min(F.col("ordered").cast("int")).alias("ordered"))
    )

    def cut_of(end: str) -> DataFrame:
        return cuts.select(S, F.col("node").alias(end), F.col("cut_lsn").alias(f"{end}_cut"))

    def position(direction: str, me: str, other: str, prefix: str) -> DataFrame:
        return before.filter(F.col("dir") == direction).select(
            F.col("node").alias(me),
            F.col("hi").alias(f"{me}_cut"),
            F.col("peer").alias(other),
            F.col("n_before").alias(f"{prefix}_n"),
            F.col("top_before").alias(f"{prefix}_top"),
            F.col("ttop_before").alias(f"{prefix}_ttop"),
        )

    both_cuts = F.col("src_cut").isNotNull() & F.col("dst_cut").isNotNull()
    channels = _shared(
        ids.crossJoin(summary.channels)
        .withColumn("in_logs", F.lit(True))
        .join(recorded_channels, [S, "src", "dst"], "full")
        .join(cut_of("src"), [S, "src"], "left")
        .join(cut_of("dst"), [S, "dst"], "left")
        .join(position("out", "src", "dst", "sent"), ["src", "src_cut", "dst"], "left")
        .join(position("in", "dst", "src", "got"), ["dst", "dst_cut", "src"], "left")
        .select(
            S,
            "src",
            "dst",
            "in_logs",
            "listed",
            "ordered",
            both_cuts.alias("both_cuts"),
            *(
                F.coalesce(c, F.lit(0)).alias(c)
                for c in ("sent_n", "sent_top", "sent_ttop", "got_n", "got_top", "got_ttop")
            ),
        )
    )
    cut_pair = F.col("both_cuts")
    channel_found = _found(
        channels,
        [S],
        [
            (F.col("in_logs") & F.col("listed").isNull(), _message(M.MISSING_CHANNEL, "src", "dst")),
            (F.col("listed") > 1, _message(M.CHANNEL_LISTED_TWICE, "src", "dst", "listed")),
            (
                cut_pair & (F.col("sent_n") != F.col("sent_top")),
                _message(M.SENDER_NOT_PREFIX, "src", "dst", "src", "sent_n", "sent_top"),
            ),
            (
                cut_pair & (F.col("got_n") != F.col("got_top")),
                _message(M.RECEIVER_NOT_PREFIX, "src", "dst", "dst", "got_n", "got_top"),
            ),
            (
                cut_pair & (F.col("got_ttop") > F.col("sent_ttop")),
                _message(M.ORPHAN_RECEIPT, "src", "dst", "dst", "got_ttop", "src", "sent_ttop"),
            ),
            (F.col("ordered") == 0, _message(M.IN_FLIGHT_ORDER, "src", "dst")),
        ],
    )

    # In flight on j->i in S: the transfers j sent with seq in (b, a], a the highest
    # transfer seq j sent before its cut, b the highest i received before its cut.
    state = channels.filter(cut_pair).select(
        S, "src", "dst", F.col("sent_ttop").alias("a"), F.col("got_ttop").alias("b")
    )
    ranges = state.filter(F.col("a") > F.col("b")).select(
        S, "src", "dst", "a", "b", _buckets(F.col("b") + 1, F.col("a"), bucket).alias("bucket")
    )
    sends = evs.filter(F.col("kind") == "send").select(
        "src", "dst", "seq", "msg_id", "amount", F.floor(F.col("seq") / bucket).alias("bucket")
    )
    expected = (
        sends.join(F.broadcast(ranges), ["src", "dst", "bucket"], "inner")
        .filter((F.col("seq") > F.col("b")) & (F.col("seq") <= F.col("a")))
        .select(S, "src", "dst", "msg_id", F.col("seq").alias("exp_seq"), F.col("amount").alias("exp_amount"))
        .withColumn("expected", F.lit(True))
    )
    in_flight = (
        complete.select(S, F.explode("channels").alias("c"))
        .select(S, "c.src", "c.dst", F.explode("c.in_flight").alias("m"))
        .groupBy(S, "src", "dst", F.col("m.msg_id").alias("msg_id"))
        .agg(
            F.count(F.lit(1)).alias("listed"),
            F.min("m.amount").alias("rec_amount"),
            F.min("m.seq").alias("rec_seq"),
        )
    )
    compared = _shared(expected.join(in_flight, [S, "src", "dst", "msg_id"], "full"))
    both = F.col("expected") & F.col("listed").isNotNull()
    compare_found = _found(
        compared,
        [S],
        [
            (F.col("expected") & F.col("listed").isNull(), _message(M.MISSING_IN_FLIGHT, "src", "dst", "msg_id")),
            (F.col("listed") > 1, _message(M.IN_FLIGHT_LISTED_TWICE, "src", "dst", "msg_id", "listed")),
            (
                both & (F.col("rec_amount") != F.col("exp_amount")),
                _message(M.IN_FLIGHT_AMOUNT, "src", "dst", "msg_id", "rec_amount", "exp_amount"),
            ),
            (
                both & (F.col("rec_seq") != F.col("exp_seq")),
                _message(M.IN_FLIGHT_SEQ, "src", "dst", "msg_id", "rec_seq", "exp_seq"),
            ),
        ],
    )
    # Recorded but not expected: say why, from the send record (looked up by msg_id).
    unexpected = compared.filter(F.col("expected").isNull()).select(S, "src", "dst", "msg_id")
    sent_as = sends.select(
        "msg_id", F.col("src").alias("s_src"), F.col("dst").alias("s_dst"), F.col("seq").alias("s_seq")
    ).join(F.broadcast(unexpected.select("msg_id").distinct()), ["msg_id"], "inner")
    why = unexpected.join(sent_as, ["msg_id"], "left").join(state, [S, "src", "dst"], "left")
    other_channel = (F.col("s_src") != F.col("src")) | (F.col("s_dst") != F.col("dst"))
    unexpected_found = why.select(
        S,
        _first_when(
            [
                (F.col("s_src").isNull(), _message(M.IN_FLIGHT_NEVER_SENT, "src", "dst", "msg_id")),
                (other_channel, _message(M.IN_FLIGHT_OTHER_CHANNEL, "src", "dst", "msg_id", "s_src", "s_dst")),
                (F.col("s_seq") > F.col("a"), _message(M.IN_FLIGHT_AFTER_CUT, "src", "dst", "msg_id", "src")),
                (F.col("s_seq") <= F.col("b"), _message(M.IN_FLIGHT_RECEIVED, "src", "dst", "msg_id", "dst")),
            ]
        )
        .otherwise(_message(M.UNEXPECTED_IN_FLIGHT, "src", "dst", "msg_id"))
        .alias("d"),
    )

    # 3: conservation, and the snapshot's own claims.
    totals = snapshot_totals(complete).crossJoin(summary.facts.select("initial_total"))
    total_found = _found(
        totals,
        [S],
        [
            (
                F.col("observed_total") != F.col("initial_total"),
                _message(M.CONSERVATION, "observed_total", "balances", "in_flight", "initial_total"),
            ),
            (
                F.col("claimed_total") != F.col("observed_total"),
                _message(M.CLAIMED_TOTAL, "claimed_total", "observed_total"),
            ),
            (
                F.col("claimed_expected_total") != F.col("initial_total"),
                _message(M.CLAIMED_EXPECTED, "claimed_expected_total", "initial_total"),
            ),
        ],
    )
    return (
        node_found.unionByName(channel_found)
        .unionByName(compare_found)
        .unionByName(unexpected_found)
        .unionByName(total_found)
    )


def _recorded_parts() -> tuple[Column, Column]:
    """(recorded balances, recorded in-flight) of a typed snapshot row."""
    zero = F.lit(0).cast("long")
    balances = F.aggregate("nodes", zero, lambda acc, n: acc + n.balance)
    in_flight = F.aggregate(
        F.flatten(F.transform("channels", lambda c: c.in_flight)), zero, lambda acc, m: acc + m.amount
    )
    return balances, in_flight


def _observed_total() -> Column:
    balances, in_flight = _recorded_parts()
    return balances + in_flight


def snapshot_totals(snaps: DataFrame) -> DataFrame:
    """(snapshot_id, balances, in_flight, observed_total, claimed_*) of typed snapshots."""
    balances, in_flight = _recorded_parts()
    return snaps.select(
        "snapshot_id",
        balances.alias("balances"),
        in_flight.alias("in_flight"),
        (balances + in_flight).alias("observed_total"),
        "claimed_total",
        "claimed_expected_total",
    )


# ------------------------------------------------------------------------ verdicts


def verdicts(evs: DataFrame, snaps: DataFrame, bucket: int = BUCKET) -> DataFrame:
    """Events (EVENT) and typed snapshots -> verdict rows (VERDICT), logs row first.

    One row per snapshot; COMPLETE snapshots are checked (consistent true/false),
    others are skipped (consistent null, first_discrepancy says why). One more row,
    scope "logs", carries the whole-log checks.
    """
    S = "snapshot_id"
    snaps = _shared(snaps)
    complete = snaps.filter(F.col("status") == COMPLETE)
    summary = summarize_logs(evs)
    first = lambda found: found.agg(  # noqa: E731
        F.count(F.lit(1)).alias("discrepancies"), F.min("d").alias("first")
    )
    found = first(snapshot_discrepancies(evs, complete, summary, bucket).groupBy(S))
    is_complete = F.col("status") == COMPLETE
    skipped = F.format_string(
        M.SKIPPED, "status", F.when(F.col("reason") != "", F.concat(F.lit(": "), "reason")).otherwise(F.lit(""))
    )
    snapshot_rows = (
        snaps.select("*", _observed_total().alias("observed_total"))
        .join(found, [S], "left")
        .crossJoin(summary.facts)
        .select(
            F.lit(SCOPE_SNAPSHOT).alias("scope"),
            S,
            "status",
            F.when(is_complete, F.col("discrepancies").isNull()).alias("consistent"),
            F.when(is_complete, F.size("nodes")).otherwise(0).cast("long").alias("nodes_checked"),
            F.when(is_complete, F.size("channels")).otherwise(0).cast("long").alias("channels_checked"),
            F.col("initial_total").alias("expected_total"),
            F.when(is_complete, F.col("observed_total")).alias("observed_total"),
            F.when(is_complete, F.coalesce("discrepancies", F.lit(0))).otherwise(0).cast("long").alias("discrepancies"),
            F.when(is_complete, F.col("first.text")).otherwise(skipped).alias("first_discrepancy"),
            F.lit(1).alias("_order"),
            "started_at",
        )
    )
    logs_row = first(log_discrepancies(evs, summary)).crossJoin(summary.facts).select(
        F.lit(SCOPE_LOGS).alias("scope"),
        F.lit(None).cast("string").alias(S),
        F.lit("-").alias("status"),
        (F.col("discrepancies") == 0).alias("consistent"),
        F.col("log_nodes").cast("long").alias("nodes_checked"),
        F.col("log_channels").cast("long").alias("channels_checked"),
        F.col("initial_total").alias("expected_total"),
        F.lit(None).cast("long").alias("observed_total"),
        F.col("discrepancies").cast("long"),
        F.col("first.text").alias("first_discrepancy"),
        F.lit(0).alias("_order"),
        F.lit(None).cast("string").alias("started_at"),
    )
    return (
        logs_row.unionByName(snapshot_rows)
        .coalesce(1)  # one row per snapshot: sorting in one partition needs no sampling job
        .sortWithinPartitions("_order", F.col("started_at").asc_nulls_last(), S)
        .select(*VERDICT.fieldNames())
    )
