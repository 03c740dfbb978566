"""`snapmesh trace`: vector clocks against happens-before, the ShiViz format against
ShiViz's own regex, and the diagram rendered by a real renderer (cairosvg) and
looked at pixel by pixel for the chosen snapshot's cut.

The logs come from `snapmesh synth` (the real record format, consistent by
construction, snapshots with real in-flight transfers) and, once, from a real
cluster run. Seeds are fixed and printed.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from PIL import Image

from support.polling import wait_for

from snapmesh.synth.writer import main as synth_main
from snapmesh.trace.clocks import build_trace, happened_before
from snapmesh.trace.layout import layout
from snapmesh.trace.logs import LogError, read_data_dir
from snapmesh.commands.trace import main as trace_main
from snapmesh.trace.shiviz import SHIVIZ_REGEX, render_shiviz
from snapmesh.trace.svg import CHOSEN_CUT_COLOUR, render_png, render_svg


def synth(out: Path, *, nodes: int, transfers: int, snapshots: int, seed: int) -> Path:
    argv = ["--out", str(out), "--nodes", str(nodes), "--transfers", str(transfers),
            "--snapshots", str(snapshots), "--seed", str(seed)]
    print("logs from: snapmesh synth " + " ".join(argv))
    assert synth_main(argv) == 0
    return out


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return synth(tmp_path_factory.mktemp("small"), nodes=3, transfers=25, snapshots=2, seed=7)


@pytest.fixture(scope="module")
def eight(tmp_path_factory) -> Path:
    """8 nodes, a few hundred events: the size the diagram must stay readable at."""
    return synth(tmp_path_factory.mktemp("eight"), nodes=8, transfers=160, snapshots=3, seed=11)


def recorded_in_flight(data_dir: Path) -> dict[str, set[str]]:
    found = {}
    for path in (data_dir / "snapshots").glob("*.json"):
        doc = json.loads(path.read_text())
        found[doc["snapshot_id"]] = {t["msg_id"] for c in doc["channels"] for t in c["in_flight"]}
    return found


# ------------------------------------------------------------------ clocks


def test_vector_clocks_are_exactly_happens_before(small):
    """On a small run, compare every pair of events: e -> f in the logs (program
    order plus send -> matching receive, transitively) iff VC(e) < VC(f)."""
    trace = build_trace(read_data_dir(small))
    events = trace.events
    successors = defaultdict(set)
    last_on = {}
    for event in sorted(events, key=lambda e: (e.node, e.lsn)):
        if event.node in last_on:
            successors[last_on[event.node]].add(event.index)
        last_on[event.node] = event.index
    for message in trace.messages:
        assert message.recv is not None, f"synth delivers everything: {message}"
        successors[message.send].add(message.recv)
    for event in events:
        reachable, frontier = set(), [event.index]
        while frontier:
            for nxt in successors[frontier.pop()]:
                if nxt not in reachable:
                    reachable.add(nxt)
                    frontier.append(nxt)
        for other in events:
            assert happened_before(event.clock, other.clock) == (other.index in reachable), (event, other)


def test_every_receive_dominates_its_send_strictly(eight):
    trace = build_trace(read_data_dir(eight))
    kinds = {m.kind for m in trace.messages}
    assert kinds == {"transfer", "marker"}
    for message in trace.messages:
        sent, received = trace.events[message.send], trace.events[message.recv]
        assert happened_before(sent.clock, received.clock), (sent, received)
        assert received.clock[received.node] > sent.clock.get(received.node, 0)
        assert received.time > sent.time  # Lamport time: arrows point right
        # The match is the right one: same channel, same msg_id or snapshot.
        assert (sent.record["src"], sent.record["dst"]) == (received.record["src"], received.record["dst"])
        key = "msg_id" if message.kind == "transfer" else "snapshot_id"
        assert sent.record[key] == received.record[key]


def test_in_flight_from_the_logs_is_what_each_snapshot_recorded(eight):
    trace = build_trace(read_data_dir(eight))
    recorded = recorded_in_flight(eight)
    assert set(trace.snapshot_ids()) == set(recorded) and len(recorded) == 3
    assert any(recorded.values()), "the run should have transfers in flight at some cut"
    for snapshot_id, msg_ids in recorded.items():
        assert {m.msg_id for m in trace.in_flight(snapshot_id)} == msg_ids, snapshot_id


def test_segments_torn_tail_unknown_kinds_and_restore(small, tmp_path):
    """The same run split into a sealed segment and an active file, with a torn last
    line and a kind the trace does not know, gives the same clocks; a `restore` record
    becomes an event."""
    whole = build_trace(read_data_dir(small))
    split = tmp_path / "split"
    shutil.copytree(small, split)
    lines = (split / "p1.log.jsonl").read_text().splitlines(keepends=True)
    half = len(lines) // 2
    (split / "p1.log.000000000001.jsonl").write_text("".join(lines[:half]))
    last_lsn = json.loads(lines[-1])["lsn"]
    future = json.dumps({"node": "p1", "lsn": last_lsn + 1, "kind": "compaction_hint", "upto": 3})
    restore = json.dumps({"node": "p1", "lsn": last_lsn + 2, "kind": "restore", "snapshot_id": "s-1", "epoch": 2,
                          "deliveries": 0, "balance": 5})
    (split / "p1.log.jsonl").write_text("".join(lines[half:]) + future + "\n" + restore + "\n" + '{"node":"p1","ls')
    again = build_trace(read_data_dir(split))
    assert [(e.node, e.lsn, e.clock) for e in again.events if e.kind != "restore"] == [
        (e.node, e.lsn, e.clock) for e in whole.events
    ]
    restores = [e for e in again.events if e.kind == "restore"]
    assert len(restores) == 1 and restores[0].lsn == last_lsn + 2
    assert "restore snapshot=s-1 epoch=2 balance=5" in render_shiviz(again)


# ------------------------------------------------------------------ ShiViz


def shiviz_regex_in_python() -> re.Pattern:
    """ShiViz's regex is JavaScript; `(?<name>` is `(?P<name>` in Python."""
    return re.compile(re.sub(r"\(\?<(\w+)>", r"(?P<\1>", SHIVIZ_REGEX))


