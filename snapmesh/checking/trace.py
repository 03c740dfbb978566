"""The checker of a trace: Chandy-Lamport snapshots judged from a list of events.

It never looks at the simulator or the core: its input is a plain list of event
records (dicts), so the same checker can be fed a simulator trace or events
parsed from real nodes' transfer logs (`node_logs.log_events`). Every event that
happens at a node has that node's position `pos`: any integers, unique per node,
increasing in the order things happened there (a log sequence number will do).
Events:

    {"event": "node", "node": N, "balance": B}          initial balance (one per node)
    {"event": "channel", "src": S, "dst": D}            one per directed channel
    {"event": "send", "node": S, "pos": P, "dst": D, "msg": M, "amount": A}
    {"event": "receive", "node": D, "pos": P, "src": S, "msg": M, "amount": A}
    {"event": "marker_sent", "node": S, "pos": P, "dst": D, "snapshot": I}
    {"event": "marker_received", "node": D, "pos": P, "src": S, "snapshot": I}   optional
    {"event": "cut", "node": N, "pos": P, "snapshot": I, "balance": B}
    {"event": "channel_recorded", "snapshot": I, "src": S, "dst": D,
     "msgs": [M, ...], "amounts": [A, ...]}             in arrival order
    {"event": "completed", "node": N, "snapshot": I}

`check_trace(events)` checks after the run, independent of the order of the list
(only positions matter), so events merged from several logs work as they are.
`steps.StepChecker` checks the same events one by one as they happen. A trace has
positions and message ids but no seqs and no log records, so its questions are
answered here; a snapshot against the logs of real nodes is `cut.check_snapshot`.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Event = Mapping[str, Any]
Channel = tuple[str, str]

_FIELDS: dict[str, tuple[str, ...]] = {
    "node": ("node", "balance"),
    "channel": ("src", "dst"),
    "send": ("node", "pos", "dst", "msg", "amount"),
    "receive": ("node", "pos", "src", "msg", "amount"),
    "marker_sent": ("node", "pos", "dst", "snapshot"),
    "marker_received": ("node", "pos", "src", "snapshot"),
    "cut": ("node", "pos", "snapshot", "balance"),
    "channel_recorded": ("snapshot", "src", "dst", "msgs", "amounts"),
    "completed": ("node", "snapshot"),
}

INFINITY = float("inf")


class InvariantViolation(AssertionError):
    """The trace breaks an invariant; the message lists every violation found."""


def _name(channel: Channel) -> str:
    return f"{channel[0]}->{channel[1]}"


def _validate(index: int, event: Event) -> str:
    kind = event.get("event")
    if kind not in _FIELDS:
        raise InvariantViolation(f"event #{index}: unknown event type {kind!r}: {dict(event)!r}")
    missing = [f for f in _FIELDS[kind] if f not in event]
    if missing:
        raise InvariantViolation(f"event #{index} ({kind}): missing {', '.join(missing)}")
    return kind


@dataclass(frozen=True, slots=True)
class _Send:
    channel: Channel
    pos: int
    amount: int


@dataclass(slots=True)
class Report:
    """What check_trace looked at (handy for asserting a test checked something)."""

    nodes: int = 0
    channels: int = 0
    transfers: int = 0
    snapshots: dict[str, bool] = field(default_factory=dict)  # id -> complete


# ------------------------------------------------------------ after the run


def check_trace(events: Iterable[Event], *, require_complete: bool = True) -> Report:
    """Check a whole trace. With `require_complete`, every snapshot that appears
    must have finished at every node (the liveness check after a drained run)."""
    problems: list[str] = []
    initial: dict[str, int] = {}
    channels: list[Channel] = []
    sends: dict[str, _Send] = {}
    receives: dict[str, tuple[Channel, int, int]] = {}  # msg -> (channel, pos, amount)
    at_node: dict[str, list[tuple[int, str, Event]]] = defaultdict(list)  # node -> (pos, kind, event)
    cuts: dict[tuple[str, str], tuple[int, int]] = {}  # (snapshot, node) -> (pos, balance)
    markers_sent: dict[tuple[str, Channel], list[int]] = defaultdict(list)  # -> sender positions
    markers_received: Counter[tuple[str, Channel]] = Counter()
    recorded: dict[tuple[str, Channel], list[tuple[str, int]]] = {}
    completed: Counter[tuple[str, str]] = Counter()
    snapshot_ids: dict[str, None] = {}  # ordered set

    for index, event in enumerate(events):
        kind = _validate(index, event)
        if kind == "node":
            if event["node"] in initial:
                problems.append(f"node {event['node']} declared twice")
            initial[event["node"]] = event["balance"]
            continue
        if kind == "channel":
            channels.append((event["src"], event["dst"]))
            continue
        if "snapshot" in event:
            snapshot_ids.setdefault(event["snapshot"], None)
        if "pos" in event:
            at_node[event["node"]].append((event["pos"], kind, event))
        if kind == "send":
            channel = (event["node"], event["dst"])
            if event["msg"] in sends:
                problems.append(f"transfer {event['msg']} sent twice")
            sends[event["msg"]] = _Send(channel, event["pos"], event["amount"])
        elif kind == "receive":
            channel = (event["src"], event["node"])
            if event["msg"] in receives:
                problems.append(f"transfer {event['msg']} received twice")
            receives[event["msg"]] = (channel, event["pos"], event["amount"])
        elif kind == "marker_sent":
            markers_sent[(event["snapshot"], (event["node"], event["dst"]))].append(event["pos"])
        elif kind == "marker_received":
            markers_received[(event["snapshot"], (event["src"], event["node"]))] += 1
        elif kind == "cut":
            key = (event["snapshot"], event["node"])
            if key in cuts:
                problems.append(f"snapshot {key[0]}: {key[1]} recorded its state twice")
            cuts[key] = (event["pos"], event["balance"])
        elif kind == "channel_recorded":
            key = (event["snapshot"], (event["src"], event["dst"]))
            if key in recorded:
                problems.append(f"snapshot {key[0]}: channel {_name(key[1])} recorded twice")
            if len(event["msgs"]) != len(event["amounts"]):
                problems.append(f"snapshot {key[0]}: channel {_name(key[1])}: msgs and amounts differ in length")
            recorded[key] = list(zip(event["msgs"], event["amounts"], strict=False))  # lengths checked above
        elif kind == "completed":
            completed[(event["snapshot"], event["node"])] += 1

    channel_set = set(channels)
    if len(channel_set) != len(channels):
        problems.append("a channel is declared twice")
    nodes = list(initial)
    total = sum(initial.values())

    # Transport model: sends on existing channels, received at most once, unchanged, FIFO.
    for msg, send in sends.items():
        if send.channel not in channel_set:
            problems.append(f"transfer {msg} sent on {_name(send.channel)}, which the topology lacks")
        if not isinstance(send.amount, int) or isinstance(send.amount, bool) or send.amount <= 0:
            problems.append(f"transfer {msg} has non-positive amount {send.amount!r}")
    for msg, (channel, _, amount) in receives.items():
        send = sends.get(msg)
        if send is None:
            problems.append(f"transfer {msg} received on {_name(channel)} but never sent")
        elif send.channel != channel or send.amount != amount:
            problems.append(
                f"transfer {msg} sent as {send.amount} on {_name(send.channel)}, received as {amount} on {_name(channel)}"
            )
    problems += _check_fifo(sends, receives, markers_sent, at_node)

    # Per node: positions unique; balance replayed from the trace never negative.
    for node, history in at_node.items():
        if node not in initial:
            problems.append(f"events at undeclared node {node}")
            continue
        history.sort(key=lambda item: item[0])
        positions = [pos for pos, _, _ in history]
        if len(set(positions)) != len(positions):
            problems.append(f"node {node}: two events share a position")
        balance = initial[node]
        for pos, kind, event in history:
            if kind == "send":
                balance -= event["amount"]
            elif kind == "receive":
                balance += event["amount"]
            if balance < 0:
                problems.append(f"node {node}: balance {balance} < 0 after position {pos}")
                break

    index = _TraceIndex(
        nodes=nodes, channels=channels, initial=initial, sends=sends, receives=receives, at_node=at_node,
        cuts=cuts, markers_sent=markers_sent, markers_received=markers_received, recorded=recorded,
        completed=completed,
    )
    report = Report(nodes=len(nodes), channels=len(channels), transfers=len(sends))
    for sid in snapshot_ids:
        report.snapshots[sid] = all(completed[(sid, n)] == 1 for n in nodes) and all(
            (sid, c) in recorded for c in channels
        )
        problems += _check_snapshot(sid, index, total=total, require_complete=require_complete)
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise InvariantViolation("\n".join(shown))
    return report


def _check_fifo(
    sends: Mapping[str, _Send],
    receives: Mapping[str, tuple[Channel, int, int]],
    markers_sent: Mapping[tuple[str, Channel], list[int]],
    at_node: Mapping[str, list[tuple[int, str, Event]]],
) -> list[str]:
    """What a channel delivers is a prefix of what was put on it, in order."""
    sent: dict[Channel, list[tuple[int, Any]]] = defaultdict(list)
    for msg, send in sends.items():
        sent[send.channel].append((send.pos, ("transfer", msg)))
    for (sid, channel), positions in markers_sent.items():
        for pos in positions:
            sent[channel].append((pos, ("marker", sid)))
    got: dict[Channel, list[tuple[int, Any]]] = defaultdict(list)
    for msg, (channel, pos, _) in receives.items():
        got[channel].append((pos, ("transfer", msg)))
    has_marker_receipts = False
    for node, history in at_node.items():
        for pos, kind, event in history:
            if kind == "marker_received":
                has_marker_receipts = True
                got[(event["src"], node)].append((pos, ("marker", event["snapshot"])))
    problems = []
    for channel in set(sent) | set(got):
        put = [item for _, item in sorted(sent[channel], key=lambda x: x[0])]
        if not has_marker_receipts:  # a log without marker receipts: check transfers only
            put = [item for item in put if item[0] == "transfer"]
        taken = [item for _, item in sorted(got[channel], key=lambda x: x[0])]
        if taken != put[: len(taken)]:
            problems.append(f"channel {_name(channel)} is not FIFO: sent {put}, received {taken}")
    return problems


class _ChannelLine:
    """One channel's sends in send order, each with where it was received (so a
    snapshot's questions about the channel are a binary search, not a scan)."""

    __slots__ = ("msgs", "amounts", "send_pos", "recv_pos", "suffix_min_recv", "received", "fifo")

    def __init__(self, sent: list[tuple[str, _Send]], receives: Mapping[str, tuple[Channel, int, int]]) -> None:
        self.msgs = [msg for msg, _ in sent]
        self.amounts = [send.amount for _, send in sent]
        self.send_pos = [send.pos for _, send in sent]
        self.recv_pos: list[float] = [receives[m][1] if m in receives else INFINITY for m in self.msgs]
        suffix, low = [INFINITY] * (len(sent) + 1), INFINITY
        for i in range(len(sent) - 1, -1, -1):
            low = min(low, self.recv_pos[i])
            suffix[i] = low
        self.suffix_min_recv = suffix
        # FIFO as far as this question goes: the received sends are a prefix, received in send order.
        self.received = sum(1 for p in self.recv_pos if p != INFINITY)
        head = self.recv_pos[: self.received]
        self.fifo = all(p != INFINITY for p in head) and all(a < b for a, b in zip(head, head[1:], strict=False))

    def sent_between(self, low: float, high: float) -> range:
        """Indexes of the sends with low < pos < high."""
        return range(bisect.bisect_right(self.send_pos, low), bisect.bisect_left(self.send_pos, high))

    def received_before_from(self, start: int, before: float) -> list[int]:
        """Indexes >= start of the sends received at a position < `before`."""
        if self.suffix_min_recv[start] >= before:
            return []
        return [i for i in range(start, len(self.msgs)) if self.recv_pos[i] < before]

    def in_flight(self, sender_cut: float, receiver_cut: float) -> list[tuple[str, int]]:
        """(msg, amount) of the sends before `sender_cut` received after `receiver_cut`, in send order."""
        end = bisect.bisect_right(self.send_pos, sender_cut)
        if self.fifo:
            end = min(end, self.received)
            start = bisect.bisect_right(self.recv_pos, receiver_cut, 0, end)
            return list(zip(self.msgs[start:end], self.amounts[start:end], strict=True))
        return [
            (self.msgs[i], self.amounts[i])
            for i in range(end)
            if self.recv_pos[i] != INFINITY and self.recv_pos[i] > receiver_cut
        ]


