"""Every snapshot says which app and version recorded it: the export, `snapmesh snapshot get` and the page."""

from __future__ import annotations

import json

from snapmesh.commands.snapshot_cli import render_app
from snapmesh.services.controller.export import snapshot_json
from snapmesh.ui import pages
from snapmesh.v1 import snapmesh_pb2 as pb

from snapmesh.app import App
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller.tracker import Now, Tracker
from snapmesh.protocol.topology import Topology

NOW = Now(mono=0.0, wall=1_795_000_000.0)


def recorded() -> pb.Snapshot:
    """A COMPLETE snapshot of two nodes running app "ring" version 1, as the tracker assembles it."""
    tracker = Tracker(topology=Topology.build(["a", "b"], None), deadline_s=5,
                      checker=AppChecker("ring:app", App(name="ring", new=lambda info: None)))
    tracker.start("s1", "a", NOW)
    for node, src in (("a", "b"), ("b", "a")):
        done = tracker.report(pb.FullState(snapshot_id="s1", node_id=node, state=b"0", app_name="ring", app_version=1,
                                           channels=[pb.ChannelState(src=src, dst=node)]), NOW)
    return done.snapshot


def test_the_export_snapshot_get_and_the_page_show_the_app_and_its_version():
    snapshot = recorded()
    exported = json.loads(snapshot_json(snapshot))
    assert (exported["app"]["name"], exported["app"]["version"]) == ("ring", "1")
    assert [(n["app_name"], n["app_version"]) for n in exported["nodes"]] == [("ring", "1"), ("ring", "1")]
    assert render_app(snapshot, None)[0] == "app ring:app (ring version 1)"
    html = pages.detail(snapshot, node_ids=["a", "b"], stuck=None, stuck_note="", has_trace=False, trace_note="",
                        now=0, described=None)
    assert "<h2>App ring:app <span id='app-version'>(ring version 1)</span></h2>" in html


def test_a_snapshot_from_before_versions_shows_as_before():
    old = pb.Snapshot(snapshot_id="s", status=pb.Snapshot.COMPLETE)
    old.app.spec = "ring:app"
    assert render_app(old, None)[0] == "app ring:app"
