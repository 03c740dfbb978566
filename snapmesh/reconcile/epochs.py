"""Epochs: each node's log cut at its ``restore`` records, checked one epoch at a time.

A restore to snapshot S starts epoch E+1 (see ``snapmesh.protocol.wal``'s ``restore`` and
``replay``): channels start again at seq 1, so msg ids and seqs repeat across
epochs and the epochs must never mix. A record's epoch is the running max of
``restore.epoch`` in its node's log by lsn (1 before any restore). Epoch E > 1 of a
node starts at its last restore record of E (a restore redone after a crash
replaces the cut-short one); that record, with the balance of its replays added,
becomes the epoch's ``init``, and lsn and line are counted from it, so every epoch
is checked as a run of its own by the same checks. Each snapshot is checked against
the log of the epoch it was taken in (``Snapshot.epoch``).

The restore itself is checked on the driver (restores and their replays are few):
the restore record's balance is the snapshot's recorded balance of that node, and
its replays are, per channel and in order, the snapshot's in-flight transfers
towards it (the reference: ``snapmesh/checking/logcheck.py`` ``check_restore``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from snapmesh.reconcile.schema import EVENT, SCOPE_RESTORE

_END = (1 << 63) - 1


@dataclass
class NodeEpoch:
    """One node's part of an epoch: lsns in [start, end); ``start`` is its restore (0: epoch 1)."""

    start: int
    end: int = _END
    restore: dict[str, Any] | None = None
    replays: list[dict[str, Any]] = field(default_factory=list)

    @property
    def init_balance(self) -> int:
        assert self.restore is not None
        return self.restore["balance"] + sum(r["amount"] for r in self.replays)


@dataclass
class Epochs:
    """{epoch: {node: NodeEpoch}} from the restore and replay records (driver rows)."""

    by_epoch: dict[int, dict[str, NodeEpoch]]

    @classmethod
    def of(cls, markers: Iterable[Mapping[str, Any]], nodes: Iterable[str]) -> Epochs:
        by_node: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for m in markers:
            if m["kind"] in ("restore", "replay"):
                by_node[m["node"]].append(m)
        by_epoch: dict[int, dict[str, NodeEpoch]] = defaultdict(dict)
        for node in nodes:
            current, now = NodeEpoch(start=0), 1
            by_epoch[1][node] = current
            for m in sorted(by_node.get(node, []), key=lambda m: m["lsn"]):
                if m["kind"] == "restore":
                    if m["epoch"] > now:  # else a restore redone after a crash: it replaces the cut-short one
                        current.end, now = m["lsn"], m["epoch"]
                    current = by_epoch[m["epoch"]][node] = NodeEpoch(start=m["lsn"], restore=dict(m))
                elif current.restore is not None:
                    current.replays.append(dict(m))
        return cls(dict(by_epoch))

    @property
    def restored(self) -> bool:
        return len(self.by_epoch) > 1

    def complete(self, nodes: set[str]) -> list[int]:
        """The epochs every node entered (a FAILED restore some node never took: nothing to check)."""
        return sorted(e for e, parts in self.by_epoch.items() if set(parts) == nodes)

    def events(self, evs: DataFrame, epoch: int) -> DataFrame:
        """The log of one epoch, its restore as ``init``, lsn and line counted from it."""
        spark = evs.sparkSession
        parts = self.by_epoch[epoch]
        bounds = spark.createDataFrame(
            [(n, p.start, p.end) for n, p in parts.items()], "b_node string, b_start long, b_end long"
        )
        shift = F.col("b_start") - F.when(F.col("b_start") > 0, 1).otherwise(0)
        inside = evs.join(F.broadcast(bounds), evs["node"] == bounds["b_node"], "inner").filter(
            (F.col("lsn") > F.col("b_start")) & (F.col("lsn") < F.col("b_end"))
            & ~F.col("kind").isin("restore", "replay")
        )
        shifted = inside.withColumn("lsn", F.col("lsn") - shift).withColumn("line", F.col("line") - shift)
        shifted = shifted.select(*EVENT.fieldNames())
        if epoch == 1:
            return shifted
        inits = [
            {**{f: None for f in EVENT.fieldNames()}, "file": None, "line": 1, "node": n, "lsn": 1, "kind": "init",
             "balance": p.init_balance}
            for n, p in parts.items()
        ]
        return shifted.unionByName(spark.createDataFrame(inits, EVENT))

    def cuts(self, markers: Iterable[Mapping[str, Any]], epoch: int) -> list[dict[str, Any]]:
        """The cut records of one epoch, their lsns counted as in ``events``."""
        parts = self.by_epoch[epoch]
        out = []
        for m in markers:
            p = parts.get(m["node"])
            if m["kind"] == "cut" and p is not None and p.start < m["lsn"] < p.end:
                out.append({**m, "lsn": m["lsn"] - (p.start - 1 if p.start else 0)})
        return out


