"""Snapshot ids: the one format the controller makes, and the check every RPC
taking a snapshot id runs first.

An id is the UTC start time to the microsecond and a random suffix,
`YYYYmmddTHHMMSS.ffffffZ-HEX` (`20260101T120000.000000Z-1a2b3c4d`): ids sort in
start order, and only such a text ever names a file of the store. Pure: the time
and the random bytes are arguments.

Rule
----
I1. A controller's ids keep increasing, across its restarts too, whatever the wall
    clock does: each start is at the wall clock or a microsecond after the newest
    start known (`StartClock`), and at a restart the newest known is the newest id
    the files and the journal brought back (`StartClock.after`, from the machine's
    `replayed`). Retention (K1) and every listing go by id order, so an id that
    sorted before older ones would be taken for an old snapshot: with the clock
    behind at a restart, `--keep` retired the newest one as it completed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def new_snapshot_id(now: float, suffix: Iterable[int]) -> str:
    """A time-ordered id: UTC start time to the microsecond, then a random suffix.

    `suffix` is random bytes from the caller, so ids stay unique across restarts
    and several controllers without the tracker drawing randomness itself.
    """
    return _id_at(int(round(now * 1_000_000)), suffix)


def _id_at(micros: int, suffix: Iterable[int]) -> str:
    whole, fraction = divmod(micros, 1_000_000)
    return f"{_utc_stamp(whole)}.{fraction:06d}Z-{bytes(suffix).hex()}"


class StartClock:
    """The start times of one controller's snapshots, each after the one before (I1):
    ids sort in start order even for two starts within one clock tick, or after
    the wall clock stepped back, in this process or before a restart."""

    def __init__(self) -> None:
        self._last = 0  # in whole microseconds: adding 1e-6 to a float of 1.7e9 s drifts, and two starts could share one

    def after(self, snapshot_ids: Iterable[str]) -> None:
        """Every later start comes after the newest of `snapshot_ids` (the ids a restart
        brought back; a text that is not an id says nothing about the clock)."""
        times = [micros for sid in snapshot_ids if (micros := snapshot_id_micros(sid)) is not None]
        self._last = max([self._last, *times])

    def start(self, wall: float, suffix: Iterable[int]) -> tuple[str, float]:
        """The next snapshot's id and start time, at the wall clock's `wall` or a microsecond after the last start."""
        self._last = max(int(round(wall * 1_000_000)), self._last + 1)
        return _id_at(self._last, suffix), self._last / 1_000_000


def snapshot_id_micros(snapshot_id: str) -> int | None:
    """The start time an id names, in whole microseconds since the Unix epoch (None:
    `snapshot_id` is not an id `new_snapshot_id` makes)."""
    match = _SNAPSHOT_ID_PARTS.fullmatch(snapshot_id)
    if match is None or len(snapshot_id) > SNAPSHOT_ID_MAX:
        return None
    year, month, day, hour, minute, second, fraction = map(int, match.groups())
    seconds = _days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second
    return seconds * 1_000_000 + fraction


SNAPSHOT_ID_MAX = 64
_SNAPSHOT_ID = re.compile(r"[0-9]{8}T[0-9]{6}\.[0-9]{6}Z-[0-9a-f]{2,32}")
_SNAPSHOT_ID_PARTS = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})\.([0-9]{6})Z-[0-9a-f]{2,32}")


def snapshot_id_problem(snapshot_id: str) -> str:
    """Why `snapshot_id` is not an id `new_snapshot_id` makes ("" when it is one):
    what every RPC taking a snapshot id checks first, so that no other text (a
    `../` path, a name of any file) reaches the store."""
    if not snapshot_id:
        return "snapshot_id is empty"
    if len(snapshot_id) > SNAPSHOT_ID_MAX or not _SNAPSHOT_ID.fullmatch(snapshot_id):
        shown = snapshot_id if len(snapshot_id) <= SNAPSHOT_ID_MAX else snapshot_id[:SNAPSHOT_ID_MAX] + "..."
        return (f"snapshot_id {shown!r} is not a snapshot id (YYYYmmddTHHMMSS.ffffffZ-HEX, as "
                f"20260101T120000.000000Z-1a2b3c4d)")
    return ""


def _utc_stamp(seconds: int) -> str:
    """`seconds` since the Unix epoch as YYYYmmddTHHMMSS in UTC, by the civil-from-days
    rule of the proleptic Gregorian calendar (no clock and no time module)."""
    days, rest = divmod(seconds, 86_400)
    hour, rest = divmod(rest, 3_600)
    minute, second = divmod(rest, 60)
    era, day_of_era = divmod(days + 719_468, 146_097)  # 400-year eras from 0000-03-01
    year_of_era = (day_of_era - day_of_era // 1_460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153  # 0 = March
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    year = year_of_era + era * 400 + (month <= 2)
    return f"{year:04d}{month:02d}{day:02d}T{hour:02d}{minute:02d}{second:02d}"


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since the Unix epoch of a proleptic Gregorian date: `_utc_stamp`'s rule backwards."""
    year -= month <= 2
    era, year_of_era = divmod(year, 400)
    day_of_year = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468
