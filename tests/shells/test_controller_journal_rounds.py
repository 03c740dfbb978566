"""The controller's two journal hops on a snapshot's critical path cost one log round each.

An in-process engine on a real journal file (fdatasync and all) of an idle
two-node cluster whose nodes answer in-process: a trigger makes exactly one
round before StartSnapshot leaves; a report that does not complete the snapshot
none (it is held, the machine's H1), and the completing report exactly one, every
report's record and the outcome together, before COMPLETE is shown. The journal here
sleeps after each append, as a loop thread descheduled on a busy machine
does: a writer on another thread could take the queue between two appends of
one step; the writer is a task on the loop, so a step's appends stay in one round.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from snapmesh.protocol.controller import journal as R
from snapmesh.services.controller import journal as J
from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank
from support.controller_fakes import bank_pair_engine

pytestmark = [pytest.mark.timeout(60)]


class Descheduled(J.Journal):
    """The real journal, its caller off the CPU for a while after every append."""

    def append(self, record) -> asyncio.Future[None]:
        future = super().append(record)
        time.sleep(0.02)  # the GIL is free: a round's thread may end now, but its task waits for the loop
        return future


class Node:
    """Answers StartSnapshot, noting how many journal rounds were durable when it was sent."""

    def __init__(self, rounds: Callable[[], float | None], sent: list[float | None]) -> None:
        self.rounds, self.sent = rounds, sent

    async def StartSnapshot(self, request, timeout, wait_for_ready=False):
        self.sent.append(self.rounds())
        return pb.StartSnapshotResponse()


def test_a_trigger_and_a_completing_report_each_cost_one_journal_round(tmp_path) -> None:
    asyncio.run(_one_round_each(tmp_path))


async def _one_round_each(tmp_path) -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    journal = Descheduled(tmp_path / "journal", on_round=metrics.journal_round)
    journal.open()
    engine = bank_pair_engine(journal, metrics)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    def counts() -> tuple[float | None, float | None]:  # (rounds, records)
        return value("snapmesh_controller_journal_syncs_total"), value("snapmesh_controller_journal_records_total")

    sent: list[float | None] = []
    engine.stubs = {n: Node(lambda: counts()[0], sent) for n in engine.nodes}  # type: ignore[misc]

    waiting = asyncio.create_task(engine.trigger("a", wait=True))  # answered by the machine's AnswerTrigger (W1)
    for _ in range(500):  # until StartSnapshot left (at most 5 s)
        if sent:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # StartSnapshot's task
    assert counts() == (1, 1), "the trigger did not cost exactly one round"
    assert sent == [1], "StartSnapshot left before the Started record was durable"

    (sid,) = engine.machine.ids()
    held = asyncio.create_task(engine.report(bank.pair_report(sid, "a", 60)))  # held until the snapshot ends (H1)
    for _ in range(500):
        if len(engine.machine.held):
            break
        await asyncio.sleep(0.01)
    assert len(engine.machine.held) == 1 and not held.done(), "a report that does not complete was answered"
    assert counts() == (1, 1), "a report that does not complete cost a round"
    completing = asyncio.create_task(engine.report(bank.pair_report(sid, "b", 40)))
    finished = await asyncio.wait_for(waiting, 10)
    assert finished.status == pb.Snapshot.COMPLETE, finished.reason
    await asyncio.wait_for(asyncio.gather(held, completing), 10)
    syncs, records = counts()
    assert records == 4, "both reports' records and the outcome were not all journaled"
    assert syncs == 2, f"the snapshot's reports cost {syncs - 1} rounds, not one"
    for step in ("trigger", "complete"):  # each waited for its one round: at least the 20 ms append above
        assert value("snapmesh_controller_journal_wait_seconds_count", step=step) == 1
        assert value("snapmesh_controller_journal_wait_seconds_sum", step=step) >= 0.02
    await engine.close()
    await journal.close()


def test_a_journal_rewrite_is_not_on_the_path_of_the_round_that_set_it_off(tmp_path) -> None:
    """The rewrite (a whole file written, fsynced, renamed, its directory fsynced) runs
    after the round's waiters heard: an append resolves while the rewrite still runs.
    What is appended meanwhile waits for the next round, into the rewritten file."""
    asyncio.run(_rewrite_after_the_round(tmp_path))


async def _rewrite_after_the_round(tmp_path) -> None:
    journal = J.Journal(tmp_path / "journal", rotate_bytes=1)
    journal.open()
    release, rewriting = threading.Event(), threading.Event()
    rewrite = journal._rewrite

    def held_rewrite() -> None:
        rewriting.set()
        release.wait(10)
        rewrite()

    journal._rewrite = held_rewrite  # type: ignore[method-assign]
    await journal.append(R.Started(snapshot_id="s1", initiator="a", wall=1.0))
    await journal.append(R.Finished(snapshot_id="s1", status=pb.Snapshot.FAILED, reason="x", wall=1.5))
    journal.forget("s1")  # dead, most of a file past its (tiny) bound: the next round sets off a rewrite
    try:
        await asyncio.wait_for(journal.append(R.Started(snapshot_id="s2", initiator="a", wall=2.0)), 5)
        assert await asyncio.to_thread(rewriting.wait, 5), "no rewrite was set off: the test proves nothing"
        during = journal.append(R.Started(snapshot_id="s3", initiator="a", wall=3.0))
        await asyncio.sleep(0.05)
        assert not during.done(), "an append was answered while the rewrite ran: it is not in the new file"
    finally:
        release.set()
    await asyncio.wait_for(during, 5)
    await journal.close()
    again = J.Journal(tmp_path / "journal")
    found, _ = again.open()
    await again.close()
    assert [r.snapshot_id for r in found] == ["s2", "s3"], "the rewrite lost a record or kept a forgotten one"