def restore_problems(epoch: int, parts: Mapping[str, NodeEpoch], snap: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with the restore that started ``epoch`` (``snap``: the typed snapshot restored)."""
    sid = next(iter(parts.values())).restore["snapshot_id"]  # type: ignore[index]
    if snap is None:
        return [f"epoch {epoch}: restored snapshot {sid}, which is not among the snapshots"]
    problems = []
    balances = {n["node"]: n["balance"] for n in snap["nodes"]}
    for node in sorted(set(parts) | set(balances)):
        p = parts.get(node)
        if p is None or p.restore is None:
            problems.append(f"epoch {epoch}: no restore record in {node}'s log")
            continue
        r = p.restore
        if r["snapshot_id"] != sid or r["balance"] != balances.get(node):
            problems.append(f"epoch {epoch}: {node} restored {r['snapshot_id']} to {r['balance']}, "
                            f"expected {sid} at {balances.get(node)}")
        for c in snap["channels"]:
            if c["dst"] != node:
                continue
            want = [(m["msg_id"], m["amount"], m["seq"]) for m in c["in_flight"]]
            got = [(x["msg_id"], x["amount"], x["seq"]) for x in p.replays if x["src"] == c["src"]]
            if got != want:
                problems.append(f"epoch {epoch}: {c['src']}->{node} replayed {got}, the snapshot holds {want}")
        if len(p.replays) != r["deliveries"]:
            problems.append(f"epoch {epoch}: {node} announced {r['deliveries']} replays and logged {len(p.replays)}")
    return problems


def restore_row(epoch: int, parts: Mapping[str, NodeEpoch], snap: Mapping[str, Any] | None) -> dict[str, Any]:
    """The verdict row of the restore that started ``epoch``."""
    problems = restore_problems(epoch, parts, snap)
    sid = next(iter(parts.values())).restore["snapshot_id"]  # type: ignore[index]
    recorded = None
    if snap is not None:
        recorded = sum(n["balance"] for n in snap["nodes"]) + sum(
            m["amount"] for c in snap["channels"] for m in c["in_flight"]
        )
    return {
        "scope": SCOPE_RESTORE,
        "snapshot_id": sid,
        "status": f"epoch {epoch}",
        "consistent": not problems,
        "nodes_checked": len(parts),
        "channels_checked": len(snap["channels"]) if snap is not None else 0,
        "expected_total": recorded,
        "observed_total": sum(p.init_balance for p in parts.values() if p.restore is not None),
        "discrepancies": len(problems),
        "first_discrepancy": problems[0] if problems else None,
    }


def merge_logs_rows(rows: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """One whole-log row of every (epoch, its log row): the first epoch's totals, every discrepancy."""
    first = rows[0][1]
    bad = [(e, r) for e, r in rows if r["discrepancies"]]
    return {
        **first,
        "consistent": all(r["consistent"] for _, r in rows),
        "nodes_checked": max(r["nodes_checked"] for _, r in rows),
        "channels_checked": max(r["channels_checked"] for _, r in rows),
        "discrepancies": sum(r["discrepancies"] for _, r in rows),
        "first_discrepancy": f"epoch {bad[0][0]}: {bad[0][1]['first_discrepancy']}" if bad else None,
    }
