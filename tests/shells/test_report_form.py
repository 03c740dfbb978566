"""A small state's report is formed on the event loop, a large one in a thread (reporter.form)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from snapmesh.services.node import reporter as R
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.v1 import snapmesh_pb2 as pb


def reporter() -> R.StateReporter:
    return R.StateReporter(address="127.0.0.1:1", log_=None, metrics=NodeMetrics("p1", CollectorRegistry()),  # type: ignore[arg-type]
                           options=[])


@pytest.mark.parametrize(("size", "threads"), [(0, 0), (R.INLINE_FORM_BYTES, 0), (R.INLINE_FORM_BYTES + 1, 1)])
def test_only_a_state_past_the_inline_bound_goes_to_a_thread(monkeypatch, size: int, threads: int) -> None:
    handed: list[object] = []
    to_thread = asyncio.to_thread

    async def counted(fn, *args):
        handed.append(fn)
        return await to_thread(fn, *args)

    monkeypatch.setattr(R.asyncio, "to_thread", counted)
    state = b"".join(i.to_bytes(4, "big") for i in range(size // 4 + 1))[:size]  # every block differs
    message = pb.FullState(snapshot_id="s1", node_id="p1", state=state)
    sent, names = asyncio.run(reporter().form(message))
    assert len(handed) == threads
    assert sent is message and len(names) == (size + 8191) // 8192, "a first report goes whole, its blocks named"
