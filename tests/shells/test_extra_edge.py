"""An app's extra edge (services/node/extra_edge.py X1, X2): the node's service answers the
RPCs an app names an adapter for, loaded by its "module:attr" name, and refuses them as
it always has when none does. Any app may name one; the bank's v1 calls are one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from support.counter_app import Counter
from support.engine_harness import Aborted, ServicerContext, held_node, outcome

from snapmesh.app import App, AppError
from snapmesh.v1 import snapmesh_pb2 as pb


class CountingEdge:
    """A user's own adapter: `Transfer` as a Submit of its own command, `GetState` its own words."""

    def __init__(self, engine, edge) -> None:
        self.engine, self.edge = engine, edge

    async def Transfer(self, request, context):
        reply = await self.edge.submit(b"inc", request_id=request.request_id)
        return pb.TransferResponse(msg_id=f"count {reply.reply.decode()}")

    async def GetState(self, request, context):
        return pb.NodeStateResponse(node_id=self.engine.node_id, app="counted")


def _raises(engine, edge):
    raise RuntimeError("no licence")


COUNTING = App(name="counting", new=Counter, edge=f"{__name__}:CountingEdge")
PLAIN = App(name="plain", new=Counter)


def test_an_app_names_its_edge_and_the_node_answers_through_it(tmp_path: Path) -> None:
    async def run() -> tuple[object, object, object]:
        engine, log, servicer = await held_node(tmp_path, COUNTING)
        call = asyncio.ensure_future(servicer.Transfer(pb.TransferRequest(to="p2", amount=5, request_id="r"),
                                                       ServicerContext()))
        await asyncio.sleep(0.01)
        log.flush_sync()
        one = await outcome(call)
        state = await outcome(servicer.GetState(pb.GetStateRequest(), ServicerContext()))
        batch = await outcome(servicer.TransferBatch(pb.TransferBatchRequest(
            transfers=[pb.TransferRequest(to="p2", amount=5)]), ServicerContext()))  # not one it answers: X2
        await log.close()
        return one, state, batch

    one, state, batch = asyncio.run(run())
    assert one.msg_id == "count 1", one
    assert (state.node_id, state.app) == ("p1", "counted")
    [item] = batch.results
    assert item.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "runs app 'counting'" in item.message


def test_without_an_edge_the_v1_calls_are_refused_as_they_always_were(tmp_path: Path) -> None:
    async def run() -> tuple[object, object, object, object]:
        engine, log, servicer = await held_node(tmp_path, PLAIN)
        one = await outcome(servicer.Transfer(pb.TransferRequest(to="p2", amount=5), ServicerContext()))
        empty = await outcome(servicer.TransferBatch(pb.TransferBatchRequest(), ServicerContext()))
        over = await outcome(servicer.TransferBatch(pb.TransferBatchRequest(
            transfers=[pb.TransferRequest(to="p2", amount=1)] * 10_001), ServicerContext()))
        state = servicer.GetState(pb.GetStateRequest(), ServicerContext())
        task = asyncio.ensure_future(state)
        await asyncio.sleep(0.01)
        log.flush_sync()
        got = await outcome(task)
        await log.close()
        return one, empty, over, got

    one, empty, over, state = asyncio.run(run())
    assert isinstance(one, Aborted) and one.code is grpc.StatusCode.INVALID_ARGUMENT
    assert one.details == "p1 runs app 'plain', whose edge answers no transfers: use Submit"
    assert not empty.results
    assert isinstance(over, Aborted) and over.code is grpc.StatusCode.INVALID_ARGUMENT and "at most 10000" in over.details
    assert state.app == "plain:app" and state.app_state_bytes == 1  # the node's own answer: b"0"


@pytest.mark.parametrize("spec, words", [
    ("nowhere_at_all:Edge", "No module named 'nowhere_at_all'"),
    (f"{__name__}:Missing", "has no attribute 'Missing'"),
    (f"{__name__}:_raises", "RuntimeError: no licence"),
])
def test_an_edge_that_does_not_load_stops_the_node_in_one_line(tmp_path: Path, spec: str, words: str) -> None:
    app = App(name="broken", new=Counter, edge=spec)
    with pytest.raises(AppError) as raised:
        asyncio.run(held_node(tmp_path, app))
    assert str(raised.value).startswith(f"app 'broken': its edge {spec!r} does not load: ") and words in str(raised.value)


@pytest.mark.parametrize("edge", ["no_colon", 3, ""])
def test_an_app_edge_is_module_attr_or_none(edge: object) -> None:
    with pytest.raises(AppError, match="edge must be"):
        App(name="x", new=Counter, edge=edge)  # type: ignore[arg-type]
