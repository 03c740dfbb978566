"""An app's snapshot on the page (snapmesh/ui/appview.py, pages.py): the controller's
verdict on its invariants and what the app's `describe` says, in place of the bank's money."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from snapmesh.ui import pages
from snapmesh.ui.appview import Described, Describer
from snapmesh.v1 import snapmesh_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """examples/ (token_ring) and tmp_path (apps written by the test) importable."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("token_ring", "broken_describe"):
        sys.modules.pop(name, None)


def ring_snapshot(spec: str = "token_ring:app", *, ok: bool = True) -> pb.Snapshot:
    """Three nodes, none holding the token: it is on p1 -> p2 at seq 3."""
    s = pb.Snapshot(snapshot_id="s-1", status=pb.Snapshot.COMPLETE)
    for node in ("p1", "p2", "p3"):
        s.nodes.add(node_id=node, state=b"0")
    s.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:3", seq=3, payload=b"token")
    s.app.spec, s.app.status = spec, pb.AppCheck.CHECKED
    s.app.invariants.add(name="one token", ok=ok, problems=[] if ok else ["2 tokens: at p1, at p3"])
    return s


def detail(s: pb.Snapshot, described: Described | None = None) -> str:
    return pages.detail(s, node_ids=["p1", "p2", "p3"], stuck=None, stuck_note="", has_trace=False, trace_note="",
                        now=0, described=described)


def test_describe_says_where_the_token_is(on_path):
    said = Describer()(ring_snapshot())
    assert said.text is not None and '"in flight p1->p2 (seq 3)"' in said.text, said


def test_an_app_that_does_not_load_or_whose_describe_fails_is_a_note(on_path):
    missing = Describer()(ring_snapshot("no_such_ring_module:app"))
    assert missing.text is None and missing.note.startswith("not described: --app no_such_ring_module:app: no module")
    (on_path / "broken_describe.py").write_text(
        "from snapmesh.app import App\nfrom token_ring import TokenRing\n\n"
        "app = App(name='broken', new=TokenRing, describe=lambda view: 1 / 0)\n", encoding="utf-8")
    broken = Describer()(ring_snapshot("broken_describe:app"))
    assert (broken.text, broken.note) == (None, "app 'broken': describe failed: ZeroDivisionError: division by zero")
    bank = Describer()(pb.Snapshot(snapshot_id="b", status=pb.Snapshot.COMPLETE))
    assert bank.text is None


def test_an_app_snapshots_page_shows_its_invariants_and_description_not_money(on_path):
    html = detail(ring_snapshot(), Describer()(ring_snapshot()))
    assert "<code id='app-spec'>token_ring:app</code>" in html
    assert "<tr data-invariant='one token' data-ok='true'><td>one token</td><td class='COMPLETE'>ok</td>" in html
    assert "in flight p1-&gt;p2 (seq 3)" in html
    assert "id='conservation'" not in html and "balances" not in html
    broken = detail(ring_snapshot(ok=False), Described(None, "not described: why"))
    assert "<td class='FAILED'>VIOLATED</td><td class='reason'>2 tokens: at p1, at p3</td>" in broken
    assert "<div id='described-note'>not described: why</div>" in broken
    assert pages.verdict_line(ring_snapshot(ok=False)) == "app token_ring:app: VIOLATED: one token"
    assert pages.verdict_line(ring_snapshot()) == "app token_ring:app: 1 invariant(s) hold"


def test_a_bank_snapshots_page_keeps_its_money_and_has_no_app_section():
    s = pb.Snapshot(snapshot_id="b", status=pb.Snapshot.COMPLETE, expected_total=10, total=10, conserved=True)
    s.nodes.add(node_id="p1", balance=10)
    html = detail(s)
    assert "id='conservation'" in html and "id='app'" not in html


def test_snapshot_get_prints_the_apps_verdict_and_description(on_path):
    from snapmesh.commands.snapshot_cli import render_detail

    s = ring_snapshot()
    text = render_detail(s, ["p1", "p2", "p3"], Describer()(s))
    assert "app token_ring:app: 1 invariant(s) hold\n  one token: ok\ndescribed:\n{" in text, text
    assert '"in flight p1->p2 (seq 3)"' in text and "balances" not in text
    broken = render_detail(ring_snapshot("gone:app", ok=False), ["p1"], Describer()(ring_snapshot("gone:app")))
    assert "  one token: VIOLATED: 2 tokens: at p1, at p3\ndescribed: not described: --app gone:app: no module" in broken
