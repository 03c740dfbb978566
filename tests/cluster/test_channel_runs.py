"""Channel frames between real nodes of the bank app (a cluster file without [app]).

- Its transfers cross as payload runs (ChannelBatch.payload_runs) only to a
  receiver whose acks say `accepts_payload_runs`, one message each otherwise.
- A run of native numbers (ChannelBatch.runs: what the bank's former native nodes
  sent) ends the stream FAILED_PRECONDITION, a protocol violation, before
  anything of it applies: a node reads an app's messages only.
"""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest

from snapmesh.services.node import embedded as node_embedded
from snapmesh.services.node import process as node_main
from snapmesh.services.node.engine import Engine
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings import config as cluster_config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.node_harness import cluster_file

pytestmark = pytest.mark.timeout(120)

# ------------------------------------------------------ real gRPC, two real nodes


async def _nodes(cfg: cluster_config.ClusterConfig, monkeypatch, ids: tuple[str, ...], old_receivers=()):
    """Start nodes `ids` in this loop; returns (engines, stop)."""
    engines: dict[str, Engine] = {}
    real_servicer = node_embedded.NodeServicer

    def capturing(engine, *rest):
        engines[engine.node_id] = engine
        servicer = real_servicer(engine, *rest)
        servicer.accepts_payload_runs = engine.node_id not in old_receivers
        return servicer

    stop = asyncio.get_running_loop().create_future()

    async def until_stopped():
        return await stop

    monkeypatch.setattr(node_embedded, "NodeServicer", capturing)
    monkeypatch.setattr(node_main, "wait_for_stop_signal", until_stopped)
    servers = [asyncio.create_task(node_main.serve(cfg, n)) for n in ids]
    for _ in range(600):
        if len(engines) == len(ids):
            break
        assert not any(s.done() for s in servers), [s.result() for s in servers if s.done()]
        await asyncio.sleep(0.05)

    async def stopping() -> None:
        stop.set_result(signal.SIGTERM)
        assert await asyncio.gather(*servers) == [0] * len(ids)

    return engines, stopping


def _config(tmp_path) -> cluster_config.ClusterConfig:
    path, _ = cluster_file(tmp_path, ["p1", "p2"], balance=10_000)
    return cluster_config.load(path)


@pytest.mark.parametrize("old_receiver", [False, True])
def test_the_banks_transfers_cross_in_payload_runs_only_to_a_receiver_that_accepts_them(
    tmp_path, monkeypatch, old_receiver: bool
) -> None:
    async def go() -> None:
        engines, stopping = await _nodes(_config(tmp_path), monkeypatch, ("p1", "p2"), ("p2",) if old_receiver else ())
        p2 = engines["p2"]
        try:
            async with grpc.aio.insecure_channel(_address(tmp_path, "p1"), options=CLIENT_OPTIONS) as channel:
                stub = pb_grpc.NodeStub(channel)
                request = pb.TransferBatchRequest(transfers=[pb.TransferRequest(to="p2", amount=2)] * 300)
                response = await stub.TransferBatch(request, timeout=30, wait_for_ready=True)
                assert [r.code for r in response.results] == [0] * 300
            for _ in range(400):
                if p2.node.messages_received == 300:
                    break
                await asyncio.sleep(0.05)
            assert p2.node.messages_received == 300 and p2.node.app_state() == b"10600"
            in_runs = p2.metrics.payload_run_messages("p1")._value.get()
            assert in_runs == (0 if old_receiver else 300)
        finally:
            await stopping()

    asyncio.run(go())


def _address(tmp_path, node_id: str) -> str:
    return cluster_config.load(tmp_path / "cluster.toml").node(node_id).address


async def _raw(
    address: str, frames: list[pb.ChannelFrame], until: int | None = None
) -> tuple[list[pb.ChannelAck], grpc.StatusCode | None, str]:
    """A raw Channel stream: write `frames`, read acks until the stream ends
    (its status) or one acknowledges `until` (status None: the stream was fine)."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.NodeStub(channel).Channel(timeout=20)
        acks = []
        try:
            # As a real sender: the batches after the resume point (an abort while the
            # node still writes that ack fails in gRPC itself, TOO_MANY_OPERATIONS).
            await call.write(frames[0])
            acks.append(await call.read())
            for frame in frames[1:]:
                await call.write(frame)
            while (ack := await call.read()) is not grpc.aio.EOF:
                acks.append(ack)
                if until is not None and ack.acked_seq >= until:
                    call.cancel()
                    return acks, None, ""
        except grpc.aio.AioRpcError as error:
            return acks, error.code(), error.details()
        return acks, grpc.StatusCode.OK, ""


def test_a_native_run_of_transfers_into_a_bank_app_node_is_a_protocol_violation(tmp_path, monkeypatch) -> None:
    """Only p2 runs: p1's channel into it stays quiet while this test impersonates p1."""

    async def go() -> None:
        engines, stopping = await _nodes(_config(tmp_path), monkeypatch, ("p2",))
        address = _address(tmp_path, "p2")
        opening = pb.ChannelFrame(open=pb.ChannelOpen(src="p1", dst="p2"))
        try:
            node = engines["p2"].node
            frame = pb.ChannelFrame(batch=pb.ChannelBatch(runs=[pb.TransferRun(first_seq=1, amounts=[5, 6])]))
            acks, code, details = await _raw(address, [opening, frame])
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "runs of numbers, not an app's messages" in details, details
            assert node.receivers["p1"].last_seq == 0 and node.app_state() == b"10000"
        finally:
            await stopping()

    asyncio.run(go())
