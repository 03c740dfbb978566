"""A trace -> a space-time diagram's geometry (pure; svg.py turns it into SVG).

One horizontal line per node, time to the right. x is Lamport time, so every
arrow points right (a receive is always later than its send) and concurrent
events share columns, which keeps a few hundred events across 4-8 nodes
readable. A window [start, end] of Lamport time is drawn; arrows with an end
outside it are drawn to the edge (the SVG clips them).

Each snapshot's cut is a polyline through its nodes' cut events, top to bottom.
The chosen snapshot's cut is drawn in its own colour and its in-flight
transfers (sent before the sender's cut, received after the receiver's) are
highlighted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from snapmesh.trace.clocks import Event, Message, Trace

LEFT, RIGHT, TOP, LANE_GAP, BOTTOM = 90, 40, 70, 72, 90
MIN_STEP_PX, MAX_STEP_PX, TARGET_WIDTH_PX = 5.0, 40.0, 1500.0
MIN_WIDTH = 1150  # room for the legend
PADDING_STEPS = 8  # Lamport steps shown either side of a snapshot's cuts by default


class LayoutError(ValueError):
    """A bad window or snapshot id; the message says which and what there is."""


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Arrow:
    message: Message
    start: Point
    end: Point
    style: str  # "transfer", "marker" or "in_flight"


@dataclass(frozen=True, kw_only=True, slots=True)
class Dot:
    event: Event
    at: Point


@dataclass(frozen=True, kw_only=True, slots=True)
class CutLine:
    snapshot_id: str
    points: tuple[Point, ...]  # one per node that cut, top lane first
    chosen: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    width: float
    height: float
    plot_right: float  # x of the window's end
    start: int  # the window, in Lamport time
    end: int
    lanes: dict[str, float]  # node -> y
    dots: tuple[Dot, ...]
    arrows: tuple[Arrow, ...]
    cuts: tuple[CutLine, ...]
    chosen: str | None

    @property
    def plot_left(self) -> float:
        return LEFT


def natural_key(name: str) -> list:
    """p2 before p10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def busiest_snapshot(trace: Trace) -> str | None:
    """The default chosen snapshot: the one with the most in-flight transfers (the first on a tie)."""
    ids = trace.snapshot_ids()
    if not ids:
        return None
    return max(ids, key=lambda s: (len(trace.in_flight(s)), -ids.index(s)))


def default_window(trace: Trace, chosen: str | None) -> tuple[int, int]:
    """Around the chosen snapshot's cuts and markers; the whole run when nothing is chosen."""
    last = max((e.time for e in trace.events), default=1)
    if chosen is None:
        return 1, last
    times = [e.time for e in trace.cuts(chosen).values()]
    for message in trace.messages:
        if message.kind == "marker" and message.snapshot_id == chosen:
            times.append(trace.events[message.send].time)
            if message.recv is not None:
                times.append(trace.events[message.recv].time)
    return max(1, min(times) - PADDING_STEPS), min(last, max(times) + PADDING_STEPS)


def layout(trace: Trace, *, window: tuple[int, int] | None = None, chosen: str | None = None) -> Layout:
    if chosen is not None and chosen not in trace.snapshot_ids():
        known = ", ".join(trace.snapshot_ids()) or "none"
        raise LayoutError(f"no cut for snapshot {chosen!r} in the logs (snapshots: {known})")
    start, end = window if window is not None else default_window(trace, chosen)
    if start > end:
        raise LayoutError(f"window {start}:{end} is empty (start after end)")
    last = max((e.time for e in trace.events), default=1)
    if start > last:
        raise LayoutError(f"window {start}:{end} starts after the last event (Lamport time {last})")
    end = min(end, last)  # no empty stretch after the run
    span = max(1, end - start)
    step = min(MAX_STEP_PX, max(MIN_STEP_PX, TARGET_WIDTH_PX / span))
    width = max(MIN_WIDTH, LEFT + span * step + RIGHT)
    nodes = sorted(trace.nodes, key=natural_key)
    lanes = {node: TOP + index * LANE_GAP for index, node in enumerate(nodes)}
    height = TOP + (len(nodes) - 1) * LANE_GAP + BOTTOM

    def at(event: Event) -> Point:
        return Point(LEFT + (event.time - start) * step, lanes[event.node])

    def inside(event: Event) -> bool:
        return start <= event.time <= end

    dots = tuple(Dot(event=e, at=at(e)) for e in trace.events if inside(e))
    highlighted = {m.send for m in trace.in_flight(chosen)} if chosen is not None else set()
    arrows = []
    for message in trace.messages:
        if message.recv is None:
            continue
        sent, received = trace.events[message.send], trace.events[message.recv]
        if received.time < start or sent.time > end:
            continue  # wholly outside the window
        if message.kind == "marker":
            style = "marker"
        else:
            style = "in_flight" if message.send in highlighted else "transfer"
        arrows.append(Arrow(message=message, start=at(sent), end=at(received), style=style))
    # Highlighted arrows last, so they are drawn on top.
    arrows.sort(key=lambda a: {"transfer": 0, "marker": 1, "in_flight": 2}[a.style])

    cuts = []
    for snapshot_id in trace.snapshot_ids():
        events = trace.cuts(snapshot_id)
        times = [e.time for e in events.values()]
        if max(times) < start or min(times) > end:
            continue
        points = tuple(at(events[n]) for n in nodes if n in events)
        cuts.append(CutLine(snapshot_id=snapshot_id, points=points, chosen=snapshot_id == chosen))
    cuts.sort(key=lambda c: c.chosen)  # the chosen one on top
    return Layout(width=width, height=height, plot_right=LEFT + span * step, start=start, end=end, lanes=lanes, dots=dots,
                  arrows=tuple(arrows), cuts=tuple(cuts), chosen=chosen)
