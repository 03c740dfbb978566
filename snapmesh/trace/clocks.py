"""Log records -> events with vector clocks: the causal structure of a run.

Pure: records in (node -> records in lsn order), a `Trace` out. No files.

Rules, as GoVector keeps them (so ShiViz draws what we compute):
- every event ticks its node's own entry;
- a receive first takes the component-wise max of its clock and the clock of
  the send it matches, then ticks. So a recv's clock dominates its send's and
  is strictly greater.
- Lamport time (the diagram's x axis) is 1 + the node's previous time, or
  1 + max(previous, the send's time) for a receive.

Matching, from the logs alone:
- a transfer's `recv` matches the `send` with the same (src, dst, msg_id);
- a `marker_recv` matches the `marker_sent` with the same (snapshot_id, src, dst);
- the k-th receive of a key matches the k-th send of it, so a key used again
  (a new epoch after a restore) still pairs in channel (FIFO) order;
- a receive whose send is in no log (a log lost or cut short) is a local event;
  a send never received (in flight at the end) has no partner.

Events are made for send, recv, cut, marker_sent, marker_recv, restore and
restart records; other kinds (init, abort, ones added later) are skipped.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import snapmesh.bank.logs as bank_logs  # the bank's reading of a line's figure

EVENT_KINDS = frozenset({"send", "recv", "cut", "marker_sent", "marker_recv", "restore", "restart"})
SEND_KINDS = frozenset({"send", "marker_sent"})
RECEIVE_KINDS = frozenset({"recv", "marker_recv"})


class TraceError(ValueError):
    """The logs cannot be put in a causal order (a receive before its own send)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    index: int  # position in one causal order of the whole run
    node: str
    lsn: int
    kind: str
    clock: Mapping[str, int]  # vector clock; nodes at 0 are left out
    time: int  # Lamport time
    record: Mapping


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    kind: str  # "transfer" or "marker"
    src: str
    dst: str
    send: int  # index of the send event
    recv: int | None  # index of the matching receive; None: never received in these logs
    snapshot_id: str | None = None  # markers
    msg_id: str | None = None  # transfers
    amount: int | None = None  # None: a marker, or an app's message (it has none)


@dataclass(frozen=True, slots=True)
class Trace:
    nodes: tuple[str, ...]
    events: tuple[Event, ...]
    messages: tuple[Message, ...]
    _cuts: dict[str, dict[str, Event]] = field(default_factory=dict, repr=False)

    def snapshot_ids(self) -> list[str]:
        """Every snapshot with a cut in the logs, in the order the first cut happened."""
        return list(self._cuts)

    def cuts(self, snapshot_id: str) -> dict[str, Event]:
        """node -> its cut event for `snapshot_id` (nodes that never cut are absent)."""
        return dict(self._cuts.get(snapshot_id, {}))

    def in_flight(self, snapshot_id: str) -> list[Message]:
        """The transfers the snapshot recorded as in flight: sent before the sender's
        cut, received after the receiver's cut (the channels are FIFO, so before its marker)."""
        cuts = self._cuts.get(snapshot_id, {})
        found = []
        for message in self.messages:
            if message.kind != "transfer" or message.recv is None:
                continue
            sender_cut, receiver_cut = cuts.get(message.src), cuts.get(message.dst)
            if sender_cut is None or receiver_cut is None:
                continue
            if self.events[message.send].lsn < sender_cut.lsn and self.events[message.recv].lsn > receiver_cut.lsn:
                found.append(message)
        return found


def _key(record: Mapping) -> tuple:
    if record["kind"] in ("send", "recv"):
        return ("transfer", record.get("src"), record.get("dst"), record.get("msg_id"))
    return ("marker", record.get("snapshot_id"), record.get("src"), record.get("dst"))


def build_trace(records: Mapping[str, list[Mapping]]) -> Trace:
    """Events with vector clocks and Lamport times, and the messages between them."""
    nodes = tuple(records)
    queues = {node: [r for r in records[node] if r.get("kind") in EVENT_KINDS] for node in nodes}
    sends_in_logs = Counter(_key(r) for node in nodes for r in queues[node] if r["kind"] in SEND_KINDS)

    events: list[Event] = []
    open_sends: dict[tuple, deque[int]] = {}  # key -> sends not received yet, oldest first
    receives_seen: Counter[tuple] = Counter()
    receive_of: dict[int, int | None] = {}  # send index -> receive index
    clocks: dict[str, dict[str, int]] = {node: {} for node in nodes}
    times = dict.fromkeys(nodes, 0)
    cursors = dict.fromkeys(nodes, 0)

    def record_event(node: str, record: Mapping, sent: Event | None) -> Event:
        clock = clocks[node]
        time = times[node]
        if sent is not None:
            for other, tick in sent.clock.items():
                if tick > clock.get(other, 0):
                    clock[other] = tick
            time = max(time, sent.time)
        clock[node] = clock.get(node, 0) + 1
        times[node] = time + 1
        event = Event(index=len(events), node=node, lsn=record["lsn"], kind=record["kind"], clock=dict(clock),
                      time=time + 1, record=record)
        events.append(event)
        return event

    remaining = sum(map(len, queues.values()))
    while remaining:
        progressed = False
        for node in nodes:
            queue = queues[node]
            while cursors[node] < len(queue):
                record = queue[cursors[node]]
                sent = None
                if record["kind"] in RECEIVE_KINDS:
                    key = _key(record)
                    pending = open_sends.get(key)
                    if pending:
                        sent = events[pending.popleft()]
                    elif receives_seen[key] < sends_in_logs[key]:
                        break  # its send is in a log we have not reached yet
                    receives_seen[key] += 1
                event = record_event(node, record, sent)
                if sent is not None:
                    receive_of[sent.index] = event.index
                if record["kind"] in SEND_KINDS:
                    open_sends.setdefault(_key(record), deque()).append(event.index)
                cursors[node] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [f"{n} lsn {queues[n][cursors[n]]['lsn']}" for n in nodes if cursors[n] < len(queues[n])]
            raise TraceError(f"receives wait on sends that wait on them (a cycle): {', '.join(stuck)}")

    messages = []
    cuts: dict[str, dict[str, Event]] = {}
    for event in events:
        record = event.record
        if event.kind in SEND_KINDS:
            marker = event.kind == "marker_sent"
            messages.append(Message(
                kind="marker" if marker else "transfer",
                src=record.get("src", event.node),
                dst=record.get("dst", ""),
                send=event.index,
                recv=receive_of.get(event.index),
                snapshot_id=record.get("snapshot_id") if marker else None,
                msg_id=None if marker else record.get("msg_id"),
                amount=None if marker or bank_logs.is_app_record(record) else record.get(bank_logs.TALLY_KEYS["send"]),
            ))
        elif event.kind == "cut":
            cuts.setdefault(str(record.get("snapshot_id")), {}).setdefault(event.node, event)
    return Trace(nodes=nodes, events=tuple(events), messages=tuple(messages), _cuts=cuts)


def happened_before(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    """Vector clock a < b: every entry <=, and the clocks differ."""
    return all(tick <= b.get(node, 0) for node, tick in a.items()) and dict(a) != dict(b)
