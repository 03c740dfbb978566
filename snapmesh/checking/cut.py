"""Is a snapshot a consistent cut of what the logs say happened? The one definition.

Pure: records from `snapmesh.protocol.wal` in, problems out; no file, clock or
network (callers read the files). The real-log checker (`logcheck.check_logs`), the
plain-Python reconciler (`snapmesh.reconcile.baseline`, and through it the rows the
Spark job must match), the fault fuzzer's judge (`snapmesh.sim.invariants`), the
trace checker (`trace.check_trace`, the simulator's, over the trace read as logs)
and an app campaign's checks (`snapmesh.chaos.appchecks`) all ask `check_snapshot`;
each words the problems its own way. docs/reconcile.md, "The rules", lists the
rules with the name each has here.

What a message holds and what a node's state is are the app's: a `Reading` says.
A message's recorded content is compared with the content its send record holds as
an opaque value, and a node's recorded state with the state the logs give at its
cut. `Payloads` is an app's reading (snapmesh.app): a message's payload as logged,
a node's state the digest its cut record holds. The bank's
(`snapmesh.bank.cut.Reading`) replays its log to the cut and adds its own
rules, conservation among them; none of its arithmetic is here.

`LogIndex` reads every node's records once, in lsn order (`add` one at a time, for a
reader that streams, or `LogIndex.of(logs)`): per node and per channel end,
(records, highest seq, highest transfer seq) before every `cut`; per channel the
send records by seq; the markers. `check_snapshot(index, snapshot)` then costs about
the snapshot's size.

With per-channel seqs over FIFO channels, "the sends j logged before its cut minus
the receives i logged before its cut" is the sends with seq in (b, a]: a the highest
transfer seq j sent before its cut, b the highest i received before its cut. The
prefix rules (each end's seqs before its cut are 1..n) are what make the two the same.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from snapmesh.protocol import wal

Channel = tuple[str, str]
Transfer = tuple[str, Any, int]  # (msg_id, content as the reading reads it, seq)

# The rules, by the problem each reports (the order of docs/reconcile.md "The rules").
# A reading adds its own rules (the bank's: snapmesh/bank/cut.py's RULES).
MISSING_NODE = "MISSING_NODE"  # a node the logs show is not in the snapshot
UNKNOWN_NODE = "UNKNOWN_NODE"  # a node in the snapshot has no log
NODE_LISTED_TWICE = "NODE_LISTED_TWICE"
NO_CUT = "NO_CUT"  # a node of the logs has no `cut` record for the snapshot
MANY_CUTS = "MANY_CUTS"
MISSING_CHANNEL = "MISSING_CHANNEL"  # a channel (of the logs, or the topology) is not in the snapshot
UNKNOWN_CHANNEL = "UNKNOWN_CHANNEL"  # only against a topology: a recorded channel outside it
CHANNEL_LISTED_TWICE = "CHANNEL_LISTED_TWICE"
STATE = "STATE"  # recorded state != the state the logs give at the cut
SENDER_NOT_PREFIX = "SENDER_NOT_PREFIX"  # the sender's seqs before its cut are not 1..n
RECEIVER_NOT_PREFIX = "RECEIVER_NOT_PREFIX"
ORPHAN_RECEIPT = "ORPHAN_RECEIPT"  # received before the receiver's cut, sent after the sender's
MISSING_IN_FLIGHT = "MISSING_IN_FLIGHT"  # sent before the sender's cut, not received before the receiver's
IN_FLIGHT_NEVER_SENT = "IN_FLIGHT_NEVER_SENT"
IN_FLIGHT_OTHER_CHANNEL = "IN_FLIGHT_OTHER_CHANNEL"
IN_FLIGHT_AFTER_CUT = "IN_FLIGHT_AFTER_CUT"  # nothing sent after a cut appears in the snapshot
IN_FLIGHT_RECEIVED = "IN_FLIGHT_RECEIVED"
UNEXPECTED_IN_FLIGHT = "UNEXPECTED_IN_FLIGHT"
IN_FLIGHT_LISTED_TWICE = "IN_FLIGHT_LISTED_TWICE"
IN_FLIGHT_CONTENT = "IN_FLIGHT_CONTENT"  # recorded content != the send record's
IN_FLIGHT_SEQ = "IN_FLIGHT_SEQ"
IN_FLIGHT_ORDER = "IN_FLIGHT_ORDER"
MARKERS = "MARKERS"  # only with markers=True: not one marker out and one in per channel
MARKER_BEFORE_CUT = "MARKER_BEFORE_CUT"  # only with markers=True

NODE_RULES = (MISSING_NODE, UNKNOWN_NODE, NODE_LISTED_TWICE, NO_CUT, MANY_CUTS, STATE)
IN_FLIGHT_RULES = (
    MISSING_IN_FLIGHT, IN_FLIGHT_NEVER_SENT, IN_FLIGHT_OTHER_CHANNEL, IN_FLIGHT_AFTER_CUT, IN_FLIGHT_RECEIVED,
    UNEXPECTED_IN_FLIGHT, IN_FLIGHT_LISTED_TWICE, IN_FLIGHT_CONTENT, IN_FLIGHT_SEQ, IN_FLIGHT_ORDER,
)


# The kinds the rules read, and their fields (the required ones of `wal.SPEC`).
READ_KINDS = ("init", "send", "recv", "cut", "marker_sent", "marker_recv", "restore", "replay")
_READ_FIELDS = {
    kind: tuple((key, attr, typ) for (key, typ, required), attr in zip(wal.SPEC[kind], wal.ATTRS[kind], strict=True)
                if required)
    for kind in READ_KINDS
}
# What `Payloads` reads besides, and a receipt's payload (the synthetic app logs write it back).
_OPTIONAL_READ = {"send": ("payload",), "recv": ("payload",), "cut": ("digest",)}


def record(raw: Mapping[str, Any], node: str | None = None,
           older: Callable[[wal.Record, str], wal.Record] | None = None) -> wal.Record:
    """A log line its reader already parsed and checked (a dict) as the `wal` record
    the rules read; a kind they do not read (abort, restart, checkpoint, ...) as
    `wal.Unknown`, whatever its fields. With `node` (whose log it is), a line may
    leave out its own end of the channel (`src` of a send, `dst` of a receipt). A line
    without its kind's mark (wal.APP_MARKS) is of an older format: `wal.Older`, or
    what `older` (its app's reading's decoder: record, where) makes of it."""
    kind = raw["kind"]
    fields = _READ_FIELDS.get(kind)
    if fields is None:
        return wal.Unknown(lsn=raw["lsn"], kind=kind)
    own = {"src": node} if kind in ("send", "marker_sent") else {"dst": node} if kind in ("recv", "marker_recv") else {}
    mark = wal.APP_MARKS.get(kind)
    if mark is not None and mark not in raw:
        kept = {**own, **{key: value for key, value in raw.items() if key not in ("node", "lsn", "kind")}}
        found = wal.Older(lsn=raw["lsn"], kind=kind, fields=kept)
        return found if older is None else older(found, f"{raw.get('node', node)} lsn {raw['lsn']}")
    values = {attr: raw[key] if key in raw else own[key] for key, attr, _ in fields}
    for name in _OPTIONAL_READ.get(kind, ()):
        if name in raw:
            values[name] = raw[name]
    return wal.BY_KIND[kind](lsn=raw["lsn"], **values)


class Problem(NamedTuple):
    """One broken rule: `rule` (a name above, or the reading's) and the values its
    message shows, in the order of `snapmesh.reconcile.messages` (the first is the
    node or the src)."""

    rule: str
    args: tuple


@dataclass(frozen=True, slots=True)
class CutState:
    """A node at one of its `cut` records: the record's lsn, the record, and per
    ("out", dst) / ("in", src) the (records, highest seq, highest transfer seq)
    before it."""

    lsn: int
    record: wal.Cut
    links: Mapping[tuple[str, str], tuple[int, int, int]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a snapshot recorded, as listed (a node or channel may be listed twice)."""

    snapshot_id: str
    nodes: Sequence[tuple[str, Any]]  # (node, recorded state as the reading reads it)
    channels: Sequence[tuple[str, str, Sequence[Transfer]]]  # (src, dst, in flight in the listed order)
    claims: Mapping[str, Any] = field(default_factory=dict)  # what the snapshot says of itself (the reading's rules)


@dataclass(slots=True)
class Verdict:
    """`check_snapshot`'s answer: the problems (rule order, not yet sorted), per
    channel with both cuts the in-flight messages the logs give, in seq order, and
    what the reading's whole-snapshot rules worked out (the bank's: its totals)."""

    snapshot_id: str
    problems: list[Problem] = field(default_factory=list)
    expected: dict[Channel, list[Transfer]] = field(default_factory=dict)
    whole: Any = None

    @property
    def consistent(self) -> bool:
        return not self.problems


class Reading(Protocol):
    """What an app's messages and states are, for the rules. Problems it finds are
    (rule, args) pairs, worded by `snapmesh.reconcile.messages` like the rules here."""

    node_rules: tuple[str, ...]  # its rules about one node (args[0] the node)

    def content(self, send: wal.Send) -> Any:
        """The content a send record logged, compared with the recorded one as it is."""

    def said(self, cut: wal.Cut) -> Any:
        """What a cut record says of the node's state (and orders two cuts at one lsn)."""

    def state(self, node: str, cut: CutState) -> Any:
        """The node's state the logs give at `cut`, compared with the recorded one as it is."""

    def feed(self, node: str, records: Sequence[wal.Record]) -> None:
        """`node`'s records (in lsn order, after those fed before), read once more, as the reading needs."""

    def check_node(self, node: str, cut: CutState) -> Iterable[tuple[str, tuple]]:
        """More rules on one node at its cut."""

    def check_whole(self, snap: Snapshot, verdict: Verdict) -> tuple[Any, Iterable[tuple[str, tuple]]]:
        """More rules on the whole snapshot: (what it worked out, the problems)."""

    def opening(self, restore: wal.Restore) -> wal.Record:
        """The first record of the epoch `restore` starts (`epoch_logs`)."""

    def replayed(self, opening: wal.Record, replay: wal.Replay) -> wal.Record:
        """That first record with one `replay` after the restore folded in."""


class Payloads:
    """An app's reading (snapmesh.app): a message's content is its payload as logged
    (base64), a node's state the digest its cut record holds (of the app's snapshot()
    bytes, in the form snapmesh/protocol/statedigest.py SD3/SD4 gives). Record a snapshot's in-flight payloads as `wal.pack`
    gives them and each node's state as that digest of its bytes."""

    node_rules: tuple[str, ...] = ()

    def content(self, send: wal.Send) -> str:
        return send.payload

    def said(self, cut: wal.Cut) -> str:
        return cut.digest

    def state(self, node: str, cut: CutState) -> str:
        return cut.record.digest

    def feed(self, node: str, records: Sequence[wal.Record]) -> None:
        pass

    def check_node(self, node: str, cut: CutState) -> Iterable[tuple[str, tuple]]:
        return ()

    def check_whole(self, snap: Snapshot, verdict: Verdict) -> tuple[Any, Iterable[tuple[str, tuple]]]:
        return None, ()

    def opening(self, restore: wal.Restore) -> wal.Record:
        return restore  # the rules read no restore record; an app's state is in it

    def replayed(self, opening: wal.Record, replay: wal.Replay) -> wal.Record:
        return opening


class LogIndex:
    """Every node's records read once (see the module docstring), and by `reading`
    too (`Reading.feed`: `of` hands it each node's records; a caller of `add` feeds
    it itself). `snapshot_ids`: keep cut states for these snapshots only (None: all)."""

    def __init__(self, snapshot_ids: Iterable[str] | None = None, *, reading: Reading) -> None:
        self.reading = reading
        self.wanted = None if snapshot_ids is None else set(snapshot_ids)
        self.nodes: dict[str, None] = {}  # in the order first seen
        self.cuts: dict[tuple[str, str], list[CutState]] = defaultdict(list)  # (sid, node) ->
        self.send_by_seq: dict[Channel, dict[int, wal.Send]] = defaultdict(dict)  # seq -> its send record
        self.first_send: dict[str, tuple[str, str, int]] = {}  # msg_id -> min (src, dst, seq)
        self.channels: set[Channel] = set()
        self.markers_sent: dict[tuple[str, Channel], list[int]] = defaultdict(list)  # -> lsns
        self.markers_recv: Counter[tuple[str, Channel]] = Counter()
        self._links: dict[str, dict[tuple[str, str], list[int]]] = defaultdict(dict)

    @classmethod
    def of(
        cls, logs: Mapping[str, Iterable[wal.Record]], snapshot_ids: Iterable[str] | None = None, *, reading: Reading,
    ) -> LogIndex:
        index = cls(snapshot_ids, reading=reading)
        for node, records in logs.items():
            records = records if isinstance(records, Sequence) else list(records)
            for record in records:
                index.add(node, record)
            reading.feed(node, records)
        return index

    def _link(self, node: str, key: tuple[str, str], seq: int, transfer: bool) -> None:
        link = self._links[node].get(key)
        if link is None:
            link = self._links[node][key] = [0, 0, 0]
        link[0] += 1
        link[1] = max(link[1], seq)
        if transfer:
            link[2] = max(link[2], seq)

    def add(self, node: str, r: wal.Record) -> None:
        """The next record of `node`'s log (each node's in lsn order)."""
        self.nodes.setdefault(node)
        kind = r.KIND  # a reading's own records of a kind (the bank's native ones) are its subclasses
        if kind == "send":
            channel = (r.src, r.dst)  # type: ignore[attr-defined]
            self._link(node, ("out", r.dst), r.seq, True)  # type: ignore[attr-defined]
            self.send_by_seq[channel][r.seq] = r  # type: ignore[assignment, attr-defined]
            sent = (r.src, r.dst, r.seq)  # type: ignore[attr-defined]
            first = self.first_send.get(r.msg_id)  # type: ignore[attr-defined]
            self.first_send[r.msg_id] = sent if first is None else min(first, sent)  # type: ignore[attr-defined]
            self.channels.add(channel)
        elif kind == "recv":
            self._link(node, ("in", r.src), r.seq, True)  # type: ignore[attr-defined]
            self.channels.add((r.src, r.dst))  # type: ignore[attr-defined]
        elif kind == "marker_sent":
            self._link(node, ("out", r.dst), r.seq, False)  # type: ignore[attr-defined]
            self.markers_sent[(r.snapshot_id, (r.src, r.dst))].append(r.lsn)  # type: ignore[attr-defined]
            self.channels.add((r.src, r.dst))  # type: ignore[attr-defined]
        elif kind == "marker_recv":
            self._link(node, ("in", r.src), r.seq, False)  # type: ignore[attr-defined]
            self.markers_recv[(r.snapshot_id, (r.src, r.dst))] += 1  # type: ignore[attr-defined]
            self.channels.add((r.src, r.dst))  # type: ignore[attr-defined]
        elif kind == "cut" and (self.wanted is None or r.snapshot_id in self.wanted):  # type: ignore[attr-defined]
            links = {key: (v[0], v[1], v[2]) for key, v in self._links[node].items()}
            self.cuts[(r.snapshot_id, node)].append(CutState(r.lsn, r, links))  # type: ignore[arg-type, attr-defined]

    def cut(self, sid: str, node: str) -> CutState | None:
        """The node's cut for `sid` (the first, when a log has several)."""
        states = self.cuts.get((sid, node))
        said = self.reading.said
        return min(states, key=lambda c: (c.lsn, said(c.record))) if states else None


def epoch_logs(logs: Mapping[str, Sequence[wal.Record]], epoch: int, reading: Reading) -> dict[str, list[wal.Record]]:
    """Each node's log in `epoch`, as a run of its own: epoch 1 up to the first
    `restore`; epoch E from the last `restore` record of E, which becomes the
    reading's opening record with the replays after it folded in (seqs start over)."""
    out: dict[str, list[wal.Record]] = {}
    for node, records in logs.items():
        current: list[wal.Record] | None = None
        if epoch == 1:
            current = out[node] = []
        for r in records:
            if r.KIND == "restore":
                current = [reading.opening(r)] if r.epoch == epoch else None
                if current is not None:
                    out[node] = current  # a restore redone after a crash replaces the cut-short one
            elif current is None:
                continue
            elif r.KIND == "replay":
                current[0] = reading.replayed(current[0], r)
            else:
                current.append(r)
    return out


def check_snapshot(
    index: LogIndex,
    snap: Snapshot,
    *,
    topology: Iterable[Channel] | None = None,
    markers: bool = False,
) -> Verdict:
    """Every rule on one snapshot, and the index's reading's. `topology`: the
    channels there are (default: the ones the logs show; given, a recorded channel
    outside it is UNKNOWN_CHANNEL). `markers`: also one marker out and one in per
    channel, sent after the sender's cut (the Spark job does not read markers, so
    the reconcilers leave it off)."""
    sid, reading = snap.snapshot_id, index.reading
    verdict = Verdict(sid)
    say = verdict.problems.append
    listed: dict[str, list[Any]] = defaultdict(list)
    for node, state in snap.nodes:
        listed[node].append(state)
    for node in sorted(set(index.nodes) | set(listed)):
        in_logs, states, cut = node in index.nodes, listed.get(node), index.cut(sid, node)
        if in_logs and not states:
            say(Problem(MISSING_NODE, (node,)))
        if not in_logs:
            say(Problem(UNKNOWN_NODE, (node,)))
        if states and len(states) > 1:
            say(Problem(NODE_LISTED_TWICE, (node, len(states))))
        if in_logs and cut is None:
            say(Problem(NO_CUT, (node,)))
        if cut is not None and len(index.cuts[(sid, node)]) > 1:
            say(Problem(MANY_CUTS, (node, len(index.cuts[(sid, node)]))))
        if cut is not None:
            logged = reading.state(node, cut)
            if states and min(states) != logged:
                say(Problem(STATE, (node, min(states), logged)))
            for rule, args in reading.check_node(node, cut):
                say(Problem(rule, args))

    by_channel: dict[Channel, list[Sequence[Transfer]]] = defaultdict(list)
    for src, dst, items in snap.channels:
        by_channel[(src, dst)].append(items)
    channels = set(index.channels) if topology is None else set(topology)
    for src, dst in sorted(channels | set(by_channel)):
        _check_channel(index, sid, src, dst, channels, by_channel.get((src, dst), []), topology is not None,
                       verdict)
    if markers:
        for src, dst in sorted(channels):
            _check_markers(index, sid, src, dst, say)

    verdict.whole, found = reading.check_whole(snap, verdict)
    for rule, args in found:
        say(Problem(rule, args))
    return verdict


def _check_channel(
    index: LogIndex, sid: str, src: str, dst: str, channels: set[Channel], entries: list[Sequence[Transfer]],
    strict: bool, verdict: Verdict,
) -> None:
    say = verdict.problems.append
    if (src, dst) in channels and not entries:
        say(Problem(MISSING_CHANNEL, (src, dst)))
    if strict and (src, dst) not in channels:
        say(Problem(UNKNOWN_CHANNEL, (src, dst)))
    if len(entries) > 1:
        say(Problem(CHANNEL_LISTED_TWICE, (src, dst, len(entries))))
    for items in entries:
        seqs = [seq for _, _, seq in items]
        if seqs != sorted(seqs):
            say(Problem(IN_FLIGHT_ORDER, (src, dst)))
            break
    recorded: dict[str, list[tuple[Any, int]]] = defaultdict(list)
    for items in entries:
        for msg_id, content, seq in items:
            recorded[msg_id].append((content, seq))
    sender, receiver = index.cut(sid, src), index.cut(sid, dst)
    expected: dict[str, tuple[Any, int]] = {}
    a = b = None
    if sender is not None and receiver is not None:
        sent_n, sent_top, a = sender.links.get(("out", dst), (0, 0, 0))
        got_n, got_top, b = receiver.links.get(("in", src), (0, 0, 0))
        if sent_n != sent_top:
            say(Problem(SENDER_NOT_PREFIX, (src, dst, src, sent_n, sent_top)))
        if got_n != got_top:
            say(Problem(RECEIVER_NOT_PREFIX, (src, dst, dst, got_n, got_top)))
        if b > a:
            say(Problem(ORPHAN_RECEIPT, (src, dst, dst, b, src, a)))
        by_seq, content = index.send_by_seq.get((src, dst), {}), index.reading.content
        for seq in range(b + 1, a + 1):
            send = by_seq.get(seq)
            if send is not None:
                expected[send.msg_id] = (content(send), seq)
        verdict.expected[(src, dst)] = [(m, logged, seq) for m, (logged, seq) in expected.items()]
    for msg_id, (logged, seq) in expected.items():
        got = recorded.get(msg_id)
        if not got:
            say(Problem(MISSING_IN_FLIGHT, (src, dst, msg_id)))
            continue
        rec_content, rec_seq = min(x[0] for x in got), min(x[1] for x in got)
        if rec_content != logged:
            say(Problem(IN_FLIGHT_CONTENT, (src, dst, msg_id, rec_content, logged)))
        if rec_seq != seq:
            say(Problem(IN_FLIGHT_SEQ, (src, dst, msg_id, rec_seq, seq)))
    for msg_id, got in recorded.items():
        if len(got) > 1:
            say(Problem(IN_FLIGHT_LISTED_TWICE, (src, dst, msg_id, len(got))))
        if msg_id in expected:
            continue
        sent = index.first_send.get(msg_id)
        if sent is None:
            say(Problem(IN_FLIGHT_NEVER_SENT, (src, dst, msg_id)))
        elif (sent[0], sent[1]) != (src, dst):
            say(Problem(IN_FLIGHT_OTHER_CHANNEL, (src, dst, msg_id, sent[0], sent[1])))
        elif a is not None and sent[2] > a:
            say(Problem(IN_FLIGHT_AFTER_CUT, (src, dst, msg_id, src)))
        elif b is not None and sent[2] <= b:
            say(Problem(IN_FLIGHT_RECEIVED, (src, dst, msg_id, dst)))
        else:
            say(Problem(UNEXPECTED_IN_FLIGHT, (src, dst, msg_id)))


def _check_markers(index: LogIndex, sid: str, src: str, dst: str, say) -> None:  # noqa: ANN001
    sent = index.markers_sent.get((sid, (src, dst)), [])
    got = index.markers_recv.get((sid, (src, dst)), 0)
    sender = index.cut(sid, src)
    if len(sent) != 1 or got != 1:
        say(Problem(MARKERS, (src, dst, len(sent), got)))
    elif sender is not None and sent[0] < sender.lsn:
        say(Problem(MARKER_BEFORE_CUT, (src, dst, src)))
