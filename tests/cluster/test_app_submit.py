"""Node.Submit through the node's gRPC servicer, with an in-process engine and a real transfer log.

An app command is answered with the app's reply only once durable; a retry with
its request_id gets the first reply and does not run again; the app's refusal
is the status it named, its exception UNKNOWN with its text; a command over the
size limit is INVALID_ARGUMENT; and a restore
to a cut before a command still waiting for its fsync answers it ABORTED, as it
does a Transfer (tests/shells/test_restore_taken_back.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from support.counter_app import Counter, Forgetful
from support.engine_harness import Aborted, ServicerContext, held_node, outcome

from snapmesh.services.node.servicer import MAX_COMMAND_BYTES, NodeServicer
from snapmesh.services.node.translog import TransferLog
from snapmesh.app import App
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.timeout(60)


APP = App(name="counter", new=Counter)


async def _answer(servicer: NodeServicer, log: TransferLog, command: bytes, request_id: str = "") -> object:
    call = asyncio.ensure_future(servicer.Submit(pb.SubmitRequest(command=command, request_id=request_id),
                                                 ServicerContext()))
    await asyncio.sleep(0.02)
    log.flush_sync()
    return await outcome(call)


def test_the_reply_waits_for_the_disk_and_a_retry_gets_it_again(tmp_path: Path) -> None:
    async def run() -> list[object]:
        engine, log, servicer = await held_node(tmp_path, APP)
        call = asyncio.ensure_future(servicer.Submit(pb.SubmitRequest(command=b"inc", request_id="r1"), ServicerContext()))
        await asyncio.sleep(0.05)
        assert not call.done()  # applied and logged, waiting for its fsync
        log.flush_sync()
        first = await asyncio.wait_for(call, 10)
        answers = [first, await _answer(servicer, log, b"inc", "r1"), await _answer(servicer, log, b"inc")]
        await log.close()
        return answers

    first, again, second = asyncio.run(run())
    assert (first.reply, first.replayed, first.epoch) == (b"1", False, 1)
    assert (again.reply, again.replayed) == (b"1", True)
    assert second.reply == b"2"


def test_refusals_take_the_apps_status_and_text(tmp_path: Path) -> None:
    async def run() -> list[object]:
        engine, log, servicer = await held_node(tmp_path, APP)
        answers = [await _answer(servicer, log, command) for command in (b"refuse", b"boom", b"x" * (MAX_COMMAND_BYTES + 1))]
        answers.append(await _answer(servicer, log, b"inc"))  # nothing of the refused ones ran
        await log.close()
        return answers

    refused, failed, too_big, ok = asyncio.run(run())
    assert refused.code is grpc.StatusCode.NOT_FOUND and "nothing here" in refused.details
    assert failed.code is grpc.StatusCode.UNKNOWN and "kaboom" in failed.details
    assert too_big.code is grpc.StatusCode.INVALID_ARGUMENT and str(MAX_COMMAND_BYTES) in too_big.details
    assert ok.reply == b"1"


def test_a_command_that_cannot_be_taken_back_stops_the_node(tmp_path: Path) -> None:
    async def run() -> tuple[object, object, str]:
        engine, log, servicer = await held_node(tmp_path, App(name="forgetful", new=Forgetful))
        ok = await _answer(servicer, log, b"inc")
        failed = await _answer(servicer, log, b"boom")  # taking it back replays "inc", which raises now
        stopping = await asyncio.wait_for(engine.app_failed, 5)
        await log.close()
        return ok, failed, stopping

    ok, failed, stopping = asyncio.run(run())
    assert ok.reply == b"1"
    assert failed.code is grpc.StatusCode.UNAVAILABLE and "is stopping" in failed.details, failed.details
    assert "replayed from the undo log raised RuntimeError: not twice" in stopping


def test_a_command_a_restore_took_back_before_its_fsync_is_answered_aborted(tmp_path: Path) -> None:
    async def run() -> object:
        engine, log, servicer = await held_node(tmp_path, APP)
        engine.start_snapshot("s1")
        log.flush_sync()
        call = asyncio.ensure_future(servicer.Submit(pb.SubmitRequest(command=b"inc", request_id="r1"), ServicerContext()))
        await asyncio.sleep(0.05)
        assert not call.done()
        engine.restore("s1", 2, [], state=b"0")  # s1's cut is before the command
        log.flush_sync()
        try:
            return await outcome(call)
        finally:
            assert engine.node.app_state() == b"0"
            await log.close()

    answer = asyncio.run(run())
    assert isinstance(answer, Aborted) and answer.code is grpc.StatusCode.ABORTED, answer
    assert "restore of snapshot s1" in answer.details and "not done" in answer.details