def test_the_shiviz_file_parses_with_shivizs_regex(eight):
    trace = build_trace(read_data_dir(eight))
    text = render_shiviz(trace)
    header, blank, body = text.split("\n", 2)
    assert header == r"(?<host>\S*) (?<clock>{.*})\n(?<event>.*)" and blank == ""
    matches = list(shiviz_regex_in_python().finditer(body))
    assert len(matches) == len(trace.events) == body.count("\n") // 2
    kinds_seen = set()
    for match, event in zip(matches, trace.events, strict=True):
        clock = json.loads(match["clock"])
        assert match["host"] == event.node and clock[event.node] >= 1, "the host is in its own clock"
        assert all(isinstance(tick, int) and tick > 0 for tick in clock.values()), "zero entries are left out"
        assert clock == {n: t for n, t in event.clock.items() if t}
        kinds_seen.add(match["event"].split(" ", 1)[0])
    assert {"send", "recv", "cut", "marker"} <= kinds_seen


# ------------------------------------------------------------------ the picture


def colour_at(image: Image.Image, x: float, y: float) -> tuple[int, int, int]:
    return image.getpixel((int(x), int(y)))[:3]


def is_colour(pixel: tuple[int, int, int], hex_colour: str, tolerance: int = 24) -> bool:
    want = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, want, strict=True))


def test_the_svg_renders_and_the_chosen_cut_is_drawn_where_the_cuts_are(eight):
    trace = build_trace(read_data_dir(eight))
    chosen = max(trace.snapshot_ids(), key=lambda s: len(trace.in_flight(s)))
    geometry = layout(trace, chosen=chosen)
    image = Image.open(io.BytesIO(render_png(render_svg(geometry)))).convert("RGB")
    assert image.size == (round(geometry.width), round(geometry.height))

    cut = next(c for c in geometry.cuts if c.chosen)
    cuts = trace.cuts(chosen)
    assert len(cut.points) == len(trace.nodes) == 8 == len(cuts)
    # The line goes through each node's cut event, on that node's lane.
    for point, node in zip(cut.points, sorted(cuts, key=lambda n: int(n[1:])), strict=True):
        assert point.y == geometry.lanes[node]
        assert point.x == geometry.plot_left + (cuts[node].time - geometry.start) * (
            (geometry.plot_right - geometry.plot_left) / (geometry.end - geometry.start))
    # Along every segment, the pixels are the cut colour ...
    for a, b in zip(cut.points, cut.points[1:], strict=False):
        for f in (0.2, 0.35, 0.5, 0.65, 0.8):
            x, y = a.x + f * (b.x - a.x), a.y + f * (b.y - a.y)
            assert is_colour(colour_at(image, x, y), CHOSEN_CUT_COLOUR), (x, y, colour_at(image, x, y))
    # ... and the colour is nowhere near the window's start on any lane.
    for y in geometry.lanes.values():
        assert not is_colour(colour_at(image, geometry.plot_left + 2, y), CHOSEN_CUT_COLOUR)
    # Highlighted in-flight arrows exist for the chosen snapshot.
    assert sum(a.style == "in_flight" for a in geometry.arrows) == len(trace.in_flight(chosen)) > 0


