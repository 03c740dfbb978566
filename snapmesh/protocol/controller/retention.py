"""Which finished snapshots `--keep N` retention deletes, kept current as snapshots come and go, pure.

The one rule (K1; the machine emits Retire for what it returns): the finished snapshots
older than the N newest COMPLETE ones (ids sort in start order), except the one
last restored. The controller applies it on every COMPLETE to the tracker's
working set (up to a thousand snapshots); sorting that set each time made a
completion cost grow with the snapshots kept. Here the ids stay sorted as
snapshots finish and leave memory, so a COMPLETE costs a bisect and the ids it
retires.
"""

from __future__ import annotations

import bisect


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

    def retire(self, keep: int, protect: str = "") -> list[str]:
        """The ids the rule gives now that no earlier call returned, sorted."""
        if keep < 1 or len(self._complete) <= keep:
            return []
        below = bisect.bisect_left(self._waiting, self._complete[-keep])
        retired = [sid for sid in self._waiting[:below] if sid != protect]
        self._waiting[:below] = [protect] if len(retired) < below else []  # the protected one may go later
        return retired
