"""What the snapshot page shows, computed from the controller's snapshots (pure).

No I/O here: snapshots (`pb.Snapshot`), the topology, node log records and `now`
(seconds since the epoch) come in as arguments, so every figure is testable
without a server.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from snapmesh.checking.snapshots import duration_s
from snapmesh.protocol.appstate import carries_v1
from snapmesh.settings.appsettings import app_words
from snapmesh.v1 import snapmesh_pb2 as pb

COMPLETE, FAILED, IN_PROGRESS = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED, pb.Snapshot.IN_PROGRESS


def status_name(snapshot: pb.Snapshot) -> str:
    return pb.Snapshot.Status.Name(snapshot.status)


def started_s(snapshot: pb.Snapshot) -> float:
    return snapshot.started_at.ToNanoseconds() / 1e9 if snapshot.HasField("started_at") else 0.0


def newest_first(snapshots: Iterable[pb.Snapshot]) -> list[pb.Snapshot]:
    return sorted(snapshots, key=lambda s: (started_s(s), s.snapshot_id), reverse=True)


# ------------------------------------------------------------------ overview


@dataclass(frozen=True, slots=True)
class Overview:
    counts: dict[str, int]  # COMPLETE, FAILED, IN_PROGRESS
    latest_complete: pb.Snapshot | None
    latest_failed: pb.Snapshot | None
    epoch: int  # the highest epoch seen (snapshots, nodes)


def overview(snapshots: Sequence[pb.Snapshot], node_epochs: Mapping[str, int | None] = {}) -> Overview:  # noqa: B006
    ordered = newest_first(snapshots)
    counts = {name: 0 for name in ("COMPLETE", "FAILED", "IN_PROGRESS")}
    for s in snapshots:
        counts[status_name(s)] = counts.get(status_name(s), 0) + 1
    epochs = [s.epoch for s in snapshots] + [e for e in node_epochs.values() if e]
    return Overview(
        counts=counts,
        latest_complete=next((s for s in ordered if s.status == COMPLETE), None),
        latest_failed=next((s for s in ordered if s.status == FAILED), None),
        epoch=max(epochs, default=0),
    )


# ------------------------------------------------------------------ summary


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Summary:
    count: int  # COMPLETE snapshots among the last n
    last_n: int
    duration_ms: dict[str, float | None]  # p50, p99, max
    state_size_bytes: dict[str, float | None]


def summary(snapshots: Sequence[pb.Snapshot], last_n: int) -> Summary:
    """Flink's checkpoint summary: p50, p99 and max of end-to-end duration and state
    size over the COMPLETE snapshots among the newest `last_n`."""
    recent = [s for s in newest_first(snapshots)[:last_n] if s.status == COMPLETE]

    def figures(values: list[float]) -> dict[str, float | None]:
        return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values, default=None)}

    return Summary(
        count=len(recent),
        last_n=last_n,
        duration_ms=figures([s.stats.end_to_end_duration_ms or duration_s(s) * 1000 for s in recent]),
        state_size_bytes=figures([float(s.stats.state_size_bytes) for s in recent]),
    )


# ------------------------------------------------------------------ history


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[pb.Snapshot]
    number: int  # 1-based
    pages: int
    total: int


def history(snapshots: Sequence[pb.Snapshot], page: int, per_page: int) -> Page:
    ordered = newest_first(snapshots)
    pages = max(1, math.ceil(len(ordered) / per_page))
    number = min(max(1, page), pages)
    start = (number - 1) * per_page
    return Page(rows=ordered[start : start + per_page], number=number, pages=pages, total=len(ordered))


def age_ms(snapshot: pb.Snapshot, now: float) -> float:
    """Duration of a finished snapshot; age of one in progress."""
    if snapshot.HasField("finished_at"):
        return duration_s(snapshot) * 1000
    return max(0.0, now - started_s(snapshot)) * 1000 if snapshot.HasField("started_at") else 0.0


# ------------------------------------------------------------------ one snapshot


@dataclass(frozen=True, slots=True)
class Transfer:
    src: str
    dst: str
    amount: int
    seq: int
    msg_id: str


def in_flight(snapshot: pb.Snapshot) -> list[Transfer]:
    return [Transfer(src=c.src, dst=c.dst, amount=t.amount, seq=t.seq, msg_id=t.msg_id)
            for c in snapshot.channels for t in c.in_flight]


@dataclass(frozen=True, slots=True)
class Conservation:
    balances: int
    in_flight: int
    total: int
    expected: int
    conserved: bool

    @property
    def line(self) -> str:
        verdict = "CONSERVED" if self.conserved else "VIOLATED"
        return (f"balances {self.balances} + in flight {self.in_flight} = total {self.total}; "
                f"expected {self.expected}: {verdict}")


def conservation(snapshot: pb.Snapshot) -> Conservation:
    balances = sum(n.balance for n in snapshot.nodes)
    moving = sum(t.amount for t in in_flight(snapshot))
    return Conservation(balances=balances, in_flight=moving, total=balances + moving,
                        expected=snapshot.expected_total, conserved=balances + moving == snapshot.expected_total)


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    balance: int | None  # None: not reported (yet)
    start_delay_ms: float | None  # this and the rest None: no figures from this node (yet)
    recording_ms: float | None
    report_ms: float | None
    in_flight_messages: int | None
    in_flight_bytes: int | None


def node_rows(snapshot: pb.Snapshot, node_ids: Sequence[str]) -> list[NodeRow]:
    balances = {n.node_id: n.balance for n in snapshot.nodes}
    stats = {n.node_id: n for n in snapshot.stats.nodes}
    ids = list(node_ids) + sorted(set(balances) - set(node_ids))
    rows = []
    for node in ids:
        n = stats.get(node)
        if n is None:  # not reported: no figures, rather than zeros that read as "instant"
            rows.append(NodeRow(node, balances.get(node), None, None, None, None, None))
            continue
        rows.append(NodeRow(node_id=node, balance=balances.get(node), start_delay_ms=n.start_delay_ms,
                            recording_ms=n.recording_duration_ms, report_ms=n.report_time_ms,
                            in_flight_messages=n.in_flight_messages, in_flight_bytes=n.in_flight_bytes))
    return rows


# ------------------------------------------------------------------ where is it stuck?


@dataclass(frozen=True, slots=True)
class Stuck:
    """Why a snapshot IN_PROGRESS is not done yet.

    `source` is "logs" (from the nodes' transfer logs: a `cut` record means the
    node recorded, a `marker_recv` record means that channel's marker arrived) or
    "controller" (no logs: the controller only knows which nodes reported; a node
    that has not reported may have recorded and wait for markers)."""

    source: str
    age_ms: float
    not_recorded: list[str]  # nodes that have not recorded (logs) / not reported (controller)
    open_channels: list[tuple[str, str]]  # (src, dst): the marker has not arrived at dst
    reported: list[str] = field(default_factory=list)


def stuck(
    snapshot: pb.Snapshot,
    node_ids: Sequence[str],
    channels: Sequence[tuple[str, str]],
    now: float,
    records: Mapping[str, Iterable[Mapping]] | None = None,
) -> Stuck:
    """The nodes that have not recorded yet and the channels still open, for a
    snapshot IN_PROGRESS. `records`: node id -> its log records (None: no logs;
    the controller's view is used)."""
    reported = sorted({n.node_id for n in snapshot.stats.nodes} | {n.node_id for n in snapshot.nodes})
    age = age_ms(snapshot, now)
    sid = snapshot.snapshot_id
    if records is None:
        waiting = [n for n in node_ids if n not in reported]
        return Stuck(source="controller", age_ms=age, not_recorded=waiting, reported=reported,
                     open_channels=[(src, dst) for src, dst in channels if dst in waiting])
    cut: set[str] = set()
    arrived: set[tuple[str, str]] = set()
    for node, node_records in records.items():
        for r in node_records:
            if r.get("snapshot_id") != sid:
                continue
            if r.get("kind") == "cut":
                cut.add(node)
            elif r.get("kind") == "marker_recv":
                arrived.add((r["src"], r["dst"]))
    not_recorded = [n for n in node_ids if n not in cut and n not in reported]
    open_channels = [(src, dst) for src, dst in channels if (src, dst) not in arrived and dst not in reported]
    return Stuck(source="logs", age_ms=age, not_recorded=not_recorded, open_channels=open_channels, reported=reported)


# ------------------------------------------------------------------ timeline


@dataclass(frozen=True, slots=True)
class Phase:
    node_id: str
    start_delay_ms: float
    recording_ms: float
    report_ms: float

    @property
    def end_ms(self) -> float:
        return self.start_delay_ms + self.recording_ms + self.report_ms


def phases(snapshot: pb.Snapshot) -> list[Phase]:
    """Per node: start delay (trigger to its cut), recording (cut to the last
    marker in), report (done to the controller accepting it)."""
    return [Phase(node_id=n.node_id, start_delay_ms=n.start_delay_ms, recording_ms=n.recording_duration_ms,
                  report_ms=n.report_time_ms) for n in snapshot.stats.nodes]


def strip(snapshots: Sequence[pb.Snapshot], last_n: int) -> list[pb.Snapshot]:
    """The newest `last_n` snapshots, oldest first (a timeline reads left to right)."""
    return list(reversed(newest_first(snapshots)[:last_n]))


TICKS = 4  # intervals on the timeline's axis (five labelled times)


@dataclass(frozen=True, slots=True)
class Bar:
    snapshot: pb.Snapshot
    left_pct: float  # where it starts on the axis, 0..100
    width_pct: float  # its duration on the axis (the page draws at least a sliver)
    duration_ms: float
    lane: int  # 0 = top row


@dataclass(frozen=True, slots=True)
class Timeline:
    start_s: float  # the axis, seconds since the epoch
    end_s: float
    bars: list[Bar]
    ticks: list[tuple[float, float]]  # (position 0..100, seconds since the epoch)
    lanes: int


def timeline(snapshots: Sequence[pb.Snapshot], last_n: int, now: float) -> Timeline:
    """The newest `last_n` snapshots on a time axis: each a bar from its start to its
    finish (to `now` while in progress), in the first lane where it overlaps no other,
    so concurrent snapshots sit one above the other instead of hiding each other."""
    recent = strip(snapshots, last_n)
    spans = [(s, started_s(s), started_s(s) + age_ms(s, now) / 1000) for s in recent if s.HasField("started_at")]
    if not spans:
        return Timeline(start_s=now, end_s=now, bars=[], ticks=[], lanes=0)
    start, end = min(a for _, a, _ in spans), max(b for _, _, b in spans)
    width = max(end - start, 1e-3)
    lane_ends: list[float] = []
    bars = []
    for s, a, b in spans:
        lane = next((i for i, last in enumerate(lane_ends) if last <= a), len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(b)
        lane_ends[lane] = b
        bars.append(Bar(snapshot=s, left_pct=100 * (a - start) / width, width_pct=100 * (b - a) / width,
                        duration_ms=(b - a) * 1000, lane=lane))
    ticks = [(100 * i / TICKS, start + width * i / TICKS) for i in range(TICKS + 1)]
    return Timeline(start_s=start, end_s=start + width, bars=bars, ticks=ticks, lanes=len(lane_ends))


# ------------------------------------------------------------------ the cluster


def configuration(cluster: pb.Cluster, epoch: int) -> list[tuple[str, str]]:
    """The controller's snapshot settings (GetCluster), in words, as Flink's
    checkpoint tab lists its configuration, the app the nodes run first. `epoch`:
    the page's, for a controller that does not send one."""
    epoch_text = str(cluster.epoch or epoch)
    if not cluster.HasField("settings"):  # a controller before 0.2.0 does not send them
        return [("settings", "not sent by this controller (it predates GetCluster's settings)"), ("epoch", epoch_text)]
    s = cluster.settings
    return [
        ("app", app_words(cluster.app, cluster.app_name, cluster.app_version)),  # what the nodes run, named as it names itself
        ("mode", s.snapshot_mode or "classic"),
        ("deadline", f"{s.deadline_s:g} s"),
        ("interval", f"every {s.interval_s:g} s" if s.interval_s else "none: only when triggered"),
        ("retention", f"the files of the newest {s.keep} COMPLETE" if s.keep else "every snapshot's file"),
        ("concurrency limit", f"{s.max_concurrent_snapshots} in progress" if s.max_concurrent_snapshots else "none"),
        ("epoch", epoch_text),
    ]


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    address: str
    reachable: bool  # it answered GetState just now
    epoch: int | None  # None: it did not answer
    last_report_s: float | None  # when the controller last accepted its report; None: never
    last_report_snapshot: str


def node_views(cluster: pb.Cluster, node_epochs: Mapping[str, int | None],
               snapshots: Iterable[pb.Snapshot]) -> list[NodeView]:
    last: dict[str, tuple[float, str]] = {}
    for s in snapshots:
        for n in s.stats.nodes:
            if n.HasField("ack_timestamp"):
                at = n.ack_timestamp.ToNanoseconds() / 1e9
                if at > last.get(n.node_id, (0.0, ""))[0]:
                    last[n.node_id] = (at, s.snapshot_id)
    views = []
    for n in cluster.nodes:
        epoch = node_epochs.get(n.node_id)
        at, sid = last.get(n.node_id, (None, ""))
        views.append(NodeView(node_id=n.node_id, address=n.address, reachable=epoch is not None, epoch=epoch,
                              last_report_s=at, last_report_snapshot=sid))
    return views


def neighbours(snapshots: Sequence[pb.Snapshot], snapshot_id: str) -> tuple[str | None, str | None]:
    """(the snapshot started just before `snapshot_id`, the one just after); None at either end."""
    ordered = [s.snapshot_id for s in reversed(newest_first(snapshots))]
    if snapshot_id not in ordered:
        return None, None
    at = ordered.index(snapshot_id)
    return (ordered[at - 1] if at > 0 else None), (ordered[at + 1] if at + 1 < len(ordered) else None)


def plural(count: int, noun: str) -> str:
    """"1 message", "2 messages", "0 messages"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def restore_command(snapshot: pb.Snapshot, controller: str, tls_dir: str | None) -> tuple[str, str]:
    """(the `snapmesh restore` line that rolls the cluster back to `snapshot`, why it
    would be refused: "" when it would not). The page only shows it: it changes nothing."""
    line = shlex.join(["snapmesh", "restore", "--controller", controller,
                       *(["--tls-dir", tls_dir] if tls_dir else []), snapshot.snapshot_id])
    if snapshot.status != COMPLETE:
        return line, f"only a COMPLETE snapshot can be restored; this one is {status_name(snapshot)}"
    failed = [r.name for r in snapshot.app.invariants if not r.ok]
    if failed:
        return line, f"the controller refuses it: invariant {', '.join(failed)} does not hold"
    if carries_v1(snapshot) and not snapshot.conserved:
        return line, "the controller refuses it: not conserved"
    return line, ""
