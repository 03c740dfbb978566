"""The controller engine's steps, carried out in order with no task, timer or poll of their own.

A step is one drain of the machine (engine.py `carry_out`): its Journal records
are appended at once (one log round), and each of its other effects is carried
out once the records before it are durable, in the machine's order. A step
waiting for a record is a list entry here, not a task: it goes on in the very
call that learns the record durable. The journal calls `resume` right after it
settles a round (services/controller/journal.py `listen`), so what the round
held back (COMPLETE shown, a waiting trigger's answer set) is carried out in the
loop turn that took the fdatasync back, where a task awaiting the record (and a
shield around it) woke two to four turns later, behind whatever else was ready.
A record made durable otherwise (a test's journal) resumes the step through its
future's callback, one turn later.

A step with nothing to wait for is carried out at once, in `start`'s call. A
step started while another is being carried out (an effect that feeds the
machine again) goes on after it, as a task started then would have. `done`
gives when (monotonic) the step's last record was durable (None: it journaled
nothing), or the error that ended it: a record that could not be made durable
(`unjournaled` hears the effects from it on, none of them carried out), or an
effect that raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

Waits = asyncio.Future[None] | None  # the durability an effect waits for (None: nothing)


class Steps:
    def __init__(
        self,
        carry: Callable[[Any, float | None], None],  # (effect, when the records before it were durable)
        unjournaled: Callable[[list[Any], BaseException], None],
        clock: Callable[[], float],  # monotonic
    ) -> None:
        self._carry = carry
        self._unjournaled = unjournaled
        self._clock = clock
        # each step under way: [its (effect, durability) pairs, the next one's index, durable_at, done, hooked]
        self._pending: list[list[Any]] = []
        self._running = False
        self._again = False

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """The engine closes: the steps under way go no further (as a cancelled task's would not)."""
        pending, self._pending = self._pending, []
        for entry in pending:
            if not entry[3].done():
                entry[3].cancel()

    def start(self, steps: Sequence[tuple[Any, Waits]], done: asyncio.Future[float | None]) -> None:
        self._pending.append([list(steps), 0, None, done, None])
        self.resume()

    def resume(self, _: object = None) -> None:
        """Carry each step on as far as its records are durable (a future's callback too)."""
        if self._running:  # a step started or resumed by an effect: after this pass
            self._again = True
            return
        self._running, self._again = True, True
        try:
            while self._again:
                self._again = False
                for entry in list(self._pending):
                    self._advance(entry)
        finally:
            self._running = False

    def _advance(self, entry: list[Any]) -> None:
        steps, at, durable_at, done, _ = entry
        while at < len(steps):
            effect, durable = steps[at]
            if durable is not None:
                if not durable.done():
                    if entry[4] is not durable:  # its callback once: the journal's `listen` is the fast way
                        entry[4] = durable
                        durable.add_done_callback(self.resume)
                    entry[1], entry[2] = at, durable_at
                    return
                error = durable.exception() if not durable.cancelled() else asyncio.CancelledError()
                if error is not None:
                    self._pending.remove(entry)
                    self._unjournaled([e for e, _ in steps[at:]], error)
                    _settle(done, error=error)
                    return
                durable_at = self._clock()
            else:
                try:
                    self._carry(effect, durable_at)
                except Exception as error:  # a bug: the step ends, its caller hears it
                    self._pending.remove(entry)
                    _settle(done, error=error)
                    return
            at += 1
        self._pending.remove(entry)
        _settle(done, result=durable_at)


def _settle(done: asyncio.Future[float | None], *, result: float | None = None, error: BaseException | None = None) -> None:
    if done.done():  # its caller went away (cancelled): nobody waits
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
