"""Which blocks a node's save of a large state carries in its pending-report file, pure.

A pending report of a large state (services/node/reportblocks.py) names its blocks
(its manifest); a restart rebuilds the state from them. Those blocks used to be
written as files beside the report and made durable with it by one syncfs(2) of the
whole file system, which waits for every process's dirty pages (the controller's,
the other nodes'): the save's sync followed the machine's writes, not the state's
change. Now the report's one file carries the blocks it needs that are not
durable elsewhere, and that file alone is synced.

SV1. A save carries, in its report's file, each block its state names that is not
    durable in the block directory: the new ones (found among the blocks whose
    name differs from the last state's at the same index, RK6) and those earlier
    saves carried that are not durable yet (`unsettled`). Each name once. A block
    durable in the directory is never carried: it is on disk, whole, and checked
    against its name when read (RK3).
SV2. A carried block becomes durable in the directory only after its report's
    file is (off the report's path, `ReportBlocks.collect`): written, then synced,
    then counted durable. Until it is counted durable every save that names it
    carries it again, so a report whose file is gone (acknowledged) never leaves a
    later one resting on a block that is on disk but not durable.
SV3. A restart rebuilds a report from its own carried blocks first, then the
    directory's; the carried ones are written (whole, over any file cut short by
    a crash) and synced into the directory before any save runs, so what the
    restarted node holds is what it held, durable.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence


def carried(
    names: Sequence[bytes], changed: Iterable[int], durable: Collection[bytes],
    unsettled: Iterable[bytes], kept: Collection[bytes],
) -> tuple[list[int], list[bytes]]:
    """SV1: the indices (into `names`) of the new blocks a save carries, then the
    names of `unsettled` (carried before, not durable yet) it carries again;
    `changed`: the indices whose names differ from the last state's; `kept`: the
    names of the state, as a set."""
    seen: set[bytes] = set()
    new: list[int] = []
    for i in changed:
        name = names[i]
        if name in durable or name in seen:
            continue
        seen.add(name)
        new.append(i)
    again = [name for name in unsettled if name in kept and name not in seen]
    return new, again
