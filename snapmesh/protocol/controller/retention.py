"""Which finished snapshots `--keep N` retention deletes, kept current as snapshots come and go, pure.

The rules (the machine emits Retire for what `retire` returns):
K1. The finished snapshots older than the N newest COMPLETE ones (ids sort in
    start order) are retired, except the ones `retire` is told to protect: the
    one last restored.
K2. A COMPLETE never retires the snapshot it completed (the machine protects
    it): whatever its id, the snapshot a user just saw complete keeps its files
    at least until the next COMPLETE. Ids keep start order (snapshot_ids.py I1);
    this holds even where they do not (ids from another controller, a test's).
A protected snapshot stays in the rule's view: a later call retires it once
nothing protects it.

The controller applies them on every COMPLETE to the tracker's working set (up to
a thousand snapshots); sorting that set each time made a completion cost grow
with the snapshots kept. Here the ids stay sorted as snapshots finish and leave
memory, so a COMPLETE costs a bisect and the ids it retires.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection


class Retention:
    def __init__(self) -> None:
        self._complete: list[str] = []  # the COMPLETE ids in memory, sorted
        self._waiting: list[str] = []  # the finished ids in memory not retired yet, sorted

    def add(self, snapshot_id: str, complete: bool) -> None:
        """A finished snapshot is in memory (not there already)."""
        if complete:
            bisect.insort(self._complete, snapshot_id)
        bisect.insort(self._waiting, snapshot_id)

    def remove(self, snapshot_id: str, complete: bool) -> None:
        """A finished snapshot left memory: the rule no longer sees it."""
        for ids in (self._complete, self._waiting) if complete else (self._waiting,):
            i = bisect.bisect_left(ids, snapshot_id)
            if i < len(ids) and ids[i] == snapshot_id:
                del ids[i]

    def retire(self, keep: int, protect: Collection[str] = ()) -> list[str]:
        """The ids the rules give now that no earlier call returned, sorted; none of
        `protect` (K1's last restored, K2's just completed)."""
        if keep < 1 or len(self._complete) <= keep:
            return []
        below = bisect.bisect_left(self._waiting, self._complete[-keep])
        retired = [sid for sid in self._waiting[:below] if sid not in protect]
        if len(retired) < below:  # the protected ones may go later
            self._waiting[:below] = [sid for sid in self._waiting[:below] if sid in protect]
        else:
            del self._waiting[:below]
        return retired
