"""kvshard's keys in ranges, each range's entries encoded once and kept until a key in it changes.

A snapshot of kvshard re-encoding every key costs time in proportion to the state
(about 0.4 s of CPU at 64 MiB), where only the ranges a change touched differ from
the last snapshot. The ranges are kvshard's (`snapshot_blocks`): a range ends after
a key that `boundary` says ends one, so the ranges depend on the keys present only.

Rules:
R1. `encoded(keys)` is, for each range in key order, its entries joined, each
    entry "," + `entry(key, keys[key])` but the first key's, without the comma; the
    last range is the one after the last boundary key (possibly empty). The same
    bytes a fresh encoding gives. Range 0 is kept without its leading comma, as
    whatever makes another key the first (an insert before it, its delete, a
    join of range 0 with the next) is a change within range 0.
R2. The owner calls `touch(key)` whenever the key is added to `keys`, removed
    from it, or its entry changes. An untouched range's bytes are the ones kept.
R3. A `keys` that is not the mapping of the last call (a restore, a refill, a
    replacement) is encoded afresh, whatever was touched.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any


class Ranges:
    """The encoded ranges of one node's keys (rules R1-R3)."""

    def __init__(self, boundary: Callable[[str], bool], entry: Callable[[str, Any], bytes]):
        self._boundary = boundary
        self._entry = entry
        self._of: Mapping[str, Any] | None = None  # the keys the ranges below are of (R3)
        self._bounds: list[str] = []  # each complete range's last key, sorted
        self._members: list[list[str]] = [[]]  # each range's keys, sorted; one more than bounds: the last range
        self._bytes: list[bytes | None] = [None]  # each range's encoding, None once it changed
        self._touched: set[str] = set()

    def touch(self, key: str) -> None:
        self._touched.add(key)

    def encoded(self, keys: Mapping[str, Any]) -> list[bytes]:
        """Each range's entries (R1): the touched ranges encoded again, the others as kept."""
        if keys is not self._of:
            self._build(keys)
        else:
            for key in self._touched:
                self._apply(key, key in keys)
        self._touched.clear()
        for i, encoded in enumerate(self._bytes):
            if encoded is None:
                self._bytes[i] = b"".join((b"," if i or n else b"") + self._entry(key, keys[key])
                                          for n, key in enumerate(self._members[i]))
        return self._bytes[:]

    def _build(self, keys: Mapping[str, Any]) -> None:
        self._of = keys
        self._bounds, self._members = [], [[]]
        for key in sorted(keys):
            self._members[-1].append(key)
            if self._boundary(key):
                self._bounds.append(key)
                self._members.append([])
        self._bytes = [None] * len(self._members)

    def _apply(self, key: str, present: bool) -> None:
        """The range structure after `key` was added, removed or changed; its range(s) marked for encoding."""
        i = bisect_left(self._bounds, key)  # the range whose keys are > bounds[i-1] and <= bounds[i]
        members = self._members[i]
        j = bisect_left(members, key)
        listed = j < len(members) and members[j] == key
        if present and not listed:
            members.insert(j, key)
            if self._boundary(key):  # it ends a range now: the keys up to it are one
                self._members[i:i + 1] = [members[:j + 1], members[j + 1:]]
                self._bounds.insert(i, key)
                self._bytes[i:i + 1] = [None, None]
                return
        elif listed and not present:
            del members[j]
            if i < len(self._bounds) and self._bounds[i] == key:  # its range ended with it: joined to the next
                self._members[i:i + 2] = [members + self._members[i + 1]]
                del self._bounds[i]
                self._bytes[i:i + 2] = [None]
                return
        elif not present:
            return  # neither here nor listed: nothing changed
        self._bytes[i] = None
