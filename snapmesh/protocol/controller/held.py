"""Reports held until their snapshot ends: one log round per snapshot, not one per report.

A report that does not complete its snapshot changes nothing anyone is shown: the
snapshot's outcome is a pure function of its start and all its reports. So its
record need not be durable on its own, and the node's call need not be answered
yet. The controller keeps the record here, with the call, and journals every held
record of the snapshot in the step that journals its end, so the whole snapshot
costs one fsync after its Started record however far apart its reports arrive.

H1. A report with a `call` that does not complete its snapshot is held: no Journal,
    no Publish; its call is not answered yet. (A report without a call, the
    simulator's and the replay's, is journaled at once as before.)
H2. At the snapshot's end the held calls are answered (AnswerReport) after the
    end's records: at COMPLETE every held report is journaled first, in the same
    step as the completing report and the Finished record (one log round); at
    FAILED the held reports are dropped (the snapshot no longer needs them) and
    the calls are answered once FAILED is durable.
H3. A repeat of a held report (the node's call timed out and it tried again)
    joins the held calls; it is answered with them.
H4. A report is answered only once its record (or its snapshot's FAILED) is
    durable, so an answered report survives a crash. A held one dies with the
    controller unanswered: the node keeps its pending report and sends it again
    to the restarted controller, which knows the snapshot from its Started record.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from snapmesh.protocol.controller import journal


@dataclass(slots=True)
class _Held:
    records: dict[str, journal.Reported] = field(default_factory=dict)  # by node
    calls: list[Hashable] = field(default_factory=list)


class HeldReports:
    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}  # by snapshot id, until it ends
        self._calls: set[Hashable] = set()

    def hold(self, record: journal.Reported, call: Hashable) -> None:
        """H1: `record` waits for its snapshot's end, `call` for its answer."""
        held = self._held.setdefault(record.snapshot_id, _Held())
        held.records[record.state.node_id] = record
        self.join(record.snapshot_id, call)

    def holds(self, snapshot_id: str, node_id: str) -> bool:
        """`node_id`'s report of `snapshot_id` is held (H3 asks)."""
        held = self._held.get(snapshot_id)
        return held is not None and node_id in held.records

    def join(self, snapshot_id: str, call: Hashable) -> None:
        """H3: `call` is answered with the held reports of `snapshot_id`."""
        self._held[snapshot_id].calls.append(call)
        self._calls.add(call)

    def holding(self, call: Hashable) -> bool:
        """`call` waits for its snapshot's end (the shell awaits its AnswerReport)."""
        return call in self._calls

    def release(self, snapshot_id: str) -> tuple[list[journal.Reported], tuple[Hashable, ...]]:
        """H2: the snapshot ended: its held records, and the calls to answer."""
        held = self._held.pop(snapshot_id, None)
        if held is None:
            return [], ()
        self._calls.difference_update(held.calls)
        return list(held.records.values()), tuple(held.calls)

    def __len__(self) -> int:
        return len(self._held)
