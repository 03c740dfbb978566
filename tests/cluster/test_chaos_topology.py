"""`snapmesh chaos --topology`: a short campaign on a sparse graph loses nothing; bad input is one line.

Replay a failure with the command the run prints, e.g.
`snapmesh chaos --seed 11 --duration 5 --nodes 5 --topology random-regular:2 --no-reconcile`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from snapmesh.chaos import schedule as sched

REPO = Path(__file__).resolve().parents[2]
SEED = 11

pytestmark = pytest.mark.cluster


def _chaos(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapmesh.cli", "chaos", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, says", [
    (["--topology", "random-regular:4"], "on 4 nodes: K must be below N, at most 3"),
    (["--topology", "random-regular:0", "--nodes", "5"], "K must be at least 1"),
    (["--topology", "star"], "unknown topology 'star'"),
    (["--topology", "ring", "--compose"], "--topology is for local processes"),
])
def test_bad_topologies_exit_2_with_one_line(args: list[str], says: str, tmp_path: Path) -> None:
    done = _chaos("--seed", "1", "--dir", str(tmp_path / "run"), *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == "" and not (tmp_path / "run").exists()


@pytest.mark.timeout(600)
def test_a_short_campaign_on_a_random_regular_graph_loses_nothing(tmp_path: Path) -> None:
    """Every fault kind once (the first round runs to its end whatever the duration) on 5 nodes,
    each with 2 channels out and 2 in. Spark's reconciliation is left to the long run."""
    figures_file = tmp_path / "figures.json"
    flags = ["--seed", str(SEED), "--duration", "5", "--nodes", "5", "--topology", "random-regular:2", "--no-reconcile"]
    done = _chaos(*flags, "--dir", str(tmp_path / "run"), "--json", str(figures_file), timeout=540)
    replay = "snapmesh chaos " + " ".join(flags)
    out = done.stdout
    assert done.returncode == 0, f"replay: {replay}\n{out[-4000:]}{done.stderr[-2000:]}"
    assert out.count("\nPASS  ") == 5 and "FAIL  " not in out, out[-3000:]
    assert ", topology random-regular:2, " in out.splitlines()[0]
    channels = tomllib.loads((tmp_path / "run" / "cluster.toml").read_text())["channels"]
    assert len(channels) == 10 and Counter(src for src, _ in channels) == Counter(dst for _, dst in channels)
    figures = json.loads(figures_file.read_text())
    assert figures["money_lost"] == 0 and figures["duplicates"] == 0
    assert figures["snapshots"]["COMPLETE"] > 0 and figures["snapshots"]["IN_PROGRESS"] == 0
    assert set(figures["faults"]) == set(sched.KINDS), figures["faults"]
