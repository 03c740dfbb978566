"""The names in a kvshard state, read without decoding the state whole.

`json.loads` of a kvshard state builds every key's entry and value: about 1.3
times the state's bytes beside the bytes themselves, so at 1 GiB a node the
controller could not check a snapshot within its bound (512 MiB plus one node's
state). `names` walks the state's JSON instead and yields the names only: each
entry's value is decoded and dropped, one at a time, through a window of the
bytes of at most WINDOW characters (more only for a value that does not fit).

Rules:
S1. It yields (part, name) for each name in the state, in the state's order:
    part "created" and "deleted" for the names those lists hold, "keys" for each
    key of "keys"; any other member (the pointers, "moved") is read and dropped.
S2. It takes any JSON a kvshard state may be, in any spacing; a state that is not
    ASCII (kvshard's `encode` never writes one) is decoded whole, as before.
S3. A state that is not JSON raises ValueError (json.JSONDecodeError), but for a
    control character inside a value's string, which the fast path lets through
    (`encode` escapes every one).
S4. `piece_names` yields the names of a piece (View.fold: one or more whole parts
    of snapshot_blocks(), consecutive) as `names` would within the whole state:
    the head's lists and keys when it starts the state, else the keys of its
    ranges (the first one's leading comma dropped) and the state's end if it has
    it. A piece that is not ASCII, or not such a run, raises ValueError.
S5. `whole_entries` reads a run of the keys' entries from the start of a text, each
    after a comma but the first when the text starts a piece, and without spacing, up
    to the first it cannot read whole there (cut by the text's end, or not an entry):
    the names, and where it stopped. What it read is what S4 reads of those bytes;
    the rest is S4's to read (a text that is not ASCII: S4 refuses it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from json.decoder import scanstring
from typing import Any

WINDOW = 1 << 20  # characters decoded at a time: what the walk holds beside the state
PARTS = ("created", "deleted", "keys")
_SPACE = re.compile(r"[ \t\n\r]*")
_VALUE = json.JSONDecoder().raw_decode
# Fast paths, for what kvshard's `encode` writes: a name without escapes and the
# comma or bracket after it; a key's entry up to its value, when the value is a
# string without escapes (its end found by str.find, far quicker than a regex) or
# an integer. Anything else takes the general path.
_PLAIN = r'"([^"\\\x00-\x1f]*)"'
_NAME = re.compile(_PLAIN + r"([,\]])")
_HEAD = re.compile(_PLAIN + r':\{"created_at":"[^"\\\x00-\x1f]*","value":')
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")


def names(state: bytes) -> Iterator[tuple[str, str]]:
    """(part, name) for each name of the state (S1)."""
    if not state.isascii():  # S2: a window could cut a character in two
        decoded = json.loads(state)
        for part in PARTS:
            yield from ((part, name) for name in decoded[part])
        return
    yield from _names(_Walk(state))


def piece_names(piece: bytes) -> Iterator[tuple[str, str]]:
    """(part, name) for each name of a piece of a state (S4): one or more whole parts of
    kvshard's snapshot_blocks(), consecutive."""
    if not piece.isascii():
        raise ValueError("a piece of a kvshard state is ASCII (encode writes no other)")
    head = piece.startswith(b"{")
    # Without a head, a piece is the keys' entries of some ranges (the first one's comma
    # dropped) and the state's end if last; a piece that ends amid the keys is closed
    # there, the keys and the state, by the walk (`open_end`): nothing is joined to it.
    walk = _Walk(memoryview(piece)[0 if head or not piece.startswith(b",") else 1:], open_end=True)
    yield from _names(walk, in_keys=not head)
    if walk.closed not in (0, 2) or not walk.at_end():
        raise ValueError(f"a piece of a kvshard state is not whole parts: its walk ended at {walk.base + walk.at} "
                         f"of its {len(piece)} bytes, {walk.closed} closed at its end")


def whole_entries(text: str, starts_piece: bool) -> tuple[list[str], int]:
    """The names of the whole entries at the start of `text`, and the position after the last (S5)."""
    found, at = [], 0
    while True:
        if text.startswith(",", at):
            start = at + 1
        elif at == 0 and starts_piece:
            start = 0
        else:
            return found, at
        entry = _plain(text, start) or _general(text, start)
        if entry is None:
            return found, at
        found.append(entry[0])
        at = entry[1]


def _plain(text: str, start: int) -> tuple[str, int] | None:
    """An entry as `encode` writes it with a plain string or an integer value: its name and its end."""
    head = _HEAD.match(text, start)
    if head is None:
        return None
    end = head.end()
    if text.startswith('"', end):
        end = text.find('"', end + 1) + 1
        if end == 0 or text.find("\\", head.end(), end) >= 0:
            return None
    elif number := _INT.match(text, end):
        end = number.end()
    else:
        return None
    return (head[1], end + 1) if text.startswith("}", end) else None


def _general(text: str, start: int) -> tuple[str, int] | None:
    """Any other entry without spacing, if it ends before the text does (a number at its end may go on)."""
    if not text.startswith('"', start) or text.find("}", start) < 0:  # an entry cut short: not even tried
        return None
    try:
        name, end = scanstring(text, start + 1)
        if not text.startswith(":", end):
            return None
        _, end = _VALUE(text, end + 1)
    except ValueError:
        return None
    return (name, end) if end < len(text) else None


