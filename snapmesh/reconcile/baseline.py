"""The same verdicts in one process of plain Python: the benchmark's baseline.

Streams each log once (json.loads per line) into the one definition of a
consistent snapshot, ``snapmesh.checking.cut`` (its `LogIndex` keeps per-node
running state at every cut, the per-channel sends and the per-msg_id table), and
asks `cut.check_snapshot` about every COMPLETE snapshot. The whole-log checks (the
"logs" row) are here. It produces the same VERDICT rows as the Spark job, with the
same messages (``messages``), for local directories only. It holds the whole log's
msg_id table in memory: ~1 GB per 5M transfers.
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from typing import Any

from snapmesh.checking import cut
import snapmesh.bank.cut as bank_cut
from snapmesh.reconcile import messages as M
from snapmesh.reconcile.schema import APP_MARKS, INT_COLUMNS, REQUIRED_FIELDS, SCOPE_LOGS, SCOPE_SNAPSHOT, STR_COLUMNS, TALLY_KEYS

SENDS = ("send", "marker_sent")
RECEIPTS = ("recv", "marker_recv")
INT_FIELDS = INT_COLUMNS
STR_FIELDS = STR_COLUMNS


class BadInput(Exception):
    def __init__(self, problems: list[tuple[str, int | None, str]]):
        super().__init__(f"{len(problems)} bad input(s)")
        self.problems = problems


def _problem(rec: Any, file_node: str) -> str | None:
    if not isinstance(rec, dict):
        return "a field has the wrong type, or the line is not a JSON object"
    for f in INT_FIELDS:
        v = rec.get(f)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            return "a field has the wrong type, or the line is not a JSON object"
    for f in ("node", "lsn", "kind"):
        if rec.get(f) is None:
            return f"missing field '{f}'"
    kind = rec["kind"]
    for f in REQUIRED_FIELDS.get(kind, ()):
        if rec.get(f) is None:
            return f"{kind} record without '{f}'"
    if rec["node"] != file_node:
        return f"record of node {rec['node']} in the log of {file_node}"
    if kind in SENDS and rec["src"] != rec["node"]:
        return f"{kind} with src {rec['src']} in the log of {rec['node']}"
    if kind in RECEIPTS and rec["dst"] != rec["node"]:
        return f"{kind} with dst {rec['dst']} in the log of {rec['node']}"
    return None


def reconcile(data_dir: str) -> list[dict[str, Any]]:
    """Verdict rows (same fields and order as the Spark job). Raises BadInput."""
    log_found: list[tuple[int, str]] = []
    bad: list[tuple[str, int | None, str]] = []
    nodes: dict[str, dict[str, Any]] = {}
    msgs: dict[str, list] = {}  # msg_id -> [sends, recvs, got, receiver, sent]
    seqs: dict[tuple[str, str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    bank = bank_cut.Reading()
    index = cut.LogIndex(reading=bank)
    files = sorted(glob.glob(os.path.join(data_dir, "*.log.jsonl")))
    for path in files:
        file_node = os.path.basename(path)[: -len(".log.jsonl")]
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                text = line.rstrip("\n")
                if not text.strip():
                    bad.append((path, line_no, "empty line"))
                    continue
                try:
                    rec = json.loads(text)
                except ValueError:
                    bad.append((path, line_no, "not valid JSON (truncated line?)"))
                    continue
                if isinstance(rec, dict) and rec.get("kind") in APP_MARKS and APP_MARKS[rec["kind"]] in rec:
                    rec.setdefault(TALLY_KEYS[rec["kind"]], 0)  # an app's record: no tally (schema.APP_MARKS)
                problem = _problem(rec, file_node)
                if problem:
                    bad.append((path, line_no, problem))
                    continue
                if bad:
                    continue  # only collecting bad lines from now on
                node, kind, lsn = rec["node"], rec["kind"], rec["lsn"]
                record = cut.record(rec, older=bank.older)
                index.add(node, record)
                bank.add(node, record)
                info = nodes.setdefault(node, {"inits": 0, "init_lsn": None, "init_balance": 0})
                if lsn != line_no:
                    log_found.append(M.LSN_NOT_LINE.format(node, line_no, lsn))
                if kind == "init":
                    info["inits"] += 1
                    info["init_balance"] += rec["balance"]
                    info["init_lsn"] = lsn if info["init_lsn"] is None else min(info["init_lsn"], lsn)
                elif kind in SENDS or kind in RECEIPTS:
                    src, dst, seq = rec["src"], rec["dst"], rec["seq"]
                    seqs[(src, dst, "sender" if kind in SENDS else "receiver")][seq] += 1
                    if kind == "send":
                        m = msgs.setdefault(rec["msg_id"], [0, 0, None, None, None])
                        transfer = (src, dst, seq, rec["amount"])
                        m[0] += 1
                        m[4] = transfer if m[4] is None else min(m[4], transfer)
                    elif kind == "recv":
                        m = msgs.setdefault(rec["msg_id"], [0, 0, None, None, None])
                        transfer = (src, dst, seq, rec["amount"])
                        m[1] += 1
                        m[2] = transfer if m[2] is None else min(m[2], transfer)
                        m[3] = node if m[3] is None else min(m[3], node)
    snaps_raw = []
    for path in sorted(glob.glob(os.path.join(data_dir, "snapshots", "*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                snaps_raw.append(json.load(f))
        except ValueError:
            bad.append((path, None, "not a valid snapshot JSON document"))
    if bad:
        raise BadInput(bad)

    # Whole-log checks.
    for node, info in nodes.items():
        if info["inits"] == 0:
            log_found.append(M.NO_INIT.format(node))
        if info["inits"] > 1:
            log_found.append(M.MANY_INITS.format(node, info["inits"]))
        if info["init_lsn"] is not None and info["init_lsn"] != 1:
            log_found.append(M.INIT_NOT_FIRST.format(node, info["init_lsn"]))
    describe = lambda t: M.TRANSFER % t  # noqa: E731
    for msg_id, (sends, recvs, got, receiver, sent) in msgs.items():
        if sends == 0:
            log_found.append(M.RECV_NEVER_SENT.format(msg_id, receiver))
        if sends > 1:
            log_found.append(M.SENT_TWICE.format(msg_id, sends))
        if recvs > 1:
            log_found.append(M.RECEIVED_TWICE.format(msg_id, recvs))
        if sent is not None and got is not None and sent != got:
            log_found.append(M.RECV_MISMATCH.format(msg_id, describe(got), describe(sent)))
    high: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for (src, dst, side), counts in seqs.items():
        who = src if side == "sender" else dst
        ordered = sorted(counts)
        high[(src, dst)][side] = ordered[-1]
        dup = min((s for s, n in counts.items() if n > 1), default=None)
        if dup is not None:
            log_found.append(M.SEQ_DUPLICATE.format(src, dst, dup, counts[dup], side, who))
        if len(ordered) != ordered[-1] or ordered[0] != 1:
            prev, missing = 0, None
            for s in ordered:
                if s > prev + 1:
                    missing = prev + 1
                    break
                prev = s
            if missing is not None:
                log_found.append(M.SEQ_MISSING.format(src, dst, missing, side, who))
            else:
                log_found.append(M.SEQ_NOT_1_TO_N.format(src, dst, side, who))
    for (src, dst), h in high.items():
        if "receiver" in h and h["receiver"] > h.get("sender", 0):
            log_found.append(M.RECV_BEYOND_SENT.format(src, dst, dst, h["receiver"], src, h.get("sender", 0)))
    initial_total = sum(i["init_balance"] for i in nodes.values())

    rows = [
        {
            "scope": SCOPE_LOGS,
            "snapshot_id": None,
            "status": "-",
            "consistent": not log_found,
            "nodes_checked": len(nodes),
            "channels_checked": len(high),
            "expected_total": initial_total,
            "observed_total": None,
            "discrepancies": len(log_found),
            "first_discrepancy": min(log_found)[1] if log_found else None,
        }
    ]
    snaps_raw.sort(key=lambda d: (d.get("started_at") is None, d.get("started_at") or "", d.get("snapshot_id")))
    for doc in snaps_raw:
        rows.append(_check_snapshot(doc, index, initial_total))
    return rows


def _i(v: Any) -> int:
    return int(v) if v not in (None, "") else 0


def _claim(v: Any) -> int | None:
    return None if v in (None, "") else int(v)


def snapshot_of(doc: dict[str, Any]) -> cut.Snapshot:
    """An exported snapshot file (protobuf JSON: int64 values are strings) for `cut`."""
    return cut.Snapshot(
        snapshot_id=doc.get("snapshot_id"),
        nodes=[(n.get("node_id"), _i(n.get("balance"))) for n in doc.get("nodes") or []],
        channels=[
            (c.get("src"), c.get("dst"),
             [(m.get("msg_id"), _i(m.get("amount")), _i(m.get("seq"))) for m in c.get("in_flight") or []])
            for c in doc.get("channels") or []
        ],
        claims={"total": _claim(doc.get("total")), "expected_total": _claim(doc.get("expected_total"))},
    )


def _check_snapshot(doc: dict[str, Any], index: cut.LogIndex, initial_total: int) -> dict[str, Any]:
    sid, status = doc.get("snapshot_id"), doc.get("status") or "STATUS_UNSPECIFIED"
    row = {
        "scope": SCOPE_SNAPSHOT,
        "snapshot_id": sid,
        "status": status,
        "consistent": None,
        "nodes_checked": 0,
        "channels_checked": 0,
        "expected_total": initial_total,
        "observed_total": None,
        "discrepancies": 0,
        "first_discrepancy": M.SKIPPED % (status, f": {doc['reason']}" if doc.get("reason") else ""),
    }
    if status != "COMPLETE":
        return row
    snap = snapshot_of(doc)
    verdict = cut.check_snapshot(index, snap)
    found = [getattr(M, p.rule).format(*p.args) for p in verdict.problems]
    row.update(
        consistent=not found,
        nodes_checked=len(snap.nodes),
        channels_checked=len(snap.channels),
        observed_total=verdict.whole.observed,
        discrepancies=len(found),
        first_discrepancy=min(found)[1] if found else None,
    )
    return row
