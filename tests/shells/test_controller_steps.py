"""The engine's steps (services/controller/steps.py): in order, each effect after the records
before it are durable, in the call that settles them; a step an effect starts goes on after
it; a record that fails ends its step there; a closed engine's steps go no further."""

from __future__ import annotations

import asyncio

import pytest

from snapmesh.services.controller.steps import Steps

pytestmark = [pytest.mark.timeout(30)]


def test_steps_go_on_in_the_settling_call_in_order_and_stop_at_a_failed_record() -> None:
    asyncio.run(_steps())


async def _steps() -> None:
    loop = asyncio.get_running_loop()
    done_log: list[str] = []
    failed: list[tuple[list[str], BaseException]] = []
    steps: Steps

    def carry(effect: str, durable_at: float | None) -> None:
        done_log.append(effect)
        if effect == "feeds":  # an effect that feeds the machine again: its step goes on after this one
            steps.start([("inner", None)], loop.create_future())

    steps = Steps(carry, lambda effects, error: failed.append((effects, error)), clock=lambda: 7.0)
    record, other = loop.create_future(), loop.create_future()
    first, second = loop.create_future(), loop.create_future()
    steps.start([("rec", record), ("feeds", None), ("after", None)], first)
    steps.start([("at once", None), ("rec2", other), ("never", None)], second)
    assert done_log == ["at once"] and len(steps) == 2, "a step went past a record not yet durable"
    record.set_result(None)
    steps.resume()  # as the journal's `listen` calls it: in the same call, no loop turn
    assert done_log == ["at once", "feeds", "after", "inner"] and first.result() == 7.0
    other.set_exception(OSError("disk full"))
    steps.resume()
    assert [(e, str(x)) for e, x in failed] == [(["rec2", "never"], "disk full")]
    assert isinstance(second.exception(), OSError) and "never" not in done_log and len(steps) == 0

    held, third = loop.create_future(), loop.create_future()
    steps.start([("r", held), ("shown", None)], third)
    held.set_result(None)
    await asyncio.sleep(0)  # no listener: the future's own callback resumes it, a loop turn later
    await asyncio.sleep(0)
    assert done_log[-1] == "shown" and third.done()

    closing, fourth = loop.create_future(), loop.create_future()
    steps.start([("r", closing), ("too late", None)], fourth)
    steps.close()
    closing.set_result(None)
    steps.resume()
    assert "too late" not in done_log and fourth.cancelled()
