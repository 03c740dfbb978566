"""The one load generator: an app's workload, sent as `SubmitBatch` calls to a cluster's nodes.

Every app is loaded alike, the bank included (its commands are transfers): the
demo, `snapmesh app`, chaos, the bench and the real-process tests all use it.

- Streams: `set(callers, interval)` starts `callers` streams, each drawing from
  a workload of its own (`app.workload(nodes, rng)`, its rng from `seed`).
  `per_node` (the default): `callers` streams per node, each given only that
  node's NodeInfo, so every node is loaded alike (the bank: each node pays its
  own neighbours); off: `callers` streams over the whole cluster (an app whose
  workload follows its own commands, such as kvshard's guesses of where keys are).
- A stream takes `batch` commands at a time, sends those for one node in one
  `SubmitBatch` (the nodes' calls at once) and waits for every answer before its
  next draw: one call per `interval` seconds (0: back to back, a closed loop).
- Exactly once: each command has a request id of its own (unique per run). A
  node down or busy (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, for
  the call or for one command) gets the same ids again every RETRY_PAUSE_S
  until it answers, `give_up_s` passes or the load stops: the node's
  exactly-once window answers a retry with the first reply, so a command runs
  once however often it is sent. Per node `stats` counts replies, refusals by
  status (a refusal is the app's answer: the bank's insufficient funds) and
  commands given up on (their outcome unknown); `on_answer(node, command,
  reply or None, status)` sees every outcome.
- Without `exactly_once` (the bench, where the generator must stay cheap beside the
  nodes it loads) each stream sends a few pre-serialized calls, with no request
  ids and no retries, and only calls and failed calls are counted.

Errors never escape: a failed call is counted (and reported once per node and
status through `on_error`). The nodes' logs, not these counters, are the truth.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence

import grpc

from snapmesh.app import App, NodeInfo
from snapmesh.load.stats import LoadStats
from snapmesh.serving import credentials
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings import security
from snapmesh.v1 import snapmesh_pb2 as pb

SUBMIT_BATCH = "/snapmesh.v1.Node/SubmitBatch"
RETRIED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})
RETRY_PAUSE_S = 0.1  # before a retry, and after a failed call without exactly_once
_OK = grpc.StatusCode.OK.value[0]
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_POOL = 16  # pre-serialized draws per stream without exactly_once

Answer = Callable[[str, bytes, "bytes | None", str], None]
Item = tuple[str, bytes]  # (request id, command)


class LoadGenerator:
    """`targets`: node id -> address dialled; `nodes`: the NodeInfo the workload is given
    (those of all the cluster's nodes, as the nodes themselves get them)."""

    def __init__(
        self,
        app: App,
        targets: Mapping[str, str],
        nodes: Sequence[NodeInfo],
        *,
        batch: int = 1,
        seed: int = 1,
        per_node: bool = True,
        exactly_once: bool = True,
        timeout: float = 30.0,
        give_up_s: float = 60.0,
        on_error: Callable[[str], None] | None = None,
        on_answer: Answer | None = None,
        identity: security.Identity | None = None,  # a TLS cluster's client identity; None: plaintext
    ) -> None:
        if app.workload is None:
            raise ValueError(f"app {app.name!r} has no workload")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.app = app
        self.targets = dict(targets)
        self.nodes = list(nodes)
        self.batch = batch
        self.seed = seed
        self.per_node = per_node
        self.exactly_once = exactly_once
        self.timeout = timeout
        self.give_up_s = give_up_s
        self.on_error = on_error
        self.on_answer = on_answer
        self.prefix = f"{app.name}-{seed}-{uuid.uuid4().hex[:8]}"  # unique per run: ids never meet an old window
        self.stats = LoadStats()
        for node in self.targets:
            self.stats.node(node)
        self._identity = identity
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._halted = asyncio.Event()  # set: the current streams make no new call
        self._generation = 0  # of set(): a new generation's request ids are new ones
        self._reported: set[str] = set()

    async def __aenter__(self) -> LoadGenerator:
        for node, address in self.targets.items():
            channel = credentials.open_channel(address, self._identity, options=CLIENT_OPTIONS, aio=True)
            self._channels[node] = channel
            # Bytes in, bytes out: the pool's requests are serialized once, and answers parsed only when tallied.
            self._calls[node] = channel.unary_unary(SUBMIT_BATCH)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def commands(self, stream: str) -> Iterator[tuple[str, bytes]]:
        """Stream `stream`'s (node, command): its own workload, seeded by the stream's name. A
        per-node stream ("p1:0") is given its node's NodeInfo only; a cluster stream ("0") all of them."""
        node = stream.rpartition(":")[0]
        infos = [i for i in self.nodes if i.node_id == node] if node else self.nodes
        return iter(self.app.workload(infos, random.Random(f"{self.seed}:{stream}")) if infos else ())

    def streams(self, callers: int) -> list[str]:
        if not self.per_node:
            return [str(index) for index in range(callers)]
        return [f"{info.node_id}:{index}" for info in self.nodes if info.node_id in self.targets
                for index in range(callers)]

    async def set(self, callers: int, interval: float = 0.0) -> None:
        """Run `callers` streams (per node with `per_node`), each making one round of calls per
        `interval` seconds (0: back to back); 0 stops the load. Calls already made are
        answered first (or given up on), so `stats` counts every command a node took."""
        await self._halt()
        self._halted = asyncio.Event()
        self._generation += 1
        for stream in self.streams(callers):
            self._tasks.append(asyncio.create_task(self._stream(stream, interval, self._halted)))

    async def close(self) -> None:
        try:
            await self._halt()
        finally:
            for channel in self._channels.values():
                await channel.close()
            self._channels.clear()

    async def submit(self, node: str, command: bytes, request_id: str) -> pb.SubmitResult | None:
        """One command, retried under `request_id` as the streams' are: its result (reply,
        replayed), or None when it was refused or given up on."""
        return (await self.submit_batch(node, [(request_id, command)]))[0]

    async def submit_batch(self, node: str, items: Sequence[Item]) -> list[pb.SubmitResult | None]:
        """(request id, command) pairs in one SubmitBatch, outside any stream, counted in `stats`
        as theirs are: each one's result, or None. The request ids must be new ones (`prefix` helps)."""
        return await self._send(node, list(items), asyncio.Event())

    async def _halt(self) -> None:
        """No new calls; wait for the answers to those under way (then cancel what is left).
        A stream that failed (its workload raised: a bug, or bad params) raises here."""
        self._halted.set()
        tasks, self._tasks = self._tasks, []
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.timeout + RETRY_PAUSE_S)
            for task in late:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            failed = [o for o in outcomes if isinstance(o, Exception) and not isinstance(o, asyncio.CancelledError)]
            if failed:
                raise failed[0]

    def _draw(self, commands: Iterator[tuple[str, bytes]], ids: Iterator[str]) -> dict[str, list[Item]]:
        """The next `batch` commands, by node; empty when the workload has no more."""
        drawn: dict[str, list[Item]] = {}
        for count, (node, command) in enumerate(commands, 1):
            drawn.setdefault(node, []).append((next(ids), command))
            if count >= self.batch:
                break
        return drawn

    async def _stream(self, stream: str, interval: float, halted: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        commands = self.commands(stream)
        ids = iter(f"{self.prefix}-{self._generation}-{stream}-{n}" for n in range(1 << 62))
        pool = None
        if not self.exactly_once:  # a few draws, serialized once; no ids: a resent request must run again
            draws = [self._draw(commands, iter(lambda: "", None)) for _ in range(_POOL)]
            pool = [[(node, _request(items)) for node, items in d.items()] for d in draws if d]
        rng = random.Random(f"{self.seed}:{stream}:pool")
        due = loop.time() + interval * rng.random()  # spread paced streams over one interval
        while not halted.is_set():
            if interval:
                if await _halted_within(halted, due - loop.time()):
                    return
                due = max(due + interval, loop.time() - interval)  # a late call does not start a burst
            if pool is not None:
                if not pool:
                    return
                await asyncio.gather(*(self._send_blind(node, payload, halted)
                                       for node, payload in pool[rng.randrange(len(pool))]))
                continue
            drawn = self._draw(commands, ids)
            if not drawn:
                return
            await asyncio.gather(*(self._send(node, items, halted) for node, items in drawn.items()))

    async def _send_blind(self, node: str, payload: bytes, halted: asyncio.Event) -> None:
        try:
            await self._calls[node](payload, timeout=self.timeout)
        except grpc.aio.AioRpcError as error:
            self._call_failed(node, error)
            await _halted_within(halted, RETRY_PAUSE_S)
            return
        self.stats.calls += 1

    async def _send(self, node: str, items: list[Item], halted: asyncio.Event) -> list[pb.SubmitResult | None]:
        """`items` to `node` in SubmitBatch calls, the unanswered ones again until answered or given up on."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.give_up_s
        counts = self.stats.node(node)
        results: dict[str, pb.SubmitResult | None] = {}
        last: dict[str, str] = {}  # request id -> the status of its last unanswered try
        pending = items
        while pending:
            again: list[Item] = []
            try:
                answer = pb.SubmitBatchResponse.FromString(
                    await self._calls[node](_request(pending), timeout=self.timeout))
            except grpc.aio.AioRpcError as error:
                self._call_failed(node, error)
                code = error.code().name
                if code in RETRIED:
                    again = pending
                    last.update((rid, code) for rid, _ in pending)
                else:  # the call itself refused (a batch too big, ids repeated): every command in it
                    for rid, command in pending:
                        counts.refusals[code] += 1
                        results[rid] = self._tell(node, command, None, code)
            else:
                self.stats.calls += 1
                for (rid, command), result in zip(pending, answer.results, strict=False):
                    code = "OK" if result.code == _OK else _CODE_NAMES.get(result.code, str(result.code))
                    if code == "OK":
                        counts.replies += 1
                        self.stats.replayed += result.replayed
                        results[rid] = self._tell(node, command, result.reply, code, result)
                    elif code in RETRIED:
                        self._report(node, code, result.message)
                        again.append((rid, command))
                        last[rid] = code
                    else:
                        counts.refusals[code] += 1
                        results[rid] = self._tell(node, command, None, code)
            if again and (loop.time() >= deadline or await _halted_within(halted, RETRY_PAUSE_S)):
                for rid, command in again:  # the outcome is unknown: it may have run
                    counts.given_up += 1
                    results[rid] = self._tell(node, command, None, last[rid])
                again = []
            self.stats.retries += len(again)
            pending = again
        return [results.get(rid) for rid, _ in items]

    def _tell(self, node: str, command: bytes, reply: bytes | None, status: str,
              result: pb.SubmitResult | None = None) -> pb.SubmitResult | None:
        if self.on_answer is not None:
            self.on_answer(node, command, reply, status)
        return result

    def _call_failed(self, node: str, error: grpc.aio.AioRpcError) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{node}: {error.code().name}: {error.details()}"
        self._report(node, error.code().name, error.details() or "")

    def _report(self, node: str, code: str, details: str) -> None:
        key = f"{node}:{code}"
        if self.on_error is not None and key not in self._reported:
            self._reported.add(key)
            self.on_error(f"a call to {node} failed: {code}: {details}")


def _request(items: list[Item]) -> bytes:
    """The SubmitBatch request of `items`, serialized. Each item is added in place and filled
    field by field: a list of SubmitRequests given to the constructor is copied item by item,
    six times the cost (~1.4 µs a command, beside ~0.2)."""
    request = pb.SubmitBatchRequest()
    add = request.items.add
    for rid, command in items:
        item = add()
        item.request_id = rid
        item.command = command
    return request.SerializeToString()


async def _halted_within(halted: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True at once when `halted` is set."""
    if seconds > 0 and not halted.is_set():
        try:
            await asyncio.wait_for(halted.wait(), seconds)
        except TimeoutError:
            pass
    return halted.is_set()
