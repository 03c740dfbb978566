"""The controller's hops of a snapshot's path after a node's cut (snapmesh/protocol/hops.py),
timed for `snapmesh_snapshot_hop_seconds{hop}` (docs/metrics.md):

    received   the node's `sent_at_unix_ns` -> the engine takes the report (this
               process's wall clock: the one hop across processes)
    journaled  taken -> its journal record durable (monotonic), for the report that
               completes its snapshot (with the held reports' records and the outcome);
               a held report (the machine's held.py) has no hop of its own
    visible    durable -> COMPLETE in the hands of a waiting trigger (monotonic):
               from the callback that brings the journal's round back to the loop
               (it carries the step on and sets the trigger's answer: steps.py) to
               the trigger's coroutine resumed, the next loop turn

The engine says when each happens; this object keeps the stamps in between (a
waiting trigger's, by its call) and moves the metric (`measures.hop`).
"""

from __future__ import annotations

from collections.abc import Iterable

from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.protocol import hops
from snapmesh.protocol.controller import measures
from snapmesh.protocol.controller.tracker import COMPLETE, Now
from snapmesh.v1 import snapmesh_pb2 as pb


class ControllerHops:
    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics
        self._durable_at: dict[int, float] = {}  # a waiting trigger's call -> when its answer's records were durable

    def received(self, state: pb.FullState, now: Now) -> None:
        """The machine took `state` (not refused) at `now`."""
        self._metrics.apply(measures.hop("received", hops.transit_s(state.sent_at_unix_ns, now.wall)))

    def journaled(self, received: Now, durable_at: float | None) -> None:
        """The report taken at `received` is durable since `durable_at` (monotonic; None: its step journaled nothing)."""
        if durable_at is not None:
            self._metrics.apply(measures.hop("journaled", durable_at - received.mono))

    def answering(self, calls: Iterable[int], durable_at: float | None) -> None:
        """An AnswerTrigger for `calls` is carried out, its step's records durable since `durable_at`."""
        if durable_at is not None:
            for call in calls:
                self._durable_at[call] = durable_at

    def visible(self, call: int, snapshot: pb.Snapshot, mono: float) -> None:
        """The trigger waiting as `call` holds `snapshot` at `mono`: the hop, when it is COMPLETE."""
        durable_at = self._durable_at.pop(call, None)
        if durable_at is not None and snapshot.status == COMPLETE:
            self._metrics.apply(measures.hop("visible", mono - durable_at))

    def forget(self, call: int) -> None:
        """The trigger waiting as `call` is gone (answered, failed or cancelled)."""
        self._durable_at.pop(call, None)
