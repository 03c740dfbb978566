"""A LoadGenerator on a thread of its own, for synchronous callers (the tests, chaos, `snapmesh app --app`).

    with BackgroundLoad.for_cluster(cluster, batch=50) as load:
        ...
    assert load.stats.accepted > 0
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from snapmesh.app import load_app
from snapmesh.load.generator import LoadGenerator
from snapmesh.load.stats import LoadStats
from snapmesh.services.app.drive import node_infos
from snapmesh.settings.config import hosted
from snapmesh.v1 import snapmesh_pb2 as pb


class BackgroundLoad:
    def __init__(self, generator: LoadGenerator, *, callers: int = 1, interval: float = 0.0) -> None:
        self.generator = generator
        self.callers = callers
        self.interval = interval
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: BaseException | None = None  # what ended the thread, raised by stop()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="load", daemon=True)

    @classmethod
    def for_cluster(cls, cluster, *, callers: int = 1, interval: float = 0.0, app=None,
                    params: Mapping[str, Any] | None = None, max_amount: int | None = None,
                    **options) -> BackgroundLoad:
        """Load on every node of a `supervisor.Cluster`, dialled directly (past any proxy): the
        workload of `app` (default: the one the cluster runs, the bank for a file without [app])
        with the cluster's [app] params, `params` over them; `max_amount`, the bank's, is one of
        them. `options` go to the LoadGenerator."""
        if max_amount is not None and max_amount < 1:
            raise ValueError(f"max_amount must be >= 1, got {max_amount}")
        settings = hosted(cluster.config)
        if app is None:
            app = load_app(settings.module)
        topology = cluster.config.topology
        merged = {**settings.params, **(params or {})}
        if max_amount is not None:
            merged["max_amount"] = max_amount
        infos = node_infos(list(topology.nodes), topology.channels, merged)
        options.setdefault("identity", getattr(cluster, "client_identity", None))
        generator = LoadGenerator(app, {n: cluster.direct_address(n) for n in topology.nodes}, infos, **options)
        return cls(generator, callers=callers, interval=interval)

    @property
    def stats(self) -> LoadStats:
        return self.generator.stats

    def __enter__(self) -> BackgroundLoad:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> BackgroundLoad:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the load thread did not start")
        return self

    def submit(self, node: str, command: bytes, request_id: str) -> pb.SubmitResult | None:
        """One command sent from the load's thread, retried under `request_id` (LoadGenerator.submit)."""
        if self._loop is None or self._stop.is_set():
            raise RuntimeError("the load is not running")
        future = asyncio.run_coroutine_threadsafe(self.generator.submit(node, command, request_id), self._loop)
        return future.result()

    def stop(self) -> None:
        """Stop making calls and wait for the thread (idempotent). A stream that failed raises here."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.generator.timeout + 30)
            if self._thread.is_alive():
                raise RuntimeError("the load thread did not stop")
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"the load failed: {failure!r}") from failure

    async def _main(self) -> None:
        try:
            async with self.generator as generator:
                self._loop = asyncio.get_running_loop()
                if self.callers:
                    await generator.set(self.callers, self.interval)
                self._ready.set()
                while not self._stop.is_set():
                    await asyncio.sleep(0.05)
        except Exception as exc:  # handed to the thread that stops the load: stop() raises it
            self._failure = exc
        finally:
            self._ready.set()
