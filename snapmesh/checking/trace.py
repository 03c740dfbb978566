"""The checker of a trace: Chandy-Lamport snapshots judged from a list of events.

It never looks at the simulator or the core: its input is a plain list of event
records (dicts), so the same checker can be fed a simulator trace or events
parsed from real nodes' transfer logs (`node_logs.log_events`). Every event that
happens at a node has that node's position `pos`: any integers, unique per node,
increasing in the order things happened there (a log sequence number will do).
Events (V is a value the app gives meaning to: a node's state, under the app's
`state_key`, a message's content under its `content_key`, a recorded channel's
contents, one per message, under its `contents_key`):

    {"event": "node", "node": N, STATE: V}              initial state (one per node)
    {"event": "channel", "src": S, "dst": D}            one per directed channel
    {"event": "send", "node": S, "pos": P, "dst": D, "msg": M, CONTENT: V}
    {"event": "receive", "node": D, "pos": P, "src": S, "msg": M, CONTENT: V}
    {"event": "marker_sent", "node": S, "pos": P, "dst": D, "snapshot": I}
    {"event": "marker_received", "node": D, "pos": P, "src": S, "snapshot": I}   optional
    {"event": "cut", "node": N, "pos": P, "snapshot": I, STATE: V}
    {"event": "channel_recorded", "snapshot": I, "src": S, "dst": D,
     "msgs": [M, ...], CONTENTS: [V, ...]}             in arrival order
    {"event": "completed", "node": N, "snapshot": I}

`check_trace(events)` checks after the run, independent of the order of the list
(only positions matter), so events merged from several logs work as they are.
`steps.StepChecker` checks the same events one by one as they happen.

What is the trace's own is checked here: the events' fields, the transport
(FIFO, each transfer received once, unchanged), positions, completion, the
markers. What the values mean is the app's, passed as `app` (a `Part`; the bank's
is snapmesh/bank/trace.py's, which its callers hand in). Whether each snapshot is a consistent cut is
`cut.check_snapshot`, the one definition, asked about the trace read as the
nodes' logs (`trace_logs`: seqs from the positions); its problems are then said
in this checker's words.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from snapmesh.checking import cut
from snapmesh.protocol import wal

Event = Mapping[str, Any]
Channel = tuple[str, str]



class Part(Protocol):
    """An app's part of a trace: the keys its events hold their values under, and what the values mean."""

    state_key: str  # a node's state, in `node` and `cut` events
    content_key: str  # a message's content, in `send` and `receive` events
    contents_key: str  # a recorded channel's contents, in `channel_recorded` events

    def reading(self) -> cut.Reading:
        """The app's `cut.Reading` of the trace read as logs (`trace_logs`)."""

    def logged(self, kind: str, value: Any) -> Mapping[str, Any]:
        """The fields a log line of `kind` (init, send, recv, cut) holds `value` in, as its node logs it."""

    def total(self, initial: Mapping[str, Any]) -> Any:
        """What the whole-snapshot rule holds the snapshots to, from the nodes' initial states."""

    def message_problem(self, msg: str, content: Any) -> str | None: ...

    def history_problems(self, node: str, initial: Any, history: Iterable[tuple[int, str, Event]]) -> list[str]:
        """The app's rules over one node's events, in position order."""

    def whole_problem(self, sid: str, rules: set[str], whole: Any, total: Any) -> str | None:
        """The app's rules over a whole snapshot, once it is all in (`rules`: the broken ones)."""


def fields_of(app: Any) -> dict[str, tuple[str, ...]]:
    """Each event kind's fields, its values under the app's keys."""
    return {
        "node": ("node", app.state_key),
        "channel": ("src", "dst"),
        "send": ("node", "pos", "dst", "msg", app.content_key),
        "receive": ("node", "pos", "src", "msg", app.content_key),
        "marker_sent": ("node", "pos", "dst", "snapshot"),
        "marker_received": ("node", "pos", "src", "snapshot"),
        "cut": ("node", "pos", "snapshot", app.state_key),
        "channel_recorded": ("snapshot", "src", "dst", "msgs", app.contents_key),
        "completed": ("node", "snapshot"),
    }


