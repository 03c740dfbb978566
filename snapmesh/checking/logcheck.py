"""A separate checker for Chandy-Lamport snapshots, working only from a trace.

It never looks at the simulator or the core: its input is a plain list of event
records (dicts), so the same checker can be fed a simulator trace or events
parsed from real nodes' transfer logs. Every event that happens at a node has
that node's position `pos`: any integers, unique per node, increasing in the
order things happened there (a log sequence number will do). Events:

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

Two ways to check:

- `check_trace(events)`: after the run. Independent of the order of the list
  (only positions matter), so events merged from several logs work as they are.
- `StepChecker`: fed the events one by one in the order they happened (the
  simulator's trace is in that order) and checked after every step; catches a
  violation at the step that causes it.

And for real processes, `check_logs(logs, snapshots, channels=...)`: the
nodes' transfer logs (read with `node_logs.read_logs`) against the COMPLETE
snapshots the cluster produced. It runs `check_trace` on the logs (every
snapshot id in them, finished or not, for safety) and then, per COMPLETE
snapshot: each recorded balance is the node's `cut` and what its log gives
before the cut; each channel's in-flight list is exactly the sends before the
sender's cut minus the receives before the receiver's cut, in seq order, with
their amounts and seqs; one marker per channel each way; and balances plus
in-flight equal the total.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snapmesh.checking.node_logs import log_events

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


# ------------------------------------------------------------ step by step


class StepChecker:
    """Feed events in the order they happened; each `feed` checks what can be
    checked at that moment, `check_state` compares with the real system."""

    def __init__(self) -> None:
        self.initial: dict[str, int] = {}
        self.balances: dict[str, int] = {}
        self.queues: dict[Channel, deque[tuple[str, Any, int]]] = {}  # (kind, msg|sid, amount)
        self.sent_at: dict[str, tuple[Channel, int]] = {}  # msg -> (channel, pos)
        self.cuts: dict[tuple[str, str], int] = {}  # (sid, node) -> pos
        self.markers_sent: Counter[tuple[str, Channel]] = Counter()
        self.markers_received: Counter[tuple[str, Channel]] = Counter()
        self.open_recordings: dict[tuple[str, Channel], list[tuple[str, int]]] = {}
        self.recorded: set[tuple[str, Channel]] = set()
        self.completed: set[tuple[str, str]] = set()
        self.last_pos: dict[str, int] = {}
        self.fed = 0

    @property
    def total(self) -> int:
        return sum(self.initial.values())

    def feed_all(self, events: Sequence[Event]) -> None:
        """Feed the events not fed yet (a growing trace list)."""
        for event in events[self.fed :]:
            self.feed(event)

    def feed(self, event: Event) -> None:
        index = self.fed
        self.fed += 1
        kind = _validate(index, event)

        def fail(problem: str) -> InvariantViolation:
            return InvariantViolation(f"event #{index} {dict(event)!r}: {problem}")

        if kind == "node":
            self.initial[event["node"]] = self.balances[event["node"]] = event["balance"]
            return
        if kind == "channel":
            self.queues[(event["src"], event["dst"])] = deque()
            return
        if "pos" in event:
            node = event["node"]
            if node in self.last_pos and event["pos"] <= self.last_pos[node]:
                raise fail(f"position does not increase at {node}")
            self.last_pos[node] = event["pos"]
        if kind in ("send", "marker_sent"):
            channel = (event["node"], event["dst"])
        elif kind in ("receive", "marker_received", "channel_recorded"):
            channel = (event["src"], event.get("dst", event.get("node")))
        else:
            channel = None
        if channel is not None and channel not in self.queues:
            raise fail(f"the topology has no channel {_name(channel)}")

        if kind == "send":
            self.balances[event["node"]] -= event["amount"]
            if self.balances[event["node"]] < 0:
                raise fail(f"{event['node']}'s balance went negative")
            self.queues[channel].append(("transfer", event["msg"], event["amount"]))
            self.sent_at[event["msg"]] = (channel, event["pos"])
        elif kind == "marker_sent":
            key = (event["snapshot"], channel)
            self.markers_sent[key] += 1
            if self.markers_sent[key] > 1:
                raise fail(f"second marker for {key[0]} on {_name(channel)}")
            if (event["snapshot"], event["node"]) not in self.cuts:
                raise fail("marker sent before the sender recorded its state")
            self.queues[channel].append(("marker", event["snapshot"], 0))
        elif kind in ("receive", "marker_received"):
            queue = self.queues[channel]
            expected = ("transfer", event["msg"]) if kind == "receive" else ("marker", event["snapshot"])
            if not queue or queue[0][:2] != expected:
                raise fail(f"not FIFO: head of {_name(channel)} is {queue[0] if queue else 'nothing'}")
            _, _, amount = queue.popleft()
            if kind == "receive":
                if amount != event["amount"]:
                    raise fail(f"amount changed in transit: sent {amount}")
                self._receive(event, channel, fail)
            else:
                key = (event["snapshot"], channel)
                self.markers_received[key] += 1
                if self.markers_received[key] > 1:
                    raise fail(f"second marker for {key[0]} received on {_name(channel)}")
        elif kind == "cut":
            key = (event["snapshot"], event["node"])
            if key in self.cuts:
                raise fail("second cut for the same snapshot at the same node")
            if event["balance"] != self.balances[event["node"]]:
                raise fail(f"recorded balance differs from the balance {self.balances[event['node']]} at the cut")
            self.cuts[key] = event["pos"]
            for c in self.queues:
                if c[1] == event["node"]:
                    self.open_recordings[(event["snapshot"], c)] = []
        elif kind == "channel_recorded":
            key = (event["snapshot"], channel)
            if key in self.recorded:
                raise fail("channel recorded twice")
            if key not in self.open_recordings:
                raise fail("channel recorded before the receiver recorded its state")
            got = list(zip(event["msgs"], event["amounts"], strict=True))
            want = self.open_recordings.pop(key)
            if got != want:
                raise fail(f"recorded {got}, but after the cut the channel delivered {want}")
            if self.markers_received[key] != 1:
                raise fail("channel recorded before its marker arrived")
            self.recorded.add(key)
        elif kind == "completed":
            key = (event["snapshot"], event["node"])
            if key in self.completed:
                raise fail("completed twice")
            if any(c[1] == event["node"] and (event["snapshot"], c) not in self.recorded for c in self.queues):
                raise fail("completed with an incoming channel still open")
            self.completed.add(key)

    def _receive(self, event: Event, channel: Channel, fail: Any) -> None:
        src, dst = channel
        msg, amount = event["msg"], event["amount"]
        self.balances[dst] += amount
        _, send_pos = self.sent_at[msg]
        for (sid, node), pos in self.cuts.items():
            if node != src or send_pos < pos:
                continue
            # Sent after src's cut for sid: dst must already have cut, or this
            # transfer would enter dst's recorded balance.
            if (sid, dst) not in self.cuts:
                raise fail(f"snapshot {sid}: sent after {src}'s cut, received before {dst}'s cut")
        for (sid, c), items in self.open_recordings.items():
            if c == channel:
                if (sid, src) in self.cuts and send_pos > self.cuts[(sid, src)]:
                    raise fail(f"snapshot {sid}: a transfer sent after {src}'s cut would be recorded in flight")
                items.append((msg, amount))

    def check_state(
        self,
        balances: Mapping[str, int] | None = None,
        in_flight: Mapping[Channel, Sequence[int]] | None = None,
    ) -> None:
        """Conservation now: balances + money on channels = total, per the trace
        and, when given, per the real system (which must agree with the trace)."""
        on_channels = {c: [amount for kind, _, amount in q if kind == "transfer"] for c, q in self.queues.items()}
        money = sum(self.balances.values()) + sum(sum(a) for a in on_channels.values())
        if money != self.total:
            raise InvariantViolation(f"money not conserved: balances + channels = {money}, total {self.total}")
        if balances is not None and dict(balances) != self.balances:
            raise InvariantViolation(f"balances {dict(balances)} differ from the trace's {self.balances}")
        if in_flight is not None:
            actual = {c: list(v) for c, v in in_flight.items()}
            if actual != on_channels:
                raise InvariantViolation(f"channel contents {actual} differ from the trace's {on_channels}")
        for key, count in self.markers_sent.items():
            if count > 1:  # pragma: no cover - feed already refuses this
                raise InvariantViolation(f"{count} markers for {key[0]} on {_name(key[1])}")


# ------------------------------------------------------------ real node logs


@dataclass(frozen=True, slots=True)
class RecordedSnapshot:
    """What a COMPLETE snapshot recorded, independent of how it was delivered."""

    snapshot_id: str
    balances: dict[str, int]
    in_flight: dict[Channel, list[tuple[str, int, int]]]  # (msg_id, amount, seq), in order

    @classmethod
    def from_proto(cls, snapshot: Any) -> RecordedSnapshot:
        """From a controller `Snapshot` (snapmesh.v1)."""
        return cls(
            snapshot_id=snapshot.snapshot_id,
            balances={n.node_id: n.balance for n in snapshot.nodes},
            in_flight={(c.src, c.dst): [(t.msg_id, t.amount, t.seq) for t in c.in_flight] for c in snapshot.channels},
        )

    @classmethod
    def from_states(cls, states: Mapping[str, Any]) -> RecordedSnapshot:
        """From every node's `FullState` report ({node id: FullState})."""
        (sid,) = {s.snapshot_id for s in states.values()}
        return cls(
            snapshot_id=sid,
            balances={node: s.balance for node, s in states.items()},
            in_flight={
                (c.src, c.dst): [(t.msg_id, t.amount, t.seq) for t in c.in_flight]
                for s in states.values()
                for c in s.channels
            },
        )


