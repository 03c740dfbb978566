"""The snapshot page's HTML: server-rendered, no assets from anywhere else.

Every page is `layout(main)`: the style and one small script are inline (our own,
nothing fetched at run time). The script refreshes without a reload: every few
seconds it asks for the same URL with the header `X-Snapmesh-Partial: 1` and
puts the answer (the inside of `<main>` only) in place. The page is read-only: it
has no form, no button and no link that changes anything.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from html import escape
from urllib.parse import quote

from snapmesh.checking import described as described_
from snapmesh.protocol.appstate import carries_v1
from snapmesh.ui import model
from snapmesh.v1 import snapmesh_pb2 as pb

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:bold}
header .note{color:#b0bec5;font-size:12px;margin-left:auto}
main{padding:8px 16px}
section{background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px 12px;margin:10px 0}
h2{font-size:16px;margin:4px 0 8px}
table{border-collapse:collapse}
th,td{padding:2px 8px;text-align:left;border-bottom:1px solid #eee;white-space:nowrap}
td.num,th.num{text-align:right}
.COMPLETE{color:#1b5e20}.FAILED{color:#b71c1c}.IN_PROGRESS{color:#e65100}
.counts span{display:inline-block;margin-right:18px;font-size:18px}
.strip{position:relative;width:100%;min-width:480px;background:#f7f7f7;border-bottom:1px solid #999}
.strip a{position:absolute;display:block;height:16px;min-width:3px;border-radius:2px;opacity:.85}
.axis{position:relative;width:100%;min-width:480px;height:18px;font-size:11px;color:#555}
.axis span{position:absolute;transform:translateX(-50%);white-space:nowrap}
.axis span:first-child{transform:none}.axis span:last-child{transform:translateX(-100%)}
dl.config{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:0}
dl.config dt{color:#555}dl.config dd{margin:0;font-weight:bold}
.nav a,.nav span{margin-right:16px}
pre.command{background:#f1f1f1;padding:4px 8px;display:inline-block;margin:4px 0;user-select:all}
.unreachable{color:#b71c1c}
.strip a.COMPLETE{background:#43a047}.strip a.FAILED{background:#e53935}.strip a.IN_PROGRESS{background:#fb8c00}
.bar{display:flex;height:14px;width:480px;background:#f1f1f1}
.bar span{display:block;height:14px}
.p-delay{background:#90caf9}.p-record{background:#1e88e5}.p-report{background:#0d47a1}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
.error{border-color:#e53935;background:#ffebee}
.reason{white-space:normal;max-width:420px}
td.reason{min-width:200px}
#history th{white-space:normal;vertical-align:bottom}
section{overflow-x:auto}
.pager a,.pager b{margin-right:8px}
img.trace{max-width:100%;border:1px solid #ddd;background:#fff}
"""

SCRIPT = """
(function(){
  var main = document.getElementById('live'), note = document.getElementById('refreshed');
  var every = Number(main.getAttribute('data-refresh-ms')) || 2000;
  function tick(){
    fetch(location.href, {headers: {'X-Snapmesh-Partial': '1'}, cache: 'no-store'})
      .then(function(r){ return r.text().then(function(t){ return [r.status, t]; }); })
      .then(function(a){ main.innerHTML = a[1]; main.setAttribute('data-status', a[0]);
                         note.textContent = 'live: updated ' + new Date().toLocaleTimeString(); })
      .catch(function(e){ note.textContent = 'live: the page server does not answer (' + e + ')'; })
      .then(function(){ setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
"""


def layout(title: str, main: str, *, controller: str, status: int = 200, refresh_ms: int = 2000) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><a href='/'>snapmesh snapshots</a><span>controller {escape(controller)}</span>"
        "<span>read-only</span><span class='note' id='refreshed'>live</span></header>"
        f"<main id='live' data-status='{status}' data-refresh-ms='{refresh_ms}'>{main}</main>"
        f"<script>{SCRIPT}</script></body></html>"
    )


# ------------------------------------------------------------------ pieces