class _TraceIndex:
    """What `check_trace` gathered, indexed once so that checking each snapshot
    costs about its own size, not the trace's (a 30-minute campaign has
    thousands of snapshots over hundreds of thousands of events)."""

    def __init__(
        self,
        *,
        nodes: Sequence[str],
        channels: Sequence[Channel],
        initial: Mapping[str, int],
        sends: Mapping[str, _Send],
        receives: Mapping[str, tuple[Channel, int, int]],
        at_node: Mapping[str, list[tuple[int, str, Event]]],
        cuts: Mapping[tuple[str, str], tuple[int, int]],
        markers_sent: Mapping[tuple[str, Channel], list[int]],
        markers_received: Mapping[tuple[str, Channel], int],
        recorded: Mapping[tuple[str, Channel], list[tuple[str, int]]],
        completed: Mapping[tuple[str, str], int],
    ) -> None:
        self.nodes, self.channels, self.channel_set = nodes, channels, set(channels)
        self.initial, self.sends, self.receives, self.cuts = initial, sends, receives, cuts
        self.markers_sent, self.markers_received, self.completed = markers_sent, markers_received, completed
        by_channel: dict[Channel, list[tuple[str, _Send]]] = defaultdict(list)
        for msg, send in sorted(sends.items(), key=lambda kv: kv[1].pos):
            by_channel[send.channel].append((msg, send))
        self.lines = {channel: _ChannelLine(sent, receives) for channel, sent in by_channel.items()}
        # Per node: positions of its sends and receives (sorted) and the balance change up to each.
        self.moves: dict[str, tuple[list[int], list[int]]] = {}
        for node, history in at_node.items():
            positions, running, total = [], [], 0
            for pos, kind, event in history:  # sorted by position
                if kind in ("send", "receive"):
                    total += -event["amount"] if kind == "send" else event["amount"]
                    positions.append(pos)
                    running.append(total)
            self.moves[node] = (positions, running)
        self.recorded_by_sid: dict[str, list[tuple[Channel, list[tuple[str, int]]]]] = defaultdict(list)
        for (sid, channel), items in recorded.items():
            self.recorded_by_sid[sid].append((channel, items))
        self.marker_channels_by_sid: dict[str, list[Channel]] = defaultdict(list)
        for sid, channel in markers_sent:
            self.marker_channels_by_sid[sid].append(channel)

    def cut_pos(self, sid: str, node: str) -> float:
        return self.cuts[(sid, node)][0] if (sid, node) in self.cuts else INFINITY

    def balance_before(self, node: str, pos: int) -> int:
        positions, running = self.moves.get(node, ([], []))
        i = bisect.bisect_left(positions, pos)
        return self.initial[node] + (running[i - 1] if i else 0)