def check_logs(
    logs: Mapping[str, list[Mapping[str, Any]]],
    snapshots: Iterable[RecordedSnapshot | Any],
    *,
    channels: Iterable[Channel],
    total: int | None = None,
) -> Report:
    """Check real node logs and the COMPLETE `snapshots` taken while they were
    written (RecordedSnapshot, or controller Snapshots). `channels`: the
    topology. `total` defaults to the sum of the logs' `init` balances. Read the
    logs at rest (no transfer being made), or a receive may outrun the send
    read before it."""
    channels = list(channels)
    recorded = [s if isinstance(s, RecordedSnapshot) else RecordedSnapshot.from_proto(s) for s in snapshots]
    events: list[Event] = [{"event": "channel", "src": s, "dst": d} for s, d in channels]
    events += log_events(logs)
    for snap in recorded:
        events += [
            {"event": "channel_recorded", "snapshot": snap.snapshot_id, "src": c[0], "dst": c[1],
             "msgs": [m for m, _, _ in items], "amounts": [a for _, a, _ in items]}
            for c, items in snap.in_flight.items()
        ]
        events += [{"event": "completed", "node": n, "snapshot": snap.snapshot_id} for n in snap.balances]
    problems: list[str] = []
    try:
        report = check_trace(events, require_complete=False)
    except InvariantViolation as violation:
        problems += str(violation).splitlines()
        report = Report()
    initial = {node: r["balance"] for node, records in logs.items() for r in records if r.get("kind") == "init"}
    expected_total = sum(initial.values()) if total is None else total
    index = _LogIndex(logs)
    for snap in recorded:
        problems += _snapshot_against_logs(snap, index, channels, expected_total)
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise InvariantViolation("\n".join(shown))
    return report


