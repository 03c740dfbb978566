"""The demo's snapshots record money in flight, from the workload.

The workload's burst (transfers at every node as each snapshot is triggered) on a
real 3-node cluster: some COMPLETE snapshot records in-flight transfers, its table
lists them and says balances + in flight = total, the demo names it, and the Spark
verdict table carries its in-flight count (the table's formatting; the Spark job
itself is run by test_reconcile_cli).
"""

from __future__ import annotations

import io

import pytest

from snapmesh.bank.workload import WorkloadParams, run_workload
from snapmesh.settings.config import write_cluster
from snapmesh.bank.demo import IN_FLIGHT_TRIES, point_at_in_flight
from snapmesh.reconcile.job import format_table
from snapmesh.processes.supervisor import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def test_the_burst_leaves_money_in_flight_at_a_cut_and_the_tables_show_it(tmp_path):
    config = write_cluster(tmp_path / "cluster.toml", nodes=3, topology="mesh", data_dir=tmp_path)
    with Cluster(config) as cluster:
        out = io.StringIO()
        # Whether a cut finds money on a channel is a race with the network: on a loaded machine
        # five snapshots may all miss it, so the test takes the demo's own further tries.
        params = WorkloadParams(duration=3.2, snapshot_every=0.6, seed=11, burst=30, in_flight_tries=IN_FLIGHT_TRIES)
        summary = run_workload(cluster.controller_address, params, out=out)
    text = out.getvalue()
    assert summary.exit_code == 0, text
    assert summary.burst_made > 0, text
    with_flight = [s for s in summary.complete if any(c.in_flight for c in s.channels)]
    assert with_flight, f"no snapshot recorded money in flight:\n{text}"
    # The demo's choice: the most transfers in flight, a tie going to the larger amount.
    best = max(with_flight, key=lambda s: (sum(len(c.in_flight) for c in s.channels),
                                          sum(t.amount for c in s.channels for t in c.in_flight)))
    amount = sum(t.amount for c in best.channels for t in c.in_flight)
    balances = sum(n.balance for n in best.nodes)
    assert balances + amount == best.total == best.expected_total
    assert f"total {best.total} = balances {balances} + in flight {amount}; " in text, text
    busy = next(c for c in best.channels if c.in_flight)
    listed = ", ".join(str(t.amount) for t in busy.in_flight[:20])
    assert f"{busy.src}->{busy.dst} ({len(busy.in_flight)}, seq {busy.in_flight[0].seq}" in text, text
    assert f"): {listed}" in text, text

    pointer = io.StringIO()
    assert point_at_in_flight(summary, out=pointer) == best.snapshot_id
    count = sum(len(c.in_flight) for c in best.channels)
    assert f"recorded {count} transfer(s) worth {amount}" in pointer.getvalue()


def test_the_tables_conservation_line_adds_up_what_was_recorded_not_the_controllers_total():
    from snapmesh.bank.render import snapshot_table
    from snapmesh.v1 import snapmesh_pb2 as pb

    s = pb.Snapshot(snapshot_id="s", initiator="p1", status=pb.Snapshot.COMPLETE, expected_total=300, total=300,
                    conserved=True)
    s.nodes.add(node_id="p1", balance=100)
    s.nodes.add(node_id="p2", balance=150)
    c = s.channels.add(src="p1", dst="p2")
    for seq, amount in ((7, 30), (8, 20)):
        c.in_flight.add(msg_id=f"p1:p2:{seq}", amount=amount, seq=seq)
    s.channels.add(src="p2", dst="p1")
    lines = snapshot_table(s)
    assert "  |     p1->p2 (2, seq 7..8): 30, 20  = 50" in lines
    assert "  |   total 300 = balances 250 + in flight 50; expected 300: CONSERVED" in lines
    s.channels[0].in_flight[1].amount = 15  # a recorded 5 short: the controller's total would hide it
    assert ("  |   total 295 = balances 250 + in flight 45; expected 300: VIOLATED "
            "(the controller says total 300, conserved)") in snapshot_table(s)


