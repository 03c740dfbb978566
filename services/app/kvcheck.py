"""kvshard's invariant, every key exactly once, over a snapshot's View (kvshard.py).

Split from kvshard.py, which holds the machine: the check reads the states by
piece (View.fold) or by name (kvscan), never decoded whole.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable

from snapmesh.app import View
from snapmesh.services.app import kvscan


def every_key_exactly_once(view: View) -> list[str]:
    """The names created minus the names deleted are each found once, at a node or in a
    handoff in flight, and nothing else is found; each name created and deleted at most once.

    It reads one node's state at a time (kvscan: the names only, never the state decoded
    whole), so it holds one state, not all, and keeps a compact digest, not the names:
    with every name created once, the invariant holds iff the names found plus the
    names deleted are the names created, as multisets, which sums of a hash of each
    name, per bucket of names, tell. Names are created once when each namespace's
    ("p1/...") created names are listed at one node (K1, KR3), in order (sorted, so a
    name twice at one node is seen). Only the names of a bucket whose sums differ, or
    of a namespace listed at two nodes, are then read again and kept, to name what is
    wrong in the same words as a check over every name would.

    First, by pieces (View.fold): the sum of every name's digest, created +, found or
    deleted -, is 0 modulo _PRIME iff every bucket's is, but with odds 2^-127, and a
    piece's share of it is kept by the controller with the piece, so a snapshot adds
    up only the pieces that changed; and within a changed piece of key ranges, each
    block's share (its whole entries' names, read by kvscan S5), so a snapshot reads
    only the blocks that changed (foldmemo FM6). Only when that does not hold is
    every state read as below, to name what is wrong."""
    if _holds(view):
        return []
    sums = [0] * BUCKETS
    lister: dict[str, str] = {}  # namespace -> the node that lists its created names
    suspect: set[str] = set()  # namespaces listed at two nodes
    everything = False  # a node's created names out of order: every name is read again
    for node in view.states:
        everything = not _add_sums(view, node, sums, lister, suspect) or everything
    handoffs = _handoffs(view)
    for _, _, _, key in handoffs:
        sums[_digest(key) % BUCKETS] -= _digest(key)
    wrong = {bucket for bucket, total in enumerate(sums) if total % _PRIME}
    if not (wrong or suspect or everything):
        return []
    return _named_problems(view, handoffs, lambda name: everything or name.split("/", 1)[0] in suspect
                           or _digest(name) % BUCKETS in wrong)


BUCKETS = 4096  # digests kept: a wrong bucket's names are read again, about 1/BUCKETS of them
_PRIME = 2**127 - 1  # the sums are compared modulo it: a different multiset of names sums the same with odds 2^-127


_FOLD = "kvshard.every_key_exactly_once/1"  # names _piece's results in the controller's memo (View.fold)


def _holds(view: View) -> bool:
    """Whether every name's digest adds up to 0 (created +, found, deleted or handed off
    -), each namespace's created names listed at one node, in order: the invariant holds."""
    total, lister = 0, {}
    try:
        for node in view.states:
            # the pieces' shares joined (View.fold_joined): a changed piece re-joins its own
            # path, no step per piece; join's in_order is False for names listed in two pieces
            node_total, spaces, in_order = view.fold_joined(node, _FOLD, _BY_PIECE)
            if not in_order:
                return False  # created names in two pieces, or out of order: the slow path names why
            if any(lister.setdefault(space, node) != node for space in spaces or ()):
                return False
            total += node_total
    except ValueError:  # a piece that is not a run of whole parts: the slow path reads the states whole
        return False
    total -= sum(_digest(key) for _, _, _, key in _handoffs(view))
    return total % _PRIME == 0


def _piece(piece: bytes) -> tuple[int, tuple[str, ...] | None, bool]:
    """A piece's share (View.fold): its names' digests summed modulo _PRIME (created +,
    found or deleted -), its created names' namespaces (None: it lists none), and whether
    those are in order, each once."""
    total, spaces, last, in_order = 0, None, None, True
    for part, name in kvscan.piece_names(piece):
        digest = _digest(name)
        if part == "created":
            total += digest
            in_order = in_order and (last is None or name > last)
            last = name
            spaces = spaces or {}
            spaces[name.split("/", 1)[0]] = None
        else:
            total -= digest
    return total % _PRIME, None if spaces is None else tuple(spaces), in_order


