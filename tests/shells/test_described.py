"""An app's `describe` rendered by the page, `snapmesh snapshot get` and the trace
picture (issue 32), over snapshots built here: the token ring (examples/token_ring.py)
loaded by its module:attr, as a reader of the snapshot loads it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from snapmesh.app import App, AppError, load_app
from snapmesh.checking import described
from snapmesh.commands.snapshot_cli import render_detail
from snapmesh.protocol.controller import answers
from snapmesh.ui import pages
from snapmesh.checking.described import caption
from snapmesh.v1 import snapmesh_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPEC = "token_ring:app"


@pytest.fixture(autouse=True)
def examples_on_the_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    sys.modules.pop("token_ring", None)


def ring_snapshot(token_at: str | None, *, in_flight_to: str | None = None, ok: bool = True) -> pb.Snapshot:
    """A COMPLETE token-ring snapshot of p1..p3: the token at `token_at` or on p1 -> `in_flight_to`."""
    s = pb.Snapshot(snapshot_id="20261127T100000Z-ab12cd34", status=pb.Snapshot.COMPLETE, epoch=1)
    s.started_at.FromNanoseconds(10**18)
    s.finished_at.FromNanoseconds(10**18 + 5 * 10**6)
    for node in ("p1", "p2", "p3"):
        s.nodes.add(node_id=node, state=b"1" if node == token_at else b"0")
    channel = s.channels.add(src="p1", dst=in_flight_to or "p2")
    if in_flight_to:
        channel.in_flight.add(msg_id=f"p1:{in_flight_to}:4", seq=4, payload=b"token")
    s.app.spec, s.app.status = SPEC, pb.AppCheck.CHECKED
    s.app.invariants.add(name="one token", ok=ok, problems=[] if ok else ["0 tokens: none anywhere"])
    return s


def test_describe_is_the_apps_summary_of_the_snapshot_and_a_bank_snapshot_has_none():
    held = described.describe(ring_snapshot("p2"))
    assert held == described.Described(SPEC, {"token": ["at p2"]}, "")
    moving = described.describe(ring_snapshot(None, in_flight_to="p3"))
    assert moving.summary == {"token": ["in flight p1->p3 (seq 4)"]}
    assert described.rows(moving.summary) == [("token", '["in flight p1->p3 (seq 4)"]')]
    bank = pb.Snapshot(snapshot_id="b", status=pb.Snapshot.COMPLETE)
    assert described.describe(bank) is None and caption(None) == ()
    running = ring_snapshot("p2")
    running.status = pb.Snapshot.IN_PROGRESS
    assert described.describe(running) is None  # no state to describe yet


def test_what_cannot_be_described_is_a_note_never_an_error():
    s = ring_snapshot("p1")

    def refuse(spec: str) -> App:
        raise AppError(f"--app {spec}: no module named 'token_ring'")

    assert described.describe(s, load=refuse).note == (
        "the app does not load here: --app token_ring:app: no module named 'token_ring'")
    ring = load_app(SPEC)
    silent = App(name="quiet", new=ring.new)
    assert described.describe(s, load=lambda _: silent).note == "app 'quiet' has no describe"

    def broken(view):
        raise KeyError("p9")

    raising = App(name="ring", new=ring.new, describe=broken)
    assert described.describe(s, load=lambda _: raising).note == "app 'ring': describe raised KeyError: 'p9'"
    odd = App(name="ring", new=ring.new, describe=lambda view: ["a", "list"])
    assert described.describe(s, load=lambda _: odd).note == "app 'ring': describe returned list, not a mapping"
    long = App(name="ring", new=ring.new, describe=lambda view: {"keys": list(range(500))})
    [(name, value)] = described.rows(described.describe(s, load=lambda _: long).summary)
    assert name == "keys" and len(value) == described.MAX_LINE and value.endswith("...")


def test_the_page_shows_the_invariants_and_the_describe_instead_of_the_money_lines():
    s = ring_snapshot(None, in_flight_to="p3")
    html = pages.detail(s, node_ids=["p1", "p2", "p3"], stuck=None, stuck_note="", has_trace=False, trace_note="",
                        now=0, described=described.describe(s))
    assert "<tr data-invariant='one token'><td>one token</td><td class='COMPLETE'>ok</td></tr>" in html
    assert ("<tr data-key='token'><td>token</td><td>[&quot;in flight p1-&gt;p3 (seq 4)&quot;]</td></tr>" in html)
    assert "id='conservation'" not in html and "balances 0" not in html
    assert "<tr class='message'><td>p1</td><td>p3</td><td class='num'>4</td><td class='num'>5</td>" in html
    assert "1 message in flight" in html
    assert "<th class='num'>state bytes</th>" in html and "recorded balance" not in html
    assert "<tr data-node='p1'><td>p1</td><td class='num'>1</td>" in html  # b"0": one byte of state
    broken = ring_snapshot(None, ok=False)
    html = pages.detail(broken, node_ids=[], stuck=None, stuck_note="", has_trace=False, trace_note="", now=0,
                        described=described.describe(broken))
    assert "<td class='FAILED'>0 tokens: none anywhere</td>" in html
    assert "<tr data-key='token'><td>token</td><td>[]</td></tr>" in html


def test_the_page_of_an_answer_without_its_states_shows_their_sizes_and_says_why_no_describe():
    s = answers.leave_out_states(ring_snapshot(None, in_flight_to="p3"))  # as the controller answers past its limit
    about = described.describe(s)
    assert about.summary is None and "left out of this answer" in about.note and "answer_state_bytes" in about.note
    html = pages.detail(s, node_ids=["p1", "p2", "p3"], stuck=None, stuck_note="", has_trace=False, trace_note="",
                        now=0, described=about)
    assert "<tr data-node='p1'><td>p1</td><td class='num'>1</td>" in html  # state_bytes, not the absent state's 0
    assert "<tr data-invariant='one token'><td>one token</td><td class='COMPLETE'>ok</td></tr>" in html
    assert "snapmesh snapshot get --json` fetches them" in html


def test_snapshot_get_prints_the_verdicts_and_the_describe():
    text = render_detail(ring_snapshot("p3"), ["p1", "p2", "p3"])
    assert "app token_ring:app\ninvariant  verdict\none token  ok\n\ndescribe:\nname   value\ntoken  [\"at p3\"]" in text
    assert "balances" not in text.split("app token_ring:app")[1]
    assert "node  state bytes" in text and re.search(r"\np3 +1 ", text)  # b"1": one byte, not a balance
    moving = render_detail(ring_snapshot(None, in_flight_to="p2"))
    assert "channel  in flight  payload bytes\np1->p2           1              5" in moving
    assert re.search(r"messages in flight: 1\nfrom +to +payload bytes +seq +msg id\np1 +p2 +5 +4 +p1:p2:4", moving), moving
    bank = pb.Snapshot(snapshot_id="b", status=pb.Snapshot.COMPLETE, expected_total=10)
    bank.nodes.add(node_id="p1", balance=10)
    assert render_detail(bank).endswith("balances 10 + in flight 0 = 10; expected 10")


def test_the_picture_carries_the_describe_under_it(tmp_path):
    from snapmesh.synth.writer import main as synth_main
    from snapmesh.trace.clocks import build_trace
    from snapmesh.trace.layout import layout
    from snapmesh.trace.logs import read_data_dir
    from snapmesh.trace.svg import render_svg

    assert caption(described.describe(ring_snapshot("p2"))) == ("app token_ring:app:", 'token: ["at p2"]')
    assert synth_main(["--out", str(tmp_path), "--nodes", "3", "--transfers", "40", "--snapshots", "1",
                       "--seed", "5"]) == 0
    geometry = layout(build_trace(read_data_dir(tmp_path)))
    plain, captioned = render_svg(geometry), render_svg(geometry, caption=("app token_ring:app:", 'token: ["at p2"]'))
    assert 'class="caption">token: ["at p2"]</text>' in captioned.replace("&quot;", '"')
    assert "caption" not in plain
    height = lambda svg: float(svg.split('height="', 1)[1].split('"', 1)[0])  # noqa: E731
    assert height(captioned) == height(plain) + 2 * 18 + 8  # room for both lines under the plot


def test_snapmesh_trace_prints_the_describe_of_an_app_snapshot_from_its_file(tmp_path, capsys):
    from google.protobuf import json_format

    from snapmesh.commands.trace import main as trace_main
    from snapmesh.synth.writer import main as synth_main

    assert synth_main(["--out", str(tmp_path), "--nodes", "3", "--transfers", "40", "--snapshots", "1",
                       "--seed", "5"]) == 0
    bank_svg, app_svg = tmp_path / "bank.svg", tmp_path / "app.svg"
    assert trace_main(["--data-dir", str(tmp_path), "--format", "svg", "--out", str(bank_svg), "--snapshot", "s-1"]) == 0
    assert 'class="caption"' not in bank_svg.read_text()  # the bank's snapshot: no describe
    ring = ring_snapshot("p2")
    ring.snapshot_id = "s-1"
    (tmp_path / "snapshots" / "s-1.json").write_text(json_format.MessageToJson(ring, preserving_proto_field_name=True))
    assert trace_main(["--data-dir", str(tmp_path), "--format", "svg", "--out", str(app_svg), "--snapshot", "s-1"]) == 0
    assert 'class="caption">token: ["at p2"]</text>' in app_svg.read_text().replace("&quot;", '"')
    (tmp_path / "snapshots" / "s-1.json").write_text("{not json")
    assert trace_main(["--data-dir", str(tmp_path), "--format", "svg", "--out", str(app_svg), "--snapshot", "s-1"]) == 0
    assert "s-1.json" in app_svg.read_text() and "does not read" in app_svg.read_text()
    capsys.readouterr()
