"""Pieces every check shares: record kinds, column helpers, the discrepancy struct.

A discrepancy is a ``struct<priority, text>`` built from a ``messages.Message``; a
verdict's first discrepancy is the smallest one, so ``min`` over the struct picks it.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from snapmesh.reconcile.messages import Message

COMPLETE = "COMPLETE"
# lsn/seq bucket width of the range joins: small enough that a record meets few
# intervals, large enough that the interval table stays tiny.
BUCKET = 1024

SENDS = ("send", "marker_sent")
RECEIPTS = ("recv", "marker_recv")
TRANSFERS = ("send", "recv")
FLOW_KINDS = ("init",) + SENDS + RECEIPTS
CHANNEL_KINDS = SENDS + RECEIPTS


def kind_in(kinds: tuple[str, ...]) -> Column:
    return F.col("kind").isin(*kinds)


def first_when(cases: list[tuple[Column, Column]]) -> Column:
    """The value of the first case whose condition holds, else null."""
    (cond0, val0), rest = cases[0], cases[1:]
    return reduce(lambda acc, case: acc.when(*case), rest, F.when(cond0, val0))


def message(m: Message, *args: str | Column) -> Column:
    return F.struct(
        F.lit(m.priority).alias("priority"),
        F.format_string(m.template, *args).alias("text"),
    )


def found(df: DataFrame, keys: list[str], checks: list[tuple[Column, Column]]) -> DataFrame:
    """One row per (key, discrepancy) for every check whose condition holds."""
    hits = F.array(*(F.when(cond, msg) for cond, msg in checks))
    return df.select(*keys, F.explode(F.filter(hits, lambda d: d.isNotNull())).alias("d"))


def shared(df: DataFrame) -> DataFrame:
    """Compute once a small intermediate table that several exact checks read.

    Only the exact path (``verdicts.verdicts``, run when a checksum differs) uses
    this: without it every reader inlines and recomputes its whole plan (~150
    stages). The tables are tiny (per node, per cut, per channel), never the log.
    """
    return df.localCheckpoint()


class InputError(Exception):
    """Input the job cannot check: a missing path, no logs, no snapshots, a bad segment."""
