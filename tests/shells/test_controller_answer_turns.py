"""A waiting trigger's COMPLETE goes out the loop turn after the journal round that made it durable.

An in-process engine on a real journal file (fdatasync and all) of an idle
two-node cluster whose nodes answer in-process. The loop's turns are counted by
a callback that schedules itself again each turn. The journal calls the step
back in the very callback that settles the round (steps.py), and the step sets
the trigger's answer there: its coroutine resumes the next turn, where a step
as a task behind `asyncio.shield`s woke two to four turns later (each a turn of
everything else ready on a busy controller). And the journal's round runs in
its own thread: the loop's shared executor, where a report's block writes run,
can be full and the round is not queued behind it.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry

from snapmesh.services.controller import journal as J
from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank
from support.controller_fakes import bank_pair_engine

pytestmark = [pytest.mark.timeout(60)]


class Turns:
    """Counts the event loop's turns: a callback that schedules itself again each turn."""

    def __init__(self) -> None:
        self.count = 0
        self._stopped = False
        asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self.count += 1
        if not self._stopped:
            asyncio.get_running_loop().call_soon(self._turn)

    def stop(self) -> None:
        self._stopped = True


async def _engine(tmp_path, on_round) -> tuple[ControllerEngine, J.Journal]:
    metrics = ControllerMetrics(CollectorRegistry())

    def rounds(records: int) -> None:
        metrics.journal_round(records)
        on_round(records)

    journal = J.Journal(tmp_path / "journal", on_round=rounds)
    journal.open()
    return bank_pair_engine(journal, metrics), journal


def test_a_waiting_trigger_resumes_the_turn_after_the_round_that_made_complete_durable(tmp_path) -> None:
    asyncio.run(_one_turn(tmp_path))


async def _one_turn(tmp_path) -> None:
    turns = Turns()
    durable_at: list[tuple[int, int]] = []  # (records, the turn the round came back to the loop)
    engine, journal = await _engine(tmp_path, lambda records: durable_at.append((records, turns.count)))

    async def wait() -> int:
        ended = await engine.trigger("a", wait=True)
        assert ended.status == pb.Snapshot.COMPLETE, ended.reason
        return turns.count

    waiting = asyncio.create_task(wait())
    while not engine.machine.ids() or not durable_at:  # the Started round back
        await asyncio.sleep(0.005)
    (sid,) = engine.machine.ids()
    held = asyncio.create_task(engine.report(bank.pair_report(sid, "a", 60)))
    while not len(engine.machine.held):
        await asyncio.sleep(0.005)
    completing = asyncio.create_task(engine.report(bank.pair_report(sid, "b", 40)))
    answered_at = await asyncio.wait_for(waiting, 10)
    await asyncio.wait_for(asyncio.gather(held, completing), 10)
    turns.stop()
    (records, complete_at), = [r for r in durable_at if r[0] == 3]  # both reports' records and the outcome
    assert answered_at - complete_at <= 1, (
        f"the trigger resumed {answered_at - complete_at} loop turns after its round was back, not the next turn")
    await engine.close()
    await journal.close()


def test_a_journal_round_does_not_wait_for_the_loops_shared_executor(tmp_path) -> None:
    asyncio.run(_executor_full(tmp_path))


async def _executor_full(tmp_path) -> None:
    engine, journal = await _engine(tmp_path, lambda records: None)
    release = threading.Event()
    # every worker of the default executor busy (block writes of reports, a restore's check...)
    busy = [asyncio.get_running_loop().run_in_executor(None, release.wait, 20) for _ in range(64)]
    try:
        snapshot = await asyncio.wait_for(engine.trigger("a"), 5)  # its Started record durable, then it returns
        assert snapshot.snapshot_id in engine.machine.ids()
    finally:
        release.set()
        await asyncio.gather(*busy)
    await engine.close()
    await journal.close()
