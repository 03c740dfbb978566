"""snapmesh/serving/runtime.py `serve_until_stopped`: the node's and the controller's one
serving sequence. The host starts, the server says it serves, then it waits for a stop
signal or a failure: a signal is exit 0 with the server's stop line, a failure its
status with its error line; a host that cannot bind raises before anything else."""

from __future__ import annotations

import asyncio
import logging
import signal

import pytest

from snapmesh.serving.runtime import BindError, Failure, serve_until_stopped

log = logging.getLogger("test.serving")


class Host:
    def __init__(self, bind: bool = True) -> None:
        self.bind, self.started = bind, False

    async def start(self) -> None:
        if not self.bind:
            raise BindError("cannot bind gRPC address x:1")
        self.started = True


async def _serve(host, stop_signal, failures, said):
    return await serve_until_stopped(
        host, log, serving=lambda: said.append("serving"), stop_signal=stop_signal,
        stopping=lambda sig: f"{sig.name}: stopping", failures=failures,
    )


def test_a_signal_stops_it_with_0_and_the_stop_line(caplog) -> None:
    async def run():
        said: list[str] = []
        never = asyncio.get_running_loop().create_future()

        async def sigterm():
            return signal.SIGTERM

        status = await _serve(Host(), sigterm, [Failure(never, lambda f: "no", 1)], said)
        return status, said

    with caplog.at_level(logging.INFO, "test.serving"):
        assert asyncio.run(run()) == (0, ["serving"])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", "SIGTERM: stopping")]


def test_the_first_failure_stops_it_with_its_status_and_line(caplog) -> None:
    async def run():
        loop = asyncio.get_running_loop()
        never, failed = loop.create_future(), loop.create_future()
        loop.call_later(0.01, failed.set_result, "the app broke")

        async def no_signal():
            await asyncio.Event().wait()

        return await _serve(Host(), no_signal, [Failure(never, lambda f: "no", 1),
                                                Failure(failed, lambda f: f"failed: {f.result()}", 2)], [])

    with caplog.at_level(logging.INFO, "test.serving"):
        assert asyncio.run(run()) == 2
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("ERROR", "failed: the app broke")]


def test_a_host_that_cannot_bind_raises_before_it_serves() -> None:
    said: list[str] = []

    async def run():
        async def sigterm():
            return signal.SIGTERM

        await _serve(Host(bind=False), sigterm, [], said)

    with pytest.raises(BindError):
        asyncio.run(run())
    assert said == []
