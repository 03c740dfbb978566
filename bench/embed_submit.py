"""embed's in-process submit on a 4-node mesh of the minimal app (part of `python -m bench submit_batch`).

Four processes (bench/embed_host.py), each a grpc.aio server that embeds a node
(`snapmesh.embed`) and drives it in process: no client RPC, only the node's own
channels to its peers; the same four serve the batches, then unary. Batches:
`callers` tasks in all (a quarter on each node), each `await node.submit_many`
of `batch` commands; unary: UNARY_CALLERS tasks in all, each `await
node.submit`. Figures, summed over the four hosts in one window after a warm-up:
  - the commands answered per second;
  - the whole machine's busy CPU per command (as `cpu_us_per_command_4n_<app>`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.grpc_raw import UNARY_CALLERS
from bench.observe import machine_busy_s
from snapmesh.settings.config import write_cluster

NODES = 4
READY_TIMEOUT_S = 60.0


def measure(modes: tuple[str, ...], *, callers: int, batch: int, warmup_s: float, seconds: float
            ) -> dict[str, dict[str, float]]:
    """Each of `modes` in turn on one mesh of four hosts: "batch" (`callers` in all, `batch`
    commands a call) or "unary" (UNARY_CALLERS in all), a quarter of them on each node, as
    SubmitBatch's and Submit's callers spread over the four; the figures by mode."""
    per_node = [max(1, (callers if mode == "batch" else UNARY_CALLERS) // NODES) for mode in modes]
    figures: dict[str, list[dict]] = {}
    busy: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        root = Path(tmp)
        path = write_cluster(root / "cluster.toml", nodes=NODES, topology="mesh", data_dir=root / "data")
        path.write_text(path.read_text() + '\n[app]\nmodule = "bench.minimal_app:app"\n')
        logs = [(root / f"p{i}.stderr").open("w") for i in range(1, NODES + 1)]  # a host's words, named if it fails
        hosts = [subprocess.Popen(
            [sys.executable, "-m", "bench.embed_host", str(path), f"p{i}", ",".join(modes),
             ",".join(map(str, per_node)), str(batch), str(warmup_s), str(seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[i - 1], text=True, env=os.environ.copy(),
        ) for i in range(1, NODES + 1)]
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            for host in hosts:
                line = host.stdout.readline().strip()
                if line != "ready" or time.monotonic() > deadline:
                    said = Path(logs[hosts.index(host)].name).read_text()[-2000:]
                    raise RuntimeError(f"embed host {host.args[4]} did not start (said {line!r}, exit {host.poll()}):\n"
                                       f"{said}")
            for mode in modes:
                for host in hosts:
                    host.stdin.write("go\n")
                    host.stdin.flush()
                time.sleep(warmup_s)
                busy_before = machine_busy_s()
                time.sleep(seconds)
                busy[mode] = machine_busy_s() - busy_before
                figures[mode] = [json.loads(host.stdout.readline()) for host in hosts]
            for host in hosts:
                host.wait(timeout=60)
        finally:
            for host in hosts:
                if host.poll() is None:
                    host.kill()
                    host.wait()
            for log in logs:
                log.close()
    return {mode: _figures(figures[mode], busy[mode]) for mode in modes}


def _figures(figures: list[dict], busy_s: float) -> dict[str, float]:
    commands = sum(f["commands"] for f in figures)
    elapsed = max(f["elapsed_s"] for f in figures)
    return {
        "rate": commands / elapsed,
        "cpu_us_per_command": busy_s / max(commands, 1) * 1e6,
        "hosts_cpu_us_per_command": sum(f["cpu_s"] for f in figures) / max(commands, 1) * 1e6,
        "refused": float(sum(f["refused"] for f in figures)),
    }