def _check_snapshot(sid: str, ix: _TraceIndex, *, total: int, require_complete: bool) -> list[str]:
    p: list[str] = []
    say = p.append
    nodes, channels, cuts, completed = ix.nodes, ix.channels, ix.cuts, ix.completed

    def cut_pos(node: str) -> float:
        return ix.cut_pos(sid, node)

    # Liveness: every node recorded and finished, every channel recorded.
    recorded = dict(ix.recorded_by_sid.get(sid, []))
    if require_complete:
        for node in nodes:
            if (sid, node) not in cuts:
                say(f"snapshot {sid}: {node} never recorded its state")
            if completed.get((sid, node), 0) != 1:
                say(f"snapshot {sid}: {node} completed {completed.get((sid, node), 0)} times, expected once")
        for channel in channels:
            if channel not in recorded:
                say(f"snapshot {sid}: channel {_name(channel)} never recorded")
    for node in nodes:
        if completed.get((sid, node)) and (sid, node) not in cuts:
            say(f"snapshot {sid}: {node} completed without recording its state")

    # Markers: one per channel, sent after the sender's cut and before any later transfer.
    for channel in channels:
        sent = ix.markers_sent.get((sid, channel), [])
        src = channel[0]
        if len(sent) > 1 or (require_complete and len(sent) != 1):
            say(f"snapshot {sid}: {len(sent)} markers sent on {_name(channel)}, expected exactly one")
        if ix.markers_received.get((sid, channel), 0) > 1:
            say(f"snapshot {sid}: {ix.markers_received[(sid, channel)]} markers received on {_name(channel)}")
        if not sent:
            continue
        if sent[0] < cut_pos(src):
            say(f"snapshot {sid}: {src} sent the marker on {_name(channel)} before recording its state")
        line = ix.lines.get(channel)
        for i in line.sent_between(cut_pos(src), sent[0]) if line else ():
            say(f"snapshot {sid}: transfer {line.msgs[i]} left {src} after its cut but before the marker on {_name(channel)}")
    for channel in ix.marker_channels_by_sid.get(sid, []):
        if channel not in ix.channel_set:
            say(f"snapshot {sid}: marker sent on {_name(channel)}, which the topology lacks")

    # Recorded balances: initial + received - sent before the cut.
    recorded_total = 0
    for node in nodes:
        if (sid, node) not in cuts:
            continue
        pos, balance = cuts[(sid, node)]
        expected = ix.balance_before(node, pos)
        if balance != expected:
            say(f"snapshot {sid}: {node} recorded {balance}, but its trace before the cut gives {expected}")
        recorded_total += balance

    # Consistent cut, transfer by transfer. A node that never recorded the
    # snapshot (it abandoned it before the marker came: a restart, an abort) has
    # no cut to be before; the marker reached it first all the same (FIFO), so
    # a transfer it received is no violation.
    for (src, dst), line in ix.lines.items():
        if (sid, dst) not in cuts:
            continue
        first_after_cut = bisect.bisect_left(line.send_pos, cut_pos(src))
        for i in line.received_before_from(first_after_cut, cut_pos(dst)):
            say(f"snapshot {sid}: transfer {line.msgs[i]} was sent after {src}'s cut but received before {dst}'s cut")
    in_snapshot = dict.fromkeys(msg for items in recorded.values() for msg, _ in items)
    for msg in in_snapshot:
        send = ix.sends.get(msg)
        if send is not None and not send.pos < cut_pos(send.channel[0]):
            say(f"snapshot {sid}: transfer {msg} was sent after {send.channel[0]}'s cut but is recorded in flight")

    # Channel states: exactly the transfers sent before the sender's cut and
    # received after the receiver's cut, in FIFO order, with their amounts.
    for channel, items in recorded.items():
        src, dst = channel
        if channel not in ix.channel_set:
            say(f"snapshot {sid}: recorded a state for {_name(channel)}, which the topology lacks")
            continue
        for msg, _amount in items:
            if msg not in ix.sends:
                say(f"snapshot {sid}: {_name(channel)} records transfer {msg}, which was never sent")
            elif msg not in ix.receives:
                say(f"snapshot {sid}: {_name(channel)} records transfer {msg}, which was never received")
        if (sid, dst) in cuts and completed.get((sid, dst)):
            line = ix.lines.get(channel)
            expected_items = line.in_flight(cut_pos(src), cut_pos(dst)) if line else []
            if items != expected_items:
                say(
                    f"snapshot {sid}: {_name(channel)} recorded {items}; sent before {src}'s cut and "
                    f"received after {dst}'s cut: {expected_items}"
                )
        recorded_total += sum(amount for _, amount in items)

    # Conservation, once the whole snapshot is in.
    is_complete = all((sid, n) in cuts for n in nodes) and all(c in recorded for c in channels)
    if is_complete and recorded_total != total:
        say(f"snapshot {sid}: recorded balances + in-flight = {recorded_total}, but the total is {total}")
    return p