def test_the_verdict_table_shows_each_complete_snapshots_in_flight_count():
    row = dict(scope="snapshot", status="COMPLETE", consistent=True, nodes_checked=4, channels_checked=12,
               expected_total=4000, observed_total=4000, discrepancies=0, first_discrepancy="")
    rows = [
        dict(row, scope="logs", snapshot_id=None, status="-"),
        dict(row, snapshot_id="s1"),
        dict(row, snapshot_id="s2", status="FAILED", consistent=None, first_discrepancy="skipped: FAILED"),
    ]
    lines = format_table(rows, {"s1": (59, 2887), "s2": (0, 0)}).splitlines()
    head = lines[0].split("  ")
    assert "in flight" in [h.strip() for h in head]
    s1 = next(line for line in lines if line.startswith("s1"))
    assert "ok" in s1 and "59 (2887)" in s1
    s2 = next(line for line in lines if line.startswith("s2"))
    assert "59" not in s2 and " - " in s2


def test_the_demo_names_its_in_flight_snapshot_draws_it_and_screenshots_the_page(tmp_path):
    """`snapmesh demo` itself (the Spark step left out: test_reconcile_* run it), as a process."""
    import re
    import subprocess
    import sys

    from snapmesh.ui.browser import install

    install()  # Debian's chromium + chromedriver, as `make demo` does
    data_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "demo", "--duration", "4.5", "--snapshot-every", "1", "--seed", "24",
         "--skip-reconcile", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=120,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert re.search(r"^ui: http://127\.0\.0\.1:\d+/ ", out, re.M), out[:2000]
    named = re.search(r"^== money in flight: snapshot (\S+) recorded (\d+) transfer\(s\) worth (\d+) ", out, re.M)
    assert named and int(named[2]) > 0, out
    assert f"  +-- snapshot {named[1]} " in out  # its table
    assert f"== restoring snapshot {named[1]} " in out  # the restore delivers its in-flight transfers again
    drawn = re.search(r"^== message flow: .*; snapshot (\S+) with (\d+) in flight\)", out, re.M)
    assert drawn and drawn[1] == named[1] and drawn[2] == named[2], out[-2000:]
    assert "trace.svg" in out and (data_dir / "trace.svg").stat().st_size > 0
    # The picture itself: that snapshot's cut, and an orange arrow for each of its recorded
    # in-flight transfers (the ids in the saved snapshot), no more.
    import json

    svg = (data_dir / "trace.svg").read_text()
    assert f"snapshot {named[1]} chosen" in svg
    # an app's message (the bank is one) has no amount in its tip: the trace reads no app's bytes
    drawn_ids = set(re.findall(r'marker-end="url\(#head-in-flight\)"><title>transfer \S+ (\S+)(?: amount \S+)?</title>', svg))
    saved = json.loads((data_dir / "snapshots" / f"{named[1]}.json").read_text())
    recorded = {t["msg_id"] for c in saved["channels"] for t in c.get("in_flight", [])}
    assert drawn_ids == recorded and len(recorded) == int(named[2]), (drawn_ids, recorded)
    assert svg.count("url(#head-in-flight)\"") == len(recorded)
    for name in ("ui.png", "ui-snapshot.png"):
        assert (data_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    # The page the screenshot shows lists that snapshot's transfers in flight, every one.
    assert (f"== page screenshots: {data_dir / 'ui.png'}, {data_dir / 'ui-snapshot.png'} "
            f"(snapshot {named[1]}: {named[2]} transfer(s) in flight on the page)") in out, out[-2000:]


def test_the_demo_keeps_taking_snapshots_until_one_finds_money_in_flight(tmp_path):
    """No snapshot in the timed part (one every 60 s, 1.5 s of load): only the extra
    snapshots at the end can find money in flight, and one of them must."""
    import re
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "demo", "--duration", "1.5", "--snapshot-every", "60", "--seed", "7",
         "--skip-reconcile", "--data-dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=120,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "no snapshot found money in flight yet: up to 20 more, each with a burst" in out, out
    named = re.search(r"^== money in flight: snapshot (\S+) recorded (\d+) transfer\(s\)", out, re.M)
    assert named and int(named[2]) > 0, out
    tables = re.findall(r"^  \+-- snapshot (\S+) ", out, re.M)
    assert 1 <= len(tables) <= 20 and tables[-1] == named[1], tables  # it stopped at the first that found some
