"""One host of bench/embed_submit.py: a grpc.aio server that embeds a node, driven in process.

    python -m bench.embed_host CLUSTER NODE_ID MODES CALLERS BATCH WARMUP_S SECONDS

Each mode of MODES (comma-separated, CALLERS one count each, in the same order)
is `batch` (each caller `await node.submit_many([("", b"x")] * BATCH)`) or
`unary` (each caller `await node.submit(b"x")`), for the minimal app (a command
sends one message to the next node). Prints `ready` once the node serves; then,
for each mode in turn, waits for a line on stdin (every host starts together),
runs that mode's closed-loop callers for WARMUP_S, counts the commands answered
in the next SECONDS and prints them as one JSON line. Then it closes the node
and exits. The modes share the process and its node, as unary Submit shares the
batches' mesh: starting four more processes cost more than the windows.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc

import snapmesh
from snapmesh.app import Refused

RECEIVE_LIMIT = 5 * 1024 * 1024  # docs/apps.md: a full batch and the channel frames exceed gRPC's default


async def main(cluster: str, node_id: str, modes: list[str], callers: list[int], batch: int, warmup_s: float,
               seconds: float) -> int:
    wrong = [m for m in modes if m not in ("batch", "unary")]
    if wrong or not modes or len(callers) != len(modes):
        print(f"modes {modes!r} with callers {callers!r}: expected batch or unary, one caller count each",
              file=sys.stderr)
        return 2
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", RECEIVE_LIMIT)])
    node = await snapmesh.embed("bench.minimal_app:app", cluster=cluster, node_id=node_id, server=server)
    await server.start()
    print("ready", flush=True)
    for mode, count in zip(modes, callers, strict=True):
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print(json.dumps({"node": node_id, "mode": mode, **await _window(node, mode, count, batch, warmup_s, seconds)}),
              flush=True)
    status = await node.close()
    await server.stop(1)
    return status


async def _window(node, mode: str, callers: int, batch: int, warmup_s: float, seconds: float) -> dict:
    """One mode's callers: warmed up for `warmup_s`, then counted for `seconds`."""
    counted = {"open": False, "commands": 0, "refused": 0}
    stop_at = time.monotonic() + warmup_s + seconds
    items = [("", b"x")] * batch

    async def caller() -> None:
        while time.monotonic() < stop_at:
            if mode == "batch":
                results = await node.submit_many(items)
                refused = sum(1 for r in results if isinstance(r, Refused))
                done = len(results) - refused
            else:
                try:
                    await node.submit(b"x")
                    done, refused = 1, 0
                except Refused:
                    done, refused = 0, 1
            if counted["open"]:
                counted["commands"] += done
                counted["refused"] += refused

    tasks = [asyncio.create_task(caller()) for _ in range(callers)]
    await asyncio.sleep(warmup_s)
    cpu_before, started = time.process_time(), time.monotonic()
    counted["open"] = True
    await asyncio.sleep(seconds)
    counted["open"] = False
    cpu_s, elapsed = time.process_time() - cpu_before, time.monotonic() - started
    await asyncio.gather(*tasks)
    return {"commands": counted["commands"], "refused": counted["refused"], "cpu_s": cpu_s, "elapsed_s": elapsed}


if __name__ == "__main__":
    cluster_file, node_, modes_, callers_, batch_, warmup, window = sys.argv[1:8]
    sys.exit(asyncio.run(main(cluster_file, node_, modes_.split(","), [int(c) for c in callers_.split(",")],
                              int(batch_), float(warmup), float(window))))
