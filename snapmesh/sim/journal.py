"""The controller's journal in the simulator: appends wait in `pending` until a flush makes a prefix durable.

As `sim/disk.py` does for a node's log, and as the gRPC controller's group
commit does (services/controller/journal.py): a record is durable only once
flushed, and a controller crash loses what is pending. The simulated
controller carries out the machine's effects as the engine's loop does: an
effect after a Journal in the same step waits (`defer`) until that record is
durable, so nothing is shown or sent before what it shows is durable. Each
case draws whether its journal lags at all; one that does not makes every
record durable at once.

The judge of that rule (D1): what was shown survives a controller crash. A
snapshot a node was told to start, or whose outcome was shown, is known after
the restart with that outcome; an epoch a node was sent is the journal's.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from snapmesh.protocol.controller import journal as records
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb


class SimJournal:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng  # its own generator: a lagging journal leaves the schedule's draws alone
        self.lags = rng.random() < 0.5
        self.durable: list[records.Record] = []
        self.pending: list[records.Record] = []
        self._deferred: deque[tuple[int, Callable[[], None]]] = deque()  # (records that must be durable, the effect)
        self.shown: dict[str, int] = {}  # snapshot -> the status shown (IN_PROGRESS: a node was told to start it)
        self.shown_epoch = 0

    @property
    def appended(self) -> int:
        return len(self.durable) + len(self.pending)

    def append(self, record: records.Record) -> int:
        """Journal `record`; returns how many records must be durable for what follows it."""
        (self.pending if self.lags else self.durable).append(record)
        return self.appended

    def defer(self, needed: int, effect: Callable[[], None]) -> bool:
        """Run `effect` once `needed` records are durable (now, when they are); False when it waits."""
        if needed <= len(self.durable) and not self._deferred:
            effect()
            return True
        self._deferred.append((needed, effect))
        return False

    def step(self) -> bool:
        """A scheduler step: some of what is pending may become durable. True when any did."""
        if self.pending and self.rng.random() < 0.5:
            self.flush(self.rng.randint(1, len(self.pending)))
            return True
        return False

    def flush(self, count: int | None = None) -> None:
        """Make the first `count` pending records durable (all: None), then carry out what waited for them."""
        count = len(self.pending) if count is None else count
        self.durable += self.pending[:count]
        del self.pending[:count]
        while self._deferred and self._deferred[0][0] <= len(self.durable):
            _, effect = self._deferred.popleft()
            effect()

    def crash(self) -> None:
        """The controller dies: what is pending is lost, and what waited for it never happens."""
        self.pending.clear()
        self._deferred.clear()

    def restarted(self, statuses: dict[str, int], epoch: int) -> None:
        """D1, once the journal is replayed: everything shown is still so."""
        for sid, shown in self.shown.items():
            now = statuses.get(sid)
            if now is None or (shown != pb.Snapshot.IN_PROGRESS and now != shown):
                said = pb.Snapshot.Status.Name(shown)
                raise Violation(
                    f"durable before shown: snapshot {sid} was shown {said}, and after a controller restart it is "
                    f"{'unknown' if now is None else pb.Snapshot.Status.Name(now)}"
                )
        if epoch < self.shown_epoch:
            raise Violation(f"durable before shown: nodes were sent epoch {self.shown_epoch}, the journal gives {epoch}")
