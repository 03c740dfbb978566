"""A stopped log read on another node set (a rescale), pure: recovery.py's channels up to the last stop.

A node whose log ends in a stop snapshot may be started on another node set
(`snapmesh cluster rescale`): its channels then differ from the ones its records
name. Up to the log's last `stop`, recovery reads every record on the channel it
names (each new one fresh: seq 1, nothing acked or received; a checkpoint's
channels are its own), and at the stop keeps the topology's channels only: the
restore that must follow a stop starts every channel over anyway.
"""

from __future__ import annotations

from typing import Any

from snapmesh.protocol import wal


def known(state: Any, incoming: tuple[str, ...], outgoing: tuple[str, ...],
           record: wal.Record) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Up to a log's last stop (a rescale may follow it): the channels the topology
    has, those the log named so far, and the one `record` names, each fresh when new."""
    kind = type(record)
    if kind is wal.Send or kind is wal.MarkerSent:
        dst = record.dst  # type: ignore[attr-defined]
        if dst not in state.next_seq:
            state.next_seq[dst], state.acked[dst], state.outbox[dst] = 1, 0, []
    elif kind is wal.Recv or kind is wal.MarkerRecv:
        state.last_received.setdefault(record.src, 0)  # type: ignore[attr-defined]
    return (tuple(dict.fromkeys([*incoming, *state.last_received])), tuple(dict.fromkeys([*outgoing, *state.next_seq])))


def reshape(state: Any, incoming: tuple[str, ...], outgoing: tuple[str, ...]) -> None:
    """At the log's last stop: the topology's channels only (the restore that must follow starts each over)."""
    for table, names, zero in ((state.next_seq, outgoing, 1), (state.acked, outgoing, 0),
                               (state.last_received, incoming, 0)):
        for name in [n for n in table if n not in names]:
            del table[name]
        for name in names:
            table.setdefault(name, zero)
    for name in [n for n in state.outbox if n not in outgoing]:
        del state.outbox[name]
    for name in outgoing:
        state.outbox.setdefault(name, [])
