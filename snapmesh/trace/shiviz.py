"""A trace as a ShiViz log (the GoVector format the seed project used).

The file starts with the parser regex ShiViz asks for, then a blank line, then
two lines per event: `host {"host":n, "other":m}` and the event's text. Clocks
are JSON with zero entries left out; the host is always in its own clock.
"""

from __future__ import annotations

import json

from snapmesh.trace.clocks import Event, Trace

SHIVIZ_REGEX = r"(?<host>\S*) (?<clock>{.*})\n(?<event>.*)"


def describe(event: Event) -> str:
    """One line saying what happened, for ShiViz's event text and the SVG's tooltips."""
    r = event.record
    kind = event.kind
    if kind == "send":
        return f"send {r.get('amount')} to {r.get('dst')} msg_id={r.get('msg_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "recv":
        return f"recv {r.get('amount')} from {r.get('src')} msg_id={r.get('msg_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "cut":
        return f"cut snapshot={r.get('snapshot_id')} balance={r.get('balance')} lsn={event.lsn}"
    if kind == "marker_sent":
        return f"marker sent to {r.get('dst')} snapshot={r.get('snapshot_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "marker_recv":
        return f"marker received from {r.get('src')} snapshot={r.get('snapshot_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "restore":
        return f"restore snapshot={r.get('snapshot_id')} epoch={r.get('epoch')} balance={r.get('balance')} lsn={event.lsn}"
    return f"{kind} lsn={event.lsn}"


def render_shiviz(trace: Trace) -> str:
    lines = [SHIVIZ_REGEX, ""]
    for event in trace.events:
        clock = {node: tick for node, tick in event.clock.items() if tick}
        # ShiViz reads the host from the first field: no spaces in node ids there.
        host = event.node.replace(" ", "_")
        lines.append(f"{host} {json.dumps({k.replace(' ', '_'): v for k, v in clock.items()}, separators=(', ', ':'))}")
        lines.append(describe(event))
    return "\n".join(lines) + "\n"