INFINITY = float("inf")


class InvariantViolation(AssertionError):
    """The trace breaks an invariant; the message lists every violation found."""


def _name(channel: Channel) -> str:
    return f"{channel[0]}->{channel[1]}"


def _validate(index: int, event: Event, fields: Mapping[str, tuple[str, ...]]) -> str:
    kind = event.get("event")
    if kind not in fields:
        raise InvariantViolation(f"event #{index}: unknown event type {kind!r}: {dict(event)!r}")
    missing = [f for f in fields[kind] if f not in event]
    if missing:
        raise InvariantViolation(f"event #{index} ({kind}): missing {', '.join(missing)}")
    return kind


@dataclass(frozen=True, slots=True)
class _Send:
    channel: Channel
    pos: int
    content: Any


@dataclass(slots=True)
class Report:
    """What check_trace looked at (handy for asserting a test checked something)."""

    nodes: int = 0
    channels: int = 0
    transfers: int = 0
    snapshots: dict[str, bool] = field(default_factory=dict)  # id -> complete


# ------------------------------------------------------------ after the run


def check_trace(events: Iterable[Event], *, app: Part, require_complete: bool = True) -> Report:
    """Check a whole trace. With `require_complete`, every snapshot that appears
    must have finished at every node (the liveness check after a drained run).
    `app`: the app's part, what the values mean."""
    fields = fields_of(app)
    state_key, content_key, contents_key = app.state_key, app.content_key, app.contents_key
    problems: list[str] = []
    initial: dict[str, Any] = {}
    channels: list[Channel] = []
    sends: dict[str, _Send] = {}
    receives: dict[str, tuple[Channel, int, Any]] = {}  # msg -> (channel, pos, content)
    at_node: dict[str, list[tuple[int, str, Event]]] = defaultdict(list)  # node -> (pos, kind, event)
    cuts: dict[tuple[str, str], tuple[int, Any]] = {}  # (snapshot, node) -> (pos, state)
    markers_sent: dict[tuple[str, Channel], list[int]] = defaultdict(list)  # -> sender positions
    markers_received: Counter[tuple[str, Channel]] = Counter()
    recorded: dict[tuple[str, Channel], list[tuple[str, Any]]] = {}
    completed: Counter[tuple[str, str]] = Counter()
    snapshot_ids: dict[str, None] = {}  # ordered set

    for index, event in enumerate(events):
        kind = _validate(index, event, fields)
        if kind == "node":
            if event["node"] in initial:
                problems.append(f"node {event['node']} declared twice")
            initial[event["node"]] = event[state_key]
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
            sends[event["msg"]] = _Send(channel, event["pos"], event[content_key])
        elif kind == "receive":
            channel = (event["src"], event["node"])
            if event["msg"] in receives:
                problems.append(f"transfer {event['msg']} received twice")
            receives[event["msg"]] = (channel, event["pos"], event[content_key])
        elif kind == "marker_sent":
            markers_sent[(event["snapshot"], (event["node"], event["dst"]))].append(event["pos"])
        elif kind == "marker_received":
            markers_received[(event["snapshot"], (event["src"], event["node"]))] += 1
        elif kind == "cut":
            key = (event["snapshot"], event["node"])
            if key in cuts:
                problems.append(f"snapshot {key[0]}: {key[1]} recorded its state twice")
            cuts[key] = (event["pos"], event[state_key])
        elif kind == "channel_recorded":
            key = (event["snapshot"], (event["src"], event["dst"]))
            if key in recorded:
                problems.append(f"snapshot {key[0]}: channel {_name(key[1])} recorded twice")
            contents = event[contents_key]
            if len(event["msgs"]) != len(contents):
                problems.append(f"snapshot {key[0]}: channel {_name(key[1])}: msgs and {contents_key} differ in length")
            recorded[key] = list(zip(event["msgs"], contents, strict=False))  # lengths checked above
        elif kind == "completed":
            completed[(event["snapshot"], event["node"])] += 1

    channel_set = set(channels)
    if len(channel_set) != len(channels):
        problems.append("a channel is declared twice")
    nodes = list(initial)
    total = app.total(initial)

    # Transport model: sends on existing channels, received at most once, unchanged, FIFO.
    for msg, send in sends.items():
        if send.channel not in channel_set:
            problems.append(f"transfer {msg} sent on {_name(send.channel)}, which the topology lacks")
        if problem := app.message_problem(msg, send.content):
            problems.append(problem)
    for msg, (channel, _, content) in receives.items():
        send = sends.get(msg)
        if send is None:
            problems.append(f"transfer {msg} received on {_name(channel)} but never sent")
        elif send.channel != channel or send.content != content:
            problems.append(
                f"transfer {msg} sent as {send.content} on {_name(send.channel)}, received as {content} on {_name(channel)}"
            )
    problems += _check_fifo(sends, receives, markers_sent, at_node)

    # Per node: positions unique; the app's rules over its history.
    for node, history in at_node.items():
        if node not in initial:
            problems.append(f"events at undeclared node {node}")
            continue
        history.sort(key=lambda item: item[0])
        positions = [pos for pos, _, _ in history]
        if len(set(positions)) != len(positions):
            problems.append(f"node {node}: two events share a position")
        problems += app.history_problems(node, initial[node], history)

    index = _TraceIndex(
        nodes=nodes, channels=channels, initial=initial, sends=sends, receives=receives, at_node=at_node,
        cuts=cuts, markers_sent=markers_sent, markers_received=markers_received, recorded=recorded,
        completed=completed, app=app,
    )
    report = Report(nodes=len(nodes), channels=len(channels), transfers=len(sends))
    for sid in snapshot_ids:
        report.snapshots[sid] = all(completed[(sid, n)] == 1 for n in nodes) and all(
            (sid, c) in recorded for c in channels
        )
        problems += _check_snapshot(sid, index, app, total=total, require_complete=require_complete)
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise InvariantViolation("\n".join(shown))
    return report


