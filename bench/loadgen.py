"""The bench's load generator, in a process of its own: `python -m bench.loadgen`.

It is the project's one load generator (`snapmesh.load.generator.LoadGenerator`)
with the bank app's workload (transfers of 1..MAX_AMOUNT), run without tallying:
it sends pre-serialized SubmitBatch calls and does not parse the answers, so it
stays cheap beside the nodes it loads. `LoadGen` is the parent's handle;
the two talk over the child's stdin and stdout:

    first line    {"batch": B, "seed": S, "nodes": {id: {"address": A, "neighbours": [...]}}}
    then          {"callers": C, "rate": R}   C callers per node, R transfers/s in all
                                              (0: as fast as answers come back) -> "ok"
                  "stats"                     -> one JSON line: calls, errors, last_error
    EOF           exit (so it also goes when the parent dies)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from snapmesh.load.generator import LoadGenerator
from snapmesh.processes.supervisor import Cluster
from snapmesh.services.app import bank
from snapmesh.services.app.drive import node_infos

MAX_AMOUNT = 100


async def serve(spec: dict) -> None:
    """The child process: the generator, reconfigured by the lines on stdin."""
    loop = asyncio.get_running_loop()
    nodes = spec["nodes"]
    channels = [(n, to) for n, node in nodes.items() for to in node["neighbours"]]
    generator = LoadGenerator(
        bank.app,
        {n: node["address"] for n, node in nodes.items()},
        node_infos(list(nodes), channels, {"max_amount": MAX_AMOUNT}),
        batch=spec["batch"],
        seed=spec.get("seed", 1),
        exactly_once=False,
    )
    async with generator:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            line = line.strip()
            if line == "stats":
                stats = generator.stats
                print(json.dumps({"calls": stats.calls, "errors": stats.errors, "last_error": stats.last_error}),
                      flush=True)
                continue
            command = json.loads(line)
            callers, rate = command["callers"], command.get("rate", 0)
            # One caller's seconds between calls, so that all of them together make `rate`.
            interval = spec["batch"] * callers * len(nodes) / rate if rate else 0.0
            await generator.set(callers, interval)
            print("ok", flush=True)


class LoadGen:
    """The parent's handle on the load generator process."""

    def __init__(self, cluster: Cluster, *, batch: int, seed: int = 1) -> None:
        topology = cluster.config.topology
        spec = {
            "batch": batch,
            "seed": seed,
            "nodes": {
                n: {"address": cluster.node_address(n), "neighbours": sorted(topology.outgoing(n))}
                for n in topology.nodes
            },
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._send(json.dumps(spec), expect=None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, line: str, expect: str | None = "ok") -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if expect is None:
            return ""
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the load generator exited")
        return answer.strip()

    def set(self, callers: int, rate: float = 0.0) -> None:
        self._send(json.dumps({"callers": callers, "rate": rate}))

    def stats(self) -> dict:
        return json.loads(self._send("stats", expect="json"))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    asyncio.run(serve(json.loads(sys.stdin.readline())))
