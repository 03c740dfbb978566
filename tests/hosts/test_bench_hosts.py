"""The phase on hosts of `python -m bench cluster` (bench/hosts.py), as a short smoke:
8 nodes, one host each, 5 ms one way on every link, a few snapshots in one mode.
Root, `ip`, `tc`, `iptables` (CI has them: no skip). The figures themselves come
from `make bench BENCH=cluster`; this checks the phase runs, measures the delayed
links at what they are set to, names its keys as the issue does and, with
`--no-write`, leaves bench/results.json alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.hosts import net

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_the_phase_on_hosts_measures_the_round_trip_and_snapshots_under_the_issues_keys() -> None:
    assert net.missing_rights() is None, "bench.hosts needs root, ip, tc and iptables (CI has them)"
    results = (REPO / "bench" / "results.json").read_bytes()
    done = subprocess.run([sys.executable, "-m", "bench.hosts", "--peak", "4000", "--snapshots", "3", "--modes",
                           "classic", "--no-write"], cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = {m.group(1): float(m.group(2).replace(",", ""))
               for m in re.finditer(r"^(\w+)\s+([\d,.]+|nan)$", done.stdout, re.MULTILINE)}
    for key in ("host_rtt_ms_5ms", "snapshot_p50_ms_8n_hosts_5ms", "snapshot_p99_ms_8n_hosts_5ms"):
        assert key in figures and f"{key}_classic" in figures, (key, done.stdout)
    assert 8.0 <= figures["host_rtt_ms_5ms"] <= 12.0, figures  # two delayed links: 2 x 5 ms, within 20%
    assert figures["snapshots_not_complete_8n_hosts_5ms_classic"] == 0, done.stderr[-2000:]
    assert 2 * figures["host_rtt_ms_5ms"] <= figures["snapshot_p50_ms_8n_hosts_5ms"]  # at least two round trips
    assert figures["snapshot_p50_ms_8n_hosts_5ms"] <= figures["snapshot_p99_ms_8n_hosts_5ms"]
    assert "left behind" not in done.stderr
    run_ids = re.findall(r"\(run (\w+)\)", done.stderr)
    assert run_ids and all(net.leftovers(r) == [] for r in run_ids)
    assert (REPO / "bench" / "results.json").read_bytes() == results