def _names(walk: _Walk, in_keys: bool = False) -> Iterator[tuple[str, str]]:
    if in_keys:  # a piece without the head (S4): its walk starts amid the keys
        yield from _keys(walk)
        if walk.expect(",}") == "}":
            return
    else:
        walk.expect("{")
        if walk.next_is("}"):
            return
    while True:
        member = walk.string()
        walk.expect(":")
        if member in ("created", "deleted"):
            walk.expect("[")
            closed = walk.next_is("]")
            while not closed:
                if found := walk.fast(_NAME):
                    yield member, found[1]
                    closed = found[2] == "]"
                else:
                    yield member, walk.string()
                    closed = walk.expect(",]") == "]"
            found = None  # a match holds its window: let it go with the window
        elif member == "keys":
            walk.expect("{")
            yield from _keys(walk)
        else:
            walk.value()
        if walk.expect(",}") == "}":
            return


def _keys(walk: _Walk) -> Iterator[tuple[str, str]]:
    """("keys", name) for each entry of the keys' object, from after its brace to past its end."""
    closed = walk.next_is("}")
    while not closed:
        if found := walk.plain_entry():
            yield "keys", found[0]
            closed = found[1] == "}"
        else:
            yield "keys", walk.string()
            walk.expect(":")
            walk.value()
            closed = walk.expect(",}") == "}"


class _Walk:
    """A position in the state's bytes, and the window of them decoded around it."""

    def __init__(self, state: bytes | memoryview, open_end: bool = False) -> None:
        self.state = memoryview(state)
        self.base = 0  # the window's first byte in the state
        self.text = ""
        self.at = 0  # the position, in the window
        self.open_end = open_end  # a "}" expected at the end is taken as there (S4)
        self.closed = 0  # how many were

    def _refill(self, size: int) -> None:
        self.base += self.at
        self.text = ""  # let the old window go before the new one is made: one window at a time
        self.text = str(self.state[self.base:self.base + size], "ascii")
        self.at = 0

    def _whole(self) -> bool:
        return self.base + len(self.text) >= len(self.state)

    def at_end(self) -> bool:
        self._skip_space()
        return self.at >= len(self.text) and self._whole()

    def _closes(self, chars: str) -> bool:
        """Whether the walk takes a "}" of `chars` as there, at the end of an open-ended state."""
        if self.open_end and "}" in chars and self.at >= len(self.text) and self._whole():
            self.closed += 1
            return True
        return False

    def _skip_space(self) -> None:
        while True:
            self.at = _SPACE.match(self.text, self.at).end()
            if self.at < len(self.text) or self._whole():
                return
            self._refill(WINDOW)

    def fast(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        """`pattern` matched at the position, which moves past it; None if it does not
        match there (also when the window cuts it: the general path reads it then)."""
        found = pattern.match(self.text, self.at)
        if found:
            self.at = found.end()
        return found

    def plain_entry(self) -> tuple[str, str] | None:
        """A key's entry as `encode` writes it, with a plain string or an integer value:
        its name and the comma or brace after it, the position moved past that; None
        otherwise, or when the window cuts it (the general path reads it then)."""
        text = self.text
        head = _HEAD.match(text, self.at)
        if head is None:
            return None
        start = head.end()
        if text.startswith('"', start):
            end = text.find('"', start + 1) + 1
            if end == 0 or text.find("\\", start, end) >= 0:
                return None
        elif number := _INT.match(text, start):
            end = number.end()
        else:
            return None
        tail = text[end:end + 2]
        if tail not in ("},", "}}"):
            return None
        self.at = end + 2
        return head[1], tail[1]

    def next_is(self, char: str) -> bool:
        self._skip_space()
        if self.text.startswith(char, self.at):
            self.at += 1
            return True
        return self._closes(char)

    def expect(self, chars: str) -> str:
        self._skip_space()
        char = self.text[self.at:self.at + 1]
        if not char and self._closes(chars):
            return "}"
        if not char or char not in chars:
            raise json.JSONDecodeError(f"expected one of {chars!r}", self.text, self.at)
        self.at += 1
        return char

    def string(self) -> str:
        self.expect('"')
        self.at -= 1  # the quote again: a string cut by the window is read anew, from its quote
        return self._read(lambda text, at: scanstring(text, at + 1))

    def value(self) -> Any:
        self._skip_space()
        return self._read(_VALUE)

    def _read(self, parse: Callable[[str, int], tuple[Any, int]]) -> Any:
        """What `parse` reads at the position, whole: a read that fails or ends at the
        window's end (a number may end there cut short) is tried again in a window twice
        as long, until the window holds the rest of the state."""
        size = WINDOW
        while True:
            try:
                found, end = parse(self.text, self.at)
            except ValueError:
                if self._whole():
                    raise
            else:
                if end < len(self.text) or self._whole():
                    self.at = end
                    return found
            size = max(size, len(self.text) - self.at) * 2
            self._refill(size)
