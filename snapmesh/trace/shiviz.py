"""A trace as a ShiViz log (the GoVector format the seed project used).

The file starts with the parser regex ShiViz asks for, then a blank line, then
two lines per event: `host {"host":n, "other":m}` and the event's text. Clocks
are JSON with zero entries left out; the host is always in its own clock.
"""

from __future__ import annotations

import json

import snapmesh.bank.logs as bank_logs  # the bank's reading of a line's figure
from snapmesh.trace.clocks import Event, Trace

SHIVIZ_REGEX = r"(?<host>\S*) (?<clock>{.*})\n(?<event>.*)"


def describe(event: Event) -> str:
    """One line saying what happened, for ShiViz's event text and the SVG's tooltips."""
    r = event.record
    kind = event.kind
    app = bank_logs.is_app_record(r)  # an app's record has no tally (wal.APP_MARKS): none said
    if kind == "send":
        amount = "" if app else f" {r.get('amount')}"
        return f"send{amount} to {r.get('dst')} msg_id={r.get('msg_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "recv":
        amount = "" if app else f" {r.get('amount')}"
        return f"recv{amount} from {r.get('src')} msg_id={r.get('msg_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "cut":
        tally = f"digest={r.get('digest')}" if app else f"balance={r.get('balance')}"
        return f"cut snapshot={r.get('snapshot_id')} {tally} lsn={event.lsn}"
    if kind == "marker_sent":
        return f"marker sent to {r.get('dst')} snapshot={r.get('snapshot_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "marker_recv":
        return f"marker received from {r.get('src')} snapshot={r.get('snapshot_id')} seq={r.get('seq')} lsn={event.lsn}"
    if kind == "restore":
        tally = "" if app else f" balance={r.get('balance')}"
        return f"restore snapshot={r.get('snapshot_id')} epoch={r.get('epoch')}{tally} lsn={event.lsn}"
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