def _check_fifo(
    sends: Mapping[str, _Send],
    receives: Mapping[str, tuple[Channel, int, Any]],
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
    initial: Mapping[str, Any], at_node: Mapping[str, list[tuple[int, str, Event]]], snapshot_ids: Iterable[str],
    app: Part,
) -> tuple[cut.LogIndex, dict[tuple[Channel, str], int]]:
    """The trace as the nodes' logs (`cut.record` of the lines they would write), read into a `cut.LogIndex`
    by the app's `cut.Reading`, and each transfer's seq ((channel, msg) -> seq). `at_node`: each declared
    node's events sorted by position. A channel's sends get seqs 1..n in the sender's position
    order; a receive takes the seq of the send with its msg id on its channel (0
    when there is none: a receive the trace's own checks report, which still
    counts in the receiver's state); cuts stay cuts. Markers are left out: the
    marker rules are the trace's own (a trace may lack marker receipts, and it
    judges snapshots still open)."""
    seq_of: dict[tuple[Channel, str], int] = {}
    sent: dict[Channel, int] = {}
    for node in initial:
        for _, kind, event in at_node.get(node, ()):
            if kind == "send":
                channel = (node, event["dst"])
                seq_of[(channel, event["msg"])] = sent[channel] = sent.get(channel, 0) + 1
    # Each record is the line its node would log (the value where the app logs it), read as the rules read one.
    logs: dict[str, list[wal.Record]] = {}
    reading = app.reading()
    older = getattr(reading, "older", None)  # the app's decoder of an older format's lines, if it has one
    logged = app.logged

    def read(raw: dict) -> wal.Record:
        return cut.record(raw, older=older)

    content_key, state_key = app.content_key, app.state_key
    for node, state in initial.items():
        history = at_node.get(node, [])
        log = logs[node] = [read({"lsn": history[0][0] - 1 if history else 0, "kind": "init",
                                  **logged("init", state)})]
        add = log.append
        for pos, kind, event in history:
            if kind == "send":
                dst, msg = event["dst"], event["msg"]
                # A msg id sent twice on a channel: both take the later seq (the trace reports it).
                add(read({"lsn": pos, "kind": "send", "msg_id": msg, "src": node, "dst": dst,
                          "seq": seq_of[((node, dst), msg)], **logged("send", event[content_key])}))
            elif kind == "receive":
                src, msg = event["src"], event["msg"]
                add(read({"lsn": pos, "kind": "recv", "msg_id": msg, "src": src, "dst": node,
                          "seq": seq_of.get(((src, node), msg), 0), **logged("recv", event[content_key])}))
            elif kind == "cut":
                add(read({"lsn": pos, "kind": "cut", "snapshot_id": event["snapshot"],
                          **logged("cut", event[state_key])}))
    return cut.LogIndex.of(logs, snapshot_ids, reading=reading), seq_of


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
        initial: Mapping[str, Any],
        sends: Mapping[str, _Send],
        receives: Mapping[str, tuple[Channel, int, Any]],
        at_node: Mapping[str, list[tuple[int, str, Event]]],
        cuts: Mapping[tuple[str, str], tuple[int, Any]],
        markers_sent: Mapping[tuple[str, Channel], list[int]],
        markers_received: Mapping[tuple[str, Channel], int],
        recorded: Mapping[tuple[str, Channel], list[tuple[str, Any]]],
        completed: Mapping[tuple[str, str], int],
        app: Part,
    ) -> None:
        self.nodes, self.channels, self.channel_set = nodes, channels, set(channels)
        self.sends, self.receives, self.cuts = sends, receives, cuts
        self.markers_sent, self.markers_received, self.completed = markers_sent, markers_received, completed
        by_channel: dict[Channel, list[tuple[str, _Send]]] = defaultdict(list)
        for msg, send in sorted(sends.items(), key=lambda kv: kv[1].pos):
            by_channel[send.channel].append((msg, send))
        self.lines = {channel: _ChannelLine(sent) for channel, sent in by_channel.items()}
        self.recorded_by_sid: dict[str, list[tuple[Channel, list[tuple[str, Any]]]]] = defaultdict(list)
        for (sid, channel), items in recorded.items():
            self.recorded_by_sid[sid].append((channel, items))
        self.marker_channels_by_sid: dict[str, list[Channel]] = defaultdict(list)
        for sid, channel in markers_sent:
            self.marker_channels_by_sid[sid].append(channel)
        sids = {sid for sid, _ in cuts} | {sid for sid, _ in recorded}
        self.logs, self.seq_of = trace_logs(initial, at_node, sids, app)

    def cut_pos(self, sid: str, node: str) -> float:
        return self.cuts[(sid, node)][0] if (sid, node) in self.cuts else INFINITY