class _ByPiece:
    """_piece, and the same share block by block (foldmemo FM6): a block's share is that
    of the keys' entries that end in it (kvscan S5), and it leaves the bytes of the one
    its end cuts to the next block; the piece's last block reads what is left as _piece
    would (kvscan S4). A piece that starts the state (its lists of names), or is not
    ASCII, is read whole: None."""

    def __call__(self, piece: bytes) -> tuple[int, tuple[str, ...] | None, bool]:
        return _piece(piece)

    def step(self, carry: bytes | None, block: bytes, last: bool) -> tuple[tuple, bytes] | None:
        starts = carry is None
        if starts and block.startswith(b"{"):
            return None
        text = block if not carry else carry + block
        if not text.isascii():
            return None
        found, end = kvscan.whole_entries(str(text, "ascii"), starts)
        total = -sum(map(_digest, found))
        rest = text[end:]
        if not last:
            return (total % _PRIME, None, True), rest
        if not (starts and end == 0):  # after an entry: what follows it, as S4 would read it there
            rest = rest.lstrip(b" \t\n\r")
            if rest[:1] not in (b"", b",", b"}"):
                raise ValueError(f"a piece of a kvshard state is not whole parts: {rest[:20]!r} after an entry")
        if not rest:
            return (total % _PRIME, None, True), b""
        more, spaces, in_order = _piece(rest)
        return ((total + more) % _PRIME, spaces, in_order), b""

    @staticmethod
    def join(parts: list[tuple[int, tuple[str, ...] | None, bool]]) -> tuple[int, tuple[str, ...] | None, bool]:
        """The parts' shares as one (associative: View.fold_joined joins joins, a changed piece's
        path at each snapshot, so one loop and no generator for the parts that list no names)."""
        total, listing, in_order = 0, [], True
        for part_total, spaces, part_in_order in parts:
            total += part_total
            in_order = in_order and part_in_order
            if spaces is not None:
                listing.append(spaces)
        if not listing:
            return total % _PRIME, None, in_order
        return (total % _PRIME, tuple(dict.fromkeys(s for spaces in listing for s in spaces)),
                in_order and len(listing) <= 1)


_BY_PIECE = _ByPiece()


def _digest(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=16).digest(), "big")


def _add_sums(view: View, node: str, sums: list[int], lister: dict[str, str], suspect: set[str]) -> bool:
    """Add the node's names to the sums (created +, found or deleted -) and its created
    names' namespaces to `lister` (or `suspect`); whether it lists them in order, each
    once (snapshot() sorts them). A function of its own: the state is let go at its return."""
    last = None
    in_order = True
    for part, name in kvscan.names(view.states[node]):
        digest = _digest(name)
        if part == "created":
            sums[digest % BUCKETS] += digest
            in_order = in_order and (last is None or name > last)
            last = name
            space = name.split("/", 1)[0]
            if lister.setdefault(space, node) != node:
                suspect.add(space)
        else:
            sums[digest % BUCKETS] -= digest
    return in_order


def _handoffs(view: View) -> list[tuple[str, str, int, str]]:
    """(src, dst, seq, key) of every handoff in flight."""
    found = []
    for src, dst, seq, payload in view.in_flight:
        message = json.loads(payload)
        if message["type"] == "handoff":
            found.append((src, dst, seq, message["key"]))
    return found


def _named_problems(view: View, handoffs: list[tuple[str, str, int, str]], chosen: Callable[[str], bool]) -> list[str]:
    """every_key_exactly_once's problems among the names `chosen` picks, each found where it is."""
    created: Counter[str] = Counter()
    deleted: Counter[str] = Counter()
    found: dict[str, list[str]] = {}
    for node in sorted(view.states):
        for part, name in kvscan.names(view.states[node]):
            if chosen(name):
                if part == "keys":
                    found.setdefault(name, []).append(f"at {node}")
                else:
                    (created if part == "created" else deleted)[name] += 1
    for src, dst, seq, key in handoffs:
        if chosen(key):
            found.setdefault(key, []).append(f"in flight {src}->{dst} seq {seq}")
    problems = [f"key {k} created {n} times" for k, n in sorted(created.items()) if n > 1]
    problems += [f"key {k} deleted {n} times" for k, n in sorted(deleted.items()) if n > 1]
    problems += [f"key {k} deleted but never created" for k in sorted(set(deleted) - set(created))]
    expected = set(created) - set(deleted)
    for key in sorted(expected | set(found)):
        seen = found.get(key, [])
        if key not in expected:
            problems.append(f"key {key} seen {len(seen)} times ({', '.join(seen)}) but is not a live key")
        elif len(seen) != 1:
            problems.append(f"key {key} seen {len(seen)} times" + (f" ({', '.join(seen)})" if seen else " (lost)"))
    return problems
