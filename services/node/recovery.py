"""Rebuild a node's state from its transfer log.

What a restarted node needs, all derived from its own records:
- its balance (init, minus every send, plus every recv);
- per outgoing channel, the next seq and the outbox: every message logged as
  sent, in seq order (acks are not logged; the receiver's resume point on
  reconnect says which of them it already holds);
- per incoming channel, the last seq received;
- every snapshot id with a `cut` record: its recording was in memory and is
  lost, so the core is told it is abandoned (rule R5).

A log that cannot be trusted stops the node: `CorruptLogError` names the file
and the line. The one damage that is expected is a torn last line (a crash in
the middle of a write, which was therefore never acknowledged): it is cut off
with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from services.node.translog import KINDS

log = logging.getLogger(__name__)


class CorruptLogError(ValueError):
    """The log is damaged beyond a torn last line; the message is `file:line: problem`."""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A message logged as sent on one outgoing channel."""

    seq: int
    amount: int  # 0 for a marker
    snapshot_id: str  # "" for a transfer


@dataclass(slots=True)
class Recovered:
    balance: int
    last_lsn: int
    next_seq: dict[str, int] = field(default_factory=dict)  # dst -> next seq to use
    outbox: dict[str, list[OutboxEntry]] = field(default_factory=dict)  # dst -> sent, seq order
    last_received: dict[str, int] = field(default_factory=dict)  # src -> last seq
    abandoned: set[str] = field(default_factory=set)
    fresh: bool = False  # True: no log existed, nothing recovered


_INT_FIELDS = {
    "init": ("balance",),
    "send": ("seq", "amount"),
    "recv": ("seq", "amount"),
    "cut": ("balance",),
    "marker_sent": ("seq",),
    "marker_recv": ("seq",),
}
_STR_FIELDS = {
    "send": ("msg_id", "src", "dst"),
    "recv": ("msg_id", "src", "dst"),
    "cut": ("snapshot_id",),
    "marker_sent": ("snapshot_id", "src", "dst"),
    "marker_recv": ("snapshot_id", "src", "dst"),
    "abort": ("snapshot_id",),
}


def recover(
    path: Path,
    node_id: str,
    *,
    initial_balance: int,
    incoming: tuple[str, ...],
    outgoing: tuple[str, ...],
    repair: bool = True,
) -> Recovered:
    """Read the log at `path` (a missing or empty file means a fresh node).
    With `repair`, a torn last line is truncated in place."""
    state = Recovered(
        balance=initial_balance,
        last_lsn=0,
        next_seq={dst: 1 for dst in outgoing},
        outbox={dst: [] for dst in outgoing},
        last_received={src: 0 for src in incoming},
    )
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        state.fresh = True
        return state
    if not data:
        state.fresh = True
        return state

    complete_end = data.rfind(b"\n") + 1  # bytes up to and including the last newline
    if complete_end < len(data):
        torn_line = data.count(b"\n", 0, complete_end) + 1
        log.warning(
            "%s:%d: torn last line (%d bytes, a crash mid-write): truncating it",
            path,
            torn_line,
            len(data) - complete_end,
        )
        if repair:
            with open(path, "r+b") as handle:
                handle.truncate(complete_end)
                handle.flush()
                os.fsync(handle.fileno())
        data = data[:complete_end]
        if not data:
            state.fresh = True
            return state

    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):
        _apply(state, _parse(path, number, raw, node_id, state.last_lsn + 1), path, number, node_id, incoming, outgoing)
        state.last_lsn += 1
    return state


def _parse(path: Path, number: int, raw: bytes, node_id: str, expected_lsn: int) -> dict:
    where = f"{path}:{number}"
    try:
        record = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptLogError(f"{where}: not a JSON record ({exc})") from None
    if not isinstance(record, dict):
        raise CorruptLogError(f"{where}: not a JSON object")
    if record.get("node") != node_id:
        raise CorruptLogError(f"{where}: record of node {record.get('node')!r}, this log belongs to {node_id!r}")
    lsn = record.get("lsn")
    if lsn != expected_lsn or isinstance(lsn, bool):
        raise CorruptLogError(f"{where}: lsn {lsn!r} where {expected_lsn} was expected (gap or reorder)")
    kind = record.get("kind")
    if not isinstance(kind, str) or not kind:
        raise CorruptLogError(f"{where}: record without a kind")
    # A kind this version does not know is skipped, as every reader of the log does.
    for name in _INT_FIELDS.get(kind, ()):
        value = record.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise CorruptLogError(f"{where}: {kind} record needs an integer {name!r}, got {value!r}")
    for name in _STR_FIELDS.get(kind, ()):
        if not isinstance(record.get(name), str):
            raise CorruptLogError(f"{where}: {kind} record needs a string {name!r}, got {record.get(name)!r}")
    return record


def _apply(
    state: Recovered,
    record: dict,
    path: Path,
    number: int,
    node_id: str,
    incoming: tuple[str, ...],
    outgoing: tuple[str, ...],
) -> None:
    where = f"{path}:{number}"
    kind = record["kind"]
    if kind not in KINDS:
        return
    if (number == 1) != (kind == "init"):
        raise CorruptLogError(f"{where}: {'the first record must be init' if number == 1 else 'a second init record'}")
    if kind == "init":
        state.balance = record["balance"]
    elif kind in ("send", "marker_sent"):
        dst = record["dst"]
        if record["src"] != node_id or dst not in outgoing:
            raise CorruptLogError(f"{where}: {kind} on {record['src']}->{dst}, not a channel out of {node_id}")
        if record["seq"] != state.next_seq[dst]:
            raise CorruptLogError(f"{where}: {kind} seq {record['seq']} on {node_id}->{dst}, expected {state.next_seq[dst]}")
        state.next_seq[dst] += 1
        if kind == "send":
            state.balance -= record["amount"]
            state.outbox[dst].append(OutboxEntry(seq=record["seq"], amount=record["amount"], snapshot_id=""))
        else:
            state.outbox[dst].append(OutboxEntry(seq=record["seq"], amount=0, snapshot_id=record["snapshot_id"]))
    elif kind in ("recv", "marker_recv"):
        src = record["src"]
        if record["dst"] != node_id or src not in incoming:
            raise CorruptLogError(f"{where}: {kind} on {src}->{record['dst']}, not a channel into {node_id}")
        if record["seq"] != state.last_received[src] + 1:
            raise CorruptLogError(
                f"{where}: {kind} seq {record['seq']} on {src}->{node_id}, expected {state.last_received[src] + 1}"
            )
        state.last_received[src] += 1
        if kind == "recv":
            state.balance += record["amount"]
    elif kind == "cut":
        state.abandoned.add(record["snapshot_id"])
    if state.balance < 0:
        raise CorruptLogError(f"{where}: balance would be {state.balance}")
