"""One log line longer than the read bound, its state left out as it streams past.

``StateCut`` is fed a line's bytes in pieces (never the whole line at once) and gives
back what ``parse.without_state`` would have made of the whole line, holding at most
a bound's worth of it: the line with its record's own state emptied (``"state":""``).
Where ``without_state`` leaves a line whole (no top-level state key, a backslash in
the state, a line torn inside it), the text given back keeps what makes the line
good or bad, so that parsing it gives the verdict the whole line gives:

- torn inside the state (no closing quote): the line up to the state's first quote,
  an unterminated string: not valid JSON, as the whole line is;
- escapes in the state: the string is scanned as JSON reads it; valid, it is emptied
  (its content is read by no check); invalid (a bad escape, a raw control character,
  no closing quote), the text stops right after the fault: not valid JSON either way;
- after the state more than a bound's worth of text: when the first character after
  the string is not one a JSON object allows there (``,`` or ``}``), the text stops
  right after it (not valid JSON, as the whole line); otherwise, and when no
  top-level state key comes within a bound's worth of bytes, the line cannot be read
  within the bound: ``problem`` says so, naming the setting to raise.
"""

from __future__ import annotations

import re
import zlib

STATE_KEY = b'"state":"'
STATE_KEPT = 1 << 16  # parse.STATE_KEPT: a line this long or shorter is left as it is (characters)
_WHOLE_MAX = 4 * STATE_KEPT + 4  # bytes that can hold STATE_KEPT characters of UTF-8
_CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8 bytes that start no character
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_JSON_STRING_STOP = re.compile(rb'["\\\x00-\x1f]')
_SIMPLE_ESCAPES = b'"\\/bfnrt'
_HEX = b"0123456789abcdefABCDEF"


def _depth(piece: bytes) -> int:
    """parse._depth: objects and arrays a piece of a line opens (negative: closes)."""
    bare = _STRING.sub(b"", _ESCAPE.sub(b"", piece))
    return bare.count(b"{") + bare.count(b"[") - bare.count(b"}") - bare.count(b"]")


class StateCut:
    """Feed a line's bytes (``feed``), then ``end()``: the text to parse and a problem.

    ``bound``: the most bytes of the line held at once (besides the head's checksum).
    ``head_len``: how many of the line's first bytes Spark's reader kept; their CRC-32
    is ``head_crc`` once they have streamed past (what the reader and this pass agree on).
    """

    def __init__(self, bound: int, head_len: int = 0) -> None:
        self.bound = bound
        self.head_len = head_len
        self.head_crc = 0
        self.size = 0  # bytes of the line
        self.chars = 0  # its characters, while they may be at most STATE_KEPT
        self.whole: bytearray | None = bytearray()  # the line, while it may be left whole
        self.prefix = bytearray()  # up to and with the state key's opening quote
        self.stage = "prefix"  # prefix, content, escaped, tail, done
        self.start = -1  # where the state's text starts in prefix (found: the key's end)
        self.out = b""  # stage done: the text to parse
        self.problem: str | None = None
        # finding the record's own state key (parse.without_state's walk)
        self.at = -1  # the key occurrence searched from
        self.since = 0
        self.depth = 0
        self.tail = bytearray()
        self.pending = b""  # escaped: an escape's bytes split across pieces

    # ------------------------------------------------------------------ feeding

    def feed(self, data: bytes | memoryview) -> None:
        data = bytes(data)
        if not data:
            return
        if self.size < self.head_len:
            self.head_crc = zlib.crc32(data[: self.head_len - self.size], self.head_crc)
        self.size += len(data)
        if self.whole is not None:
            if self.size <= _WHOLE_MAX:
                self.whole += data
                self.chars += len(data.translate(None, _CONTINUATION))
            else:
                self.whole = None
        if self.stage == "prefix":
            self._feed_prefix(data)
        elif self.stage == "content":
            self._feed_content(data)
        elif self.stage == "escaped":
            self._feed_escaped(data)
        elif self.stage == "tail":
            self._feed_tail(data)

    def _feed_prefix(self, data: bytes) -> None:
        self.prefix += data
        while True:
            at = self.prefix.find(STATE_KEY, self.at + 1)
            if at < 0:
                break
            self.at = at
            key = at > 0 and self.prefix[at - 1 : at] in (b"{", b",")
            if not key:
                continue
            now = self.depth + _depth(bytes(self.prefix[self.since : at]))
            if now == 1:
                self.start = at + len(STATE_KEY)
                rest = bytes(self.prefix[self.start :])
                del self.prefix[self.start :]
                self.stage = "content"
                self._feed_content(rest)
                return
            self.since, self.depth = at, now
        if len(self.prefix) > self.bound:
            self._stop(None, "no top-level state key within the bound")

    def _feed_content(self, data: bytes) -> None:
        quote, backslash = data.find(b'"'), data.find(b"\\")
        if backslash >= 0 and (quote < 0 or backslash < quote):
            self.stage = "escaped"  # without_state leaves such a line whole: read it as JSON does
            self._feed_escaped(data[backslash:])
        elif quote >= 0:
            self.stage = "tail"
            self._feed_tail(data[quote:])

    def _feed_escaped(self, data: bytes) -> None:
        data, self.pending = self.pending + data, b""
        i = 0
        while self.stage == "escaped":
            m = _JSON_STRING_STOP.search(data, i)
            if m is None:
                return
            j = m.start()
            c = data[j : j + 1]
            if c == b'"':
                self.stage = "tail"
                self._feed_tail(data[j:])
                return
            if c != b"\\":  # a raw control character: JSON has none in a string
                self._stop(bytes(self.prefix) + c)
                return
            if j + 1 >= len(data) or (data[j + 1 : j + 2] == b"u" and j + 6 > len(data)):
                self.pending = data[j:]  # the escape goes on in the next piece
                return
            e = data[j + 1 : j + 2]
            if e == b"u":
                if not all(h in _HEX for h in data[j + 2 : j + 6]):
                    self._stop(bytes(self.prefix) + data[j : j + 6])
                    return
                i = j + 6
            elif e in _SIMPLE_ESCAPES:
                i = j + 2
            else:
                self._stop(bytes(self.prefix) + data[j : j + 2])
                return

    def _feed_tail(self, data: bytes) -> None:
        room = self.bound - len(self.tail)
        self.tail += data[: max(0, room) + 1]
        if len(self.tail) <= self.bound:
            return
        after = bytes(self.tail[1:]).lstrip(b" \t")
        if after[:1] not in (b",", b"}"):  # not JSON at that character: the rest cannot mend it
            cut = len(self.tail) - len(after)
            self._stop(bytes(self.prefix) + bytes(self.tail[: cut + 1]))
        else:
            self._stop(None, "more than the bound after its state")

    def _stop(self, text: bytes | None, why: str = "") -> None:
        self.stage = "done"
        self.out = text or b""
        if text is None:
            self.problem = why
        self.prefix = bytearray()
        self.tail = bytearray()

    # ------------------------------------------------------------------- ending

    def end(self) -> tuple[bytes, str | None]:
        """(the text to parse, None) or (b"", why it cannot be read within the bound)."""
        if self.whole is not None and self.chars <= STATE_KEPT:
            return bytes(self.whole), None  # without_state leaves it as it is
        if self.stage == "prefix":
            return b"", "no top-level state key within the bound"
        if self.stage in ("content", "escaped"):
            return bytes(self.prefix), None  # torn inside its state: an unterminated string
        if self.stage == "tail":
            return bytes(self.prefix) + bytes(self.tail), None
        return self.out, self.problem
