"""The one load generator: transfers made against a cluster's nodes.

The bank app (`snapmesh app`), the real-process tests and the benchmarks all
move money with it; only how they drive it differs:

- `LoadGenerator` (asyncio): per node, `callers` concurrent callers, each
  sending `TransferBatch` calls of `batch` transfers (amount 1..`max_amount`)
  to random neighbours, one call per `interval` seconds (0: the next as soon as
  the answer is back, a closed loop). `set(callers, interval)` changes the load
  while it runs. With `tally`, every answer is read and `stats` counts the
  transfers accepted, refused for insufficient funds, and failed; without it
  (the bench, where the generator must stay cheap) only calls are counted and
  requests are drawn from a few pre-serialized ones.
- `BackgroundLoad`: the same on a thread of its own, for synchronous code
  (the tests): `with BackgroundLoad.for_cluster(cluster) as load: ...`.

Errors never escape: a node down or a stream cut is counted (and reported
once per node and status through `on_error`), and the caller waits 0.1 s
before its next call. The nodes' logs, not these counters, are the truth.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from snapmesh.settings import security
from snapmesh.serving import credentials
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb

TRANSFER_BATCH = "/snapmesh.v1.Node/TransferBatch"
_OK = grpc.StatusCode.OK.value[0]
_REFUSED = grpc.StatusCode.FAILED_PRECONDITION.value[0]  # insufficient funds
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_POOL = 16  # pre-serialized requests per node when not tallying
_BACKOFF_S = 0.1  # after a failed call


@dataclass(slots=True)
class LoadStats:
    calls: int = 0  # answered TransferBatch calls
    accepted: int = 0  # transfers (counted only with `tally`)
    refused: int = 0  # insufficient funds: expected now and then
    failed: int = 0  # any other refusal, and every transfer of a failed call
    moved: int = 0  # money in accepted transfers
    errors: int = 0  # failed calls (a node down, a timeout)
    last_error: str = ""


class LoadGenerator:
    """`targets`: node id -> address to dial; `neighbours`: node id -> nodes it
    may pay (nodes without any make no calls). `seed` draws every request."""

    def __init__(
        self,
        targets: Mapping[str, str],
        neighbours: Mapping[str, Sequence[str]],
        *,
        batch: int = 1,
        max_amount: int = 100,
        seed: int = 1,
        tally: bool = True,
        timeout: float = 30.0,
        on_error: Callable[[str], None] | None = None,
        identity: security.Identity | None = None,  # a TLS cluster's client identity; None: plaintext
    ) -> None:
        self._identity = identity
        if batch < 1 or max_amount < 1:
            raise ValueError(f"batch and max_amount must be >= 1, got {batch} and {max_amount}")
        self.neighbours = {n: list(neighbours.get(n, ())) for n in targets if neighbours.get(n)}
        self.targets = {n: targets[n] for n in self.neighbours}
        self.batch = batch
        self.max_amount = max_amount
        self.seed = seed
        self.tally = tally
        self.timeout = timeout
        self.on_error = on_error
        self.stats = LoadStats()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._pools: dict[str, list[tuple[bytes, list[int]]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._halted = asyncio.Event()  # set: the current callers make no new call
        self._reported: set[str] = set()

    async def __aenter__(self) -> LoadGenerator:
        for node, address in self.targets.items():
            channel = credentials.open_channel(address, self._identity, options=CLIENT_OPTIONS, aio=True)
            self._channels[node] = channel
            # Bytes in, bytes out: nothing is serialized or parsed per call unless asked.
            self._calls[node] = channel.unary_unary(TRANSFER_BATCH)
            if not self.tally:
                rng = random.Random(f"{self.seed}:{node}")
                self._pools[node] = [self._request(node, rng) for _ in range(_POOL)]
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def set(self, callers: int, interval: float = 0.0) -> None:
        """Run `callers` callers per node, each making one call per `interval`
        seconds (0: back to back); 0 callers stops the load. Calls already
        made are answered first, so `stats` counts every transfer a node took."""
        await self._halt()
        self._halted = asyncio.Event()
        for node in self.targets:
            for index in range(callers):
                rng = random.Random(f"{self.seed}:{node}:{index}")
                self._tasks.append(asyncio.create_task(self._caller(node, rng, interval, self._halted)))

    async def close(self) -> None:
        await self._halt()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _halt(self) -> None:
        """No new calls; wait for the answers to those under way (then cancel what is left)."""
        self._halted.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=self.timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _request(self, node: str, rng: random.Random) -> tuple[bytes, list[int]]:
        pairs = [(rng.choice(self.neighbours[node]), rng.randint(1, self.max_amount)) for _ in range(self.batch)]
        request = pb.TransferBatchRequest(transfers=[pb.TransferRequest(to=to, amount=a) for to, a in pairs])
        return request.SerializeToString(), [a for _, a in pairs]

    async def _caller(self, node: str, rng: random.Random, interval: float, halted: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        call, pool = self._calls[node], self._pools.get(node)
        due = loop.time() + interval * rng.random()  # spread paced callers over one interval
        while not halted.is_set():
            if interval:
                if await _halted_within(halted, due - loop.time()):
                    return
                due = max(due + interval, loop.time() - interval)  # a late call does not start a burst
            payload, amounts = pool[rng.randrange(len(pool))] if pool else self._request(node, rng)
            try:
                answer = await call(payload, timeout=self.timeout)
            except grpc.aio.AioRpcError as error:
                self._call_failed(node, error, len(amounts))
                await _halted_within(halted, _BACKOFF_S)
                continue
            self.stats.calls += 1
            if self.tally:
                self._count(node, pb.TransferBatchResponse.FromString(answer), amounts)

    def _count(self, node: str, response: pb.TransferBatchResponse, amounts: list[int]) -> None:
        stats = self.stats
        for result, amount in zip(response.results, amounts, strict=False):
            if result.code == _OK:
                stats.accepted += 1
                stats.moved += amount
            elif result.code == _REFUSED:
                stats.refused += 1
            else:
                stats.failed += 1
                self._report(node, _CODE_NAMES.get(result.code, str(result.code)), result.message)

    def _call_failed(self, node: str, error: grpc.aio.AioRpcError, transfers: int) -> None:
        self.stats.errors += 1
        self.stats.failed += transfers
        self.stats.last_error = f"{node}: {error.code().name}: {error.details()}"
        self._report(node, error.code().name, error.details() or "")

    def _report(self, node: str, code: str, details: str) -> None:
        key = f"{node}:{code}"
        if self.on_error is not None and key not in self._reported:
            self._reported.add(key)
            self.on_error(f"transfer from {node} failed: {code}: {details}")


async def _halted_within(halted: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True at once when `halted` is set."""
    if seconds > 0 and not halted.is_set():
        try:
            await asyncio.wait_for(halted.wait(), seconds)
        except TimeoutError:
            pass
    return halted.is_set()


