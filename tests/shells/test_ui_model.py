"""`snapmesh ui`'s figures (snapmesh/ui/model.py), pure: snapshots built here, no server."""

from __future__ import annotations

from snapmesh.settings.appsettings import app_words
from snapmesh.ui import model, pages
from snapmesh.v1 import snapmesh_pb2 as pb

COMPLETE, FAILED, IN_PROGRESS = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED, pb.Snapshot.IN_PROGRESS


def snap(sid: str, status, started: float, took_ms: float = 0.0, *, size: int = 0, epoch: int = 1, **fields):
    s = pb.Snapshot(snapshot_id=sid, status=status, epoch=epoch, **fields)
    s.started_at.FromNanoseconds(int(started * 1e9))
    if status != IN_PROGRESS:
        s.finished_at.FromNanoseconds(int((started + took_ms / 1000) * 1e9))
    s.stats.end_to_end_duration_ms = took_ms
    s.stats.state_size_bytes = size
    return s


def test_overview_counts_and_the_latest_of_each_kind():
    snaps = [snap("a", COMPLETE, 10, 5), snap("b", FAILED, 20, 9, reason="deadline"), snap("c", COMPLETE, 30, 4),
             snap("d", IN_PROGRESS, 40, epoch=2)]
    o = model.overview(snaps, {"p1": 3, "p2": None})
    assert o.counts == {"COMPLETE": 2, "FAILED": 1, "IN_PROGRESS": 1}
    assert o.latest_complete.snapshot_id == "c" and o.latest_failed.snapshot_id == "b"
    assert o.epoch == 3  # a node in a newer epoch than any snapshot (after a restore)


def test_summary_percentiles_over_the_last_n_complete():
    snaps = [snap(f"s{i}", COMPLETE, i, took_ms=float(i), size=100 * i) for i in range(1, 101)]
    snaps.append(snap("f", FAILED, 1000, took_ms=5000.0))
    s = model.summary(snaps, last_n=50)
    assert s.count == 49  # the failed one is among the newest 50 but not counted
    assert s.duration_ms == {"p50": 76.0, "p99": 100.0, "max": 100.0}
    assert s.state_size_bytes["max"] == 10000
    assert model.percentile([], 50) is None


def test_history_pages_newest_first():
    snaps = [snap(f"s{i:02d}", COMPLETE, i, 1) for i in range(45)]
    first = model.history(snaps, page=1, per_page=20)
    assert [s.snapshot_id for s in first.rows[:2]] == ["s44", "s43"] and first.pages == 3 and first.total == 45
    last = model.history(snaps, page=9, per_page=20)
    assert last.number == 3 and [s.snapshot_id for s in last.rows] == ["s04", "s03", "s02", "s01", "s00"]


def test_conservation_adds_balances_and_in_flight():
    s = snap("a", COMPLETE, 1, 2, expected_total=300, total=300, conserved=True)
    s.nodes.add(node_id="p1", balance=100)
    s.nodes.add(node_id="p2", balance=150)
    c = s.channels.add(src="p1", dst="p2")
    c.in_flight.add(msg_id="p1:p2:7", amount=30, seq=7)
    c.in_flight.add(msg_id="p1:p2:8", amount=20, seq=8)
    s.channels.add(src="p2", dst="p1")
    line = model.conservation(s)
    assert (line.balances, line.in_flight, line.total, line.conserved) == (250, 50, 300, True)
    assert [(t.src, t.dst, t.amount) for t in model.in_flight(s)] == [("p1", "p2", 30), ("p1", "p2", 20)]


def test_stuck_from_the_logs_names_the_silent_node_and_its_open_channels():
    s = snap("x", IN_PROGRESS, 100)
    nodes = ["p1", "p2", "p3"]
    channels = [(a, b) for a in nodes for b in nodes if a != b]
    records = {
        "p1": [{"kind": "cut", "snapshot_id": "x"}, {"kind": "marker_recv", "snapshot_id": "x", "src": "p2", "dst": "p1"}],
        "p2": [{"kind": "cut", "snapshot_id": "x"}, {"kind": "marker_recv", "snapshot_id": "x", "src": "p1", "dst": "p2"},
               {"kind": "cut", "snapshot_id": "older"}],
        "p3": [{"kind": "cut", "snapshot_id": "older"}],
    }
    st = model.stuck(s, nodes, channels, now=103.5, records=records)
    assert st.source == "logs" and st.not_recorded == ["p3"]
    assert st.open_channels == [("p1", "p3"), ("p2", "p3"), ("p3", "p1"), ("p3", "p2")]
    assert st.age_ms == 3500.0


