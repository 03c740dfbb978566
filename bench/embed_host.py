"""One host of bench/embed_submit.py: a grpc.aio server that embeds a node, driven in process.

    python -m bench.embed_host CLUSTER NODE_ID MODE CALLERS BATCH WARMUP_S SECONDS

MODE is `batch` (each caller `await node.submit_many([("", b"x")] * BATCH)`) or
`unary` (each caller `await node.submit(b"x")`), for the minimal app (a command
sends one message to the next node). Prints `ready` once the node serves, waits
for a line on stdin (every host starts together), runs its CALLERS closed-loop
callers for WARMUP_S, then counts the commands answered in the next SECONDS,
prints them as one JSON line, closes the node and exits.
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


async def main(cluster: str, node_id: str, mode: str, callers: int, batch: int, warmup_s: float, seconds: float) -> int:
    if mode not in ("batch", "unary"):
        print(f"mode {mode!r}: expected batch or unary", file=sys.stderr)
        return 2
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", RECEIVE_LIMIT)])
    node = await snapmesh.embed("bench.minimal_app:app", cluster=cluster, node_id=node_id, server=server)
    await server.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
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
    print(json.dumps({"node": node_id, "commands": counted["commands"], "refused": counted["refused"],
                      "cpu_s": cpu_s, "elapsed_s": elapsed}), flush=True)
    status = await node.close()
    await server.stop(1)
    return status


if __name__ == "__main__":
    cluster_file, node, mode_, callers_, batch_, warmup, window = sys.argv[1:8]
    sys.exit(asyncio.run(main(cluster_file, node, mode_, int(callers_), int(batch_), float(warmup), float(window))))
