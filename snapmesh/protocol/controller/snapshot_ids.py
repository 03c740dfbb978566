"""Snapshot ids: the one format the controller makes, and the check every RPC
taking a snapshot id runs first.

An id is the UTC start time to the microsecond and a random suffix,
`YYYYmmddTHHMMSS.ffffffZ-HEX` (`20260101T120000.000000Z-1a2b3c4d`): ids sort in
start order, and only such a text ever names a file of the store. Pure: the time
and the random bytes are arguments.
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
    """The start times of one controller's snapshots, each after the one before:
    ids sort in start order even for two starts within one clock tick, or after
    the wall clock stepped back."""

    def __init__(self) -> None:
        self._last = 0  # in whole microseconds: adding 1e-6 to a float of 1.7e9 s drifts, and two starts could share one

    def start(self, wall: float, suffix: Iterable[int]) -> tuple[str, float]:
        """The next snapshot's id and start time, at the wall clock's `wall` or a microsecond after the last start."""
        self._last = max(int(round(wall * 1_000_000)), self._last + 1)
        return _id_at(self._last, suffix), self._last / 1_000_000


SNAPSHOT_ID_MAX = 64
_SNAPSHOT_ID = re.compile(r"[0-9]{8}T[0-9]{6}\.[0-9]{6}Z-[0-9a-f]{2,32}")


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
