"""A log the bank's native nodes wrote, read as the bank app's (bank_edge.py rule B5).

Before every node hosted an app, a node of a cluster file without [app] ran the
bank natively: its log's records carry its tally (init, checkpoint, send,
recv, restore, replay) and no app's record. Such a segment is read once by the
pure recovery as it always was, and what it rebuilt is then mapped to the bank
app's shape: the tally the node held becomes the app's state, each tally in
its outbox a message, each tally as decimal ASCII (the bank app's encoding,
services/app/bank.py); a request id's answer becomes the app's reply (the tally
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

from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.apphost import Host
from snapmesh.protocol.node.recovery import Recovered
from snapmesh.protocol.node.requests import Paid

_MESSAGES = (wal.Send, wal.Recv, wal.Replay)
_STATES = (wal.Checkpoint, wal.Restore)
_STAMPS = (wal.Init, wal.Checkpoint, wal.AppVersion)


def native_log(records: Sequence[tuple[str, wal.Record]]) -> bool:
    """Whether `records` (an active segment) were written by a native bank node (B5):
    some record carries a tally, and none is an app's."""
    tallied = False
    for _, record in records:
        kind = type(record)
        if kind is wal.Command or (kind in _MESSAGES and record.payload) or (kind in _STATES and record.state):
            return False
        if kind in _STAMPS and record.app:
            return False
        tallied = tallied or bool(getattr(record, "tally", 0))
    return tallied


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
        native = recovery.recover(records, node_id=node_id, incoming=incoming, outgoing=outgoing)
        return as_bank_app(native, host, amounts(records))


def amounts(records: Sequence[tuple[str, wal.Record]]) -> dict[tuple[str, int], int]:
    """The amount of each transfer a native segment sent, by (dst, seq) in the epoch it ends in:
    its checkpoint's outbox items ([seq, amount, ""]) and its send records."""
    found: dict[tuple[str, int], int] = {}
    for _, record in records:
        kind = type(record)
        if kind is wal.Checkpoint:
            found = {(dst, int(item[0])): int(item[1]) for dst, items in record.outbox.items() for item in items}
        elif kind is wal.Restore:  # every channel starts again at seq 1
            found = {}
        elif kind is wal.Send:
            found[(record.dst, record.seq)] = record.tally
    return found


def as_bank_app(native: Recovered, host: Host, sent: dict[tuple[str, int], int]) -> Recovered:
    """A native bank node's recovered state as the bank app's (B5); `host` is given its state,
    `sent` is the amount of each transfer by (dst, seq) (`amounts`)."""
    host.restore(str(native.tally).encode())
    outbox = {dst: [e._replace(payload=str(sent[(dst, e.seq)]).encode()) if not e.snapshot_id else e for e in entries]
              for dst, entries in native.outbox.items()}
    requests = OrderedDict(
        (rid, Paid(wal.pack(str(p.first_seq).encode()), _seq_of(p.msg_id), p.at, p.lsn, "", p.epoch))
        for rid, p in native.requests.items()
    )
    return dataclasses.replace(native, tally=0, restored_tally=0, outbox=outbox, requests=requests, host=host,
                               app_name=host.app.name, app_version=host.app.version, reshaped=True)


def _seq_of(msg_id: str) -> int:
    seq = msg_id.rpartition(":")[2]
    return int(seq) if seq.isdigit() else 0
