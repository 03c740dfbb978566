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

from node_logs import log_events

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

    by_channel: dict[Channel, list[tuple[str, _Send]]] = defaultdict(list)
    for msg, send in sorted(sends.items(), key=lambda kv: kv[1].pos):
        by_channel[send.channel].append((msg, send))

    report = Report(nodes=len(nodes), channels=len(channels), transfers=len(sends))
    for sid in snapshot_ids:
        report.snapshots[sid] = all(completed[(sid, n)] == 1 for n in nodes) and all(
            (sid, c) in recorded for c in channels
        )
        problems += _check_snapshot(
            sid,
            nodes=nodes,
            channels=channels,
            initial=initial,
            total=total,
            sends=sends,
            by_channel=by_channel,
            receives=receives,
            at_node=at_node,
            cuts=cuts,
            markers_sent=markers_sent,
            markers_received=markers_received,
            recorded=recorded,
            completed=completed,
            require_complete=require_complete,
        )
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


def _check_snapshot(
    sid: str,
    *,
    nodes: Sequence[str],
    channels: Sequence[Channel],
    initial: Mapping[str, int],
    total: int,
    sends: Mapping[str, _Send],
    by_channel: Mapping[Channel, list[tuple[str, _Send]]],
    receives: Mapping[str, tuple[Channel, int, int]],
    at_node: Mapping[str, list[tuple[int, str, Event]]],
    cuts: Mapping[tuple[str, str], tuple[int, int]],
    markers_sent: Mapping[tuple[str, Channel], list[int]],
    markers_received: Mapping[tuple[str, Channel], int],
    recorded: Mapping[tuple[str, Channel], list[tuple[str, int]]],
    completed: Mapping[tuple[str, str], int],
    require_complete: bool,
) -> list[str]:
    p: list[str] = []
    say = p.append
    channel_set = set(channels)

    def cut_pos(node: str) -> float:
        return cuts[(sid, node)][0] if (sid, node) in cuts else INFINITY

    # Liveness: every node recorded and finished, every channel recorded.
    if require_complete:
        for node in nodes:
            if (sid, node) not in cuts:
                say(f"snapshot {sid}: {node} never recorded its state")
            if completed.get((sid, node), 0) != 1:
                say(f"snapshot {sid}: {node} completed {completed.get((sid, node), 0)} times, expected once")
        for channel in channels:
            if (sid, channel) not in recorded:
                say(f"snapshot {sid}: channel {_name(channel)} never recorded")
    for node in nodes:
        if completed.get((sid, node)) and (sid, node) not in cuts:
            say(f"snapshot {sid}: {node} completed without recording its state")

    # Markers: one per channel, sent after the sender's cut and before any later transfer.
    for channel in channels:
        sent = markers_sent.get((sid, channel), [])
        src = channel[0]
        if len(sent) > 1 or (require_complete and len(sent) != 1):
            say(f"snapshot {sid}: {len(sent)} markers sent on {_name(channel)}, expected exactly one")
        if markers_received.get((sid, channel), 0) > 1:
            say(f"snapshot {sid}: {markers_received[(sid, channel)]} markers received on {_name(channel)}")
        if not sent:
            continue
        if sent[0] < cut_pos(src):
            say(f"snapshot {sid}: {src} sent the marker on {_name(channel)} before recording its state")
        for msg, send in by_channel.get(channel, []):
            if cut_pos(src) < send.pos < sent[0]:
                say(f"snapshot {sid}: transfer {msg} left {src} after its cut but before the marker on {_name(channel)}")
    for (other_sid, channel) in markers_sent:
        if other_sid == sid and channel not in channel_set:
            say(f"snapshot {sid}: marker sent on {_name(channel)}, which the topology lacks")

    # Recorded balances: initial + received - sent before the cut.
    recorded_total = 0
    for node in nodes:
        if (sid, node) not in cuts:
            continue
        pos, balance = cuts[(sid, node)]
        expected = initial[node]
        for other_pos, kind, event in at_node.get(node, []):
            if other_pos < pos and kind == "send":
                expected -= event["amount"]
            elif other_pos < pos and kind == "receive":
                expected += event["amount"]
        if balance != expected:
            say(f"snapshot {sid}: {node} recorded {balance}, but its trace before the cut gives {expected}")
        recorded_total += balance

    # Consistent cut, transfer by transfer.
    in_snapshot_channels = {
        msg: channel for (s, channel), items in recorded.items() if s == sid for msg, _ in items
    }
    for msg, send in sends.items():
        src, dst = send.channel
        sent_before = send.pos < cut_pos(src)
        received = receives.get(msg)
        # A receiver that never recorded this snapshot (it was aborted there
        # first) has no cut for a transfer to cross.
        received_before = received is not None and (sid, dst) in cuts and received[1] < cut_pos(dst)
        if received_before and not sent_before:
            say(f"snapshot {sid}: transfer {msg} was sent after {src}'s cut but received before {dst}'s cut")
        if not sent_before and msg in in_snapshot_channels:
            say(f"snapshot {sid}: transfer {msg} was sent after {src}'s cut but is recorded in flight")

    # Channel states: exactly the transfers sent before the sender's cut and
    # received after the receiver's cut, in FIFO order, with their amounts.
    for (s, channel), items in recorded.items():
        if s != sid:
            continue
        src, dst = channel
        if channel not in channel_set:
            say(f"snapshot {sid}: recorded a state for {_name(channel)}, which the topology lacks")
            continue
        expected_items = []
        for msg, send in by_channel.get(channel, []):
            if send.pos > cut_pos(src):
                break
            received = receives.get(msg)
            if received is not None and received[1] > cut_pos(dst):
                expected_items.append((msg, send.amount))
        for msg, _amount in items:
            if msg not in sends:
                say(f"snapshot {sid}: {_name(channel)} records transfer {msg}, which was never sent")
            elif msg not in receives:
                say(f"snapshot {sid}: {_name(channel)} records transfer {msg}, which was never received")
        if (s, dst) in cuts and completed.get((sid, dst)) and items != expected_items:
            say(
                f"snapshot {sid}: {_name(channel)} recorded {items}; sent before {src}'s cut and "
                f"received after {dst}'s cut: {expected_items}"
            )
        recorded_total += sum(amount for _, amount in items)

    # Conservation, once the whole snapshot is in.
    is_complete = all((sid, n) in cuts for n in nodes) and all((sid, c) in recorded for c in channels)
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
    """The logs indexed once for checking many snapshots (each lookup a dict or
    a bisect, not a scan of every record)."""

    def __init__(self, logs: Mapping[str, list[Mapping[str, Any]]]) -> None:
        self.nodes = set(logs)
        # (node, snapshot id) -> (the first cut record, the log's balance just before it)
        self.cuts: dict[tuple[str, str], tuple[Mapping[str, Any], int]] = {}
        # (node, kind, peer) -> that node's send (by dst) or recv (by src) records, in lsn order
        self.transfers: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
        # (kind, snapshot id, src, dst) -> marker records
        self.markers: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
        for node, records in logs.items():
            balance = 0
            for r in records:
                kind = r.get("kind")
                if kind == "init":
                    balance = r["balance"]
                elif kind == "send":
                    balance -= r["amount"]
                    self.transfers[(node, kind, r["dst"])].append(r)
                elif kind == "recv":
                    balance += r["amount"]
                    self.transfers[(node, kind, r["src"])].append(r)
                elif kind == "cut":
                    self.cuts.setdefault((node, r["snapshot_id"]), (r, balance))
                elif kind in ("marker_sent", "marker_recv"):
                    self.markers[(kind, r["snapshot_id"], r["src"], r["dst"])].append(r)
        self._lsns = {key: [r["lsn"] for r in records] for key, records in self.transfers.items()}

    def before(self, node: str, kind: str, peer: str, lsn: int) -> list[Mapping[str, Any]]:
        """`node`'s `kind` records with `peer` logged before `lsn`."""
        key = (node, kind, peer)
        return self.transfers.get(key, [])[: bisect.bisect_left(self._lsns.get(key, []), lsn)]


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
        if (node, sid) not in index.cuts:
            say(f"snapshot {sid}: no cut record in {node}'s log")
            continue
        r, balance = index.cuts[(node, sid)]
        cut[node] = r["lsn"]
        if not r["balance"] == balance == snap.balances.get(node):
            say(f"snapshot {sid}: {node} recorded {snap.balances.get(node)}, its cut says {r['balance']}, "
                f"its log before the cut gives {balance}")
    if p:
        return p

    for src, dst in channels:
        channel = _name((src, dst))
        received = {r["msg_id"] for r in index.before(dst, "recv", src, cut[dst])}
        expected = [(r["msg_id"], r["amount"], r["seq"]) for r in index.before(src, "send", dst, cut[src])
                    if r["msg_id"] not in received]
        got = snap.in_flight.get((src, dst), [])
        if got != expected:
            say(f"snapshot {sid}: {channel} in flight {got}; sent before {src}'s cut and not received before "
                f"{dst}'s cut: {expected}")
        sent = index.markers.get(("marker_sent", sid, src, dst), [])
        got_markers = index.markers.get(("marker_recv", sid, src, dst), [])
        if len(sent) != 1 or len(got_markers) != 1:
            say(f"snapshot {sid}: {channel} carried {len(sent)} markers out and {len(got_markers)} in, expected one")
        elif sent[0]["lsn"] < cut[src]:
            say(f"snapshot {sid}: {src} sent the marker on {channel} before its cut")
    recorded_total = sum(snap.balances.values()) + sum(a for items in snap.in_flight.values() for _, a, _ in items)
    if recorded_total != total:
        say(f"snapshot {sid}: balances + in flight = {recorded_total}, the total is {total}")
    return p
