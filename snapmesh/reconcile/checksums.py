"""The fast path: every check by aggregates over the log, no join of log to log.

A consistent run is certified with three small aggregations of the log and one read
of the snapshots; the exact joins of ``log_checks``/``snapshot_checks`` run only to
name the discrepancies of what a checksum did not certify. The Spark side builds
the aggregates (``cut_rows``, ``interval_sums``, ``sends_upto``, ``snapshot_sums``);
``certify`` compares them on the driver (they are per node, per cut and per
channel: small) and is pure Python. It certifies docs/reconcile.md "The rules" 1-7.

What the aggregates prove, per channel j->i (P = 2**31 - 1, h = xxhash64(seq, amount)
split in two 31-bit halves, so no sum of 2**32 rows overflows a long):

* Each side logs seqs 1..n once each: count = max = n, min = 1, and the sums of
  seq, seq**2 and seq**3 (mod P) equal those of 1..n. (A duplicate and a gap change
  them unless at least four seqs are wrong in a way that keeps all three sums.)
* msg_id is ``src:dst:seq`` on every send and receipt, and no node name has a ``:``:
  then msg_ids are unique because seqs are, and name their channel and seq.
* The receipts are the sends with seq <= n_i (the receiver's highest): same count,
  same sum of h. So every receipt matches a send in seq and amount.
* Before a cut each side logged exactly seqs 1..top (count = top), so the sends
  with seq <= a (a: the sender's highest transfer before its cut) are the sender's
  transfers before its cut, and the sends with seq <= b (b: the receiver's highest
  receipt before its cut) match the receiver's receipts before its cut. In flight
  on j->i is then (count, sum of h) of the first minus the second: a per-cut
  prefix of the interval sums, no join. The recorded in-flight must have the same.

Balances, cut records, node and channel lists, order and totals are compared
exactly. A hash collision could certify a wrong in-flight set with probability
about 2**-62 per comparison; everything else certified here is exact.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from snapmesh.reconcile import messages as M
from snapmesh.reconcile.common import BUCKET, CHANNEL_KINDS, COMPLETE, RECEIPTS, SENDS, TRANSFERS, kind_in
from snapmesh.reconcile.schema import SCOPE_LOGS, SCOPE_SNAPSHOT

P = 2_147_483_647  # 2**31 - 1: power sums mod P of values < 2**31 fit a long
TAIL = (1 << 63) - 1  # the interval after a node's last cut
ZERO = {"n": 0, "delta": 0, "top": 0, "ttop": 0, "tn": 0, "h1": 0, "h2": 0}

# ------------------------------------------------------------------ Spark side


def _hash_halves(seq: Column, amount: Column) -> tuple[Column, Column]:
    h = F.xxhash64(seq.cast("long"), amount.cast("long"))
    return h.bitwiseAND(F.lit(0x7FFFFFFF)), F.shiftrightunsigned(h, 33)


def _power_terms(seq: Column) -> tuple[Column, Column, Column]:
    s1 = F.pmod(seq, F.lit(P))
    s2 = F.pmod(s1 * s1, F.lit(P))
    return s1, s2, F.pmod(s2 * s1, F.lit(P))


def _msg_id_of(src: Column, dst: Column, seq: Column) -> Column:
    return F.concat_ws(":", src, dst, seq.cast("string"))


MARKER_COLUMNS = ("node", "kind", "snapshot_id", "lsn", "balance", "epoch", "deliveries", "msg_id", "src", "dst",
                  "seq", "amount")


MARKER_KINDS = ("cut", "restore", "replay")


def cut_rows(evs: DataFrame, *keep: str) -> DataFrame:
    """Every cut, restore and replay record (small: nodes x (snapshots + restored transfers)).

    The cuts make the interval table; the restores and replays cut the log into
    epochs (``epochs``). ``keep``: more columns to select beside them."""
    return evs.filter(F.col("kind").isin(*MARKER_KINDS)).select(*keep, *MARKER_COLUMNS)


INTERVALS = T.StructType(
    [T.StructField(n, T.LongType() if n != "i_node" else T.StringType()) for n in ("i_node", "i_bucket", "lo", "hi")]
)


def interval_table(spark: SparkSession, cuts: Iterable[tuple[str, int]], bucket: int = BUCKET) -> DataFrame:
    """(i_node, i_bucket, lo, hi): each node's intervals [previous cut, cut) by lsn bucket."""
    per_node: dict[str, set[int]] = defaultdict(set)
    for node, lsn in cuts:
        per_node[node].add(lsn)
    rows = []
    for node, lsns in per_node.items():
        lo = 0
        for hi in sorted(lsns):
            rows += [(node, b, lo, hi) for b in range(lo // bucket, (hi - 1) // bucket + 1)]
            lo = hi
    return spark.createDataFrame(rows, INTERVALS)


def interval_sums(
    evs: DataFrame, intervals: DataFrame, bucket: int = BUCKET, *, by: tuple[str, ...] = (), extent: bool = False
) -> DataFrame:
    """Per (node, hi, dir, peer): the sums every check reads. One scan, one aggregation.

    ``hi`` is the cut ending the record's interval (TAIL after the last cut); ``dir``
    is "out" (sends and markers sent, peer = dst), "in" (receipts, peer = src) or
    "bal" (the rest). The interval table is broadcast; records join it on (node, lsn
    bucket) and the range condition. ``by``: more grouping columns; ``extent`` adds
    ``lsn_max``, the group's last lsn (what ``Presummed`` re-keys by).
    """
    iv = F.broadcast(intervals)
    located = evs.withColumn("bucket", F.floor(F.col("lsn") / bucket))
    cond = (
        (located["node"] == iv["i_node"])
        & (located["bucket"] == iv["i_bucket"])
        & (located["lsn"] >= iv["lo"])
        & (located["lsn"] < iv["hi"])
    )
    joined = located.join(iv, cond, "left").withColumn("hi", F.coalesce(F.col("hi"), F.lit(TAIL)))
    channel, transfer, init = kind_in(CHANNEL_KINDS), kind_in(TRANSFERS), F.col("kind") == "init"
    direction = F.when(kind_in(SENDS), F.lit("out")).when(kind_in(RECEIPTS), F.lit("in")).otherwise(F.lit("bal"))
    peer = F.when(kind_in(SENDS), F.col("dst")).when(kind_in(RECEIPTS), F.col("src")).otherwise(F.lit(""))
    delta = (
        F.when(init, F.col("balance"))
        .when(F.col("kind") == "recv", F.col("amount"))
        .when(F.col("kind") == "send", -F.col("amount"))
        .otherwise(F.lit(0))
    )
    h1, h2 = _hash_halves(F.col("seq"), F.col("amount"))
    p1, p2, p3 = _power_terms(F.col("seq"))
    bad_id = transfer & (F.col("msg_id") != _msg_id_of(F.col("src"), F.col("dst"), F.col("seq")))
    return joined.groupBy(*by, "node", "hi", direction.alias("dir"), peer.alias("peer")).agg(
        *([F.max("lsn").alias("lsn_max")] if extent else []),
        F.count(F.lit(1)).alias("n"),
        F.sum(delta).cast("long").alias("delta"),
        F.min(F.when(channel, F.col("seq"))).alias("low"),
        F.max(F.when(channel, F.col("seq"))).alias("top"),
        F.max(F.when(transfer, F.col("seq"))).alias("ttop"),
        F.count(F.when(transfer, 1)).alias("tn"),
        F.sum(F.when(transfer, h1)).alias("h1"),
        F.sum(F.when(transfer, h2)).alias("h2"),
        F.sum(F.when(channel, p1)).alias("p1"),
        F.sum(F.when(channel, p2)).alias("p2"),
        F.sum(F.when(channel, p3)).alias("p3"),
        F.count(F.when(bad_id, 1)).alias("bad_id"),
        F.count(F.when(init, 1)).alias("inits"),
        F.min(F.when(init, F.col("lsn"))).alias("init_lsn"),
        F.sum(F.when(init, F.col("balance"))).alias("init_balance"),
        F.count(F.when(F.col("lsn") != F.col("line"), 1)).alias("lsn_off"),
    )


SUM_COLUMNS = ("n", "delta", "low", "top", "ttop", "tn", "h1", "h2", "p1", "p2", "p3", "bad_id", "inits", "init_lsn",
               "init_balance", "lsn_off")
# interval_sums(..., by=("file",), extent=True) as ``snapmesh reconcile ingest`` stores it.
SEGMENT_SUMS = T.StructType(
    [T.StructField("file", T.StringType()), T.StructField("node", T.StringType()), T.StructField("hi", T.LongType()),
     T.StructField("dir", T.StringType()), T.StructField("peer", T.StringType()),
     T.StructField("lsn_max", T.LongType())]
    + [T.StructField(n, T.LongType()) for n in SUM_COLUMNS]
)


BOUNDS = T.StructType([T.StructField(n, T.StringType()) for n in ("src", "dst")] + [T.StructField("bound", T.LongType())])


def sends_upto(evs: DataFrame, bounds: DataFrame) -> DataFrame:
    """Per channel of ``bounds`` (src, dst, bound): count and hash sums of its sends with seq <= bound."""
    h1, h2 = _hash_halves(F.col("seq"), F.col("amount"))
    return (
        evs.filter(F.col("kind") == "send")
        .join(F.broadcast(bounds), ["src", "dst"], "inner")
        .filter(F.col("seq") <= F.col("bound"))
        .groupBy("src", "dst")
        .agg(F.count(F.lit(1)).alias("tn"), F.sum(h1).alias("h1"), F.sum(h2).alias("h2"))
    )


def snapshot_sums(typed: DataFrame) -> DataFrame:
    """Typed snapshots -> per snapshot: its lists, and per channel in-flight sums (no arrays of transfers)."""

    def in_flight_sums(c: Column) -> Column:
        def halves_of(m: Column) -> Column:
            h1, h2 = _hash_halves(m.seq, m.amount)
            return F.struct(h1.alias("h1"), h2.alias("h2"))

        halves = F.transform(c.in_flight, halves_of)
        seqs = F.transform(c.in_flight, lambda m: m.seq)
        zero = F.lit(0).cast("long")
        return F.struct(
            c.src.alias("src"),
            c.dst.alias("dst"),
            F.size(c.in_flight).cast("long").alias("tn"),
            F.aggregate(halves, zero, lambda acc, h: acc + h.h1).alias("h1"),
            F.aggregate(halves, zero, lambda acc, h: acc + h.h2).alias("h2"),
            F.aggregate(c.in_flight, zero, lambda acc, m: acc + m.amount).alias("amount"),
            F.size(F.filter(c.in_flight, lambda m: m.msg_id != _msg_id_of(c.src, c.dst, m.seq))).alias("bad_id"),
            (seqs == F.array_sort(seqs)).alias("ordered"),
        )

    passed = [c for c in ("file", "problem", "app") if c in typed.columns]  # bad-input columns and app, when given
    return typed.select(
        *passed,
        "snapshot_id",
        "status",
        "reason",
        "started_at",
        "epoch",
        "claimed_total",
        "claimed_expected_total",
        "nodes",
        F.transform("channels", in_flight_sums).alias("channels"),
    )


# ------------------------------------------------------------------ driver side


@dataclass(frozen=True)
class Presummed:
    """The interval sums of the sealed segments, made at ingest, and the rows they do not cover.

    Ingest sums each segment split at every marker record in it (cut, restore,
    replay), so each of its groups lies inside one interval between any two cuts;
    ``lsn_max`` (the group's last lsn) then names that interval: the first cut after
    it. The sums compose (counts, sums, min, max), so ``LogFacts.of`` takes these
    rows beside the ones ``interval_sums`` makes of ``rest`` (None: nothing left).
    """

    rows: list[dict[str, Any]]
    rest: DataFrame | None

    def at(self, cuts: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
        """The rows with ``hi`` = the first cut of ``cuts`` (node, lsn) after each group (TAIL: none)."""
        per_node: dict[str, list[int]] = defaultdict(list)
        for node, lsn in cuts:
            per_node[node].append(lsn)
        for lsns in per_node.values():
            lsns.sort()
        out = []
        for r in self.rows:
            lsns = per_node.get(r["node"], [])
            i = bisect.bisect_right(lsns, r["lsn_max"])
            out.append({**r, "hi": lsns[i] if i < len(lsns) else TAIL})
        return out


@dataclass
class _Prefix:
    """One (node, dir, peer) link's interval sums, and running sums by cut."""

    his: list[int] = field(default_factory=list)
    running: list[dict[str, int]] = field(default_factory=list)

    def add(self, hi: int, row: Mapping[str, Any]) -> None:
        self.his.append(hi)
        self.running.append(row)  # made running in finish()

    def finish(self) -> None:
        order = sorted(range(len(self.his)), key=self.his.__getitem__)
        self.his = [self.his[i] for i in order]
        acc = dict(ZERO)
        running = []
        for i in order:
            r = self.running[i]
            acc = {
                "n": acc["n"] + r["n"],
                "delta": acc["delta"] + (r["delta"] or 0),
                "top": max(acc["top"], r["top"] or 0),
                "ttop": max(acc["ttop"], r["ttop"] or 0),
                "tn": acc["tn"] + r["tn"],
                "h1": acc["h1"] + (r["h1"] or 0),
                "h2": acc["h2"] + (r["h2"] or 0),
            }
            running.append(acc)
        self.running = running

    def before(self, cut: int) -> dict[str, int]:
        """Sums over the records with lsn < cut (the intervals ending at or before it)."""
        i = bisect.bisect_right(self.his, cut)
        return self.running[i - 1] if i else ZERO

    def total(self) -> dict[str, int]:
        return self.running[-1] if self.running else ZERO


def _power_sums_of_1_to(n: int) -> tuple[int, int, int]:
    s1 = n * (n + 1) // 2
    return s1 % P, n * (n + 1) * (2 * n + 1) // 6 % P, s1 * s1 % P


@dataclass
class LogFacts:
    """The interval sums, arranged for the checks."""

    nodes: list[str]
    channels: list[tuple[str, str]]
    links: dict[tuple[str, str, str], _Prefix]
    sides: dict[tuple[str, str, str], dict[str, int]]  # (node, dir, peer) -> totals incl. low, p1..p3
    initial_total: int
    node_ok: bool  # one init per node, first; lsn counts lines; msg_ids src:dst:seq

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]]) -> LogFacts:
        links: dict[tuple[str, str, str], _Prefix] = defaultdict(_Prefix)
        sides: dict[tuple[str, str, str], dict[str, int]] = {}
        per_node: dict[str, dict[str, int]] = defaultdict(lambda: {"inits": 0, "init_lsn": None, "init_balance": 0, "bad": 0})
        for r in rows:
            key = (r["node"], r["dir"], r["peer"])
            links[key].add(r["hi"], r)
            node = per_node[r["node"]]
            node["inits"] += r["inits"]
            node["init_balance"] += r["init_balance"] or 0
            if r["init_lsn"] is not None:
                node["init_lsn"] = r["init_lsn"] if node["init_lsn"] is None else min(node["init_lsn"], r["init_lsn"])
            node["bad"] += r["lsn_off"] + r["bad_id"]
            if r["dir"] != "bal":
                side = sides.setdefault(key, {"n": 0, "low": None, "top": 0, "p1": 0, "p2": 0, "p3": 0})
                side["n"] += r["n"]
                side["top"] = max(side["top"], r["top"] or 0)
                if r["low"] is not None:
                    side["low"] = r["low"] if side["low"] is None else min(side["low"], r["low"])
                for p in ("p1", "p2", "p3"):
                    side[p] += r[p] or 0
        for prefix in links.values():
            prefix.finish()
        channels = sorted({(n, p) if d == "out" else (p, n) for n, d, p in sides})
        names_ok = all(":" not in name for name in [*per_node, *(x for c in channels for x in c)])
        node_ok = names_ok and all(
            v["inits"] == 1 and v["init_lsn"] == 1 and v["bad"] == 0 for v in per_node.values()
        )
        initial = sum(v["init_balance"] for v in per_node.values())
        return cls(sorted(per_node), channels, dict(links), sides, initial, node_ok)

    def link(self, node: str, direction: str, peer: str) -> _Prefix:
        return self.links.get((node, direction, peer)) or _Prefix()

    def side_is_1_to_n(self, key: tuple[str, str, str]) -> bool:
        s = self.sides.get(key)
        if s is None:
            return True
        n = s["n"]
        return s["top"] == n and s["low"] == 1 and (s["p1"] % P, s["p2"] % P, s["p3"] % P) == _power_sums_of_1_to(n)

    def receiver_bounds(self) -> list[tuple[str, str, int]]:
        """(src, dst, n_received) of the channels where the receiver is behind the sender."""
        out = []
        for src, dst in self.channels:
            got = self.sides.get((dst, "in", src), {}).get("n", 0)
            sent = self.sides.get((src, "out", dst), {}).get("n", 0)
            if 0 < got < sent:
                out.append((src, dst, got))
        return out