def test_stuck_without_logs_is_the_controllers_view():
    s = snap("x", IN_PROGRESS, 100)
    s.stats.nodes.add(node_id="p1")
    st = model.stuck(s, ["p1", "p2"], [("p1", "p2"), ("p2", "p1")], now=101, records=None)
    assert st.source == "controller" and st.not_recorded == ["p2"] and st.open_channels == [("p1", "p2")]


def test_a_node_that_has_not_reported_and_an_unfinished_snapshot_show_no_figures_rather_than_zeros():
    s = snap("x", IN_PROGRESS, 100)
    s.stats.nodes.add(node_id="p1", start_delay_ms=2.5, recording_duration_ms=0.0, report_time_ms=1.0)
    p1, p2 = model.node_rows(s, ["p1", "p2"])
    assert (p1.start_delay_ms, p1.recording_ms, p1.in_flight_messages) == (2.5, 0.0, 0)
    assert (p2.balance, p2.start_delay_ms, p2.recording_ms, p2.report_ms, p2.in_flight_messages,
            p2.in_flight_bytes) == (None,) * 6
    html = pages.detail(s, node_ids=["p1", "p2"], stuck=None, stuck_note="", has_trace=False, trace_note="", now=101)
    row = html.split("<tr data-node='p2'>")[1].split("</tr>")[0]
    assert "0.0 ms" not in row and row.count(">-<") == 6, row
    assert "<div id='totals'>in flight and state size: known once the snapshot is COMPLETE (IN_PROGRESS)</div>" in html
    s.status = COMPLETE
    s.stats.in_flight_messages, s.stats.in_flight_bytes, s.stats.state_size_bytes = 2, 28, 300
    html = pages.detail(s, node_ids=["p1", "p2"], stuck=None, stuck_note="", has_trace=False, trace_note="", now=101)
    assert "<div id='totals'>in flight: 2 messages, 28 bytes; state size 300 bytes</div>" in html


def test_one_of_a_thing_is_singular_on_the_page():
    s = snap("x", COMPLETE, 100, 5, conserved=True)
    s.stats.in_flight_messages, s.stats.in_flight_bytes, s.stats.state_size_bytes = 1, 1, 1
    s.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", amount=3, seq=1)
    html = pages.detail(s, node_ids=["p1", "p2"], stuck=None, stuck_note="", has_trace=False, trace_note="", now=101)
    assert "<div id='totals'>in flight: 1 message, 1 byte; state size 1 byte</div>" in html
    assert "1 transfer in flight)" in html and "1 transfers" not in html and "1 messages" not in html
    assert [model.plural(n, "message") for n in (0, 1, 2)] == ["0 messages", "1 message", "2 messages"]


def cluster_answer(**settings) -> pb.Cluster:
    c = pb.Cluster(epoch=3)
    c.nodes.add(node_id="p1", address="127.0.0.1:5001")
    c.nodes.add(node_id="p2", address="127.0.0.1:5002")
    if settings:
        c.settings.CopyFrom(pb.SnapshotSettings(**settings))
    return c


def test_the_configuration_is_the_controllers_settings_in_words():
    full = cluster_answer(snapshot_mode="overtake", deadline_s=8, interval_s=0.5, keep=20, max_concurrent_snapshots=32)
    assert model.configuration(full, epoch=1) == [
        ("app", "bank"), ("mode", "overtake"), ("deadline", "8 s"), ("interval", "every 0.5 s"),
        ("retention", "the files of the newest 20 COMPLETE"), ("concurrency limit", "32 in progress"), ("epoch", "3")]
    bare = cluster_answer(snapshot_mode="classic", deadline_s=10)
    assert dict(model.configuration(bare, epoch=1))["interval"] == "none: only when triggered"
    assert dict(model.configuration(bare, epoch=1))["retention"] == "every snapshot's file"
    assert dict(model.configuration(bare, epoch=1))["concurrency limit"] == "none"
    # A controller from before the settings: the page says so rather than showing zeros.
    old = pb.Cluster()
    assert model.configuration(old, epoch=2) == [
        ("settings", "not sent by this controller (it predates GetCluster's settings)"), ("epoch", "2")]
    html = pages.index([], cluster=full, node_epochs={"p1": 3, "p2": None}, restore=None, restore_note="none",
                       page=1, per_page=20, last_n=50, now=100)
    assert "<dt>concurrency limit</dt><dd data-setting='concurrency limit'>32 in progress</dd>" in html