class BackgroundLoad:
    """A LoadGenerator on a thread of its own, for synchronous callers.

        with BackgroundLoad.for_cluster(cluster, batch=50) as load:
            ...
        assert load.stats.accepted > 0
    """

    def __init__(self, generator: LoadGenerator, *, callers: int = 1, interval: float = 0.0) -> None:
        self.generator = generator
        self.callers = callers
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="load", daemon=True)

    @classmethod
    def for_cluster(cls, cluster, *, callers: int = 1, interval: float = 0.0, **options) -> BackgroundLoad:
        """Load on every node of a `supervisor.Cluster`, dialled directly (past
        any proxy), to its neighbours in the cluster's topology; `options` go to
        the LoadGenerator."""
        topology = cluster.config.topology
        targets = {n: cluster.direct_address(n) for n in topology.nodes}
        options.setdefault("identity", getattr(cluster, "client_identity", None))
        generator = LoadGenerator(targets, {n: topology.outgoing(n) for n in topology.nodes}, **options)
        return cls(generator, callers=callers, interval=interval)

    @property
    def stats(self) -> LoadStats:
        return self.generator.stats

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop making calls and wait for the thread (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
            if self._thread.is_alive():
                raise RuntimeError("the load thread did not stop")

    async def _main(self) -> None:
        async with self.generator as generator:
            await generator.set(self.callers, self.interval)
            while not self._stop.is_set():
                await asyncio.sleep(0.05)
