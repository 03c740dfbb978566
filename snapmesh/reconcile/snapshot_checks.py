"""Step 3, snapshot checks: every COMPLETE snapshot against the logs, exact.

The rules are docs/reconcile.md "The rules" (the pure `snapmesh.checking.cut` states
them in Python); the comments below name the rule each join implements.

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
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from snapmesh.reconcile import messages as M
from snapmesh.reconcile.common import BUCKET, FLOW_KINDS, RECEIPTS, SENDS, first_when, found, kind_in, message, shared
from snapmesh.reconcile.log_checks import LogSummary, summarize_logs


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
    flow = evs.filter(kind_in(FLOW_KINDS)).select(
        "node", "lsn", "kind", "balance", "amount", "seq", "src", "dst", F.floor(F.col("lsn") / bucket).alias("bucket")
    )
    matched = flow.join(F.broadcast(intervals), on=["node", "bucket"], how="inner").filter(
        (F.col("lsn") >= F.col("lo")) & (F.col("lsn") < F.col("hi"))
    )
    direction = F.when(kind_in(SENDS), F.lit("out")).when(kind_in(RECEIPTS), F.lit("in")).otherwise(F.lit("bal"))
    peer = F.when(kind_in(SENDS), F.col("dst")).when(kind_in(RECEIPTS), F.col("src")).otherwise(F.lit(""))
    delta = (
        F.when(F.col("kind") == "init", F.col("balance"))
        .when(F.col("kind") == "recv", F.col("amount"))
        .when(F.col("kind") == "send", -F.col("amount"))
        .otherwise(F.lit(0))
    )
    transfer_seq = F.when(kind_in(("send", "recv")), F.col("seq"))
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
    return shared(
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
    cuts = shared(_cuts(evs))
    before = _before_cuts(evs, cuts, bucket)
    ids = complete.select(S)

    # Rules 1 and 3 (docs/reconcile.md "The rules").
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
    node_found = found(
        nodes,
        [S],
        [
            (F.col("in_logs") & ~listed, message(M.MISSING_NODE, "node")),
            (F.col("in_logs").isNull(), message(M.UNKNOWN_NODE, "node")),
            (F.col("listed") > 1, message(M.NODE_LISTED_TWICE, "node", "listed")),
            (F.col("in_logs") & ~has_cut, message(M.NO_CUT, "node")),
            (F.col("cuts") > 1, message(M.MANY_CUTS, "node", "cuts")),
            (
                listed & has_cut & (F.col("recorded") != F.col("balance_before")),
                message(M.STATE, "node", "recorded", "balance_before"),
            ),
            (
                has_cut & (F.col("cut_balance") != F.col("balance_before")),
                message(M.CUT_BALANCE, "node", "cut_balance", "balance_before"),
            ),
        ],
    )

    # Rules 2, 4, 5 and the order of 6.
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
    channels = shared(
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
    channel_found = found(
        channels,
        [S],
        [
            (F.col("in_logs") & F.col("listed").isNull(), message(M.MISSING_CHANNEL, "src", "dst")),
            (F.col("listed") > 1, message(M.CHANNEL_LISTED_TWICE, "src", "dst", "listed")),
            (
                cut_pair & (F.col("sent_n") != F.col("sent_top")),
                message(M.SENDER_NOT_PREFIX, "src", "dst", "src", "sent_n", "sent_top"),
            ),
            (
                cut_pair & (F.col("got_n") != F.col("got_top")),
                message(M.RECEIVER_NOT_PREFIX, "src", "dst", "dst", "got_n", "got_top"),
            ),
            (
                cut_pair & (F.col("got_ttop") > F.col("sent_ttop")),
                message(M.ORPHAN_RECEIPT, "src", "dst", "dst", "got_ttop", "src", "sent_ttop"),
            ),
            (F.col("ordered") == 0, message(M.IN_FLIGHT_ORDER, "src", "dst")),
        ],
    )

    # Rule 6: the in-flight transfers the logs give (the seq range (b, a]).
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
    compared = shared(expected.join(in_flight, [S, "src", "dst", "msg_id"], "full"))
    both = F.col("expected") & F.col("listed").isNotNull()
    compare_found = found(
        compared,
        [S],
        [
            (F.col("expected") & F.col("listed").isNull(), message(M.MISSING_IN_FLIGHT, "src", "dst", "msg_id")),
            (F.col("listed") > 1, message(M.IN_FLIGHT_LISTED_TWICE, "src", "dst", "msg_id", "listed")),
            (
                both & (F.col("rec_amount") != F.col("exp_amount")),
                message(M.IN_FLIGHT_CONTENT, "src", "dst", "msg_id", "rec_amount", "exp_amount"),
            ),
            (
                both & (F.col("rec_seq") != F.col("exp_seq")),
                message(M.IN_FLIGHT_SEQ, "src", "dst", "msg_id", "rec_seq", "exp_seq"),
            ),
        ],
    )
    # Rule 6, recorded but not expected: why, from the send record (by msg_id).
    unexpected = compared.filter(F.col("expected").isNull()).select(S, "src", "dst", "msg_id")
    sent_as = sends.select(
        "msg_id", F.col("src").alias("s_src"), F.col("dst").alias("s_dst"), F.col("seq").alias("s_seq")
    ).join(F.broadcast(unexpected.select("msg_id").distinct()), ["msg_id"], "inner")
    why = unexpected.join(sent_as, ["msg_id"], "left").join(state, [S, "src", "dst"], "left")
    other_channel = (F.col("s_src") != F.col("src")) | (F.col("s_dst") != F.col("dst"))
    unexpected_found = why.select(
        S,
        first_when(
            [
                (F.col("s_src").isNull(), message(M.IN_FLIGHT_NEVER_SENT, "src", "dst", "msg_id")),
                (other_channel, message(M.IN_FLIGHT_OTHER_CHANNEL, "src", "dst", "msg_id", "s_src", "s_dst")),
                (F.col("s_seq") > F.col("a"), message(M.IN_FLIGHT_AFTER_CUT, "src", "dst", "msg_id", "src")),
                (F.col("s_seq") <= F.col("b"), message(M.IN_FLIGHT_RECEIVED, "src", "dst", "msg_id", "dst")),
            ]
        )
        .otherwise(message(M.UNEXPECTED_IN_FLIGHT, "src", "dst", "msg_id"))
        .alias("d"),
    )

    # Rule 7.
    totals = snapshot_totals(complete).crossJoin(summary.facts.select("initial_total"))
    total_found = found(
        totals,
        [S],
        [
            (
                F.col("observed_total") != F.col("initial_total"),
                message(M.CONSERVATION, "observed_total", "balances", "in_flight", "initial_total"),
            ),
            (
                F.col("claimed_total") != F.col("observed_total"),
                message(M.CLAIMED_TOTAL, "claimed_total", "observed_total"),
            ),
            (
                F.col("claimed_expected_total") != F.col("initial_total"),
                message(M.CLAIMED_EXPECTED, "claimed_expected_total", "initial_total"),
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


def observed_total() -> Column:
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
