"""Node.SubmitBatch and the node's edge (services/node/edge.py), with an in-process engine and a real transfer log.

A batch is answered once every item is durable, one result per item in order,
each with its own code: a refused item (the app's code, its exception's
UNKNOWN, a command over the size limit) changes nothing and does not stop the
rest. A batch replayed with the same request ids is answered with the first
replies, marked replayed, and the app does not run again. An empty batch, one
over the count or byte bound and one that names a request_id twice are
INVALID_ARGUMENT whole, before anything runs. A
restore to a cut before the batch answers its items ABORTED, and an item the
node cannot take back stops the node: the whole call is UNAVAILABLE and the
items after it do not run. `submit` raises `snapmesh.app.Refused` where
`submit_many` returns it in its list.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from pathlib import Path

import grpc
import pytest

from support.engine_harness import Aborted, ServicerContext, held_node, outcome

from snapmesh.app import App, Refused, Reply
from snapmesh.services.node import edge as node_edge
from snapmesh.services.node.edge import MAX_BATCH_BYTES, MAX_BATCH_COMMANDS, MAX_COMMAND_BYTES, Edge
from snapmesh.services.node.servicer import NodeServicer
from snapmesh.services.node.translog import TransferLog
from snapmesh.v1 import snapmesh_pb2 as pb

from support.counter_app import Counter, Forgetful  # "inc" counts and sends, "refuse" and "boom" refuse

pytestmark = pytest.mark.timeout(60)

APP = App(name="counter", new=Counter)
OK = grpc.StatusCode.OK.value[0]


def _batch(*items: tuple[str, bytes]) -> pb.SubmitBatchRequest:
    return pb.SubmitBatchRequest(items=[pb.SubmitRequest(request_id=rid, command=command) for rid, command in items])


async def _answer(servicer: NodeServicer, log: TransferLog, request: pb.SubmitBatchRequest) -> object:
    call = asyncio.ensure_future(servicer.SubmitBatch(request, ServicerContext()))
    await asyncio.sleep(0.02)
    log.flush_sync()
    return await outcome(call)


def _results(response: pb.SubmitBatchResponse) -> list[tuple[int, bytes, bool]]:
    return [(r.code, r.reply, r.replayed) for r in response.results]


def test_each_item_has_its_own_code_in_order_and_a_refusal_stops_nothing(tmp_path: Path) -> None:
    async def run() -> tuple[object, bytes | None]:
        engine, log, servicer = await held_node(tmp_path, APP)
        request = _batch(("", b"inc"), ("", b"refuse"), ("a", b"inc"), ("", b"boom"),
                         ("", b"x" * (MAX_COMMAND_BYTES + 1)), ("b", b"inc"))
        answer = await _answer(servicer, log, request)
        state = engine.node.app_state()
        await log.close()
        return answer, state

    response, state = asyncio.run(run())
    codes = [r.code for r in response.results]
    assert codes == [OK, grpc.StatusCode.NOT_FOUND.value[0], OK, grpc.StatusCode.UNKNOWN.value[0],
                     grpc.StatusCode.INVALID_ARGUMENT.value[0], OK]
    assert [r.reply for r in response.results] == [b"1", b"", b"2", b"", b"", b"3"]  # in order, none ran twice
    assert "nothing here" in response.results[1].message and "kaboom" in response.results[3].message
    assert str(MAX_COMMAND_BYTES) in response.results[4].message
    assert all(r.epoch == 1 for r in response.results if r.code == OK)
    assert all(not r.message for r in response.results if r.code == OK)
    assert state == b"3"  # the refused ones changed nothing


def test_the_answer_waits_for_the_disk(tmp_path: Path) -> None:
    async def run() -> object:
        engine, log, servicer = await held_node(tmp_path, APP)
        call = asyncio.ensure_future(servicer.SubmitBatch(_batch(("", b"inc"), ("", b"inc")), ServicerContext()))
        await asyncio.sleep(0.05)
        assert not call.done()  # applied and logged, waiting for its fsync
        assert engine.node.app_state() == b"2"
        log.flush_sync()
        response = await outcome(call)
        await log.close()
        return response

    assert _results(asyncio.run(run())) == [(OK, b"1", False), (OK, b"2", False)]


def test_a_batch_replayed_with_the_same_ids_gets_the_first_replies_and_runs_nothing(tmp_path: Path) -> None:
    async def run() -> tuple[object, object, bytes | None]:
        engine, log, servicer = await held_node(tmp_path, APP)
        request = _batch(("r1", b"inc"), ("r2", b"refuse"), ("r3", b"inc"))
        first = await _answer(servicer, log, request)
        again = await _answer(servicer, log, request)
        state = engine.node.app_state()
        await log.close()
        return first, again, state

    first, again, state = asyncio.run(run())
    refused = grpc.StatusCode.NOT_FOUND.value[0]
    assert _results(first) == [(OK, b"1", False), (refused, b"", False), (OK, b"2", False)]
    # A refused id was never answered: its retry runs (and is refused) again; the others are replayed.
    assert _results(again) == [(OK, b"1", True), (refused, b"", False), (OK, b"2", True)]
    assert state == b"2"


@pytest.mark.parametrize(
    "items, words",
    [
        ([], ["at least one"]),
        ([("", b"inc")] * (MAX_BATCH_COMMANDS + 1), [str(MAX_BATCH_COMMANDS), str(MAX_BATCH_COMMANDS + 1)]),
        ([("", b"x" * MAX_COMMAND_BYTES)] * (MAX_BATCH_BYTES // MAX_COMMAND_BYTES + 1), [str(MAX_BATCH_BYTES)]),
        ([("a", b"inc"), ("twice", b"inc"), ("b", b"inc"), ("twice", b"inc")], ["'twice'", "items 1 and 3"]),
    ],
    ids=["empty", "too-many", "too-many-bytes", "repeated-id"],
)
def test_a_malformed_batch_is_invalid_argument_whole_and_runs_nothing(tmp_path: Path, items, words) -> None:
    async def run() -> tuple[object, bytes | None]:
        engine, log, servicer = await held_node(tmp_path, APP)
        answer = await _answer(servicer, log, _batch(*items))
        state = engine.node.app_state()
        await log.close()
        return answer, state

    answer, state = asyncio.run(run())
    assert isinstance(answer, Aborted) and answer.code is grpc.StatusCode.INVALID_ARGUMENT, answer
    assert all(word in answer.details for word in words), answer.details
    assert state == b"0"


def test_a_batch_longer_than_a_step_runs_in_order_and_hands_the_loop_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(node_edge, "COMMANDS_PER_STEP", 3)

    async def run() -> tuple[object, list[int]]:
        engine, log, servicer = await held_node(tmp_path, APP)
        turns: list[int] = []  # the records logged by each time the watcher gets the loop

        async def watch() -> None:
            while True:
                turns.append(engine.node.last_lsn)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        response = await _answer(servicer, log, _batch(*[("", b"inc")] * 10))
        watcher.cancel()
        await log.close()
        return response, turns

    response, turns = asyncio.run(run())
    assert [r.reply for r in response.results] == [str(n).encode() for n in range(1, 11)]
    steps = [after - before for before, after in itertools.pairwise(turns) if after != before]
    # 3 commands a step, each a send record carrying its command: the watcher ran between steps.
    assert steps[:4] == [3, 3, 3, 1], steps


def test_a_batch_a_restore_took_back_before_its_fsync_is_aborted_item_by_item(tmp_path: Path) -> None:
    async def run() -> object:
        engine, log, servicer = await held_node(tmp_path, APP)
        engine.start_snapshot("s1")
        log.flush_sync()
        call = asyncio.ensure_future(servicer.SubmitBatch(_batch(("r1", b"inc"), ("", b"refuse")), ServicerContext()))
        await asyncio.sleep(0.05)
        assert not call.done()
        engine.restore("s1", 2, [], state=b"0")  # s1's cut is before the batch
        log.flush_sync()
        try:
            return await outcome(call)
        finally:
            await log.close()

    response = asyncio.run(run())
    aborted, refused = response.results
    assert aborted.code == grpc.StatusCode.ABORTED.value[0] and "restore of snapshot s1" in aborted.message
    assert "not done" in aborted.message and not aborted.reply
    assert refused.code == grpc.StatusCode.NOT_FOUND.value[0]  # a refusal stays what it was


def test_the_edge_raises_a_refusal_alone_and_lists_it_in_a_batch(tmp_path: Path) -> None:
    async def run() -> tuple[Reply, Refused | None, list, object]:
        engine, log, _ = await held_node(tmp_path, APP)
        edge = Edge(engine)
        flushing = asyncio.get_running_loop().call_later(0.02, log.flush_sync)
        one = await edge.submit(b"inc", request_id="r1")
        flushing.cancel()
        refused = None
        try:
            await edge.submit(b"refuse")
        except Refused as exc:
            refused = exc
        flushing = asyncio.get_running_loop().call_later(0.02, log.flush_sync)
        many = await edge.submit_many([("r1", b"inc"), ("", b"refuse"), ("", b"inc")])
        flushing.cancel()
        try:
            await edge.submit_many([])
        except Refused as exc:
            whole = exc
        await log.close()
        return one, refused, many, whole

    one, refused, many, whole = asyncio.run(run())
    assert one == Reply(reply=b"1", replayed=False, epoch=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.reply = b"2"  # type: ignore[misc]
    assert refused is not None and (refused.code, refused.text) == ("NOT_FOUND", "nothing here")
    assert many[0] == Reply(b"1", True, 1) and many[2] == Reply(b"2", False, 1)
    assert isinstance(many[1], Refused) and many[1].code == "NOT_FOUND"
    assert isinstance(whole, Refused) and whole.code == "INVALID_ARGUMENT"


def test_an_item_that_cannot_be_taken_back_stops_the_node_and_the_rest_of_the_batch(tmp_path: Path, monkeypatch) -> None:
    async def run() -> tuple[object, str, list[dict]]:
        engine, log, servicer = await held_node(tmp_path, App(name="forgetful", new=Forgetful))
        # "boom" is refused; taking it back replays the first "inc", which raises now: the node must stop.
        answer = await _answer(servicer, log, _batch(("", b"inc"), ("", b"boom"), ("", b"inc")))
        stopping = await asyncio.wait_for(engine.app_failed, 5)
        await log.close()
        return answer, stopping, [json.loads(line) for line in (tmp_path / "p1.log.jsonl").read_text().splitlines()]

    monkeypatch.setattr(Forgetful, "runs", 0)  # its count is the class's: put back after the test
    answer, stopping, records = asyncio.run(run())
    assert isinstance(answer, Aborted) and answer.code is grpc.StatusCode.UNAVAILABLE, answer
    assert "is stopping" in answer.details and "not twice" in stopping
    # the first "inc" (a command record, or its send carrying it); the last never ran
    assert sum(r["kind"] == "command" or "command" in r for r in records) == 1
