"""A node's edge: clients' commands to its app, one at a time or in batches.

`Edge` is the one way a command enters a node: the `Node` service's Submit and
SubmitBatch are thin calls of it (servicer.py), and an app's own service, or a
program that embeds the node, calls the same two methods:

    await edge.submit(command, request_id="")     -> Reply, or raises Refused
    await edge.submit_many([(request_id, command), ...])
                                                  -> [Reply | Refused, ...] in order
    await edge.query(query)                       -> the app's on_query reply, or raises Refused

`Reply` and `Refused` are `snapmesh.app`'s: the reply bytes, whether it is a
retry's first reply, the epoch; or a gRPC status name and a reason. A refused
command changed nothing.

Rules
-----
E1. An answer is given only once the log holds everything the command did
    (and everything logged before the answer, node rule N11): nothing shown
    can be taken back by a crash. A log that failed or closed never answers:
    the call raises Refused("UNAVAILABLE"), in a batch for the whole batch.
E2. A batch runs its commands through the app in order, each on its own: a
    refused one (the same refusals and codes as `submit`) does not stop the
    rest. One engine step per COMMANDS_PER_STEP commands, and the event loop
    is handed back between steps, so channel frames, acks and other calls
    are not starved by a large batch; the log is told a writer is pending, so
    the next step's records join the round (translog.py).
E3. A batch that is empty, holds more than MAX_BATCH_COMMANDS commands or more
    than MAX_BATCH_BYTES of commands and request ids, or names one request_id
    twice is refused whole (INVALID_ARGUMENT naming the limit or the id),
    before anything runs: two items with one id cannot both be the first.
E4. A command a restore took back before it was durable is answered
    ABORTED ("taken back by the restore of ..."), never as done: its retry
    with the same request_id runs it anew.
E5. Retired, not reused: it refused every call on a machine that hosts no
    app, which no `Node` is (machine.py N10: `app` is required), so it could
    never fire; an old reference to E5 names nothing that runs now.
E6. A command the node cannot take back (core.AppFailed: the app could not be
    put back as it was, apphost.py H4) stops the node: the call raises
    Refused("UNAVAILABLE"), in a batch for the whole batch, and the items
    after it do not run. The log holds what ran before it; a retry with the
    same request ids, once the node is back, is answered from it.
E7. A query (`query`, snapmesh.app A7) is not logged; it is answered once the
    log holds every step up to the last one the app's state rests on, so an
    answer never shows a state a crash takes back (a log that cannot: E1's
    UNAVAILABLE), and ABORTED ("ask again") when a restore took that state
    back meanwhile. The same size limit as a command; UNIMPLEMENTED for an app
    without on_query; FAILED_PRECONDITION for one that sends (apphost.H7).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from itertools import chain
from functools import partial
from operator import attrgetter, is_, itemgetter

from snapmesh.app import STATUS_CODES, Refused, Reply
from snapmesh.protocol.node import core
from snapmesh.protocol.node.effects import Submitted
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.translog import LogClosedError

# Why the node refused a client's request -> the gRPC status name the client gets.
REFUSAL_CODE: dict[core.Refusal, str] = {
    core.Refusal.INVALID_INPUT: "INVALID_ARGUMENT",
    core.Refusal.CHANNEL_FULL: "RESOURCE_EXHAUSTED",
    core.Refusal.REQUESTS_FULL: "RESOURCE_EXHAUSTED",
    core.Refusal.APP_REFUSED: "FAILED_PRECONDITION",  # unless the app named one (AppRefusal.code)
    core.Refusal.APP_FAILED: "UNKNOWN",  # the app raised: its text goes with it
    core.Refusal.REPLY_TOO_LARGE: "RESOURCE_EXHAUSTED",  # over max_reply_bytes: the text names both
    core.Refusal.REQUEST_UNKNOWN: "FAILED_PRECONDITION",
    core.Refusal.RESTORING: "UNAVAILABLE",  # a restore cut short is redone first: retry
}
# A response waits at most this long for room in a full outbox (flow control);
# after that it answers anyway, so a dead peer slows clients but never hangs them.
FLOW_CONTROL_WAIT_S = 2.0
# A command holds at most this many bytes (INVALID_ARGUMENT naming the limit otherwise).
MAX_COMMAND_BYTES = 1024 * 1024
# A batch's bounds (E3): as many items as a TransferBatch, and gRPC's default
# message size in commands plus request ids, so a batch any client can send fits.
MAX_BATCH_COMMANDS = 10_000
MAX_BATCH_BYTES = 4 * 1024 * 1024
# Commands per engine step of a batch (E2). An app's step costs several times a
# native transfer's (a Context, the app's code, a command record with the reply):
# 100 token-ring commands took ~0.9 ms on a loaded 2-core machine, 500 took 7-9 ms,
# so fewer per step than TransferBatch's 500 keep a step near a millisecond.
COMMANDS_PER_STEP = 100


def refusal_code(exc: core.LocalProtocolError) -> str:
    """The status name a refused request gets: the one the app named (ctx.refuse), else REFUSAL_CODE's."""
    if isinstance(exc, core.AppRefusal) and exc.code in STATUS_CODES:
        return exc.code
    return REFUSAL_CODE[exc.kind]


