"""The load generator against a fake node in this process: it sends the app's workload through
SubmitBatch, retries a busy node under the same request ids (each command runs once), counts
refusals by status, gives up on a node that never answers, and without exactly_once sends pooled calls
with no request ids. The fake keeps an exactly-once window, as a node's edge does."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import grpc
import pytest

from snapmesh.load.background import BackgroundLoad
from snapmesh.load.generator import LoadGenerator
from snapmesh.services.app import bank
from snapmesh.services.app.drive import node_infos
from snapmesh.v1 import snapmesh_pb2 as pb

OK, REFUSED = 0, grpc.StatusCode.FAILED_PRECONDITION.value[0]
BUSY = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


class FakeNode:
    """Refuses transfers over 50 (insufficient funds); the first `down` calls are UNAVAILABLE and
    every third new command is answered RESOURCE_EXHAUSTED once; `forever`: every call UNAVAILABLE."""

    def __init__(self, down: int = 0, forever: bool = False) -> None:
        self.down, self.forever = down, forever
        self.window: dict[str, pb.SubmitResult] = {}  # request id -> its first result
        self.runs: dict[str, int] = {}  # request id -> times the command ran
        self.seen: set[str] = set()
        self.ids: list[str] = []  # every request id received, retries included

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context) -> pb.SubmitBatchResponse:
        self.ids += [item.request_id for item in request.items]
        if self.forever or self.down > 0:
            self.down -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the fake is down")
        return pb.SubmitBatchResponse(results=[self._one(item) for item in request.items])

    def _one(self, item: pb.SubmitRequest) -> pb.SubmitResult:
        rid = item.request_id
        if rid in self.window:
            first = self.window[rid]
            return pb.SubmitResult(code=first.code, message=first.message, reply=first.reply, replayed=True)
        if rid and rid not in self.seen:
            self.seen.add(rid)
            if len(self.seen) % 3 == 0:  # busy the first time only: its retry runs
                return pb.SubmitResult(code=BUSY, message="busy")
        self.runs[rid] = self.runs.get(rid, 0) + 1
        amount = json.loads(item.command)["amount"]
        result = (pb.SubmitResult(code=REFUSED, message="insufficient funds") if amount > 50
                  else pb.SubmitResult(code=OK, reply=b'{"balance": 1}'))
        if rid:
            self.window[rid] = result
        return result


async def _serve(fake: FakeNode) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(fake.SubmitBatch, request_deserializer=pb.SubmitBatchRequest.FromString,
                                                  response_serializer=pb.SubmitBatchResponse.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("snapmesh.v1.Node", {"SubmitBatch": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _generator(address: str, **options) -> LoadGenerator:
    infos = node_infos(["p1", "p2"], [("p1", "p2"), ("p2", "p1")], {"max_amount": 100})
    return LoadGenerator(bank.app, {"p1": address, "p2": address}, infos, seed=4, timeout=2.0, **options)


async def _run(generator: LoadGenerator, calls: int) -> None:
    async with generator:
        await generator.set(1)
        for _ in range(500):
            if generator.stats.calls >= calls:
                break
            await asyncio.sleep(0.01)
        await generator.set(0)


def test_a_busy_node_gets_the_same_ids_again_and_each_command_runs_once() -> None:
    fake = FakeNode(down=3)
    answers: list[str] = []

    async def main() -> LoadGenerator:
        server, address = await _serve(fake)
        generator = _generator(address, batch=5, on_answer=lambda node, command, reply, status: answers.append(status))
        try:
            await _run(generator, 20)
        finally:
            await server.stop(None)
        return generator

    stats = asyncio.run(main()).stats
    assert stats.calls >= 20 and stats.errors == 3 and stats.retries > 0
    assert set(fake.runs.values()) == {1}, "a command ran twice"
    assert len(fake.ids) > len(set(fake.ids)), "nothing was sent again"
    # The load stopping gives up on the commands still being retried (every third is busy once: at
    # most two of a stream's last batch of five); they did not run.
    assert stats.accepted + stats.refused == len(fake.runs) and stats.failed <= 4
    assert stats.accepted + stats.refused + stats.failed == len(answers)
    refused = sum(r.code == REFUSED for r in fake.window.values())
    assert stats.refusals("FAILED_PRECONDITION") == stats.refused == refused > 0
    assert answers.count("OK") == stats.accepted > 0
    assert {n for n, c in stats.nodes.items() if c.replies} == {"p1", "p2"}
    assert all(rid.startswith("bank-4-") for rid in fake.ids)


def test_a_node_that_never_answers_is_given_up_on_with_its_status() -> None:
    fake = FakeNode(forever=True)
    answers: list[tuple[str, str]] = []

    async def main() -> tuple[LoadGenerator, pb.SubmitResult | None]:
        server, address = await _serve(fake)
        generator = _generator(address, give_up_s=0.3, on_answer=lambda n, c, reply, status: answers.append((n, status)))
        try:
            async with generator:
                result = await generator.submit("p1", b'{"amount": 1, "to": "p2"}', "one-id")
        finally:
            await server.stop(None)
        return generator, result

    generator, result = asyncio.run(main())
    assert result is None and answers == [("p1", "UNAVAILABLE")]
    assert generator.stats.node("p1").given_up == generator.stats.failed == 1
    assert set(fake.ids) == {"one-id"} and generator.stats.retries == len(fake.ids) - 1 >= 1
    assert "p1: UNAVAILABLE" in generator.stats.last_error


def test_without_tally_pooled_calls_carry_no_request_ids() -> None:
    fake = FakeNode()

    async def main() -> LoadGenerator:
        server, address = await _serve(fake)
        generator = _generator(address, batch=3, exactly_once=False)
        try:
            await _run(generator, 10)
        finally:
            await server.stop(None)
        return generator

    stats = asyncio.run(main()).stats
    assert stats.calls >= 10 and stats.errors == 0 and stats.accepted == 0  # answers are not read
    assert set(fake.ids) == {""} and len(fake.ids) >= 30


def test_a_workload_that_fails_is_raised_when_the_load_stops_not_swallowed() -> None:
    def broken(nodes, rng):
        yield "p1", b"{}"
        raise KeyError("max_amount")

    app = dataclasses.replace(bank.app, workload=broken)
    load = BackgroundLoad(LoadGenerator(app, {"p1": "127.0.0.1:1"}, node_infos(["p1"], [], {}), batch=2), callers=1)
    load.start()
    with pytest.raises(RuntimeError, match="the load failed: KeyError"):
        load.stop()


def test_a_request_is_the_very_bytes_of_one_built_from_its_items() -> None:
    """generator._request fills each item in place: the same request as the constructor's, ids empty or not."""
    from snapmesh.load.generator import _request

    for items in ([("", b"1 p2")], [("gen-1-s-%d" % i, b"c%d" % i) for i in range(50)], [("a", b""), ("", b"x")]):
        built = pb.SubmitBatchRequest(items=[pb.SubmitRequest(request_id=rid, command=c) for rid, c in items])
        assert _request(items) == built.SerializeToString()
