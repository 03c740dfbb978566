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
`steps.StepChecker` checks the same events one by one as they happen.

What is the trace's own is checked here: the events' fields, the transport
(FIFO, each transfer received once, unchanged), positions, balances never
negative, completion, the markers. Whether each snapshot is a consistent cut is
`cut.check_snapshot`, the one definition, asked about the trace read as the
nodes' logs (`trace_logs`: seqs from the positions); its problems are then said
in this checker's words.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snapmesh.checking import cut
import snapmesh.bank.cut as bank_cut
from snapmesh.protocol import wal

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
    """One channel's sends in send order (so "what left between two positions" is
    a binary search, not a scan)."""

    __slots__ = ("msgs", "send_pos")

    def __init__(self, sent: list[tuple[str, _Send]]) -> None:
        self.msgs = [msg for msg, _ in sent]
        self.send_pos = [send.pos for _, send in sent]

    def sent_between(self, low: float, high: float) -> range:
        """Indexes of the sends with low < pos < high."""
        return range(bisect.bisect_right(self.send_pos, low), bisect.bisect_left(self.send_pos, high))


def trace_logs(
    initial: Mapping[str, int], at_node: Mapping[str, list[tuple[int, str, Event]]], snapshot_ids: Iterable[str],
) -> tuple[cut.LogIndex, dict[tuple[Channel, str], int]]:
    """The trace as the nodes' `wal` logs, read into a `cut.LogIndex`, and each
    transfer's seq ((channel, msg) -> seq). `at_node`: each declared node's events
    sorted by position. A channel's sends get seqs 1..n in the sender's position
    order; a receive takes the seq of the send with its msg id on its channel (0
    when there is none: a receive the trace's own checks report, which still
    counts in the receiver's balance); cuts stay cuts. Markers are left out: the
    marker rules are the trace's own (a trace may lack marker receipts, and it
    judges snapshots still open)."""
    seq_of: dict[tuple[Channel, str], int] = {}
    sent: dict[Channel, int] = {}
    for node in initial:
        for _, kind, event in at_node.get(node, ()):
            if kind == "send":
                channel = (node, event["dst"])
                seq_of[(channel, event["msg"])] = sent[channel] = sent.get(channel, 0) + 1
    logs: dict[str, list[wal.Record]] = {}
    send, recv, cut_record = wal.Send, wal.Recv, wal.Cut
    for node, balance in initial.items():
        history = at_node.get(node, [])
        log = logs[node] = [wal.Init(lsn=history[0][0] - 1 if history else 0, tally=balance)]
        add = log.append
        for pos, kind, event in history:
            if kind == "send":
                dst, msg = event["dst"], event["msg"]
                # A msg id sent twice on a channel: both take the later seq (the trace reports it).
                add(send(lsn=pos, msg_id=msg, src=node, dst=dst, seq=seq_of[((node, dst), msg)],
                         tally=event["amount"]))
            elif kind == "receive":
                src, msg = event["src"], event["msg"]
                add(recv(lsn=pos, msg_id=msg, src=src, dst=node, seq=seq_of.get(((src, node), msg), 0),
                         tally=event["amount"]))
            elif kind == "cut":
                add(cut_record(lsn=pos, snapshot_id=event["snapshot"], tally=event["balance"]))
    return cut.LogIndex.of(logs, snapshot_ids, reading=bank_cut.Reading()), seq_of