def logs_certified(facts: LogFacts, sent_upto: Mapping[tuple[str, str], Mapping[str, int]]) -> bool:
    """Whether the whole-log checks would find nothing (see the module doc)."""
    if not facts.node_ok:
        return False
    for src, dst in facts.channels:
        out_key, in_key = (src, "out", dst), (dst, "in", src)
        if not (facts.side_is_1_to_n(out_key) and facts.side_is_1_to_n(in_key)):
            return False
        got = facts.sides.get(in_key, {}).get("n", 0)
        sent = facts.sides.get(out_key, {}).get("n", 0)
        if got > sent:
            return False
        received = facts.link(dst, "in", src).total()
        sends = facts.link(src, "out", dst).total() if got == sent else sent_upto.get((src, dst), ZERO)
        if got and (received["tn"], received["h1"], received["h2"]) != (sends["tn"], sends["h1"], sends["h2"]):
            return False
    return True


def _skipped(snap: Mapping[str, Any]) -> str:
    return M.SKIPPED % (snap["status"], f": {snap['reason']}" if snap["reason"] else "")


def snapshot_certified(
    snap: Mapping[str, Any], facts: LogFacts, cuts: Mapping[tuple[str, str], list[tuple[int, int]]]
) -> bool:
    """Whether the exact checks of one COMPLETE snapshot would find nothing (logs certified)."""
    sid = snap["snapshot_id"]
    listed: dict[str, list[int]] = defaultdict(list)
    for n in snap["nodes"]:
        listed[n["node"]].append(n["balance"])
    if set(listed) != set(facts.nodes) or any(len(b) != 1 for b in listed.values()):
        return False
    cut_at: dict[str, int] = {}
    for node in facts.nodes:
        found = cuts.get((sid, node), [])
        if len(found) != 1:
            return False
        lsn, cut_balance = found[0]
        before = sum(
            facts.link(node, d, p).before(lsn)["delta"] for (n, d, p) in facts.links if n == node
        )
        if listed[node][0] != before or cut_balance != before:
            return False
        cut_at[node] = lsn
    recorded: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for c in snap["channels"]:
        recorded[(c["src"], c["dst"])].append(c)
    if any(len(v) != 1 for v in recorded.values()) or any(c not in recorded for c in facts.channels):
        return False
    if any(c["ordered"] is False for c in snap["channels"]):
        return False
    for (src, dst), [c] in recorded.items():
        if src not in cut_at or dst not in cut_at:
            if c["tn"]:
                return False
            continue
        sent = facts.link(src, "out", dst).before(cut_at[src])
        got = facts.link(dst, "in", src).before(cut_at[dst])
        if sent["n"] != sent["top"] or got["n"] != got["top"] or got["ttop"] > sent["ttop"]:
            return False
        expected = (sent["tn"] - got["tn"], sent["h1"] - got["h1"], sent["h2"] - got["h2"])
        if c["bad_id"] or (c["tn"], c["h1"], c["h2"]) != expected:
            return False
    observed = observed_total(snap)
    return (
        observed == facts.initial_total
        and snap["claimed_total"] in (None, observed)
        and snap["claimed_expected_total"] in (None, facts.initial_total)
    )


