"""`snapmesh synth`'s app mode: an app's node logs and snapshots, in the real formats.

The bank's mode (`writer.generate`) moves money; this one runs a tiny app over the
same FIFO, lossless channels with Chandy-Lamport snapshots: every message is a few
random bytes (its payload), and a node's state is what it has sent and
received so far (`state_bytes`), whose sha256 its `cut` record holds, as a hosted
app's node logs it (snapmesh.app). Each COMPLETE snapshot is exported as the
controller exports an app's (protobuf JSON): every node's state bytes and
`state_digest`, every in-flight message's payload, and `app.spec`.

`generate_app(..., doctor=KINDS)` doctors one COMPLETE snapshot per kind, each a
different one, and says where in `AppResult.doctored`:

  lost-inflight       an in-flight message left out;
  changed-payload     an in-flight message's payload replaced by other bytes;
  wrong-state-digest  a node's `state_digest` not the sha256 of its state bytes;
  wrong-state         a node's state bytes and digest replaced together, consistently
                      (a state the node never had at its cut).

The records are built as the rules read them (`cut.record`, keys named by
snapmesh/bank/formats.py) and written by the node's own `wal.Encoder`; every other
send carries a command, as a command step's first send does (wal.Send), so the
readers see both shapes of a send.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from snapmesh.bank.formats import MESSAGE_TALLY_KEY, NODE_TALLY_KEY
from snapmesh.checking import cut
from snapmesh.protocol import wal

APP_SPEC = "snapmesh.synth.apps:tiny"
DOCTORINGS = {
    "lost-inflight": "a snapshot leaves out one in-flight message",
    "changed-payload": "a snapshot records one in-flight message with other bytes",
    "wrong-state-digest": "a snapshot's state_digest of a node is not its state bytes' sha256",
    "wrong-state": "a snapshot records a node's state (bytes and digest alike) it never had at its cut",
}


@dataclass
class AppResult:
    """What was written, and which snapshot each doctoring went to (kind -> {snapshot_id, ...})."""

    records: int = 0
    messages: int = 0
    snapshots: list[str] = field(default_factory=list)
    doctored: dict[str, dict[str, Any]] = field(default_factory=dict)


def state_bytes(node: str, sent: int, received: int, last: str) -> bytes:
    """The tiny app's state: its counts and the digest of the last payload it received."""
    return json.dumps({"node": node, "sent": sent, "received": received, "last": last}, sort_keys=True).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class _Snap:
    sid: str
    states: dict[int, bytes] = field(default_factory=dict)  # node -> its state at its cut
    recording: set[int] = field(default_factory=set)
    in_flight: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)  # (msg_id, payload, seq)
    closed: int = 0