class _LogIndex:
    """The logs indexed once, so that checking many snapshots stays linear in the logs:
    per node its cut records (with the balance its log gives just before each),
    per channel the sends and receives in lsn order, and the markers."""

    def __init__(self, logs: Mapping[str, list[Mapping[str, Any]]]) -> None:
        self.nodes = set(logs)
        self.cuts: dict[tuple[str, str], tuple[int, int, int]] = {}  # (sid, node) -> (lsn, logged, computed)
        self.sends: dict[Channel, list[Mapping[str, Any]]] = defaultdict(list)
        self.recvs: dict[Channel, list[Mapping[str, Any]]] = defaultdict(list)
        self.markers_sent: dict[tuple[str, Channel], list[int]] = defaultdict(list)
        self.markers_recv: Counter[tuple[str, Channel]] = Counter()
        for node, records in logs.items():
            balance = 0
            for r in records:
                kind = r.get("kind")
                if kind == "cut":
                    self.cuts.setdefault((r["snapshot_id"], node), (r["lsn"], r["balance"], balance))
                elif kind == "init":
                    balance = r["balance"]
                elif kind == "send":
                    balance -= r["amount"]
                    self.sends[(node, r["dst"])].append(r)
                elif kind == "recv":
                    balance += r["amount"]
                    self.recvs[(r["src"], node)].append(r)
                elif kind == "marker_sent":
                    self.markers_sent[(r["snapshot_id"], (node, r["dst"]))].append(r["lsn"])
                elif kind == "marker_recv":
                    self.markers_recv[(r["snapshot_id"], (r["src"], node))] += 1
        self._lsns = {c: [r["lsn"] for r in v] for c, v in self.sends.items()}
        self._recv_lsns = {c: [r["lsn"] for r in v] for c, v in self.recvs.items()}
        self._sent = {c: [(r["msg_id"], r["amount"], r["seq"]) for r in v] for c, v in self.sends.items()}
        # Per channel: how many of the first receives are the first sends, one for one (FIFO).
        self._agree: dict[Channel, int] = {}
        for channel, recvs in self.recvs.items():
            sent, agree = self.sends.get(channel, []), 0
            while agree < min(len(recvs), len(sent)) and recvs[agree]["msg_id"] == sent[agree]["msg_id"]:
                agree += 1
            self._agree[channel] = agree

    def in_flight(self, channel: Channel, sender_cut: int, receiver_cut: int) -> list[tuple[str, int, int]]:
        """(msg_id, amount, seq) of the sends logged before `sender_cut` whose receive
        is not logged before `receiver_cut`, in lsn order."""
        sent = bisect.bisect_left(self._lsns.get(channel, []), sender_cut)
        got = bisect.bisect_left(self._recv_lsns.get(channel, []), receiver_cut)
        if got <= self._agree.get(channel, 0):  # the receives so far are the first sends: a slice
            return self._sent.get(channel, [])[got:sent]
        received = {r["msg_id"] for r in self.recvs[channel][:got]}
        return [t for t in self._sent.get(channel, [])[:sent] if t[0] not in received]