def when(ts) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    moment = dt.datetime.fromtimestamp(ts.ToNanoseconds() / 1e9, tz=dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def seconds_when(moment: float, clock_only: bool = False) -> str:
    """A time in seconds since the epoch, as `when` prints one (`clock_only`: HH:MM:SS.mmm)."""
    at = dt.datetime.fromtimestamp(moment, tz=dt.UTC)
    text = at.strftime("%H:%M:%S." if clock_only else "%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d}"
    return text if clock_only else text + "Z"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def size(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} B"


def dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def link(snapshot_id: str) -> str:
    return f"<a href='/snapshot/{quote(snapshot_id, safe='')}'>{escape(snapshot_id)}</a>"


def status(snapshot: pb.Snapshot) -> str:
    name = model.status_name(snapshot)
    return f"<span class='{name}'>{name}</span>"


def in_flight_totals(snapshot: pb.Snapshot) -> tuple[int, int]:
    """(messages, bytes): the controller's stats, or the channels when it has none."""
    if snapshot.stats.in_flight_messages:
        return snapshot.stats.in_flight_messages, snapshot.stats.in_flight_bytes
    return len(model.in_flight(snapshot)), snapshot.stats.in_flight_bytes


# ------------------------------------------------------------------ the index


def index(
    snapshots: Sequence[pb.Snapshot],
    *,
    cluster: pb.Cluster,
    node_epochs: dict[str, int | None],
    restore: pb.Restore | None,
    restore_note: str,
    page: int,
    per_page: int,
    last_n: int,
    now: float,
) -> str:
    o = model.overview(snapshots, node_epochs)
    parts = [_overview(o, node_epochs, restore, restore_note), _configuration(model.configuration(cluster, o.epoch)),
             _node_view(model.node_views(cluster, node_epochs, snapshots)), _summary(model.summary(snapshots, last_n)),
             _timeline(model.timeline(snapshots, last_n, now), last_n), _history(model.history(snapshots, page, per_page), now)]
    return "".join(parts)


def _configuration(rows: list[tuple[str, str]]) -> str:
    items = "".join(f"<dt>{escape(name)}</dt><dd data-setting='{escape(name)}'>{escape(value)}</dd>"
                    for name, value in rows)
    return f"<section id='configuration'><h2>Configuration</h2><dl class='config'>{items}</dl></section>"


def _node_view(views: list[model.NodeView]) -> str:
    rows = "".join(
        f"<tr data-node='{escape(v.node_id)}'><td>{escape(v.node_id)}</td><td>{escape(v.address)}</td>"
        + ("<td>yes</td>" if v.reachable else "<td class='unreachable'>no</td>")
        + f"<td class='num'>{dash(v.epoch)}</td>"
        + (f"<td>{seconds_when(v.last_report_s)} ({link(v.last_report_snapshot)})</td>" if v.last_report_s else "<td>never</td>")
        + "</tr>"
        for v in views
    )
    return ("<section id='node-view'><h2>Nodes</h2><table><tr><th>node</th><th>address</th><th>reachable</th>"
            f"<th class='num'>epoch</th><th>last report</th></tr>{rows}</table></section>")


def _overview(o: model.Overview, node_epochs, restore: pb.Restore | None, restore_note: str) -> str:
    counts = "".join(f"<span>{name}: <b class='{name}' id='count-{name}'>{n}</b></span>" for name, n in o.counts.items())
    silent = [n for n, e in node_epochs.items() if e is None]
    epoch = f"<b id='epoch'>{o.epoch}</b>" + (f" (not answering: {escape(', '.join(silent))})" if silent else "")
    if restore is not None:
        last = (f"snapshot {link(restore.snapshot_id)} into epoch {restore.epoch}: "
                f"{pb.Restore.Status.Name(restore.status)} at {when(restore.finished_at or restore.started_at)}"
                + (f" ({escape(restore.reason)})" if restore.reason else ""))
    else:
        last = escape(restore_note)
    lines = [
        f"<div class='counts'>{counts}</div>",
        f"<div>current epoch: {epoch}</div>",
        f"<div>last restore: <span id='last-restore'>{last}</span></div>",
    ]
    if o.latest_complete is not None:
        s = o.latest_complete
        verdict = (model.conservation(s).line if _figures(s) else
                   "invariants: " + ("; ".join(f"{n} {v}" for n, v in described_.verdicts(s)) or "none"))
        lines.append(f"<div id='latest-complete'>latest COMPLETE: {link(s.snapshot_id)} at {when(s.finished_at)}, "
                     f"{escape(verdict)}</div>")
    else:
        lines.append("<div id='latest-complete'>latest COMPLETE: none</div>")
    if o.latest_failed is not None:
        s = o.latest_failed
        lines.append(f"<div id='latest-failed'>latest FAILED: {link(s.snapshot_id)} at {when(s.finished_at)}: "
                     f"<span class='reason'>{escape(s.reason or '-')}</span></div>")
    else:
        lines.append("<div id='latest-failed'>latest FAILED: none</div>")
    return f"<section id='overview'><h2>Overview</h2>{''.join(lines)}</section>"


def _summary(s: model.Summary) -> str:
    rows = "".join(
        f"<tr><td>{label}</td>" + "".join(f"<td class='num'>{fmt(figures[k])}</td>" for k in ("p50", "p99", "max")) + "</tr>"
        for label, figures, fmt in (("end-to-end duration", s.duration_ms, ms), ("state size", s.state_size_bytes, size))
    )
    return (f"<section id='summary'><h2>Summary: the last {s.last_n} snapshots ({s.count} COMPLETE)</h2>"
            f"<table><tr><th></th><th class='num'>p50</th><th class='num'>p99</th><th class='num'>max</th></tr>{rows}"
            "</table></section>")


LANE_PX = 20  # one row of the timeline: a bar and its gap


def _timeline(t: model.Timeline, last_n: int) -> str:
    # Each bar spans its snapshot's start to its finish on one time axis; snapshots
    # that overlap take the next row down.
    boxes = "".join(
        f"<a class='{model.status_name(b.snapshot)}' href='/snapshot/{quote(b.snapshot.snapshot_id, safe='')}' "
        f"data-snapshot-id='{escape(b.snapshot.snapshot_id)}' data-duration-ms='{b.duration_ms:.1f}' "
        f"style='left:{b.left_pct:.3f}%;width:{b.width_pct:.3f}%;top:{b.lane * LANE_PX + 2}px' "
        f"title='{escape(b.snapshot.snapshot_id)} {model.status_name(b.snapshot)} {ms(b.duration_ms)}'></a>"
        for b in t.bars
    )
    if not boxes:
        return f"<section id='timeline'><h2>Timeline: the last {last_n}</h2>no snapshots yet</section>"
    ticks = "".join(f"<span style='left:{at:.3f}%'>{seconds_when(moment, clock_only=True)}</span>" for at, moment in t.ticks)
    span = (t.end_s - t.start_s) * 1000
    return (f"<section id='timeline'><h2>Timeline: the last {last_n} on a time axis of {ms(span)} (UTC)</h2>"
            f"<div class='strip' style='height:{t.lanes * LANE_PX + 2}px'>{boxes}</div>"
            f"<div class='axis'>{ticks}</div></section>")


def _history(p: model.Page, now: float) -> str:
    # Numbers right-aligned under their heads; the heads may wrap (at spaces, not at the
    # hyphen), so a FAILED snapshot's reason has room without scrolling sideways.
    head = (("id", ""), ("initiator", ""), ("status", ""), ("epoch", "num"), ("started", ""),
            ("duration / age", "num"), ("nodes", "num"), ("in\u2011flight msgs", "num"),
            ("in\u2011flight bytes", "num"), ("state size", "num"), ("reason", ""))
    rows = []
    for s in p.rows:
        messages, nbytes = in_flight_totals(s)
        rows.append(
            f"<tr data-snapshot-id='{escape(s.snapshot_id)}' data-status='{model.status_name(s)}'>"
            f"<td>{link(s.snapshot_id)}</td><td>{escape(s.initiator)}</td><td>{status(s)}</td>"
            f"<td class='num'>{s.epoch}</td><td>{when(s.started_at)}</td>"
            f"<td class='num'>{ms(model.age_ms(s, now))}</td><td class='num'>{len(s.nodes)}</td>"
            f"<td class='num'>{messages}</td><td class='num'>{nbytes}</td>"
            f"<td class='num'>{s.stats.state_size_bytes}</td><td class='reason'>{escape(s.reason)}</td></tr>"
        )
    pager = []
    for number in range(1, p.pages + 1):
        pager.append(f"<b>{number}</b>" if number == p.number else f"<a href='/?page={number}'>{number}</a>")
    return (f"<section id='history'><h2>History: {p.total} snapshots, newest first (page {p.number} of {p.pages})</h2>"
            f"<table><tr>{''.join(f'<th class={c!r}>{h}</th>' for h, c in head)}</tr>{''.join(rows)}</table>"
            f"<div class='pager'>{''.join(pager)}</div></section>")


# ------------------------------------------------------------------ one snapshot


def detail(
    s: pb.Snapshot,
    *,
    node_ids: Sequence[str],
    stuck: model.Stuck | None,
    stuck_note: str,
    has_trace: bool,
    trace_note: str,
    now: float,
    neighbours: tuple[str | None, str | None] = (None, None),
    restore: tuple[str, str] = ("", ""),
    described: described_.Described | None = None,
) -> str:
    messages, nbytes = in_flight_totals(s)
    head = [
        f"<div>status: <b id='status'>{status(s)}</b>"
        + (f" <span class='reason' id='reason'>{escape(s.reason)}</span>" if s.reason else "") + "</div>",
        f"<div>initiator {escape(s.initiator)}, epoch {s.epoch}, started {when(s.started_at)}, "
        f"{'took' if s.HasField('finished_at') else 'running for'} {ms(model.age_ms(s, now))}</div>",
        f"<div id='totals'>in flight: {model.plural(messages, 'message')}, {model.plural(nbytes, 'byte')}; "
        f"state size {model.plural(s.stats.state_size_bytes, 'byte')}</div>"
        if s.status == pb.Snapshot.COMPLETE else  # zeros would read as "nothing in flight"
        f"<div id='totals'>in flight and state size: known once the snapshot is COMPLETE ({model.status_name(s)})</div>",
    ]
    if s.status == pb.Snapshot.COMPLETE and _figures(s):  # the bank's line; an app has its section
        head.append(f"<div id='conservation'>{escape(model.conservation(s).line)}</div>")
    if s.HasField("finished_at"):  # exported once it finished
        head.append(f"<div>export: <a id='export' href='/snapshot/{quote(s.snapshot_id, safe='')}/export.json'>"
                    f"{escape(s.snapshot_id)}.json</a> (proto JSON, as in the data dir's snapshots/)</div>")
    line, refused = restore
    if line:
        head.append(f"<div>restore it with: <pre class='command' id='restore-command'>{escape(line)}</pre>"
                    + (f" <span class='reason' id='restore-refused'>({escape(refused)})</span>" if refused else "")
                    + "</div>")
    parts = [_nav(neighbours),
             f"<section id='snapshot'><h2>Snapshot {escape(s.snapshot_id)}</h2>{''.join(head)}</section>"]
    if stuck is not None:
        parts.append(_stuck(stuck, stuck_note))
    if described_.is_app(s) and s.status == pb.Snapshot.COMPLETE:
        parts.append(_app(s, described))
    parts.append(_nodes(s, node_ids))
    parts.append(_phases(model.phases(s)))
    parts.append(_channels(s))
    picture = (f"<img class='trace' alt='space-time picture of {escape(s.snapshot_id)}' "
               f"src='/snapshot/{quote(s.snapshot_id, safe='')}/trace.svg'>" if has_trace else escape(trace_note))
    parts.append(f"<section id='trace'><h2>Message flow around its cut (snapmesh trace)</h2>{picture}</section>")
    return "".join(parts)


def _app(s: pb.Snapshot, d: described_.Described | None) -> str:
    """An app's snapshot: the controller's verdict per invariant, then what the app's
    `describe` makes of it (the bank's money lines have no meaning here)."""
    checks = "".join(
        f"<tr data-invariant='{escape(name)}'><td>{escape(name)}</td>"
        f"<td class='{'COMPLETE' if verdict == 'ok' else 'FAILED'}'>{escape(verdict)}</td></tr>"
        for name, verdict in described_.verdicts(s))
    if d is None or d.summary is None:
        summary = f"<p id='described-note'>{escape(d.note if d else 'no description')}</p>"
    else:
        summary = ("<table id='described'>" + "".join(
            f"<tr data-key='{escape(k)}'><td>{escape(k)}</td><td>{escape(v)}</td></tr>"
            for k, v in described_.rows(d.summary)) + "</table>")
    version = f" <span id='app-version'>({escape(s.app.name)} version {s.app.version or 1})</span>" if s.app.name else ""
    return (f"<section id='app'><h2>App {escape(s.app.spec)}{version}</h2>"
            f"<h3>Invariants</h3><table id='invariants'>{checks or '<tr><td>none</td></tr>'}</table>"
            f"<h3>What the app describes (its describe)</h3>{summary}</section>")


def _nav(neighbours: tuple[str | None, str | None]) -> str:
    older, newer = neighbours
    return ("<div class='nav'>"
            + (f"<a id='previous' href='/snapshot/{quote(older, safe='')}'>&larr; previous {escape(older)}</a>"
               if older else "<span>no previous snapshot</span> ")
            + (f"<a id='next' href='/snapshot/{quote(newer, safe='')}'>next {escape(newer)} &rarr;</a>"
               if newer else "<span>no next snapshot</span>")
            + "</div>")


def _stuck(st: model.Stuck, note: str) -> str:
    age = ms(st.age_ms)
    what = "not recorded yet" if st.source == "logs" else "not reported yet"
    nodes = "".join(f"<li data-node='{escape(n)}'>{escape(n)}: {what}, for {age}</li>" for n in st.not_recorded)
    channels = "".join(
        f"<li data-channel='{escape(src)}->{escape(dst)}'>{escape(src)} -&gt; {escape(dst)}: "
        f"marker not arrived, for {age}</li>"
        for src, dst in st.open_channels
    )
    source = ("from the nodes' transfer logs" if st.source == "logs"
              else f"from the controller's reports only ({escape(note)})")
    return (f"<section id='stuck' class='error'><h2>Where is it stuck? ({source})</h2>"
            f"<div>reported: {escape(', '.join(st.reported) or 'none')}</div>"
            f"<h3>nodes {what}</h3><ul id='stuck-nodes'>{nodes or '<li>none</li>'}</ul>"
            f"<h3>channels still open</h3><ul id='stuck-channels'>{channels or '<li>none</li>'}</ul></section>")


def _nodes(s: pb.Snapshot, node_ids: Sequence[str]) -> str:
    # An app's node records its state bytes, not a balance: its size is what can be said here.
    app = not _figures(s)
    sizes = {n.node_id: n.state_bytes if n.state_omitted else len(n.state) for n in s.nodes}  # left out: its size
    head = ("node", "state bytes" if app else "recorded balance", "start delay", "recording", "report",
            "in-flight msgs", "in-flight bytes")
    rows = "".join(
        f"<tr data-node='{escape(r.node_id)}'><td>{escape(r.node_id)}</td>"
        f"<td class='num'>{dash(sizes.get(r.node_id) if app else r.balance)}</td><td class='num'>{ms(r.start_delay_ms)}</td>"
        f"<td class='num'>{ms(r.recording_ms)}</td><td class='num'>{ms(r.report_ms)}</td>"
        f"<td class='num'>{dash(r.in_flight_messages)}</td><td class='num'>{dash(r.in_flight_bytes)}</td></tr>"
        for r in model.node_rows(s, node_ids)
    )
    heads = "".join(f"<th class='num'>{h}</th>" if h != "node" else f"<th>{h}</th>" for h in head)  # over their numbers
    return (f"<section id='nodes'><h2>Nodes</h2><table><tr>{heads}</tr>{rows}"
            "</table></section>")


def _phases(phases: list[model.Phase]) -> str:
    if not phases:
        return "<section id='phases'><h2>Phases per node</h2>no report yet</section>"
    longest = max(p.end_ms for p in phases) or 1.0

    def span(cls: str, value: float, label: str) -> str:
        return f"<span class='{cls}' style='width:{100 * value / longest:.2f}%' title='{label} {value:.1f} ms'></span>"

    rows = "".join(
        f"<tr><td>{escape(p.node_id)}</td><td><div class='bar'>{span('p-delay', p.start_delay_ms, 'start delay')}"
        f"{span('p-record', p.recording_ms, 'recording')}{span('p-report', p.report_ms, 'report')}</div></td>"
        f"<td class='num'>{ms(p.end_ms)}</td></tr>"
        for p in phases
    )
    legend = ("<div class='legend'><span class='p-delay'></span>start delay<span class='p-record'></span>"
              "recording until the last marker<span class='p-report'></span>report</div>")
    return f"<section id='phases'><h2>Phases per node</h2><table>{rows}</table>{legend}</section>"


def _figures(s: pb.Snapshot) -> bool:
    """Whether the page shows `s` by the bank's figures (balances, amounts, conservation):
    a snapshot the bank's native nodes took, or one whose app has them (v1 fields, as
    the bank app's do); another app's by its state sizes and payloads."""
    return not described_.is_app(s) or carries_v1(s)


def _channels(s: pb.Snapshot) -> str:
    if not _figures(s):
        return _app_channels(s)
    transfers = model.in_flight(s)
    rows = "".join(
        f"<tr class='transfer'><td>{escape(t.src)}</td><td>{escape(t.dst)}</td><td class='num amount'>{t.amount}</td>"
        f"<td class='num'>{t.seq}</td><td>{escape(t.msg_id)}</td></tr>"
        for t in transfers
    )
    per_channel = "".join(
        f"<tr><td>{escape(c.src)} -&gt; {escape(c.dst)}</td><td class='num'>{len(c.in_flight)}</td>"
        f"<td class='num'>{sum(t.amount for t in c.in_flight)}</td></tr>"
        for c in s.channels
    )
    if s.status != pb.Snapshot.COMPLETE:
        return "<section id='channels'><h2>Channels</h2>recorded once the snapshot is COMPLETE</section>"
    return (
        f"<section id='channels'><h2>Channels ({len(s.channels)}; {model.plural(len(transfers), 'transfer')} in flight)</h2>"
        f"<table><tr><th>channel</th><th class='num'>in flight</th><th class='num'>amount</th></tr>{per_channel}</table>"
        f"<h3>Transfers in flight</h3><table id='in-flight'><tr><th>from</th><th>to</th><th class='num'>amount</th>"
        f"<th class='num'>seq</th><th>msg id</th></tr>{rows or '<tr><td colspan=5>none</td></tr>'}</table></section>"
    )


def _app_channels(s: pb.Snapshot) -> str:
    """An app's channels: its messages in flight, by payload size (what they mean is its describe's)."""
    if s.status != pb.Snapshot.COMPLETE:
        return "<section id='channels'><h2>Channels</h2>recorded once the snapshot is COMPLETE</section>"
    per_channel = "".join(
        f"<tr><td>{escape(c.src)} -&gt; {escape(c.dst)}</td><td class='num'>{len(c.in_flight)}</td>"
        f"<td class='num'>{sum(len(t.payload) for t in c.in_flight)}</td></tr>" for c in s.channels)
    rows = "".join(
        f"<tr class='message'><td>{escape(c.src)}</td><td>{escape(c.dst)}</td><td class='num'>{t.seq}</td>"
        f"<td class='num'>{len(t.payload)}</td><td>{escape(t.msg_id)}</td></tr>" for c in s.channels for t in c.in_flight)
    count = sum(len(c.in_flight) for c in s.channels)
    return (f"<section id='channels'><h2>Channels ({len(s.channels)}; {model.plural(count, 'message')} in flight)</h2>"
            f"<table><tr><th>channel</th><th class='num'>in flight</th><th class='num'>payload bytes</th></tr>"
            f"{per_channel}</table><h3>Messages in flight</h3><table id='in-flight'><tr><th>from</th><th>to</th>"
            f"<th class='num'>seq</th><th class='num'>payload bytes</th><th>msg id</th></tr>"
            f"{rows or '<tr><td colspan=5>none</td></tr>'}</table></section>")


# ------------------------------------------------------------------ errors


def problem(title: str, message: str) -> str:
    return f"<section class='error' id='problem'><h2>{escape(title)}</h2><p>{escape(message)}</p></section>"