def test_cli_writes_all_three_formats(eight, tmp_path, capsys):
    for fmt in ("shiviz", "svg", "png"):
        out = tmp_path / f"trace.{fmt}"
        assert trace_main(["--data-dir", str(eight), "--format", fmt, "--out", str(out)]) == 0
        assert out.stat().st_size > 1000
    assert (tmp_path / "trace.png").read_bytes().startswith(b"\x89PNG")
    assert "<svg" in (tmp_path / "trace.svg").read_text()
    assert trace_main(["--data-dir", str(eight), "--format", "svg", "--out", str(tmp_path / "w.svg"),
                       "--snapshot", "s-2", "--window", "5:60"]) == 0
    assert "Lamport time 5 to 60; snapshot s-2 chosen" in (tmp_path / "w.svg").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--snapshot", "nope"], "no cut for snapshot 'nope'"),
        (["--window", "9:3"], "window 9:3 is empty"),
        (["--window", "x"], "'x' is not FROM:TO"),
    ],
)
def test_cli_bad_arguments_exit_2(eight, tmp_path, capsys, extra, message):
    out = tmp_path / "t.svg"
    assert trace_main(["--data-dir", str(eight), "--format", "svg", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_cli_bad_logs_exit_2_naming_file_and_line(small, tmp_path, capsys):
    assert trace_main(["--data-dir", str(tmp_path / "none"), "--format", "shiviz", "--out", str(tmp_path / "x")]) == 2
    assert "no such directory" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(small, broken)
    lines = (broken / "p2.log.jsonl").read_text().splitlines()
    lines[3] = "{not json"
    (broken / "p2.log.jsonl").write_text("\n".join(lines) + "\n")
    assert trace_main(["--data-dir", str(broken), "--format", "shiviz", "--out", str(tmp_path / "x")]) == 2
    assert f"{broken / 'p2.log.jsonl'}:4: not a log record" in capsys.readouterr().err


# ------------------------------------------------------------------ a real run


def _unmatched(data_dir: Path) -> list:
    """The sent messages of the running nodes' logs that lack their receive (a LogError:
    a line a node is writing right now)."""
    return [m for m in build_trace(read_data_dir(data_dir)).messages if m.recv is None]


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_real_clusters_logs(tmp_path):
    """The node's own logs (not synth's): clocks respect every send/receive pair, each
    snapshot's in-flight transfers are those the controller recorded, and the demo's
    picture is written."""
    from snapmesh.bank.workload import WorkloadParams, run_workload
    from snapmesh.processes.supervisor import Cluster
    from snapmesh.settings.config import write_cluster
    from snapmesh.commands.trace import write_run_trace

    data_dir = tmp_path / "run"
    with Cluster(write_cluster(data_dir / "cluster.toml", nodes=4, data_dir=data_dir)) as cluster:
        params = WorkloadParams(duration=2.5, transfer_interval=0.02, snapshot_every=0.8, seed=5)
        summary = run_workload(cluster.controller_address, params, out=io.StringIO())
        # The workload stops sending, but its last transfers may still be on their
        # way: stop the cluster only once every logged send has its receive.
        wait_for(lambda: _unmatched(data_dir), until=lambda unmatched: not unmatched, timeout=30.0, interval=0.1,
                 retry_on=LogError, what="every message received before the cluster stops")
    assert summary.exit_code == 0
    trace = build_trace(read_data_dir(data_dir))
    assert not [m for m in trace.messages if m.recv is None]
    for message in trace.messages:
        assert happened_before(trace.events[message.send].clock, trace.events[message.recv].clock)
    recorded = recorded_in_flight(data_dir)
    assert len(recorded) >= 2
    for snapshot_id, msg_ids in recorded.items():
        assert {m.msg_id for m in trace.in_flight(snapshot_id)} == msg_ids, snapshot_id
    line = write_run_trace(data_dir)
    assert line.startswith(f"message flow: {data_dir / 'trace.svg'}"), line
    Image.open(io.BytesIO(render_png((data_dir / "trace.svg").read_text()))).verify()


def test_png_without_the_png_extra_is_one_clear_line(eight, tmp_path, capsys, monkeypatch):
    # cairosvg is the optional `png` extra: without it `import cairosvg` fails.
    import sys

    monkeypatch.setitem(sys.modules, "cairosvg", None)
    out = tmp_path / "trace.png"
    assert trace_main(["--data-dir", str(eight), "--format", "png", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "pip install 'snapmesh[png]'" in err and "--format png" in err
    assert not out.exists()
    # svg needs no extra.
    assert trace_main(["--data-dir", str(eight), "--format", "svg", "--out", str(tmp_path / "t.svg")]) == 0
