"""What the snapshot page shows, computed from the controller's snapshots (pure).

No I/O here: snapshots (`pb.Snapshot`), the topology, node log records and `now`
(seconds since the epoch) come in as arguments, so every figure is testable
without a server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from snapmesh.checking.snapshots import duration_s
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
