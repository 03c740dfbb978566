"""The bench smoke lane: every bench of `python -m bench`, at tiny sizes (`--smoke`,
bench/smoke.py), so that a bench cannot rot unseen. `make test` (CI's `.ci/run`)
runs it; `pytest -m bench` runs it alone.

Each bench runs as a user runs it, in a process of its own: it must exit 0, leave
bench/results.json as it was (a tiny run's figures are no figures), and leave no
process behind. Every process a bench starts (nodes, controllers, load
generators, Spark's JVMs) inherits its environment, so a variable set for the run
finds them all in /proc afterwards; one still running holds its ports too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bench import hop_split
from bench.__main__ import BENCHMARKS
from bench.utilisation import TARGETS, util_suffix
from support.polling import WaitTimedOut, wait_for

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results.json"
TAG = "SNAPMESH_BENCH_SMOKE_RUN"  # set for one bench's run: every process it starts carries it
# On this shared 2-core machine, under other tenants' load, a bench's smoke takes 2-60 s (the
# Spark one most); the timeout is for a bench that hangs, not a slow one.
TIMEOUT_S = 420

pytestmark = [pytest.mark.bench]

# Figures a smoke run must print (it writes none): the path after the cut, hop by hop, of the
# utilisation phase's one smoke variant (bench.hop_split), each a finite time.
# The bank pair's ratios (bench.bank_pair), each a positive number.
PRINTED = {
    "overtake": [f"{k}_8n_{util_suffix(t)}_overtake" for t in TARGETS for k in hop_split.FIGURES],
    "bank_pair": ["bank_generic_over_native_rate_4n", "bank_generic_over_native_cpu_4n"],
    # embed's in-process submit beside the RPCs, and each rate over one raw batched stream's
    "submit_batch": ["embed_submit_many_rate_4n_minimal", "embed_cpu_us_per_command_4n_minimal",
                     "embed_submit_rate_4n_minimal", "submit_batch_rate_4n_minimal_over_raw_batched",
                     "embed_submit_many_rate_4n_minimal_over_raw_batched"],
    # bench state's two apps, each with its controller's peak memory, its bound and its restore's bytes.
    "state": [f"state_{app}{k}_0_25mib" for app in ("", "kv_") for k in
              ("sent_fraction", "controller_peak_rss_mib", "controller_rss_bound_mib", "restore_received_bytes")],
}


def tagged(tag: str) -> list[int]:
    """The processes whose environment holds TAG=tag (others' processes, unreadable, are not ours)."""
    wanted = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def left_behind(tag: str, grace_s: float = 10.0) -> list[str]:
    """The tagged processes still running after `grace_s` (children may be exiting), each
    killed so that one failure leaves nothing on the machine; their command lines."""
    try:
        pids = wait_for(lambda: tagged(tag), timeout=grace_s, interval=0.2, until=lambda found: not found)
    except WaitTimedOut:
        pids = tagged(tag)
    lines = []
    for pid in pids:
        try:
            lines.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return lines


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.spark] if n == "reconcile" else []) for n in BENCHMARKS])
def test_every_bench_runs_at_smoke_size_writes_no_figures_and_leaves_no_process(name: str) -> None:
    before = RESULTS.read_bytes()
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "BENCH_SMOKE"}  # `--smoke` itself must set it
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "bench", "--smoke", name], cwd=REPO, capture_output=True,
                              text=True, timeout=TIMEOUT_S, env=dict(env, **{TAG: tag}))
    finally:
        stray = left_behind(tag)
    took = time.monotonic() - started
    print(f"bench {name}: smoke in {took:.1f}s")
    assert done.returncode == 0, f"bench {name} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert f"=== bench {name} ===" in done.stdout
    printed = dict(re.findall(r"^(\w+)\s+([-\d,.]+|nan)$", done.stdout, re.MULTILINE))
    for key in PRINTED.get(name, ()):
        assert key in printed and float(printed[key].replace(",", "")) > 0, f"bench {name}: {key} {printed.get(key)}"
    assert RESULTS.read_bytes() == before, f"bench {name}'s smoke run wrote bench/results.json"
    assert not stray, f"bench {name} left processes running:\n" + "\n".join(stray)


def test_a_process_left_behind_is_found_and_ended() -> None:
    """The check above can fail: a tagged child still running is named, then ended."""
    tag = uuid.uuid4().hex
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ, **{TAG: tag}))
    try:
        stray = left_behind(tag, grace_s=0.5)
        assert len(stray) == 1 and stray[0].startswith(f"{child.pid}: ")
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert left_behind(tag, grace_s=0) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