def test_the_configuration_names_the_app_its_name_and_version():
    shard = cluster_answer(snapshot_mode="classic", deadline_s=10)
    shard.app, shard.app_name, shard.app_version = "kvshard", "kvshard", 2
    assert model.configuration(shard, epoch=1)[0] == ("app", "kvshard (snapmesh.services.app.kvshard:app), kvshard version 2")
    html = pages.index([], cluster=shard, node_epochs={"p1": 3}, restore=None, restore_note="none",
                       page=1, per_page=20, last_n=50, now=100)
    assert ("<dt>app</dt><dd data-setting='app'>kvshard (snapmesh.services.app.kvshard:app), kvshard version 2</dd>"
            in html), html
    # A user's module the controller could not load: its spec alone; "bank" by either spelling.
    shard.app, shard.app_name, shard.app_version = "shelf:app", "", 0
    assert dict(model.configuration(shard, epoch=1))["app"] == "shelf:app"
    assert [app_words(spec) for spec in ("", "bank", " bank ")] == ["bank"] * 3
    assert app_words("shelf:app", "shelf", 0) == "shelf:app, shelf version 1"  # version 0: an old controller's, read as 1


def test_the_node_view_has_address_reachability_epoch_and_the_last_report():
    a, b = snap("a", COMPLETE, 10, 5), snap("b", COMPLETE, 20, 5)
    for s, at in ((a, 10.004), (b, 20.003)):
        s.stats.nodes.add(node_id="p1").ack_timestamp.FromNanoseconds(int(at * 1e9))
    views = model.node_views(cluster_answer(), {"p1": 3, "p2": None}, [b, a])
    assert [(v.node_id, v.address, v.reachable, v.epoch, v.last_report_snapshot) for v in views] == [
        ("p1", "127.0.0.1:5001", True, 3, "b"), ("p2", "127.0.0.1:5002", False, None, "")]
    assert views[0].last_report_s == 20.003 and views[1].last_report_s is None
    html = pages.index([a, b], cluster=cluster_answer(), node_epochs={"p1": 3, "p2": None}, restore=None,
                       restore_note="none", page=1, per_page=20, last_n=50, now=100)
    row = html.split("<tr data-node='p2'>")[1].split("</tr>")[0]
    assert "<td class='unreachable'>no</td>" in row and "never" in row


def test_the_timeline_puts_durations_on_one_time_axis_and_overlapping_ones_in_lanes():
    snaps = [snap("a", COMPLETE, 100.0, 1000), snap("b", COMPLETE, 100.5, 500), snap("c", FAILED, 102.0, 2000),
             snap("d", IN_PROGRESS, 103.0)]
    t = model.timeline(snaps, last_n=50, now=104.0)
    assert (t.start_s, t.end_s) == (100.0, 104.0)
    assert [(b.snapshot.snapshot_id, round(b.left_pct, 3), round(b.width_pct, 3), b.lane) for b in t.bars] == [
        ("a", 0.0, 25.0, 0), ("b", 12.5, 12.5, 1), ("c", 50.0, 50.0, 0), ("d", 75.0, 25.0, 1)]
    assert [round(b.duration_ms) for b in t.bars] == [1000, 500, 2000, 1000]  # d: running for 1 s
    assert [at for at, _ in t.ticks] == [0, 25, 50, 75, 100] and t.lanes == 2
    assert model.timeline([], 50, now=1.0).bars == []


def test_a_snapshot_page_links_its_neighbours_its_export_and_shows_its_restore_command():
    snaps = [snap("a", COMPLETE, 10, 5, conserved=True), snap("b", FAILED, 20, 5, reason="deadline"),
             snap("c", COMPLETE, 30, 5, conserved=True)]
    assert model.neighbours(snaps, "b") == ("a", "c")
    assert model.neighbours(snaps, "a") == (None, "b") and model.neighbours(snaps, "c") == ("b", None)
    assert model.neighbours(snaps, "zz") == (None, None)
    line, refused = model.restore_command(snaps[0], "10.0.0.5:50050", None)
    assert (line, refused) == ("snapmesh restore --controller 10.0.0.5:50050 a", "")
    line, refused = model.restore_command(snaps[1], "h:1", "/d/my tls")
    assert line == "snapmesh restore --controller h:1 --tls-dir '/d/my tls' b" and "this one is FAILED" in refused
    bad = snap("x", COMPLETE, 40, 5)
    bad.app.invariants.add(name="one token", ok=False, problems=["two tokens"])
    assert model.restore_command(bad, "h:1", None)[1] == "the controller refuses it: invariant one token does not hold"
    html = pages.detail(snaps[1], node_ids=[], stuck=None, stuck_note="", has_trace=False, trace_note="", now=50,
                        neighbours=("a", "c"), restore=model.restore_command(snaps[1], "h:1", None))
    assert "<a id='previous' href='/snapshot/a'>" in html and "<a id='next' href='/snapshot/c'>" in html
    assert "<a id='export' href='/snapshot/b/export.json'>" in html
    assert "<pre class='command' id='restore-command'>snapmesh restore --controller h:1 b</pre>" in html
