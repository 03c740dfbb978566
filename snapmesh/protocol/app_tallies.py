"""An app's log records without their tallies, as the readers of raw lines (dicts) read them.

An app's record leaves its tally's key out; older logs wrote 0 there (wal.APP_MARKS).
A reader that holds a line as a dict (the checkers, the trace, the bank's reading of
the logs) asks here: a record with its kind's mark and without its tally has a tally of
0; any other record without it is bad input, named by where it was read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapmesh.protocol import wal

# kind -> its tally's key in the log (the v1 format's: snapmesh/bank/formats.py)
TALLY_KEYS: Mapping[str, str] = {
    kind: name for kind in wal.APP_MARKS for (name, _, _), attr in zip(wal.SPEC[kind], wal.ATTRS[kind], strict=True)
    if attr == "tally"
}


def is_app_record(raw: Mapping[str, Any]) -> bool:
    """Whether a log line (a dict) is an app's record: it has its kind's mark (wal.APP_MARKS)."""
    mark = wal.APP_MARKS.get(raw.get("kind"))  # type: ignore[arg-type]
    return mark is not None and mark in raw


def tally_of(raw: Mapping[str, Any], where: str) -> int:
    """A log line's (a dict's) tally: 0 for an app's record that leaves it out;
    wal.CorruptRecord naming `where` (`file:line`) for another record without it."""
    key = TALLY_KEYS[raw["kind"]]
    if key in raw:
        return raw[key]
    if is_app_record(raw):
        return 0
    raise wal.CorruptRecord(f"{where}: {raw['kind']} record needs an integer {key!r}")