def taken_back_text(node_id: str, snapshot_id: str, undone: str) -> str:
    """What an answer a restore took back says (E4); `undone`: "not done" (a command) or "not paid"."""
    again = "runs it anew" if undone == "not done" else "pays it anew"
    return (f"taken back by the restore of snapshot {snapshot_id} on {node_id}: "
            f"{undone}; retrying (same request_id) {again}")


# Reply(...) filled through its slots: a frozen dataclass's __init__ sets each field by
# object.__setattr__, ~1 µs a batch item; this makes the very same object in a third of it.
_set_reply, _set_replayed, _set_epoch = Reply.reply.__set__, Reply.replayed.__set__, Reply.epoch.__set__  # type: ignore[attr-defined]
_set_first_seq = Reply.first_seq.__set__  # type: ignore[attr-defined]
_SENT_TO = attrgetter("sent_to")  # the channels a step sent on: a batch's, gathered at C speed
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_IS_SUBMITTED = partial(is_, Submitted)  # `type(answer) is Submitted` as a C callable: all(map(...)) of a batch
_IS_THREE = (3).__eq__


def _reply(answer: Submitted) -> Reply:
    """A command's answer, with the epoch it ran in: a retry's may be older than the
    node's now (requests.py W6; 0 there: an id from before it, the node's epoch now)."""
    reply = object.__new__(Reply)
    _set_reply(reply, answer.reply)
    _set_replayed(reply, answer.repeated)
    _set_epoch(reply, answer.ran_in or answer.epoch)
    _set_first_seq(reply, answer.first_seq)
    return reply