def observed_total(snap: Mapping[str, Any]) -> int:
    return sum(n["balance"] for n in snap["nodes"]) + sum(c["amount"] for c in snap["channels"])


@dataclass(frozen=True, kw_only=True)
class Certified:
    """Verdict rows the checksums settled; the snapshots (or whole logs) they did not."""

    rows: list[dict[str, Any]]
    logs_settled: bool
    unsettled: list[str]  # snapshot ids the exact path must check


def certify(
    facts: LogFacts,
    sent_upto: Mapping[tuple[str, str], Mapping[str, int]],
    cut_records: Iterable[Mapping[str, Any]],
    snaps: Iterable[Mapping[str, Any]],
) -> Certified:
    """The verdict rows the aggregates prove (consistent, or skipped), logs row first."""
    snaps = list(snaps)
    if not logs_certified(facts, sent_upto):
        return Certified(rows=[], logs_settled=False, unsettled=[s["snapshot_id"] for s in snaps])
    cuts: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for c in cut_records:
        cuts[(c["snapshot_id"], c["node"])].append((c["lsn"], c["balance"]))
    rows = [
        verdict_row(SCOPE_LOGS, None, "-", True, len(facts.nodes), len(facts.channels), facts.initial_total, None)
    ]
    unsettled = []
    for snap in sorted(snaps, key=lambda s: (s["started_at"] is None, s["started_at"] or "", s["snapshot_id"])):
        sid, status = snap["snapshot_id"], snap["status"]
        if status != COMPLETE:
            rows.append(verdict_row(SCOPE_SNAPSHOT, sid, status, None, 0, 0, facts.initial_total, None, _skipped(snap)))
        elif snapshot_certified(snap, facts, cuts):
            rows.append(
                verdict_row(
                    SCOPE_SNAPSHOT, sid, status, True, len(snap["nodes"]), len(snap["channels"]),
                    facts.initial_total, observed_total(snap),
                )
            )
        else:
            unsettled.append(sid)
    return Certified(rows=rows, logs_settled=True, unsettled=unsettled)


def verdict_row(
    scope: str,
    sid: str | None,
    status: str,
    consistent: bool | None,
    nodes: int,
    channels: int,
    expected: int,
    observed: int | None,
    first: str | None = None,
) -> dict[str, Any]:
    return {
        "scope": scope,
        "snapshot_id": sid,
        "status": status,
        "consistent": consistent,
        "nodes_checked": nodes,
        "channels_checked": channels,
        "expected_total": expected,
        "observed_total": observed,
        "discrepancies": 0,
        "first_discrepancy": first,
    }
