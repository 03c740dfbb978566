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
R4. A touched key that stayed in its range (a put, an update) has its entry alone
    encoded again and put in place of the old one, found by the entries' ends kept
    beside the bytes (8 bytes a key): a range of ~64 entries is copied, not encoded.
    A range whose keys changed (one added or removed, split or joined) is encoded whole.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import accumulate
from collections.abc import Callable, Mapping
from typing import Any


class Ranges:
    """The encoded ranges of one node's keys (rules R1-R4)."""

    def __init__(self, boundary: Callable[[str], bool], entry: Callable[[str, Any], bytes]):
        self._boundary = boundary
        self._entry = entry
        self._of: Mapping[str, Any] | None = None  # the keys the ranges below are of (R3)
        self._bounds: list[str] = []  # each complete range's last key, sorted
        self._members: list[list[str]] = [[]]  # each range's keys, sorted; one more than bounds: the last range
        # each range's encoding and where each of its entries ends in it (R4); None once its keys changed
        self._encoded: list[tuple[bytes, array[int]] | None] = [None]
        self._touched: set[str] = set()

    def touch(self, key: str) -> None:
        self._touched.add(key)

    def encoded(self, keys: Mapping[str, Any]) -> list[bytes]:
        """Each range's entries (R1): the touched ranges encoded again, the others as kept."""
        if keys is not self._of:
            self._build(keys)
        else:
            changed = [key for key in self._touched if self._apply(key, key in keys)]
            for key in changed:  # after every key added or removed: the ranges are where they stay
                self._splice(key, keys[key])
        self._touched.clear()
        for i, kept in enumerate(self._encoded):
            if kept is None:
                entries = [(b"," if i or n else b"") + self._entry(key, keys[key])
                           for n, key in enumerate(self._members[i])]
                self._encoded[i] = (b"".join(entries), array("Q", accumulate(map(len, entries))))
        return [kept[0] for kept in self._encoded]  # type: ignore[index]  (each one encoded above)

    def _build(self, keys: Mapping[str, Any]) -> None:
        self._of = keys
        self._bounds, self._members = [], [[]]
        for key in sorted(keys):
            self._members[-1].append(key)
            if self._boundary(key):
                self._bounds.append(key)
                self._members.append([])
        self._encoded = [None] * len(self._members)

    def _apply(self, key: str, present: bool) -> bool:
        """The range structure after `key` was added, removed or changed, its range(s) marked
        for encoding when their keys changed; whether only its entry changed (R4)."""
        i = bisect_left(self._bounds, key)  # the range whose keys are > bounds[i-1] and <= bounds[i]
        members = self._members[i]
        j = bisect_left(members, key)
        listed = j < len(members) and members[j] == key
        if present and listed:
            return True
        if present:
            members.insert(j, key)
            if self._boundary(key):  # it ends a range now: the keys up to it are one
                self._members[i:i + 1] = [members[:j + 1], members[j + 1:]]
                self._bounds.insert(i, key)
                self._encoded[i:i + 1] = [None, None]
                return False
        elif listed:
            del members[j]
            if i < len(self._bounds) and self._bounds[i] == key:  # its range ended with it: joined to the next
                self._members[i:i + 2] = [members + self._members[i + 1]]
                del self._bounds[i]
                self._encoded[i:i + 2] = [None]
                return False
        else:
            return False  # neither here nor listed: nothing changed
        self._encoded[i] = None
        return False

    def _splice(self, key: str, value: Any) -> None:
        """The key's entry encoded again in its range's kept bytes, in place of its old one (R4)."""
        i = bisect_left(self._bounds, key)
        kept = self._encoded[i]
        if kept is None:
            return  # encoded whole below
        data, ends = kept
        j = bisect_left(self._members[i], key)
        start, end = ends[j - 1] if j else 0, ends[j]
        entry = (b"," if i or j else b"") + self._entry(key, value)
        shift = len(entry) - (end - start)
        for n in range(j, len(ends)):
            ends[n] += shift
        self._encoded[i] = (data[:start] + entry + data[end:], ends)