class Edge:
    """Commands into one node's app (rules E1-E7; E5 retired). The node process owns one, beside its engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def submit(self, command: bytes, *, request_id: str = "", first_sent_unix_ms: int = 0) -> Reply:
        """Run `command` through the app; its reply once durable. Raises Refused.
        `request_id`: a retry key (a retry gets the first reply, the app does
        not run it again); `first_sent_unix_ms`: when the client first sent it."""
        engine = self._engine
        self._check_fence("Submit")
        if len(command) > MAX_COMMAND_BYTES:
            raise Refused("INVALID_ARGUMENT", f"a command holds at most {MAX_COMMAND_BYTES} bytes, got {len(command)}")
        try:
            answer, waiting = engine.submit(command, request_id, first_sent_unix_ms)
        except core.LocalProtocolError as exc:
            raise self._refused(exc) from None
        except core.AppFailed as exc:  # E6
            raise self._stopping(exc) from None
        await engine.wait_for_room(set(answer.sent_to), FLOW_CONTROL_WAIT_S)  # a step that sent nothing waits for nothing
        reply = await self._replied(waiting)
        if reply.taken_back:
            raise self._aborted(reply.taken_back)
        return _reply(answer)

    async def submit_many(
        self, items: Sequence[tuple[str, bytes] | tuple[str, bytes, int]]
    ) -> list[Reply | Refused]:
        """Run each (request_id, command) through the app, in order (E2); one
        answer per item, once all are durable. An item may carry a third
        field, its first_sent_unix_ms (as `submit`'s). Raises Refused for the
        whole batch (E3, and UNAVAILABLE as E1 and E6 say)."""
        return [answer if type(answer) is Refused else _reply(answer) for answer in await self.answers(items)]

    async def answers(
        self, items: Sequence[tuple[str, bytes] | tuple[str, bytes, int]]
    ) -> list[Submitted | Refused]:
        """`submit_many`, each item's answer as the node gave it (`Submitted`: its reply,
        `repeated`, and the epoch it ran in, `ran_in or epoch`), for a caller that turns it
        into its own form at once (the servicer's results) without a `Reply` per item."""
        engine = self._engine
        self._check_fence("SubmitBatch")
        batch, longest = _checked(items)
        results: list[Submitted | Refused | None] = [None] * len(batch)
        if longest <= MAX_COMMAND_BYTES:  # the common batch: every item runs
            at: Sequence[int] = range(len(batch))
            steps = batch
        else:
            at = [i for i, item in enumerate(batch) if len(item[1]) <= MAX_COMMAND_BYTES]
            for i, item in enumerate(batch):
                if len(item[1]) > MAX_COMMAND_BYTES:
                    results[i] = Refused("INVALID_ARGUMENT", f"a command holds at most {MAX_COMMAND_BYTES} bytes, "
                                                             f"got {len(item[1])}")
            steps = [batch[i] for i in at]
        done_at: list[int] = []
        done: list[Submitted] = []
        for start in range(0, len(steps), COMMANDS_PER_STEP):
            if start:
                with engine.log.writer_pending():  # the log's round now waits a turn for the next step's records
                    await asyncio.sleep(0)
            try:
                answers = engine.submit_batch(steps[start : start + COMMANDS_PER_STEP])
            except core.AppFailed as exc:  # E6
                raise self._stopping(exc) from None
            if all(map(_IS_SUBMITTED, map(type, answers))):  # the common step: every command ran; columns at C speed
                done_at.extend(at[start : start + len(answers)])
                done.extend(answers)
                continue
            for j, answer in enumerate(answers, start):
                if type(answer) is Submitted:
                    done_at.append(at[j])
                    done.append(answer)
                else:
                    results[at[j]] = self._refused(answer)
        waiting = engine.reply_batch(done)
        await engine.wait_for_room(set(chain.from_iterable(map(_SENT_TO, done))), FLOW_CONTROL_WAIT_S)
        reply = await self._replied(waiting)
        taken_back = reply.taken_back
        if len(done) == len(results) == len(taken_back) and not any(taken_back):  # all ran, none taken back (E4)
            return done  # type: ignore[return-value]  (done_at is then 0, 1, ...: `done` is the results)
        for i, answer, snapshot_id in zip(done_at, done, taken_back, strict=True):
            results[i] = self._aborted(snapshot_id) if snapshot_id else answer
        return results  # type: ignore[return-value]  (every slot is filled above)

    async def query(self, query: bytes) -> bytes:
        """The app's answer to `query` (its on_query), once durable (E7). Raises Refused."""
        engine = self._engine
        self._check_fence("Query")
        if len(query) > MAX_COMMAND_BYTES:
            raise Refused("INVALID_ARGUMENT", f"a query holds at most {MAX_COMMAND_BYTES} bytes, got {len(query)}")
        try:
            reply, lsn, epoch = engine.query(query)
        except core.LocalProtocolError as exc:
            raise self._refused(exc) from None
        except core.AppFailed as exc:  # E6
            raise self._stopping(exc) from None
        try:
            await engine.log.wait_durable(lsn)
        except LogClosedError as exc:  # LogFailedError too (E1)
            raise self._stopping(exc) from None
        restored = engine.node.epochs.taken_back(lsn, epoch)
        if restored:
            engine.metrics.command_refused("ABORTED").inc()
            raise Refused("ABORTED", f"the state this query read was taken back by the restore of snapshot "
                                     f"{restored} on {engine.node_id}: ask again")
        return reply

    def _check_fence(self, rpc: str) -> None:
        """Refused UNAVAILABLE while the node stops for a snapshot, or is stopped (fence.py F1, F4)."""
        refusal = self._engine.refusal(rpc)
        if refusal:
            self._engine.metrics.fence_refused("UNAVAILABLE")
            raise Refused("UNAVAILABLE", refusal)

    def _refused(self, exc: core.LocalProtocolError) -> Refused:
        code = refusal_code(exc)
        self._engine.metrics.command_refused(code).inc()
        return Refused(code, str(exc))

    def _aborted(self, snapshot_id: str) -> Refused:
        self._engine.metrics.command_refused("ABORTED").inc()
        return Refused("ABORTED", taken_back_text(self._engine.node_id, snapshot_id, "not done"))

    def _stopping(self, exc: Exception) -> Refused:
        return Refused("UNAVAILABLE", f"node {self._engine.node_id} is stopping: {exc}")

    async def _replied(self, waiting: asyncio.Future) -> object:
        try:
            return await self._engine.replied(waiting)
        except LogClosedError as exc:  # LogFailedError too (E1)
            raise self._stopping(exc) from None


def _checked(items: Sequence[tuple]) -> tuple[list[tuple[str, bytes, int]], int]:
    """The batch as (request_id, command, first_sent_unix_ms) items, and its longest
    command's length; or Refused (E3)."""
    if not items:
        raise Refused("INVALID_ARGUMENT", "a batch holds at least one command, got none")
    if len(items) > MAX_BATCH_COMMANDS:
        raise Refused("INVALID_ARGUMENT", f"a batch holds at most {MAX_BATCH_COMMANDS} commands, got {len(items)}")
    if all(map(_IS_THREE, map(len, items))):  # the servicer's items: as they are, and their columns at C speed
        batch = list(items)
        ids = list(map(_FIRST, batch))
    else:
        batch = [item if len(item) == 3 else (item[0], item[1], item[2] if len(item) > 2 else 0) for item in items]
        ids = [item[0] for item in batch]
    lengths = list(map(len, map(_SECOND, batch)))
    named = list(filter(None, ids))
    size = sum(lengths) + (sum(len(request_id.encode()) for request_id in named) if named else 0)
    if size > MAX_BATCH_BYTES:
        raise Refused("INVALID_ARGUMENT", f"a batch holds at most {MAX_BATCH_BYTES} bytes of commands and request ids, "
                                          f"got {size}")
    if len(set(named)) != len(named):
        first: dict[str, int] = {}
        for i, request_id in enumerate(ids):
            if request_id:
                if request_id in first:
                    raise Refused("INVALID_ARGUMENT", f"request_id {request_id!r} appears twice in one batch "
                                                      f"(items {first[request_id]} and {i})")
                first[request_id] = i
    return batch, max(lengths)
