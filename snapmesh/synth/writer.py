"""`snapmesh synth`: write synthetic transfer logs and snapshots in the real formats.

A seeded, single-threaded simulation of a bank cluster over FIFO, lossless channels
running Chandy-Lamport: random transfers (a node never sends more than it has),
random delivery order across channels, and snapshots started at evenly spaced points
of the workload while transfers keep flowing, so snapshots have real in-flight
transfers. The output is consistent by construction unless ``--corrupt KIND`` injects
one inconsistency (what and where is printed). ``--failed N`` adds snapshots that
aborted (status FAILED: skipped by the reconciliation). ``--app`` writes a tiny app's
logs and snapshots instead (snapmesh/synth/apps.py), ``--doctor KIND`` doctoring them.

Logs are written as they happen, each line by a native bank node's encoder (the v1
format, snapmesh/bank/v1records.py: the bytes such a node wrote), with buffered writes: ~10M records fit in a few
minutes of one core and little memory. Only the snapshots (small) are kept until the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import snapmesh.bank.v1records as v1records
from snapmesh.protocol import wal
from snapmesh.synth.apps import DOCTORINGS, generate_app

CORRUPTIONS = {
    "balance": "a snapshot records a node balance off by one",
    "missing-inflight": "a snapshot drops one in-flight transfer",
    "extra-inflight": "a snapshot lists, as in flight, a transfer sent after the sender's cut",
    "duplicate-recv": "a transfer is received (logged and credited) twice",
    "seq-gap": "a sender skips a sequence number on a channel",
    "missing-node": "a snapshot leaves out a node",
    "truncated": "a log line is cut short (bad input)",
}
FLUSH_LINES = 8192


@dataclass
class Result:
    """What was written: counts, and where a corruption went (for tests to assert)."""

    records: int = 0
    transfers: int = 0
    snapshots: list[str] = field(default_factory=list)
    corruption: str = ""  # human-readable: what was corrupted, and where
    detail: dict[str, object] = field(default_factory=dict)


@dataclass
class _Snapshot:
    sid: str
    initiator: int
    started: int  # step
    cut: dict[int, int] = field(default_factory=dict)  # node -> recorded balance
    recording: set[int] = field(default_factory=set)  # channels being recorded
    in_flight: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)
    closed: int = 0
    finished: int = 0
    failed: bool = False


def _iso(step: int) -> str:
    # A fake clock: 2026-01-01 plus one microsecond per simulation step.
    secs, micros = divmod(step, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1767225600 + secs)) + f".{micros // 1000:03d}Z"


def generate(
    out_dir: str,
    *,
    nodes: int = 4,
    transfers: int = 1000,
    snapshots: int = 5,
    failed: int = 0,
    seed: int = 1,
    corrupt: str | None = None,
    initial_balance: int = 1_000_000,
    quiet: bool = True,
) -> Result:
    if corrupt is not None and corrupt not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corrupt!r}; one of {', '.join(CORRUPTIONS)}")
    if nodes < 2:
        raise ValueError("need at least 2 nodes")
    rng = random.Random(seed)
    rand, randrange = rng.random, rng.randrange
    names = [f"p{i + 1}" for i in range(nodes)]
    chans = [(i, j) for i in range(nodes) for j in range(nodes) if i != j]
    chan_index = {c: k for k, c in enumerate(chans)}
    incoming = [[chan_index[(j, i)] for j in range(nodes) if j != i] for i in range(nodes)]
    outgoing = [[chan_index[(i, j)] for j in range(nodes) if j != i] for i in range(nodes)]
    queues: list[deque] = [deque() for _ in chans]
    seqs = [0] * len(chans)
    lsn = [0] * nodes
    bal = [initial_balance] * nodes
    os.makedirs(os.path.join(out_dir, "snapshots"), exist_ok=True)
    files = [open(os.path.join(out_dir, f"{n}.log.jsonl"), "w", encoding="ascii") for n in names]
    bufs: list[list[str]] = [[] for _ in names]
    encoders = [v1records.Encoder(n) for n in names]
    result = Result()
    total_slots = snapshots + failed
    starts = [(k + 1) * transfers // (total_slots + 1) for k in range(total_slots)]
    failed_slots = set(rng.sample(range(total_slots), failed)) if failed else set()
    target = snapshots // 2  # which COMPLETE snapshot a snapshot corruption hits
    done: list[_Snapshot] = []
    active: _Snapshot | None = None
    watch_node = -1  # extra-inflight: capture the next transfer this node sends
    watch_sid = ""
    captured: tuple[str, int, str, int, int] | None = None
    sent = delivered = step = 0
    midpoint = transfers // 2

    def emit(i: int, text: str) -> None:
        b = bufs[i]
        b.append(text)
        if len(b) >= FLUSH_LINES:
            files[i].writelines(b)
            b.clear()

    def next_lsn(i: int) -> int:
        lsn[i] += 1
        return lsn[i]

    def send_markers(i: int, sid: str) -> None:
        n = names[i]
        for c in outgoing[i]:
            seqs[c] += 1
            q, d = seqs[c], names[chans[c][1]]
            emit(i, encoders[i].record(wal.MarkerSent(lsn=next_lsn(i), snapshot_id=sid, src=n, dst=d, seq=q)))
            queues[c].append((None, q, sid))

    def record(i: int, snap: _Snapshot, closed_channel: int | None) -> None:
        nonlocal watch_node, watch_sid
        snap.cut[i] = bal[i]
        emit(i, encoders[i].record(v1records.Cut(lsn=next_lsn(i), snapshot_id=snap.sid, tally=bal[i])))
        for c in incoming[i]:
            if c == closed_channel:
                snap.closed += 1
            else:
                snap.recording.add(c)
        if corrupt == "extra-inflight" and watch_node < 0 and sum(not s.failed for s in done) == target:
            watch_node, watch_sid = i, snap.sid
        send_markers(i, snap.sid)

    for i in range(nodes):
        emit(i, encoders[i].record(v1records.Init(lsn=next_lsn(i), tally=initial_balance)))

    slot = 0
    while True:
        step += 1
        if active is None and slot < total_slots and sent >= starts[slot]:
            sid = f"s-{slot + 1}"
            i = randrange(nodes)
            if slot in failed_slots:
                # Aborted: the initiator recorded its state, then gave up.
                emit(i, encoders[i].record(v1records.Cut(lsn=next_lsn(i), snapshot_id=sid, tally=bal[i])))
                emit(i, encoders[i].record(wal.Abort(lsn=next_lsn(i), snapshot_id=sid, reason="deadline")))
                done.append(_Snapshot(sid=sid, initiator=i, started=step, finished=step + 1, failed=True))
            else:
                active = _Snapshot(sid=sid, initiator=i, started=step)
                record(i, active, None)
            slot += 1
        c = randrange(len(chans))
        queue = queues[c]
        if sent < transfers and (not queue or rand() < 0.45):
            src, dst = chans[c]
            amount = randrange(1, 101)
            if bal[src] < amount:
                continue
            if corrupt == "seq-gap" and sent == midpoint:
                seqs[c] += 1
                result.detail = {"src": names[src], "dst": names[dst], "missing_seq": seqs[c]}
                result.corruption = f"seq-gap: {names[src]} skipped seq {seqs[c]} on {names[src]}->{names[dst]}"
            seqs[c] += 1
            q = seqs[c]
            s, d = names[src], names[dst]
            msg_id = f"{s}:{d}:{q}"
            bal[src] -= amount
            emit(src, encoders[src].send(next_lsn(src), s, d, q, amount, msg_id))
            queue.append((msg_id, q, amount))
            sent += 1
            if src == watch_node and captured is None:
                captured = (watch_sid, c, msg_id, amount, q)
            if sent == midpoint:
                emit(0, encoders[0].record(wal.Restart(lsn=next_lsn(0))))
            if corrupt == "truncated" and sent == midpoint:
                whole = encoders[src].send(next_lsn(src), s, d, seqs[c] + 1, 1, "x")
                emit(src, whole[: whole.index('"seq":') + 6] + "\n")  # cut short after "seq":
                result.detail = {"file": f"{s}.log.jsonl", "line": lsn[src]}
                result.corruption = f"truncated: {s}.log.jsonl line {lsn[src]} cut short"
            continue
        if not queue:
            if sent >= transfers and not any(queues) and active is None and slot >= total_slots:
                break
            continue
        msg_id, q, payload = queue.popleft()
        src, dst = chans[c]
        s, d = names[src], names[dst]
        if msg_id is None:  # a marker for snapshot `payload`
            emit(dst, encoders[dst].record(wal.MarkerRecv(lsn=next_lsn(dst), snapshot_id=payload, src=s, dst=d, seq=q)))
            snap = active
            assert snap is not None and snap.sid == payload
            if dst not in snap.cut:
                record(dst, snap, c)
            else:
                snap.recording.discard(c)
                snap.closed += 1
            if len(snap.cut) == nodes and snap.closed == len(chans):
                snap.finished = step
                done.append(snap)
                active = None
            continue
        copies = 2 if corrupt == "duplicate-recv" and delivered == midpoint else 1
        for _ in range(copies):
            emit(dst, encoders[dst].recv(next_lsn(dst), s, d, q, payload, msg_id))
            bal[dst] += payload
        if copies == 2:
            result.detail = {"msg_id": msg_id}
            result.corruption = f"duplicate-recv: {d} received {msg_id} twice"
        delivered += 1
        if active is not None and c in active.recording:
            active.in_flight.setdefault(c, []).append((msg_id, payload, q))

    for f, b in zip(files, bufs, strict=True):
        f.writelines(b)
        f.close()

    complete = [s for s in done if not s.failed]
    if corrupt in ("balance", "missing-node", "missing-inflight", "extra-inflight") and not complete:
        raise ValueError(f"--corrupt {corrupt} needs at least one complete snapshot")
    expected_total = initial_balance * nodes
    docs = []
    for snap in done:
        failed_snap = snap.failed
        doc = {
            "snapshot_id": snap.sid,
            "initiator": names[snap.initiator],
            "status": "FAILED" if failed_snap else "COMPLETE",
            "reason": "synthetic abort: marker timeout" if failed_snap else "",
            "nodes": [{"node_id": names[i], "balance": str(b)} for i, b in sorted(snap.cut.items())],
            "channels": []
            if failed_snap
            else [
                {
                    "src": names[chans[c][0]],
                    "dst": names[chans[c][1]],
                    "in_flight": [
                        {"msg_id": m, "amount": str(a), "seq": str(q)} for m, a, q in snap.in_flight.get(c, [])
                    ],
                }
                for c in range(len(chans))
            ],
            "total": "0",
            "conserved": not failed_snap,
            "expected_total": str(expected_total),
            "started_at": _iso(snap.started),
            "finished_at": _iso(snap.finished),
        }
        docs.append(doc)
    _corrupt_snapshots(docs, corrupt, target, captured, names, chans, result)
    for doc in docs:
        if doc["status"] == "COMPLETE":
            total = sum(int(n["balance"]) for n in doc["nodes"])
            total += sum(int(m["amount"]) for ch in doc["channels"] for m in ch["in_flight"])
            doc["total"] = str(total)
            doc["conserved"] = total == expected_total
        with open(os.path.join(out_dir, "snapshots", f"{doc['snapshot_id']}.json"), "w", encoding="ascii") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    result.records = sum(lsn)
    result.transfers = sent
    result.snapshots = [d["snapshot_id"] for d in docs]
    return result


def _corrupt_snapshots(
    docs: list[dict],
    corrupt: str | None,
    target: int,
    captured: tuple[str, int, str, int, int] | None,
    names: list[str],
    chans: list[tuple[int, int]],
    result: Result,
) -> None:
    complete = [d for d in docs if d["status"] == "COMPLETE"]
    if corrupt == "balance":
        doc = complete[min(target, len(complete) - 1)]
        entry = doc["nodes"][1]
        was = int(entry["balance"])
        entry["balance"] = str(was + 1)
        result.detail = {"snapshot_id": doc["snapshot_id"], "node": entry["node_id"], "recorded": was + 1, "actual": was}
        result.corruption = f"balance: {doc['snapshot_id']} records {entry['node_id']} = {was + 1}, was {was}"
    elif corrupt == "missing-node":
        doc = complete[min(target, len(complete) - 1)]
        gone = doc["nodes"].pop()
        result.detail = {"snapshot_id": doc["snapshot_id"], "node": gone["node_id"]}
        result.corruption = f"missing-node: {doc['snapshot_id']} leaves out {gone['node_id']}"
    elif corrupt == "missing-inflight":
        for doc in complete[target:] + complete[:target]:
            chan = next((ch for ch in doc["channels"] if ch["in_flight"]), None)
            if chan is not None:
                gone = chan["in_flight"].pop(0)
                result.detail = {"snapshot_id": doc["snapshot_id"], "src": chan["src"], "dst": chan["dst"], "msg_id": gone["msg_id"]}
                result.corruption = f"missing-inflight: {doc['snapshot_id']} drops {gone['msg_id']} on {chan['src']}->{chan['dst']}"
                return
        raise ValueError("--corrupt missing-inflight: no snapshot has a transfer in flight (more transfers?)")
    elif corrupt == "extra-inflight":
        if captured is None:
            raise ValueError("--corrupt extra-inflight: no transfer was sent after the cut (more transfers?)")
        sid, c, msg_id, amount, q = captured
        doc = next(d for d in complete if d["snapshot_id"] == sid)
        src, dst = names[chans[c][0]], names[chans[c][1]]
        chan = next(ch for ch in doc["channels"] if (ch["src"], ch["dst"]) == (src, dst))
        chan["in_flight"].append({"msg_id": msg_id, "amount": str(amount), "seq": str(q)})
        result.detail = {"snapshot_id": doc["snapshot_id"], "src": src, "dst": dst, "msg_id": msg_id}
        result.corruption = f"extra-inflight: {doc['snapshot_id']} lists {msg_id}, sent after {src}'s cut"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="snapmesh synth",
        description="Write synthetic, consistent transfer logs and snapshots (optionally with one inconsistency).",
        epilog="corruptions: " + "; ".join(f"{k}: {v}" for k, v in CORRUPTIONS.items()),
    )
    p.add_argument("--data-dir", "--out", dest="out", required=True, metavar="DIR",
                   help="the data dir to write (<node>.log.jsonl, snapshots/); --out is its old name")
    p.add_argument("--nodes", type=int, default=4, metavar="N", help="nodes, full mesh (default 4)")
    p.add_argument("--transfers", type=int, default=1000, metavar="N", help="transfers; records ~= 2 x transfers (default 1000)")
    p.add_argument("--snapshots", type=int, default=5, metavar="N", help="complete snapshots (default 5)")
    p.add_argument("--failed", type=int, default=0, metavar="N", help="extra snapshots that abort (status FAILED; default 0)")
    p.add_argument("--seed", type=int, default=1, metavar="N", help="seed of every random choice (default 1)")
    p.add_argument("--initial-balance", type=int, default=1_000_000, metavar="N", help="each node's balance at the start "
                   "(default 1000000)")
    p.add_argument("--corrupt", choices=sorted(CORRUPTIONS), metavar="KIND", help="inject one inconsistency: " + ", ".join(CORRUPTIONS) + " (default: none)")
    p.add_argument("--app", action="store_true", help="write a tiny app's logs and snapshots (payloads, state digests; "
                   "snapmesh.synth.apps) instead of the bank's; --transfers counts its messages")
    p.add_argument("--doctor", action="append", default=[], choices=sorted(DOCTORINGS), metavar="KIND",
                   help="with --app, doctor one snapshot per KIND (repeatable): " + ", ".join(DOCTORINGS) + " (default: none)")
    return p


def _main_app(args: argparse.Namespace) -> int:
    """`--app`: the tiny app's logs and snapshots, each --doctor KIND on a snapshot of its own."""
    started = time.perf_counter()
    try:
        r = generate_app(args.out, nodes=args.nodes, messages=args.transfers, snapshots=args.snapshots, seed=args.seed,
                         doctor=tuple(args.doctor))
    except ValueError as e:
        print(f"snapmesh synth: {e}", file=sys.stderr)
        return 2
    print(f"synth: {r.records} records, {r.messages} messages, {len(r.snapshots)} app snapshots in "
          f"{time.perf_counter() - started:.1f}s")
    for kind, where in r.doctored.items():
        print(f"synth: doctored: {kind}: {where}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print(
        f"synth: seed={args.seed} nodes={args.nodes} transfers={args.transfers} snapshots={args.snapshots} "
        f"failed={args.failed} corrupt={args.corrupt or '-'} out={args.out}"
    )
    if args.doctor and not args.app:
        print("snapmesh synth: --doctor needs --app (the bank's logs take --corrupt)", file=sys.stderr)
        return 2
    if args.app:
        if args.corrupt or args.failed:
            print("snapmesh synth: --app takes --doctor, not --corrupt or --failed", file=sys.stderr)
            return 2
        return _main_app(args)
    started = time.perf_counter()
    try:
        r = generate(
            args.out,
            nodes=args.nodes,
            transfers=args.transfers,
            snapshots=args.snapshots,
            failed=args.failed,
            seed=args.seed,
            corrupt=args.corrupt,
            initial_balance=args.initial_balance,
        )
    except ValueError as e:
        print(f"snapmesh synth: {e}", file=sys.stderr)
        return 2
    print(f"synth: {r.records} records, {r.transfers} transfers, {len(r.snapshots)} snapshots in {time.perf_counter() - started:.1f}s")
    if r.corruption:
        print(f"synth: corrupted: {r.corruption}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
