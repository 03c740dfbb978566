"""The request-id window through the node's gRPC servicer (in-process engine, a real
transfer log; snapmesh/protocol/node/requests.py W2, W5, W6).

- The same request_id with another Transfer, another TransferBatch item,
  another Submit or another SubmitBatch item is INVALID_ARGUMENT naming the
  id, and nothing is paid or run; the identical retry still gets the first
  answer.
- A Submit (or SubmitBatch item) replayed after a restore moved the node to
  epoch 2 answers epoch 1, the one its command ran in (the proto's "the
  node's epoch when it ran the command").
- The gauge snapmesh_request_window_bytes shows the bytes the window holds.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from support.engine_harness import Aborted, ServicerContext, held_node, outcome

from snapmesh.services.app import bank, kvshard
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.timeout(60)


async def _answer(call, log) -> object:
    """The servicer call's answer once the log is flushed (the harness holds it back)."""
    task = asyncio.ensure_future(call)
    await asyncio.sleep(0.01)
    log.flush_sync()
    return await outcome(task)


async def _transfers(tmp_path: Path) -> None:
    engine, log, servicer = await held_node(tmp_path, bank.app, {"initial_balance": 100})  # its v1 edge
    gauge = lambda: engine.metrics.registry.get_sample_value("snapmesh_request_window_bytes", {"node": "p1"})  # noqa: E731
    try:
        first = await _answer(servicer.Transfer(pb.TransferRequest(to="p2", amount=10, request_id="order-17"),
                                                ServicerContext()), log)
        assert first.balance == 90
        other = await _answer(servicer.Transfer(pb.TransferRequest(to="p2", amount=500, request_id="order-17"),
                                                ServicerContext()), log)
        assert isinstance(other, Aborted) and other.code is grpc.StatusCode.INVALID_ARGUMENT, other
        assert "'order-17'" in other.details
        batch = pb.TransferBatchRequest(transfers=[pb.TransferRequest(to="p2", amount=11, request_id="order-17")])
        [item] = (await _answer(servicer.TransferBatch(batch, ServicerContext()), log)).results
        assert item.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "'order-17'" in item.message
        assert engine.node.app_state() == b"90", "a request under a used id was paid"
        retry = await _answer(servicer.Transfer(pb.TransferRequest(to="p2", amount=10, request_id="order-17"),
                                                ServicerContext()), log)
        assert (retry.msg_id, retry.balance) == (first.msg_id, 90)
        assert gauge() == engine.node.request_window_bytes > 0  # one id, its msg id and digest
    finally:
        await log.close()


def test_the_same_id_for_another_transfer_is_invalid_argument_and_the_gauge_shows_the_window(tmp_path: Path) -> None:
    asyncio.run(_transfers(tmp_path))


async def _submits(tmp_path: Path) -> None:
    engine, log, servicer = await held_node(tmp_path, app=kvshard.app)
    put = json.dumps({"op": "put", "key": "p1/a", "value": 1}).encode()
    try:
        first = await _answer(servicer.Submit(pb.SubmitRequest(command=put, request_id="c-1"), ServicerContext()), log)
        assert (first.replayed, first.epoch) == (False, 1)
        state = engine.node.app_state()
        engine.start_snapshot("s1")  # its cut holds c-1: the restore keeps it
        log.flush_sync()
        engine.restore("s1", 2, [], state)
        log.flush_sync()
        assert engine.node.epoch == 2
        again = await _answer(servicer.Submit(pb.SubmitRequest(command=put, request_id="c-1"), ServicerContext()), log)
        assert again.replayed and again.reply == first.reply
        assert again.epoch == 1, "a replayed Submit answered the node's epoch now, not the one it ran in"
        other = json.dumps({"op": "put", "key": "p1/a", "value": 2}).encode()
        refused = await _answer(servicer.Submit(pb.SubmitRequest(command=other, request_id="c-1"), ServicerContext()), log)
        assert isinstance(refused, Aborted) and refused.code is grpc.StatusCode.INVALID_ARGUMENT, refused
        assert "'c-1'" in refused.details
        batch = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=put, request_id="c-1"),
                                             pb.SubmitRequest(command=b"{}", request_id="c-9")])
        replayed, _ = (await _answer(servicer.SubmitBatch(batch, ServicerContext()), log)).results
        assert (replayed.code, replayed.replayed, replayed.epoch) == (0, True, 1), replayed
        batch = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=other, request_id="c-1")])
        [item] = (await _answer(servicer.SubmitBatch(batch, ServicerContext()), log)).results
        assert item.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "'c-1'" in item.message
        get = json.dumps({"op": "get", "key": "p1/a"}).encode()
        value = await _answer(servicer.Submit(pb.SubmitRequest(command=get), ServicerContext()), log)
        assert json.loads(value.reply)["value"] == 1, "the other command ran"
    finally:
        await log.close()


def test_a_replayed_submit_answers_its_epoch_and_another_command_is_invalid_argument(tmp_path: Path) -> None:
    asyncio.run(_submits(tmp_path))