def _snapshot_against_logs(snap: RecordedSnapshot, index: _LogIndex, channels: list[Channel], total: int) -> list[str]:
    sid = snap.snapshot_id
    p: list[str] = []
    say = p.append
    if set(snap.balances) != index.nodes:
        say(f"snapshot {sid}: records nodes {sorted(snap.balances)}, the logs are of {sorted(index.nodes)}")
    if set(snap.in_flight) != set(channels):
        say(f"snapshot {sid}: records channels {sorted(snap.in_flight)}, the topology has {sorted(channels)}")
    cut: dict[str, int] = {}
    for node in sorted(index.nodes):
        if (sid, node) not in index.cuts:
            say(f"snapshot {sid}: no cut record in {node}'s log")
            continue
        lsn, logged, computed = index.cuts[(sid, node)]
        cut[node] = lsn
        if not logged == computed == snap.balances.get(node):
            say(f"snapshot {sid}: {node} recorded {snap.balances.get(node)}, its cut says {logged}, "
                f"its log before the cut gives {computed}")
    if p:
        return p

    for src, dst in channels:
        channel = _name((src, dst))
        expected = index.in_flight((src, dst), cut[src], cut[dst])
        got = snap.in_flight.get((src, dst), [])
        if got != expected:
            say(f"snapshot {sid}: {channel} in flight {got}; sent before {src}'s cut and not received before "
                f"{dst}'s cut: {expected}")
        sent = index.markers_sent.get((sid, (src, dst)), [])
        got_markers = index.markers_recv.get((sid, (src, dst)), 0)
        if len(sent) != 1 or got_markers != 1:
            say(f"snapshot {sid}: {channel} carried {len(sent)} markers out and {got_markers} in, expected one")
        elif sent[0] < cut[src]:
            say(f"snapshot {sid}: {src} sent the marker on {channel} before its cut")
    recorded_total = sum(snap.balances.values()) + sum(a for items in snap.in_flight.values() for _, a, _ in items)
    if recorded_total != total:
        say(f"snapshot {sid}: balances + in flight = {recorded_total}, the total is {total}")
    return p


