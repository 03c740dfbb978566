"""Node.Query through the node's servicer, with an in-process engine and a real transfer log.

A query is not logged, and it is answered only once the log holds the steps the
state it read rests on (edge.py E7): a command applied but waiting for its fsync
holds the query back too. A query that sends is FAILED_PRECONDITION and leaves the
app as it was; an app without on_query says UNIMPLEMENTED; a
restore that took the read state back before it was durable makes it ABORTED.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from support.engine_harness import Aborted, ServicerContext, held_node, outcome

from snapmesh.app import App, Context, NodeInfo
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.timeout(60)


class Counter:
    def __init__(self, info: NodeInfo) -> None:
        self.count, self.ctx = 0, None

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        self.count += 1
        self.ctx = ctx
        return str(self.count).encode()

    def on_query(self, query: bytes) -> bytes:
        if query == b"send":
            self.count += 10
            self.ctx.send("p2", b"sneaky")
        return str(self.count).encode()

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        pass

    def snapshot(self) -> bytes:
        return str(self.count).encode()

    def restore(self, state: bytes) -> None:
        self.count = int(state)


class NoQuery(Counter):
    on_query = None


APP = App(name="counter", new=Counter)


def _query(servicer, query: bytes) -> asyncio.Future:
    return asyncio.ensure_future(servicer.Query(pb.QueryRequest(query=query), ServicerContext()))


def test_a_query_waits_for_the_steps_it_read_and_logs_nothing(tmp_path: Path) -> None:
    async def run() -> tuple[object, int, int]:
        engine, log, servicer = await held_node(tmp_path, APP)
        command = asyncio.ensure_future(servicer.Submit(pb.SubmitRequest(command=b"inc"), ServicerContext()))
        await asyncio.sleep(0.02)
        lsn = log.last_lsn
        query = _query(servicer, b"get")
        await asyncio.sleep(0.05)
        assert not query.done(), "the state it read rests on a step not yet durable"
        log.flush_sync()
        answer = await outcome(query)
        await outcome(command)
        read_again = await outcome(_query(servicer, b"get"))  # all durable: no wait
        assert read_again.reply == b"1"
        after = log.last_lsn
        await log.close()
        return answer, lsn, after

    answer, lsn, after = asyncio.run(run())
    assert answer.reply == b"1"
    assert after == lsn, "queries append nothing to the log"


def test_a_query_that_sends_is_refused_and_the_app_put_back(tmp_path: Path) -> None:
    async def run() -> list[object]:
        engine, log, servicer = await held_node(tmp_path, APP)
        command = asyncio.ensure_future(servicer.Submit(pb.SubmitRequest(command=b"inc"), ServicerContext()))
        await asyncio.sleep(0.02)
        log.flush_sync()
        await outcome(command)
        answers = [await outcome(_query(servicer, b"send")), await outcome(_query(servicer, b"get"))]
        await log.close()
        return answers

    refused, read = asyncio.run(run())
    assert isinstance(refused, Aborted) and refused.code is grpc.StatusCode.FAILED_PRECONDITION, refused
    assert "must not send" in refused.details
    assert read.reply == b"1", "the change the query made is gone, and nothing was sent"


def test_an_app_without_on_query_is_unimplemented(tmp_path: Path) -> None:
    async def run() -> object:
        engine, log, servicer = await held_node(tmp_path, App(name="noquery", new=NoQuery))
        answer = await outcome(_query(servicer, b"get"))
        await log.close()
        return answer

    answer = asyncio.run(run())
    assert isinstance(answer, Aborted) and answer.code is grpc.StatusCode.UNIMPLEMENTED, answer
    assert "has no on_query" in answer.details


def test_a_query_of_a_state_a_restore_took_back_is_aborted(tmp_path: Path) -> None:
    async def run() -> object:
        engine, log, servicer = await held_node(tmp_path, APP)
        engine.start_snapshot("s1")
        log.flush_sync()
        command = asyncio.ensure_future(servicer.Submit(pb.SubmitRequest(command=b"inc"), ServicerContext()))
        await asyncio.sleep(0.02)
        query = _query(servicer, b"get")  # reads count 1, not yet durable
        await asyncio.sleep(0.02)
        engine.restore("s1", 2, [], state=b"0")  # s1's cut is before the command
        log.flush_sync()
        await outcome(command)
        try:
            return await outcome(query)
        finally:
            await log.close()

    answer = asyncio.run(run())
    assert isinstance(answer, Aborted) and answer.code is grpc.StatusCode.ABORTED, answer
    assert "restore of snapshot s1" in answer.details
