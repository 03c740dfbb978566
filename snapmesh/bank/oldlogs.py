"""A log the bank's native nodes wrote, read as the bank app's (bank_edge.py rule B5).

Before every node hosted an app, a node of a cluster file without [app] ran the
bank natively: its log's records carry its tally (init, checkpoint, send,
recv, restore, replay) and no mark, so `wal` reads them as `wal.Older`, decoded here
with the v1 keys (snapmesh/bank/v1records.py). The pure recovery knows no tally: it
rebuilds the segment's channels and ids (`recovery.recover` without an app), and
the balance is folded here as the native node did (init or checkpoint, minus
sends, plus recvs; a restore sets it, each replay adds). The result is mapped to
the bank app's shape: the balance becomes the app's state, each amount in the
outbox a message, each as decimal ASCII (the bank app's encoding,
services/app/bank.py); a request id's answer becomes the app's reply (the balance
after it) with the seq of the message it sent, its digest unknown (as an id
from before digests: a retry is answered, never refused as another request).
The node then seals the segment (Recovered.reshaped), so the active segment
holds only the app's records and the mapping happens once.

The framework reaches this through the app (`App(old_logs="snapmesh.bank.oldlogs:NativeLogs")`,
loaded by name in services/node/recovery.py): it knows no bank.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence

import snapmesh.bank.v1records as v1records
from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.apphost import Host
from snapmesh.protocol.node.recovery import Recovered
from snapmesh.protocol.node.requests import Paid

_MESSAGES = (v1records.Send, v1records.Recv, v1records.Replay)
_STARTS = (v1records.Init, v1records.Checkpoint, v1records.Restore)  # each sets the balance
_APP_MESSAGES = (wal.Send, wal.Recv, wal.Replay)
_STATES = (wal.Checkpoint, wal.Restore)
_STAMPS = (wal.Init, wal.Checkpoint, wal.AppVersion)


def native_log(records: Sequence[tuple[str, wal.Record]]) -> bool:
    """Whether `records` (an active segment) were written by a native bank node (B5):
    some record is of the older format (`wal.Older`: a tally other than 0), and none is an
    app's (a command, a message, a state or an app's name; a record with a 0 figure and no
    mark reads as the current one, so may be either)."""
    older = False
    for _, record in records:
        kind = type(record)
        if kind is wal.Command or kind in _APP_MESSAGES or (kind in _STATES and record.state):
            return False
        if kind in _STAMPS and record.app:
            return False
        older = older or wal.older_format(record)
    return older


class NativeLogs:
    """The bank's reader of its native nodes' logs, as an app's `old_logs` plug-in (B5)."""

    @staticmethod
    def written_by(records: Sequence[tuple[str, wal.Record]]) -> bool:
        """Whether `records` (an active segment) are an old native log this reader maps."""
        return native_log(records)

    @staticmethod
    def recover(records: Sequence[tuple[str, wal.Record]], *, node_id: str, incoming: tuple[str, ...],
                outgoing: tuple[str, ...], host: Host) -> Recovered:
        """The segment's state, rebuilt as the native node did, then as the bank app's (`host` given its state)."""
        records = [(where, v1records.decode(record, where)) for where, record in records]
        balance, after = fold(records)
        records = [(where, as_payloads(record)) for where, record in records]
        native = recovery.recover(records, node_id=node_id, incoming=incoming, outgoing=outgoing)
        return as_bank_app(native, host, balance, after)


def as_payloads(record: wal.Record) -> wal.Record:
    """A native record (v1records) as its `wal` kind's, each amount as the bank app's message
    (decimal ASCII), for the channels' bookkeeping: a message's payload, a checkpoint outbox
    item's fourth place."""
    kind = type(record)
    if kind in _MESSAGES:
        return v1records.current(record, payload=_message(record.tally))  # type: ignore[attr-defined]
    if kind is v1records.Checkpoint:
        outbox = {dst: [[*item[:3], _message(item[1])] if len(item) == 3 and not item[2] else item for item in items]
                  for dst, items in record.outbox.items()}  # type: ignore[attr-defined]
        return v1records.current(record, outbox=outbox)
    return v1records.current(record) if kind in v1records.BY_KIND.values() else record


def _message(amount: object) -> str:
    return wal.pack(str(amount).encode())


def fold(records: Sequence[tuple[str, wal.Record]]) -> tuple[int, dict[str, int]]:
    """The balance at the segment's end, and per request id of a send record the balance
    right after its last one: the native node's arithmetic. A balance below zero
    is a log that cannot be trusted (CorruptLog naming file:line)."""
    balance, after = 0, {}
    for where, record in records:
        kind = type(record)
        if kind in _STARTS:
            balance = record.tally
        elif kind is v1records.Send:
            balance -= record.tally
            if record.request_id:
                after[record.request_id] = balance
        elif kind is v1records.Recv or kind is v1records.Replay:
            balance += record.tally
        if balance < 0:
            raise recovery.CorruptLog(f"{where}: the balance would be {balance}")
    return balance, after


def as_bank_app(native: Recovered, host: Host, balance: int, after: dict[str, int]) -> Recovered:
    """A native bank node's recovered state as the bank app's (B5); `host` is given its state.
    `after`: the balance after each request id's send record (`fold`); an id from the
    checkpoint holds its balance after it in its Paid's first_seq."""
    host.restore(str(balance).encode())
    requests = OrderedDict(
        (rid, Paid(wal.pack(str(after.get(rid, p.first_seq)).encode()), _seq_of(p.msg_id), p.at, p.lsn, "", p.epoch))
        for rid, p in native.requests.items()
    )
    return dataclasses.replace(native, requests=requests, host=host, app_name=host.app.name,
                               app_version=host.app.version, reshaped=True)


def _seq_of(msg_id: str) -> int:
    seq = msg_id.rpartition(":")[2]
    return int(seq) if seq.isdigit() else 0