# ------------------------------------------------------------ across epochs (issue 10)


def split_epochs(logs: Mapping[str, list[Mapping[str, Any]]]) -> dict[int, dict[str, list[Mapping[str, Any]]]]:
    """Each node's log cut at its `restore` records: {epoch: {node: records}}.
    Epoch 1 is the log up to the first restore; epoch E starts at the (last)
    restore record of E, as an `init` holding the balance after the restore
    (the recorded balance plus the replays), so each epoch is checked as a run
    of its own (msg ids and seqs start over in every epoch)."""
    by_epoch: dict[int, dict[str, list[Mapping[str, Any]]]] = defaultdict(dict)
    for node, records in logs.items():
        epoch, current = 1, []
        by_epoch[1][node] = current
        for r in records:
            kind = r.get("kind")
            if kind == "restore":
                epoch = r["epoch"]
                current = [{"node": node, "lsn": r["lsn"], "kind": "init", "balance": r["balance"]}]
                by_epoch[epoch][node] = current  # a restore redone after a crash replaces the cut-short one
            elif kind == "replay":
                current[0] = {**current[0], "balance": current[0]["balance"] + r["amount"]}
            else:
                current.append(r)
    return dict(by_epoch)


def restores_in_logs(logs: Mapping[str, list[Mapping[str, Any]]]) -> dict[int, dict[str, tuple[Mapping, list]]]:
    """{epoch: {node: (its last restore record of that epoch, the replays after it)}}."""
    found: dict[int, dict[str, tuple[Mapping, list]]] = defaultdict(dict)
    for node, records in logs.items():
        replays: list | None = None
        for r in records:
            if r.get("kind") == "restore":
                replays = []
                found[r["epoch"]][node] = (r, replays)
            elif r.get("kind") == "replay" and replays is not None:
                replays.append(r)
    return dict(found)


def check_restore(logs: Mapping[str, list[Mapping[str, Any]]], snapshot: RecordedSnapshot | Any, epoch: int) -> None:
    """The restore itself: in `epoch` every node's log sets the snapshot's
    recorded balance and then replays, per channel in channel order, exactly
    the transfers the snapshot recorded in flight towards it."""
    snap = snapshot if isinstance(snapshot, RecordedSnapshot) else RecordedSnapshot.from_proto(snapshot)
    found = restores_in_logs(logs).get(epoch, {})
    problems = []
    for node, balance in snap.balances.items():
        if node not in found:
            problems.append(f"restore of {snap.snapshot_id} in epoch {epoch}: no restore record in {node}'s log")
            continue
        record, replays = found[node]
        if record["snapshot_id"] != snap.snapshot_id or record["balance"] != balance:
            problems.append(f"epoch {epoch}: {node} restored {record['snapshot_id']} to {record['balance']}, "
                            f"expected {snap.snapshot_id} at {balance}")
        for (src, dst), items in snap.in_flight.items():
            if dst != node:
                continue
            got = [(r["msg_id"], r["amount"], r["seq"]) for r in replays if r["src"] == src]
            if got != list(items):
                problems.append(f"epoch {epoch}: {src}->{node} replayed {got}, the snapshot holds {items}")
        if len(replays) != record["deliveries"]:
            problems.append(f"epoch {epoch}: {node} announced {record['deliveries']} replays and logged {len(replays)}")
    if problems:
        raise InvariantViolation("\n".join(problems))


def check_logs_by_epoch(
    logs: Mapping[str, list[Mapping[str, Any]]],
    snapshots: Iterable[Any],
    *,
    channels: Iterable[Channel],
    total: int,
) -> dict[int, Report]:
    """`check_logs` on each epoch on its own: every COMPLETE controller
    Snapshot against the log of the epoch it was taken in (`Snapshot.epoch`)."""
    channels = list(channels)
    snapshots = list(snapshots)
    reports = {}
    for epoch, epoch_logs in sorted(split_epochs(logs).items()):
        if set(epoch_logs) != set(logs):  # a restore some node never took (FAILED): nothing to check there
            continue
        taken = [s for s in snapshots if (s.epoch or 1) == epoch]
        reports[epoch] = check_logs(epoch_logs, taken, channels=channels, total=total)
    return reports