def generate_app(
    out_dir: str, *, nodes: int = 3, messages: int = 400, snapshots: int = 5, seed: int = 1,
    doctor: tuple[str, ...] = (),
) -> AppResult:
    """Write `nodes` logs and `snapshots` COMPLETE app snapshots to `out_dir`; ValueError
    when a doctoring finds no snapshot to go to (too few snapshots, or none with a
    message in flight: another seed)."""
    unknown = [kind for kind in doctor if kind not in DOCTORINGS]
    if unknown:
        raise ValueError(f"unknown doctoring {unknown}; one of {', '.join(DOCTORINGS)}")
    if nodes < 2:
        raise ValueError("need at least 2 nodes")
    rng = random.Random(seed)
    names = [f"p{i + 1}" for i in range(nodes)]
    chans = [(i, j) for i in range(nodes) for j in range(nodes) if i != j]
    incoming = [[k for k, (_, j) in enumerate(chans) if j == i] for i in range(nodes)]
    outgoing = [[k for k, (i2, _) in enumerate(chans) if i2 == i] for i in range(nodes)]
    queues: list[deque] = [deque() for _ in chans]
    seqs = [0] * len(chans)
    lsn = [0] * nodes
    counts = [[0, 0, ""] for _ in range(nodes)]  # sent, received, last payload's digest
    encoders = [wal.Encoder(n) for n in names]
    lines: list[list[str]] = [[] for _ in names]
    starts = [(k + 1) * messages // (snapshots + 1) for k in range(snapshots)]
    done: list[_Snap] = []
    active: _Snap | None = None
    sent = slot = 0

    def emit(i: int, raw: dict[str, Any], **step: str) -> None:
        # A receipt logs the bytes it took in (its payload), as a hosted app's node does (recovery replays them).
        lsn[i] += 1
        made = cut.record({"lsn": lsn[i], **raw}, names[i])
        lines[i].append(encoders[i].record(replace(made, **step) if step else made))  # step: a command it carries

    def state(i: int) -> bytes:
        return state_bytes(names[i], *counts[i])  # type: ignore[arg-type]

    def record(i: int, snap: _Snap, closed_channel: int | None) -> None:
        snap.states[i] = state(i)
        emit(i, {"kind": "cut", "snapshot_id": snap.sid, "digest": _sha(snap.states[i])})
        for c in incoming[i]:
            if c == closed_channel:
                snap.closed += 1
            else:
                snap.recording.add(c)
        for c in outgoing[i]:
            seqs[c] += 1
            emit(i, {"kind": "marker_sent", "snapshot_id": snap.sid, "dst": names[chans[c][1]], "seq": seqs[c]})
            queues[c].append((None, seqs[c], snap.sid))

    for i in range(nodes):
        emit(i, {"kind": "init", "app": ""})
    while True:
        if active is None and slot < snapshots and sent >= starts[slot]:
            active = _Snap(sid=f"a-{slot + 1}")
            record(rng.randrange(nodes), active, None)
            slot += 1
        c = rng.randrange(len(chans))
        queue = queues[c]
        src, dst = chans[c]
        if sent < messages and (not queue or rng.random() < 0.45):
            seqs[c] += 1
            msg_id = f"{names[src]}:{names[dst]}:{seqs[c]}"
            payload = wal.pack(rng.randbytes(rng.randrange(1, 24)))
            emit(src, {"kind": "send", "msg_id": msg_id, "dst": names[dst], "seq": seqs[c], "payload": payload},
                 **({"command": wal.pack(b"%d" % sent), "reply": wal.pack(b"ok")} if sent % 2 else {}))
            counts[src][0] += 1  # type: ignore[operator]
            queue.append((msg_id, seqs[c], payload))
            sent += 1
            continue
        if not queue:
            if sent >= messages and not any(queues) and active is None and slot >= snapshots:
                break
            continue
        msg_id, seq, payload = queue.popleft()
        if msg_id is None:  # a marker of snapshot `payload`
            emit(dst, {"kind": "marker_recv", "snapshot_id": payload, "src": names[src], "seq": seq})
            assert active is not None and active.sid == payload
            if dst not in active.states:
                record(dst, active, c)
            else:
                active.recording.discard(c)
                active.closed += 1
            if len(active.states) == nodes and active.closed == len(chans):
                done.append(active)
                active = None
            continue
        emit(dst, {"kind": "recv", "msg_id": msg_id, "src": names[src], "seq": seq, "payload": payload})
        counts[dst][1] += 1  # type: ignore[operator]
        counts[dst][2] = _sha(wal.unpack(payload, msg_id))[:16]
        if active is not None and c in active.recording:
            active.in_flight.setdefault(c, []).append((msg_id, payload, seq))

    docs = [_export(snap, names, chans) for snap in done]
    result = AppResult(records=sum(lsn), messages=sent, snapshots=[d["snapshot_id"] for d in docs])
    _doctor(docs, doctor, rng, result)
    os.makedirs(os.path.join(out_dir, "snapshots"), exist_ok=True)
    for name, text in zip(names, lines, strict=True):
        with open(os.path.join(out_dir, f"{name}.log.jsonl"), "w", encoding="ascii") as f:
            f.writelines(text)
    for doc in docs:
        with open(os.path.join(out_dir, "snapshots", f"{doc['snapshot_id']}.json"), "w", encoding="ascii") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    return result


def _export(snap: _Snap, names: list[str], chans: list[tuple[int, int]]) -> dict[str, Any]:
    """A COMPLETE app snapshot as the controller exports it (protobuf JSON: int64 as strings)."""
    return {
        "snapshot_id": snap.sid,
        "status": "COMPLETE",
        "nodes": [{"node_id": names[i], NODE_TALLY_KEY: "0", "state": wal.pack(state),
                   "state_digest": "sha256:" + _sha(state)} for i, state in sorted(snap.states.items())],
        "channels": [
            {"src": names[a], "dst": names[b],
             "in_flight": [{"msg_id": m, MESSAGE_TALLY_KEY: "0", "seq": str(q), "payload": p}
                           for m, p, q in snap.in_flight.get(c, [])]}
            for c, (a, b) in enumerate(chans)
        ],
        "total": "0",
        "conserved": True,
        "expected_total": "0",
        "app": {"spec": APP_SPEC, "status": "UNCHECKED"},
    }


def _doctor(docs: list[dict[str, Any]], kinds: tuple[str, ...], rng: random.Random, result: AppResult) -> None:
    """Each kind on its own snapshot, in the order given."""
    free = list(docs)
    for kind in kinds:
        needs_flight = kind in ("lost-inflight", "changed-payload")
        doc = next((d for d in free if not needs_flight or any(c["in_flight"] for c in d["channels"])), None)
        if doc is None:
            raise ValueError(f"doctoring {kind}: no snapshot left to doctor" + (" with a message in flight" * needs_flight))
        free.remove(doc)
        where: dict[str, Any] = {"snapshot_id": doc["snapshot_id"]}
        if needs_flight:
            chan = next(c for c in doc["channels"] if c["in_flight"])
            item = chan["in_flight"][rng.randrange(len(chan["in_flight"]))]
            where.update(src=chan["src"], dst=chan["dst"], msg_id=item["msg_id"])
            if kind == "lost-inflight":
                chan["in_flight"].remove(item)
            else:
                item["payload"] = wal.pack(wal.unpack(item["payload"], item["msg_id"]) + b"!")
        else:
            node = doc["nodes"][rng.randrange(len(doc["nodes"]))]
            where["node"] = node["node_id"]
            if kind == "wrong-state-digest":
                node["state_digest"] = "sha256:" + _sha(b"not " + wal.unpack(node["state"], node["node_id"]))
            else:
                other = b'{"doctored": true}'
                node.update(state=wal.pack(other), state_digest="sha256:" + _sha(other))
        result.doctored[kind] = where
