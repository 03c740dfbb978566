"""`snapmesh chaos --hosts`: the network faults in the seeded schedule, and one
short real campaign on the multi-host bench (root; CI has it: no skip) that
passes the five checks, shows a row per network fault kind, and leaves
nothing on the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snapmesh.chaos import schedule as sched
from snapmesh.hosts import net, plan

REPO = Path(__file__).resolve().parents[2]
NODES = ["p1", "p2", "p3", "p4", "p5"]
SEED = 23


def test_with_network_the_first_round_has_every_kind_and_the_network_faults_have_their_targets() -> None:
    def take(seed: int, network: bool) -> list[sched.Fault]:
        return list(itertools.islice(sched.faults(seed, NODES, disk_node="p3", network=network), 80))

    first = take(SEED, True)
    assert first == take(SEED, True) and first != take(SEED + 1, True)  # --seed replays it
    kinds = sched.kinds(network=True)
    assert set(kinds) == set(sched.KINDS) | set(plan.KINDS)
    assert {f.kind for f in first[: len(kinds)]} == set(kinds)
    assert not {f.kind for f in take(SEED, False)} & set(plan.KINDS)  # without --hosts: today's kinds only
    for fault in first:
        if fault.kind in (plan.PARTITION, plan.PARTITION_ONE_WAY):
            assert len(set(fault.nodes)) == 2 and fault.hold > 0
        elif fault.kind == plan.SPLIT:
            assert 1 <= len(fault.nodes) < len(NODES) + 1 - len(fault.nodes)  # the controller joins the majority
        elif fault.kind in (plan.ISOLATE, plan.BANDWIDTH, plan.DELAY):
            assert len(fault.nodes) == 1 and fault.hold > 0


def test_hosts_with_compose_or_without_the_tools_exits_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "snapmesh.cli", "chaos", "--hosts", "--compose", "--seed", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "one cluster at a time" in done.stderr, done.stderr
    (tmp_path / "ip").symlink_to(shutil.which("ip"))  # no tc, no iptables
    done = subprocess.run([sys.executable, "-m", "snapmesh.cli", "chaos", "--hosts", "--seed", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["snapmesh chaos: --hosts needs `tc` on PATH (iproute2 and iptables)"]


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_short_campaign_on_hosts_passes_every_check_with_a_row_per_network_fault(tmp_path: Path) -> None:
    assert net.missing_rights() is None, "chaos --hosts needs root, ip, tc and iptables (CI has them)"
    figures_file = tmp_path / "figures.json"
    argv = [sys.executable, "-m", "snapmesh.cli", "chaos", "--hosts", "--seed", str(SEED), "--duration", "10",
            "--nodes", "3", "--no-reconcile", "--dir", str(tmp_path / "run"), "--json", str(figures_file)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=540)
    out = done.stdout
    replay = f"snapmesh chaos --seed {SEED} --duration 10 --nodes 3 --hosts --no-reconcile"
    assert done.returncode == 0, f"replay: {replay}\n{out[-4000:]}{done.stderr[-2000:]}"
    assert out.count("\nPASS  ") == 5 and "FAIL  " not in out, out[-3000:]
    figures = json.loads(figures_file.read_text())
    assert figures["cluster"] == "hosts" and figures["money_lost"] == 0 and figures["duplicates"] == 0
    assert set(plan.KINDS) <= set(figures["faults"]), figures["faults"]
    assert all(r["unrecovered"] == 0 for r in figures["recovery"].values()), figures["recovery"]
    for kind in plan.KINDS:  # a row each in the faults and in the recovery times
        assert len(re.findall(rf"^  {kind} ", out, re.MULTILINE)) == 2, kind
    run_id = re.search(r"on hosts: run (\w+)", out).group(1)
    assert net.leftovers(run_id) == []


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_short_campaign_on_hosts_runs_kvshard_with_every_key_exactly_once(tmp_path: Path) -> None:
    """`--hosts --app kvshard` (refused before issue 46): the nodes on their hosts run
    kvshard, the load is its workload, and every check passes, the settled key count too."""
    assert net.missing_rights() is None, "chaos --hosts needs root, ip, tc and iptables (CI has them)"
    figures_file = tmp_path / "figures.json"
    argv = [sys.executable, "-m", "snapmesh.cli", "chaos", "--hosts", "--app", "kvshard", "--seed", str(SEED),
            "--duration", "10", "--nodes", "3", "--no-reconcile", "--dir", str(tmp_path / "run"),
            "--json", str(figures_file)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=540,
                          env={k: v for k, v in os.environ.items() if k != "SNAPMESH_APP"})
    out = done.stdout
    replay = f"snapmesh chaos --seed {SEED} --duration 10 --nodes 3 --hosts --app kvshard --no-reconcile"
    assert done.returncode == 0, f"replay: {replay}\n{out[-4000:]}{done.stderr[-2000:]}"
    assert "FAIL  " not in out and "\nPASS  once settled, every key exactly once: 0 keys lost or duplicated" in out, \
        out[-3000:]
    assert not [w for w in ("money", "balance", "amount", "conserved") if w in out.lower()], out[-3000:]
    figures = json.loads(figures_file.read_text())
    assert figures["cluster"] == "hosts" and figures["app"] == "kvshard"
    assert set(plan.KINDS) <= set(figures["faults"]), figures["faults"]
    run_id = re.search(r"on hosts: run (\w+)", out).group(1)
    assert net.leftovers(run_id) == []


@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_sigterm_mid_campaign_stops_it_and_leaves_nothing_on_the_machine(tmp_path: Path, signum: int) -> None:
    """Ctrl-C runs the same path (SIGINT); SIGTERM is what a CI job's timeout or `kill` sends."""
    assert net.missing_rights() is None, "chaos --hosts needs root, ip, tc and iptables (CI has them)"
    argv = [sys.executable, "-m", "snapmesh.cli", "chaos", "--hosts", "--seed", str(SEED), "--duration", "60",
            "--nodes", "2", "--no-reconcile", "--dir", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = None
        for line in proc.stdout:
            if found := re.search(r"on hosts: run (\w+)", line):
                run_id = found.group(1)
                break
        assert run_id and net.leftovers(run_id), proc.stderr.read() if proc.poll() is not None else "no run id"
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        time.sleep(3)  # in the schedule
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (out[-2000:], err[-2000:])
    assert f"snapmesh chaos: {signal.Signals(signum).name}: stopped before the checks" in err, err[-2000:]
    assert f"--seed {SEED}" in err and str(tmp_path / "run") in err
    assert "Traceback" not in err
    assert net.leftovers(run_id) == []
    assert len(children) >= 3 and all(not Path(f"/proc/{pid}").exists() for pid in children)
    assert str(tmp_path / "run") not in Path("/proc/mounts").read_text()  # the small disk unmounted
