"""A large TransferBatch does not starve the node's event loop.

Two real nodes serve gRPC in this test's event loop. A watcher task on the same
loop reads, at every turn it gets, how many records p1 has logged; a real gRPC
client sends one TransferBatch of MAX_BATCH transfers. Without yielding, the
whole batch is applied between two turns of the watcher; with it, at most
COMMANDS_PER_STEP transfers are (the bank app's v1 adapter hands the batch to the
node's edge, snapmesh/bank/edge.py, which yields between its steps). Counting turns, not timing them, makes this
independent of how busy the machine is.
"""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest

from snapmesh.services.node import embedded as node_embedded
from snapmesh.services.node import process as node_main
from snapmesh.services.node import edge as node_edge
from snapmesh.services.node import servicer as node_servicer
from snapmesh.services.node import translog
from snapmesh.settings import config as cluster_config
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.node_harness import cluster_file

BATCH = node_servicer.MAX_BATCH


async def _largest_step(cfg: cluster_config.ClusterConfig, monkeypatch) -> tuple[int, int, list[int]]:
    """(the most records p1 logged between two turns of the loop, the records the
    batch added, the batch's result codes)."""
    engines = {}
    real_servicer = node_embedded.NodeServicer

    def capturing(engine, *rest):
        engines[engine.node_id] = engine
        return real_servicer(engine, *rest)

    stop = asyncio.get_running_loop().create_future()

    async def until_stopped():
        return await stop

    monkeypatch.setattr(node_embedded, "NodeServicer", capturing)
    monkeypatch.setattr(node_main, "wait_for_stop_signal", until_stopped)
    servers = [asyncio.create_task(node_main.serve(cfg, n)) for n in ("p1", "p2")]
    try:
        for _ in range(600):  # both engines exist (the call below waits for the port)
            if len(engines) == 2:
                break
            if any(s.done() for s in servers):
                raise AssertionError(f"a node stopped at start-up: {[s.result() for s in servers if s.done()]}")
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the nodes did not come up within 30 s")
        node = engines["p1"].node
        largest = 0
        sending = True

        async def watch():
            nonlocal largest
            while sending:
                before = node.last_lsn
                await asyncio.sleep(0)
                largest = max(largest, node.last_lsn - before)

        watcher = asyncio.create_task(watch())
        first = node.last_lsn
        async with grpc.aio.insecure_channel(cfg.node("p1").address, options=CLIENT_OPTIONS) as channel:
            request = pb.TransferBatchRequest(transfers=[pb.TransferRequest(to="p2", amount=1)] * BATCH)
            response = await pb_grpc.NodeStub(channel).TransferBatch(request, timeout=60, wait_for_ready=True)
        sending = False
        await watcher
        return largest, node.last_lsn - first, [r.code for r in response.results]
    finally:
        if not stop.done():
            stop.set_result(signal.SIGTERM)
        codes = await asyncio.gather(*servers, return_exceptions=True)
        assert codes == [0, 0], codes


def _config(tmp_path) -> cluster_config.ClusterConfig:
    path, _ = cluster_file(tmp_path, ["p1", "p2"], balance=10 * BATCH, settings={"channel_bound": 4 * BATCH})
    return cluster_config.load(path)


def test_a_full_batch_hands_the_loop_back_every_step_of_transfers(tmp_path, monkeypatch):
    pending = []  # each hand-back tells the log a writer is pending (group commit waits a turn for it)
    real = translog.TransferLog.writer_pending

    def counting(log):
        pending.append(log.node_id)
        return real(log)

    monkeypatch.setattr(translog.TransferLog, "writer_pending", counting)
    largest, added, codes = asyncio.run(_largest_step(_config(tmp_path), monkeypatch))
    assert codes == [0] * BATCH
    assert pending == ["p1"] * (BATCH // node_edge.COMMANDS_PER_STEP - 1)
    assert added >= BATCH  # every transfer was logged: its send, which carries its command (acks may add a few)
    # One record a transfer; 50: what other turns may log meanwhile (acks).
    assert 0 < largest <= node_edge.COMMANDS_PER_STEP + 50, largest


@pytest.mark.parametrize("every", [2 * BATCH])
def test_the_watcher_sees_a_whole_batch_at_once_when_nothing_yields(tmp_path, monkeypatch, every):
    """The measuring method itself: a batch applied in one step shows as one jump."""
    monkeypatch.setattr(node_edge, "COMMANDS_PER_STEP", every)
    largest, added, codes = asyncio.run(_largest_step(_config(tmp_path), monkeypatch))
    assert codes == [0] * BATCH
    assert largest >= BATCH, largest
