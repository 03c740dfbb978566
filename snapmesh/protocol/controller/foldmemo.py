"""An app's fold over a listed state, piece by piece, each piece's result kept by its content, pure.

An invariant that reads every state whole (kvshard's every key exactly once) cost
the controller time in proportion to the states at every snapshot, where only a
few blocks changed since the last one. `FoldMemo.fold` hands the app's function
one piece of a listed state at a time and keeps its result by (the app's key,
the piece's blocks' names): at the next snapshot an unchanged piece's result is
taken, its blocks unread, so a snapshot's check costs what changed.

Rules:
FM1. A piece is a run of the state's blocks, in order, that ends at a block shorter
    than BLOCK_BYTES or at the state's last block. A node cuts each part of
    snapshot_blocks() into blocks of BLOCK_BYTES, the last one shorter (blocks.py
    B6), so a piece is one or more whole parts, consecutive; a state cut on the
    plain grid is one piece, the whole state. Only a part whose size is a multiple
    of BLOCK_BYTES joins the next one in a piece.
FM2. A result is kept under (key, the SHA-256 of the piece's block names joined).
    Each block is named by the SHA-256 of its content and checked against its name
    when read (BF3) or when filed (BF6), so the names are the bytes: a kept result
    is `fn` of those bytes, as if they were read again. The app's `fn` is a
    function of the piece's bytes alone (the key names it: a new function, a new key).
FM3. A block's size is kept by its name once a block was read (checked against
    its name): the pieces of the next state are found without reading its
    unchanged blocks.
FM4. Bounded: at most MAX_RESULTS results (a piece's, or a block's: FM6) and MAX_SIZES sizes, the ones used
    longest ago let go first; one let go is computed again when needed, never wrong.
    `fn`'s results are kept, so an app keeps them small (a sum, a few names).
FM5. Counted (`blocks_read`, `bytes_folded`, `pieces_folded`, `pieces_kept`,
    `pieces_stepped`, `blocks_stepped`, `blocks_kept`, `pieces_rejoined`): the work a fold did, for tests
    and the bench, which hold under a noisy machine. `bytes_folded` counts the bytes
    handed to `fn` or to its `step`.
FM6. Finer than the piece: an `fn` with a `step(carry, block, last)` and a `join(parts)`
    is handed a changed piece block by block, in order: `step` reads the block after
    the `carry` the block before it left (None at the piece's first block), gives its
    part of the result and what it leaves unread (kvshard: the bytes of the entry the
    block's end cuts, at most MAX_CARRY), and `join` of the parts is `fn` of the piece. A
    block's part and carry are kept under (key, the carry's SHA-256, the block's name,
    whether it ends the piece), FM2's reasoning with the carry as part of the input:
    a piece of nine blocks with one changed steps through that block (and through the
    next one only if what it leaves changed), the others' parts taken unread. A
    `step` that gives None, or a carry longer than MAX_CARRY (FM4: each is kept),
    has the piece folded whole. An unchanged piece is kept whole (FM2), first.
FM7. A state with at most MAX_HELD blocks of unknown size (FM3: the changed ones of a
    later snapshot) has them read first and held until the fold's end, and its sizes
    looked up and its pieces found in bulk, not block by block in Python: the walk over
    an unchanged 64 MiB state's ~9000 blocks was a third of a snapshot's check. Any
    other state (a first one) is walked block by block, each block held only until
    its piece is folded.
FM8. A state folded under FM7 is kept as a base (its names, sizes, and each piece's
    span and result; the last MAX_BASES): a later state of the same key and length
    whose first or last block is a base's is compared with it name by name in C, and
    only its names that differ are looked up (FM3) or read; a piece of the same span
    as one of the base's, none of its names changed, takes the base's result unhashed
    (FM2: the same names, so the same bytes and result). Its pieces' and sizes' use is
    not noted in FM4's order (a base holds what it needs; one let go is computed again).
    A state that differs in more than MAX_HELD names is folded as FM7 says, and a state of
    more pieces than FM4's bound on results is kept as no base.
FM9. Joined (`fold_joined`, an `fn` with FM6's `join`, associative: jointree.py JT1): the
    pieces' results joined, kept in a base (FM8) as a JoinTree. A later state of that base
    whose changed blocks keep their side of BLOCK_BYTES (FM1: the same pieces) re-folds the
    pieces its changed blocks lie in, found by bisection, and re-joins their paths to the
    root: no step per piece, nor per block, of the state. Any other state is folded as
    `fold` does and its results joined into a new tree: the same root, as JT1 says.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
import operator
from collections import OrderedDict, deque
from itertools import compress, repeat
from collections.abc import Callable, Sequence
from typing import Any

from snapmesh.app import BLOCK_BYTES
from snapmesh.protocol.controller.jointree import JoinTree

MAX_RESULTS = 1 << 16  # FM4: about 4 GiB of pieces of 64 KiB; 512 MiB of blocks (FM6), with carries of ~1 KiB
MAX_SIZES = 1 << 20  # FM4: 8 GiB of blocks' names
MAX_HELD = 1024  # FM7: blocks of unknown size read before their pieces are folded: 8 MiB
MAX_CARRY = 4096  # FM6: bytes a step leaves to the next block; kvshard's are a key's entry cut short
MAX_BASES = 16  # FM8: a few states per key (kvshard's four nodes, a key each invariant)
_WHOLE = object()  # FM6: the piece is folded whole


class _Base:
    """A state folded (FM8): its names, each block's size, and each piece's start and result by its end."""

    __slots__ = ("key", "names", "sizes", "pieces", "tree", "ends")

    def __init__(self, key: str, names: list[bytes], sizes: list[int], pieces: dict[int, tuple[int, Any]]) -> None:
        self.key, self.names, self.sizes, self.pieces = key, names, sizes, pieces
        self.tree: JoinTree | None = None  # FM9: the pieces' results joined, once a fold_joined asked
        self.ends: list[int] = []  # FM9: the pieces' last blocks, ascending, with the tree


class FoldMemo:
    def __init__(self, max_results: int = MAX_RESULTS, max_sizes: int = MAX_SIZES) -> None:
        self.max_results, self.max_sizes = max_results, max_sizes
        self._results: OrderedDict[tuple, Any] = OrderedDict()  # FM2's by piece, FM6's by block
        self._sizes: OrderedDict[bytes, int] = OrderedDict()
        self.blocks_read = self.bytes_folded = self.pieces_folded = self.pieces_kept = 0
        self.pieces_stepped = self.blocks_stepped = self.blocks_kept = self.pieces_rejoined = 0
        self._bases: deque[_Base] = deque(maxlen=MAX_BASES)  # FM8, the latest last

    def fold(self, names: Sequence[bytes], read: Callable[[bytes], bytes], key: str,
             fn: Callable[[bytes], Any]) -> list[Any]:
        """`fn` of each piece (FM1) of the state `names` names, in order; `read` gives a
        block by its name, checked against it, or raises (BF3)."""
        names = list(names)  # a message's repeated field makes a new bytes at each look: one look each
        return self._fold(names, *self._base(key, names), read, key, fn)[0]

    def _fold(self, names: list[bytes], base: _Base | None, changed: list[int], read: Callable[[bytes], bytes],
              key: str, fn: Callable[[bytes], Any]) -> tuple[list[Any], _Base | None]:
        """`fold`'s results, and the base it kept of the state (FM8), if any."""
        held: dict[bytes, bytes] = {}  # the blocks read for this state, until their piece is folded
        out, start = [], 0
        last = len(names) - 1
        if base is not None:  # FM8: only the names that differ from the base's looked up
            found: list[Any] = base.sizes.copy()
            for i in changed:
                found[i] = self._sizes.get(names[i])
            unknown = [i for i in changed if found[i] is None]
            deque(map(self._sizes.move_to_end, (names[i] for i in changed if found[i] is not None)), 0)
        else:
            found = list(map(self._sizes.get, names))
            unknown = list(compress(range(len(found)), map(operator.is_, found, repeat(None))))  # C: no step per block
        if len(unknown) <= MAX_HELD:  # FM7: few unknown, read first, the pieces found at C speed
            if base is None:
                deque(map(self._sizes.move_to_end, compress(names, found)), 0)  # FM4's order: each size used, last
            for i in unknown:
                held[names[i]] = block = self._read(read, names[i])
                found[i] = len(block)
            ends = list(compress(range(len(found)), map(operator.lt, found, repeat(BLOCK_BYTES))))
            if names and (not ends or ends[-1] != last):  # the state's last block ends a piece (FM1)
                ends.append(last)
            pieces: dict[int, tuple[int, Any]] = {}
            before = base.pieces if base is not None else {}
            for end in ends:
                was = before.get(end)
                if was is not None and was[0] == start and not _touched(changed, start, end):  # FM8
                    result = was[1]
                    self.pieces_kept += 1
                else:
                    result = self._piece(names[start:end + 1], held, read, key, fn)
                out.append(result)
                pieces[end] = (start, result)
                start = end + 1
            if names and len(pieces) <= self.max_results:  # FM8: a base is held within FM4's bound too
                self._bases.append(_Base(key, names, found, pieces))
                return out, self._bases[-1]
            return out, None
        sizes, touch = self._sizes.get, self._sizes.move_to_end
        for i, name in enumerate(names):
            if (size := sizes(name)) is not None:
                touch(name)
            else:
                held[name] = block = self._read(read, name)
                size = len(block)
            if size < BLOCK_BYTES or i == last:
                out.append(self._piece(names[start:i + 1], held, read, key, fn))
                held.clear()
                start = i + 1
        return out, None

    def fold_joined(self, names: Sequence[bytes], read: Callable[[bytes], bytes], key: str, fn: Any) -> Any:
        """`fn.join` of `fold`'s results (FM9), re-joining only the changed pieces' paths."""
        names = list(names)
        base, changed = self._base(key, names)
        if base is not None and base.tree is not None:
            joined = self._rejoined(base, names, changed, read, key, fn)
            if joined is not _WHOLE:
                return joined
        results, made = self._fold(names, base, changed, read, key, fn)
        if made is None:  # kept as no base (FM8): joined afresh
            return fn.join(results)
        made.tree, made.ends = JoinTree(results, fn.join), list(made.pieces)
        return made.tree.root()

    def _rejoined(self, base: _Base, names: list[bytes], changed: list[int], read: Callable[[bytes], bytes],
                  key: str, fn: Any) -> Any:
        """FM9: the base's tree with the pieces of the `changed` blocks folded again; _WHOLE
        when a changed block moves across BLOCK_BYTES (other pieces: folded by `fold`)."""
        held: dict[bytes, bytes] = {}
        sizes = base.sizes
        news = []
        for i in changed:
            size = self._sizes.get(names[i])
            if size is None:
                held[names[i]] = block = self._read(read, names[i])
                size = len(block)
            else:
                self._sizes.move_to_end(names[i])  # FM4's order, as FM8's look-ups
            if (size < BLOCK_BYTES) != (sizes[i] < BLOCK_BYTES):
                return _WHOLE
            news.append(size)
        ends, pieces, tree = base.ends, base.pieces, base.tree
        for at in sorted({bisect_left(ends, i) for i in changed}):
            end = ends[at]
            start = pieces[end][0]
            result = self._piece(names[start:end + 1], held, read, key, fn)
            pieces[end] = (start, result)
            tree.set(at, result)  # type: ignore[union-attr]
            self.pieces_rejoined += 1
        for i, size in zip(changed, news, strict=True):
            sizes[i] = size
        base.names = names
        self._bases.append(base)  # taken out by _base: the state replaces it
        return tree.root()  # type: ignore[union-attr]

    def _base(self, key: str, names: list[bytes]) -> tuple[_Base | None, list[int]]:
        """FM8: the base a state of `names` is compared with (taken out: the state replaces it), and
        the indices of its names that differ; (None, []) when none is like it."""
        if not names:
            return None, []
        for base in reversed(self._bases):
            if base.key == key and len(base.names) == len(names) and (
                    base.names[0] == names[0] or base.names[-1] == names[-1]):
                changed = list(compress(range(len(names)), map(operator.ne, names, base.names)))
                if len(changed) > MAX_HELD:
                    return None, []
                self._bases.remove(base)
                return base, changed
        return None, []

    def _piece(self, run: Sequence[bytes], held: dict[bytes, bytes], read: Callable[[bytes], bytes], key: str,
               fn: Callable[[bytes], Any]) -> Any:
        slot = (key, hashlib.sha256(b"".join(run)).digest())
        if slot in self._results:
            self._results.move_to_end(slot)
            self.pieces_kept += 1
            return self._results[slot]
        step = getattr(fn, "step", None)
        result = _WHOLE if step is None else self._stepped(run, held, read, key, step, fn.join)  # type: ignore[attr-defined]
        if result is _WHOLE:
            piece = b"".join(held[name] if name in held else self._read(read, name) for name in run)
            result = fn(piece)
            self.pieces_folded += 1
            self.bytes_folded += len(piece)
        else:
            self.pieces_stepped += 1
        self._keep(slot, result)
        return result

    def _stepped(self, run: Sequence[bytes], held: dict[bytes, bytes], read: Callable[[bytes], bytes], key: str,
                 step: Callable[[bytes | None, bytes, bool], tuple[Any, bytes] | None],
                 join: Callable[[list[Any]], Any]) -> Any:
        """`join` of the piece's parts, block by block, each kept by its carry and name (FM6); _WHOLE
        when `step` cannot take the piece so."""
        carry: bytes | None = None
        carried: bytes | None = None  # the carry's digest: None at the piece's start, b"" when empty
        parts = []
        last = len(run) - 1
        for i, name in enumerate(run):
            slot = (key, carried, name, i == last)
            if slot in self._results:
                self._results.move_to_end(slot)
                self.blocks_kept += 1
                part, carry, carried = self._results[slot]
            else:
                block = held[name] if name in held else self._read(read, name)
                stepped = step(carry, block, i == last)
                if stepped is None or len(stepped[1]) > MAX_CARRY:
                    return _WHOLE
                part, carry = stepped
                carried = hashlib.sha256(carry).digest() if carry else b""
                self.blocks_stepped += 1
                self.bytes_folded += len(block)
                self._keep(slot, (part, carry, carried))
            parts.append(part)
        return join(parts)

    def _keep(self, slot: tuple, result: Any) -> None:
        self._results[slot] = result
        while len(self._results) > self.max_results:
            self._results.popitem(last=False)

    def _read(self, read: Callable[[bytes], bytes], name: bytes) -> bytes:
        block = read(name)
        self.blocks_read += 1
        self._sizes[name] = len(block)  # FM3: checked against its name by `read`
        self._sizes.move_to_end(name)
        while len(self._sizes) > self.max_sizes:
            self._sizes.popitem(last=False)
        return block


def _touched(changed: list[int], start: int, end: int) -> bool:
    """Whether an index of `changed` (ascending) lies in start..end (FM8)."""
    at = bisect_left(changed, start)
    return at < len(changed) and changed[at] <= end