class _TraceIndex:
    """What `check_trace` gathered, indexed once so that checking each snapshot
    costs about its own size, not the trace's (a 30-minute campaign has
    thousands of snapshots over hundreds of thousands of events): the trace as
    logs for `cut.check_snapshot`, and what the trace's own rules read."""

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
        self.sends, self.receives, self.cuts = sends, receives, cuts
        self.markers_sent, self.markers_received, self.completed = markers_sent, markers_received, completed
        by_channel: dict[Channel, list[tuple[str, _Send]]] = defaultdict(list)
        for msg, send in sorted(sends.items(), key=lambda kv: kv[1].pos):
            by_channel[send.channel].append((msg, send))
        self.lines = {channel: _ChannelLine(sent) for channel, sent in by_channel.items()}
        self.recorded_by_sid: dict[str, list[tuple[Channel, list[tuple[str, int]]]]] = defaultdict(list)
        for (sid, channel), items in recorded.items():
            self.recorded_by_sid[sid].append((channel, items))
        self.marker_channels_by_sid: dict[str, list[Channel]] = defaultdict(list)
        for sid, channel in markers_sent:
            self.marker_channels_by_sid[sid].append(channel)
        sids = {sid for sid, _ in cuts} | {sid for sid, _ in recorded}
        self.logs, self.seq_of = trace_logs(initial, at_node, sids)

    def cut_pos(self, sid: str, node: str) -> float:
        return self.cuts[(sid, node)][0] if (sid, node) in self.cuts else INFINITY


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

    # A recorded transfer the trace never delivers (a run judged after it drained).
    for channel, items in recorded.items():
        for msg, _ in items:
            if msg in ix.sends and msg not in ix.receives:
                say(f"snapshot {sid}: {_name(channel)} records transfer {msg}, which was never received")

    # Against the logs the trace is: `cut.check_snapshot`, in this checker's words.
    snap = cut.Snapshot(
        snapshot_id=sid,
        nodes=[(node, cuts[(sid, node)][1]) for node in nodes if (sid, node) in cuts],
        channels=[(src, dst, [(msg, amount, ix.seq_of.get(((src, dst), msg), 0)) for msg, amount in items])
                  for (src, dst), items in recorded.items()],
    )
    verdict = cut.check_snapshot(ix.logs, snap, topology=channels)
    p += _in_trace_words(sid, ix, verdict, recorded)

    # Conservation, once the whole snapshot is in.
    is_complete = all((sid, n) in cuts for n in nodes) and all(c in recorded for c in channels)
    if is_complete and any(q.rule == bank_cut.CONSERVATION for q in verdict.problems):
        say(f"snapshot {sid}: recorded balances + in-flight = {verdict.whole.observed}, but the total is {total}")
    return p


def _in_trace_words(
    sid: str, ix: _TraceIndex, verdict: cut.Verdict, recorded: Mapping[Channel, list[tuple[str, int]]],
) -> list[str]:
    """The problems `cut.check_snapshot` found that the trace's rules name, in the
    trace's words; the rest are the trace's own checks' (FIFO, receives, liveness)."""
    p: list[str] = []
    say = p.append
    after_cut: dict[str, str] = {}  # msg -> its sender, recorded in flight though sent after the sender's cut
    for q in verdict.problems:
        rule, args = q.rule, q.args
        if rule == cut.STATE:
            node, balance, expected = args
            say(f"snapshot {sid}: {node} recorded {balance}, but its trace before the cut gives {expected}")
        elif rule == cut.ORPHAN_RECEIPT:
            src, dst, _, received_upto, _, sent_upto = args
            by_seq = ix.logs.send_by_seq.get((src, dst), {})
            for seq in range(sent_upto + 1, received_upto + 1):
                if seq in by_seq:
                    say(f"snapshot {sid}: transfer {by_seq[seq].msg_id} was sent after {src}'s cut but received "
                        f"before {dst}'s cut")
        elif rule == cut.IN_FLIGHT_AFTER_CUT or (
            # A cut missing at one end: "sent after the sender's cut" by its position alone.
            rule == cut.UNEXPECTED_IN_FLIGHT and not ix.sends[args[2]].pos < ix.cut_pos(sid, args[0])
        ):
            after_cut.setdefault(args[2], args[0])
        elif rule == cut.UNKNOWN_CHANNEL:
            say(f"snapshot {sid}: recorded a state for {_name(args)}, which the topology lacks")
        elif rule == cut.IN_FLIGHT_NEVER_SENT and args[:2] in ix.channel_set:
            say(f"snapshot {sid}: {_name(args[:2])} records transfer {args[2]}, which was never sent")
    for msg, src in after_cut.items():
        say(f"snapshot {sid}: transfer {msg} was sent after {src}'s cut but is recorded in flight")
    # A recording is final once its receiver completed: then it is exactly what the logs give.
    for (src, dst), items in recorded.items():
        expected = verdict.expected.get((src, dst))
        if expected is None or not ix.completed.get((sid, dst)):
            continue
        want = [(msg, amount) for msg, amount, _ in expected]
        if items != want:
            say(f"snapshot {sid}: {_name((src, dst))} recorded {items}; sent before {src}'s cut and "
                f"received after {dst}'s cut: {want}")
    return p
