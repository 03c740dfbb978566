"""The bank's reading of raw node logs (the JSON records `node_logs.read_logs` gives).

The generic log checkers (snapmesh/checking: `logcheck`, `node_logs`) know channels,
seqs, markers, cuts and restores; what a node's balance is at any point, and that
money is conserved, is the bank's, and is here; the module itself is the bank's part
those checkers take, handed in by their callers (`logcheck.check_logs(..., app=bank_logs)`):

- `reading(total)`: the bank's `cut.Reading` (snapmesh/bank/cut.py); `trace`, its
  part of a trace (snapmesh/bank/trace.py), with the keys of its events;
- `read(logs)` (`figures`) and `value(record, where)`: a record's balance or amount;
- `recorded(snapshot)` and `recorded_states(states, channels)`: a v1 Snapshot, or
  every node's FullState report, as (snapshot_id, balances, in flight);

- `figures(logs)`: the logs of the bank app's nodes (its state and messages as
  bytes) with the bank's figures in their records, as its native nodes wrote them:
  what the readers below take;
- `money_check(logs)`: sends against receives over all the logs, and each log's
  balance replayed (init + received - sent);
- `initial_total(logs)`: the money there is, the sum of the logs' `init` balances;
- `opening(node, restore)` and `with_replay(opening, replay)`: an epoch's first
  record after a restore, an `init` holding the restored balance plus the replays;
- `restore_problems(...)`: a restore record against the balance the snapshot recorded;
- `whole_problems(...)`: conservation broken, in `logcheck`'s words.

Pure (no I/O): records in, values and problems out. The keys are the formats'
(snapmesh/bank/formats.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import base64

import snapmesh.bank.cut as bank_cut
from snapmesh.bank.formats import MESSAGE_TALLY_KEY, NODE_TALLY_KEY
import snapmesh.bank.v1records as v1records
from snapmesh.bank.trace import BANK as trace
from snapmesh.protocol import wal

Record = Mapping[str, Any]
Channel = tuple[str, str]
InFlight = dict[Channel, list[tuple[str, int, int]]]  # (msg_id, amount, seq), in order

state_key, content_key, contents_key = trace.state_key, trace.content_key, trace.contents_key


# An app's record has no tally's key, only its kind's mark (wal.APP_MARKS); a native one the reverse. A reader of a
# line as a dict (the checkers with the bank's part, the trace, this module) asks here: a record with
# its kind's mark and without its tally has a tally of 0; any other record without it is bad input.
# kind -> its tally's key in the log (the v1 format's: formats.py)
TALLY_KEYS: Mapping[str, str] = v1records.TALLY_KEYS


def is_app_record(raw: Record) -> bool:
    """Whether a log line (a dict) is an app's record: it has its kind's mark (wal.APP_MARKS)."""
    mark = wal.APP_MARKS.get(raw.get("kind"))  # type: ignore[arg-type]
    return mark is not None and mark in raw


def tally_of(raw: Record, where: str) -> int:
    """A log line's (a dict's) tally: 0 for an app's record that leaves it out;
    wal.CorruptRecord naming `where` (`file:line`) for another record without it."""
    key = TALLY_KEYS[raw["kind"]]
    if key in raw:
        return raw[key]
    if is_app_record(raw):
        return 0
    raise wal.CorruptRecord(f"{where}: {raw['kind']} record needs an integer {key!r}")


def reading(total: int | None = None) -> bank_cut.Reading:
    """The bank's `cut.Reading` of its logs (`total`: the money there is; None: the logs' `init` balances)."""
    return bank_cut.Reading(total)


def figures(logs: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """`logs` with the bank's figures in the records the bank app wrote (services/app/bank.py:
    its state the balance, a message the amount, both decimal ASCII, base64 in the log):
    an init's, a checkpoint's and a restore's balance from their `state`, a send's,
    recv's and replay's amount from its `payload`, and a cut's balance the one its log
    gives before it (an app's cut names its state by digest only). Each record figured is
    then a native one (its figure, its kind's mark dropped: v1records reads it). A native
    record, and a log of another app (bytes that are no decimal), is kept as it is."""
    return {node: _figures(records) for node, records in logs.items()}


def _figures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    held = 0
    for record in records:
        kind = record.get("kind")
        if kind in ("init", "checkpoint", "restore") and record.get("state"):
            held = _decimal(record["state"])
            if held is None:
                return list(records)  # not the bank's bytes
            record = _native(record, NODE_TALLY_KEY, held)
        elif kind in ("init", "checkpoint", "restore"):
            held = record.get(NODE_TALLY_KEY, 0)
        elif kind in ("send", "recv", "replay"):
            amount = record.get(MESSAGE_TALLY_KEY, 0)
            if not amount and "payload" in record:
                amount = _decimal(record["payload"])
                if amount is None:
                    return list(records)
                record = _native(record, MESSAGE_TALLY_KEY, amount)
            held += -amount if kind == "send" else amount
        elif kind == "cut" and record.get("digest"):
            record = _native(record, NODE_TALLY_KEY, held)
        out.append(record)
    return out


def _native(record: dict[str, Any], key: str, figure: int) -> dict[str, Any]:
    """An app's record with its figure under `key`, as a native one: its kind's mark left out."""
    mark = wal.APP_MARKS[record["kind"]]
    return {**{k: v for k, v in record.items() if k != mark}, key: figure}


def read(logs: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The logs as this module's readers take them: `figures`."""
    return figures(logs)


def value(record: Record, where: str) -> int:
    """A record's figure: an init's or a cut's balance, a send's or a receive's amount
    (an app's record may leave it out: 0; wal.CorruptRecord naming `where` for another)."""
    return tally_of(record, where)


def recorded(snapshot: Any) -> tuple[str, dict[str, int], InFlight]:
    """A controller `Snapshot` (v1) as (snapshot_id, balances, in flight)."""
    return (snapshot.snapshot_id, {n.node_id: getattr(n, NODE_TALLY_KEY) for n in snapshot.nodes},
            {(c.src, c.dst): [_item(t) for t in c.in_flight] for c in snapshot.channels})


def recorded_states(states: Mapping[str, Any], channels: Iterable[Channel] = ()) -> tuple[str, dict[str, int], InFlight]:
    """Every node's `FullState` report ({node id: FullState}) as (snapshot_id, balances, in flight).
    A report that lists only the channels it recorded messages on (`only_recorded_channels`) had the
    other incoming channels of `channels` (the topology) empty, as the controller reads it."""
    (sid,) = {s.snapshot_id for s in states.values()}
    in_flight: InFlight = {(src, dst): [] for src, dst in channels
                           if dst in states and getattr(states[dst], "only_recorded_channels", False)}
    in_flight.update({(c.src, c.dst): [_item(t) for t in c.in_flight] for s in states.values() for c in s.channels})
    return sid, {node: getattr(s, NODE_TALLY_KEY) for node, s in states.items()}, in_flight


def snapshot_problems(snapshot: Any) -> list[str]:
    """The bank's rules over a snapshot by itself: none (conservation is held against the logs, `whole_problems`)."""
    return []


def _item(transfer: Any) -> tuple[str, int, int]:
    """A v1 InFlightTransfer as (msg_id, amount, seq)."""
    return (transfer.msg_id, getattr(transfer, MESSAGE_TALLY_KEY), transfer.seq)


def _decimal(packed: str) -> int | None:
    try:
        text = base64.b64decode(packed, validate=True)
    except ValueError:
        return None
    return int(text) if text.isdigit() else None


def money_check(logs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Sends vs recvs across all logs (the native bank's or the bank app's: `figures`):
    each msg_id sent once, received at most once, and what each log's balance is."""
    sends: dict[str, dict] = {}
    recvs: dict[str, list[dict]] = defaultdict(list)
    balances: dict[str, int] = {}
    for node_id, records in figures(logs).items():  # the bank app's logs too
        balance = 0
        for record in records:
            kind = record["kind"]
            if kind == "init":
                balance = _tally(record)
            elif kind == "send":
                assert record["msg_id"] not in sends, f"msg_id {record['msg_id']} sent twice"
                sends[record["msg_id"]] = record
                balance -= _tally(record)
            elif kind == "recv":
                recvs[record["msg_id"]].append(record)
                balance += _tally(record)
        balances[node_id] = balance
    return {
        "sends": sends,
        "duplicated": sorted(m for m, r in recvs.items() if len(r) > 1),
        "phantom": sorted(m for m in recvs if m not in sends),
        "mismatched": sorted(m for m, r in recvs.items()
                             if m in sends and _tally(r[0]) != _tally(sends[m])),
        "unreceived": sorted(m for m in sends if m not in recvs),
        "balances": balances,
    }


def initial_total(logs: Mapping[str, list[Record]]) -> int:
    """The money there is: the sum of the logs' `init` balances."""
    return sum(_tally(r) for records in logs.values() for r in records if r.get("kind") == "init")


def opening(node: str, restore: Record) -> dict[str, Any]:
    """An epoch's first record after `restore`: an `init` holding the restored balance."""
    return {"node": node, "lsn": restore["lsn"], "kind": "init", NODE_TALLY_KEY: _tally(restore)}


def with_replay(first: Record, replay: Record) -> dict[str, Any]:
    """The epoch's opening `init` with a replayed transfer's amount added to its balance."""
    return {**first, NODE_TALLY_KEY: _tally(first) + _tally(replay)}


def replayed_item(replay: Record) -> tuple[str, int, int]:
    """A replay record as an in-flight item: (msg_id, amount, seq)."""
    return (replay["msg_id"], _tally(replay), replay["seq"])


def restore_problems(epoch: int, node: str, record: Record, snapshot_id: str, balance: int) -> list[str]:
    """The restore record of `node` in `epoch` against snapshot `snapshot_id`'s recorded balance."""
    if record["snapshot_id"] != snapshot_id or _tally(record) != balance:
        return [f"epoch {epoch}: {node} restored {record['snapshot_id']} to {_tally(record)}, "
                f"expected {snapshot_id} at {balance}"]
    return []


def whole_problems(snapshot_id: str, rules: set[str], whole: Any, total: int) -> list[str]:
    """`logcheck`'s words for the bank's CONSERVATION rule, when it is among the broken `rules`."""
    if bank_cut.CONSERVATION not in rules:
        return []
    return [f"snapshot {snapshot_id}: balances + in flight = {whole.observed}, the total is {total}"]


def _tally(record: Record) -> int:
    """A record's tally; an app's record may leave it out (0: wal.APP_MARKS), no other may."""
    return tally_of(record, f"{record.get('node')}'s log, lsn {record.get('lsn')}")
