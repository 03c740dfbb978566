"""The same verdicts in one process of plain Python: the benchmark's baseline.

Streams each log once (json.loads per line), keeps per-node running state and
snapshots it at every cut, and keeps the cluster-wide per-msg_id and per-channel
tables in dicts. It produces the same VERDICT rows as the Spark job, with the same
messages (``messages``), for local directories only. It holds the whole log's
msg_id table in memory: ~1 GB per 5M transfers.
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from typing import Any

from . import messages as M
from .schema import INT_COLUMNS, REQUIRED_FIELDS, SCOPE_LOGS, SCOPE_SNAPSHOT, STR_COLUMNS

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
    msgs: dict[str, list] = {}  # msg_id -> [sends, recvs, sent, got, receiver]
    seqs: dict[tuple[str, str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    send_by_seq: dict[tuple[str, str], dict[int, tuple[str, int]]] = defaultdict(dict)
    cuts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)  # (sid, node) -> states
    files = sorted(glob.glob(os.path.join(data_dir, "*.log.jsonl")))
    for path in files:
        file_node = os.path.basename(path)[: -len(".log.jsonl")]
        balance = 0
        links: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])  # (dir, peer) -> n, top, ttop
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
                problem = _problem(rec, file_node)
                if problem:
                    bad.append((path, line_no, problem))
                    continue
                if bad:
                    continue  # only collecting bad lines from now on
                node, kind, lsn = rec["node"], rec["kind"], rec["lsn"]
                info = nodes.setdefault(node, {"inits": 0, "init_lsn": None, "init_balance": 0})
                if lsn != line_no:
                    log_found.append(M.LSN_NOT_LINE.format(node, line_no, lsn))
                if kind == "init":
                    info["inits"] += 1
                    info["init_balance"] += rec["balance"]
                    info["init_lsn"] = lsn if info["init_lsn"] is None else min(info["init_lsn"], lsn)
                    balance += rec["balance"]
                elif kind == "cut":
                    cuts[(rec["snapshot_id"], node)].append(
                        {
                            "lsn": lsn,
                            "cut_balance": rec["balance"],
                            "balance": balance,
                            "links": {k: tuple(v) for k, v in links.items()},
                        }
                    )
                elif kind in SENDS or kind in RECEIPTS:
                    src, dst, seq = rec["src"], rec["dst"], rec["seq"]
                    out = kind in SENDS
                    seqs[(src, dst, "sender" if out else "receiver")][seq] += 1
                    link = links[("out", dst) if out else ("in", src)]
                    link[0] += 1
                    link[1] = max(link[1], seq)
                    if kind in ("send", "recv"):
                        link[2] = max(link[2], seq)
                        transfer = (src, dst, seq, rec["amount"])
                        m = msgs.setdefault(rec["msg_id"], [0, 0, None, None, None])
                        if kind == "send":
                            balance -= rec["amount"]
                            m[0] += 1
                            m[2] = transfer if m[2] is None else min(m[2], transfer)
                            send_by_seq[(src, dst)][seq] = (rec["msg_id"], rec["amount"])
                        else:
                            balance += rec["amount"]
                            m[1] += 1
                            m[3] = transfer if m[3] is None else min(m[3], transfer)
                            m[4] = node if m[4] is None else min(m[4], node)
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
    for msg_id, (sends, recvs, sent, got, receiver) in msgs.items():
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
    log_channels = sorted(high)

    rows = [
        {
            "scope": SCOPE_LOGS,
            "snapshot_id": None,
            "status": "-",
            "consistent": not log_found,
            "nodes_checked": len(nodes),
            "channels_checked": len(log_channels),
            "expected_total": initial_total,
            "observed_total": None,
            "discrepancies": len(log_found),
            "first_discrepancy": min(log_found)[1] if log_found else None,
        }
    ]
    snaps_raw.sort(key=lambda d: (d.get("started_at") is None, d.get("started_at") or "", d.get("snapshot_id")))
    for doc in snaps_raw:
        rows.append(_check_snapshot(doc, nodes, log_channels, cuts, send_by_seq, msgs, initial_total))
    return rows


def _i(v: Any) -> int:
    return int(v) if v not in (None, "") else 0


def _check_snapshot(doc, nodes, log_channels, cuts, send_by_seq, msgs, initial_total) -> dict[str, Any]:
    sid, status = doc.get("snapshot_id"), doc.get("status") or "STATUS_UNSPECIFIED"
    rec_nodes = [(n.get("node_id"), _i(n.get("balance"))) for n in doc.get("nodes") or []]
    rec_channels = doc.get("channels") or []
    balances = sum(b for _, b in rec_nodes)
    in_flight_sum = sum(_i(m.get("amount")) for c in rec_channels for m in c.get("in_flight") or [])
    observed = balances + in_flight_sum
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
    found: list[tuple[int, str]] = []
    listed: dict[str, list[int]] = defaultdict(list)
    for n, b in rec_nodes:
        listed[n].append(b)

    def cut(node: str) -> dict[str, Any] | None:
        states = cuts.get((sid, node))
        return min(states, key=lambda c: (c["lsn"], c["cut_balance"])) if states else None

    for node in sorted(set(nodes) | set(listed)):
        in_logs, bs, c = node in nodes, listed.get(node), cut(node)
        if in_logs and not bs:
            found.append(M.MISSING_NODE.format(node))
        if not in_logs:
            found.append(M.UNKNOWN_NODE.format(node))
        if bs and len(bs) > 1:
            found.append(M.NODE_LISTED_TWICE.format(node, len(bs)))
        if in_logs and c is None:
            found.append(M.NO_CUT.format(node))
        if c is not None and len(cuts[(sid, node)]) > 1:
            found.append(M.MANY_CUTS.format(node, len(cuts[(sid, node)])))
        if bs and c is not None and min(bs) != c["balance"]:
            found.append(M.BALANCE.format(node, min(bs), c["balance"]))
        if c is not None and c["cut_balance"] != c["balance"]:
            found.append(M.CUT_BALANCE.format(node, c["cut_balance"], c["balance"]))

    chan_listed: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for ch in rec_channels:
        chan_listed[(ch.get("src"), ch.get("dst"))].append(ch)
    for src, dst in sorted(set(log_channels) | set(chan_listed)):
        entries = chan_listed.get((src, dst), [])
        if (src, dst) in log_channels and not entries:
            found.append(M.MISSING_CHANNEL.format(src, dst))
        if len(entries) > 1:
            found.append(M.CHANNEL_LISTED_TWICE.format(src, dst, len(entries)))
        for e in entries[:1] if len(entries) == 1 else entries:
            q = [_i(m.get("seq")) for m in e.get("in_flight") or []]
            if q != sorted(q):
                found.append(M.IN_FLIGHT_ORDER.format(src, dst))
                break
        recorded: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for e in entries:
            for m in e.get("in_flight") or []:
                recorded[m.get("msg_id")].append((_i(m.get("amount")), _i(m.get("seq"))))
        cs, cd = cut(src), cut(dst)
        if cs is None or cd is None:
            expected: dict[str, tuple[int, int]] = {}
            a = b = None
        else:
            sent_n, sent_top, a = cs["links"].get(("out", dst), (0, 0, 0))
            got_n, got_top, b = cd["links"].get(("in", src), (0, 0, 0))
            if sent_n != sent_top:
                found.append(M.SENDER_NOT_PREFIX.format(src, dst, src, sent_n, sent_top))
            if got_n != got_top:
                found.append(M.RECEIVER_NOT_PREFIX.format(src, dst, dst, got_n, got_top))
            if b > a:
                found.append(M.ORPHAN_RECEIPT.format(src, dst, dst, b, src, a))
            by_seq = send_by_seq.get((src, dst), {})
            expected = {}
            for s in range(b + 1, a + 1):
                if s in by_seq:
                    msg_id, amount = by_seq[s]
                    expected[msg_id] = (amount, s)
        for msg_id, (amount, s) in expected.items():
            got = recorded.get(msg_id)
            if not got:
                found.append(M.MISSING_IN_FLIGHT.format(src, dst, msg_id))
                continue
            rec_amount, rec_seq = min(x[0] for x in got), min(x[1] for x in got)
            if rec_amount != amount:
                found.append(M.IN_FLIGHT_AMOUNT.format(src, dst, msg_id, rec_amount, amount))
            if rec_seq != s:
                found.append(M.IN_FLIGHT_SEQ.format(src, dst, msg_id, rec_seq, s))
        for msg_id, got in recorded.items():
            if len(got) > 1:
                found.append(M.IN_FLIGHT_LISTED_TWICE.format(src, dst, msg_id, len(got)))
            if msg_id in expected:
                continue
            m = msgs.get(msg_id)
            sent = m[2] if m else None
            if sent is None:
                found.append(M.IN_FLIGHT_NEVER_SENT.format(src, dst, msg_id))
            elif (sent[0], sent[1]) != (src, dst):
                found.append(M.IN_FLIGHT_OTHER_CHANNEL.format(src, dst, msg_id, sent[0], sent[1]))
            elif a is not None and sent[2] > a:
                found.append(M.IN_FLIGHT_AFTER_CUT.format(src, dst, msg_id, src))
            elif b is not None and sent[2] <= b:
                found.append(M.IN_FLIGHT_RECEIVED.format(src, dst, msg_id, dst))
            else:
                found.append(M.UNEXPECTED_IN_FLIGHT.format(src, dst, msg_id))
    if observed != initial_total:
        found.append(M.CONSERVATION.format(observed, balances, in_flight_sum, initial_total))
    claimed = doc.get("total")
    if claimed not in (None, "") and int(claimed) != observed:
        found.append(M.CLAIMED_TOTAL.format(int(claimed), observed))
    claimed = doc.get("expected_total")
    if claimed not in (None, "") and int(claimed) != initial_total:
        found.append(M.CLAIMED_EXPECTED.format(int(claimed), initial_total))
    row.update(
        consistent=not found,
        nodes_checked=len(rec_nodes),
        channels_checked=len(rec_channels),
        observed_total=observed,
        discrepancies=len(found),
        first_discrepancy=min(found)[1] if found else None,
    )
    return row