def _check_snapshot(sid: str, ix: _TraceIndex, app: Part, *, total: Any, require_complete: bool) -> list[str]:
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
        channels=[(src, dst, [(msg, content, ix.seq_of.get(((src, dst), msg), 0)) for msg, content in items])
                  for (src, dst), items in recorded.items()],
    )
    verdict = cut.check_snapshot(ix.logs, snap, topology=channels)
    p += _in_trace_words(sid, ix, verdict, recorded)

    # The app's whole-snapshot rules, once the whole snapshot is in.
    is_complete = all((sid, n) in cuts for n in nodes) and all(c in recorded for c in channels)
    if is_complete and (problem := app.whole_problem(sid, {q.rule for q in verdict.problems}, verdict.whole, total)):
        say(problem)
    return p


def _in_trace_words(
    sid: str, ix: _TraceIndex, verdict: cut.Verdict, recorded: Mapping[Channel, list[tuple[str, Any]]],
) -> list[str]:
    """The problems `cut.check_snapshot` found that the trace's rules name, in the
    trace's words; the rest are the trace's own checks' (FIFO, receives, liveness)."""
    p: list[str] = []
    say = p.append
    after_cut: dict[str, str] = {}  # msg -> its sender, recorded in flight though sent after the sender's cut
    for q in verdict.problems:
        rule, args = q.rule, q.args
        if rule == cut.STATE:
            node, said, expected = args
            say(f"snapshot {sid}: {node} recorded {said}, but its trace before the cut gives {expected}")
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
        want = [(msg, content) for msg, content, _ in expected]
        if items != want:
            say(f"snapshot {sid}: {_name((src, dst))} recorded {items}; sent before {src}'s cut and "
                f"received after {dst}'s cut: {want}")
    return p
