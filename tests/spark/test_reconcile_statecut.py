"""A long log line's state left out as it streams past (reconcile.statecut, reconcile.longlines.recover):
the text equals what parse.without_state makes of the whole line, in pieces of any size."""

from __future__ import annotations

import base64
import json
import os
import zlib

import pytest

from snapmesh.reconcile.longlines import recover
from snapmesh.reconcile.statecut import STATE_KEPT, StateCut

BIG = base64.b64encode(os.urandom(3 * STATE_KEPT)).decode()


def cut(line: str, bound: int = 4096, piece: int = 1000) -> tuple[bytes, str | None]:
    data = line.encode()
    c = StateCut(bound)
    for i in range(0, len(data), piece):
        c.feed(data[i : i + piece])
    return c.end()


def rec(**fields: object) -> str:
    return json.dumps(fields, separators=(",", ":"))


@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
def test_the_records_own_state_is_emptied_in_pieces_of_any_size(piece: int) -> None:
    line = rec(node="p1", lsn=1, kind="init", app="blob", version=1, state=BIG)
    assert cut(line, piece=piece) == (line.replace(BIG, "").encode(), None)


def test_a_nested_state_stays_and_the_own_one_after_it_is_emptied() -> None:
    line = '{"node":"p1","lsn":1,"kind":"restore","was":{"state":"bmVzdGVk"},' f'"state":"{BIG}","epoch":2}}'
    assert cut(line) == (line.replace(BIG, "").encode(), None)


def test_a_short_line_is_left_whole() -> None:
    line = rec(node="p1", lsn=1, kind="init", state="x" * 5000)  # over the bound, not over STATE_KEPT
    assert cut(line) == (line.encode(), None)


def test_torn_inside_its_state_gives_an_unterminated_string() -> None:
    line = rec(node="p1", lsn=5, kind="init", app="blob", state=BIG)[: 2 * STATE_KEPT]
    text, problem = cut(line)
    assert problem is None and text == b'{"node":"p1","lsn":5,"kind":"init","app":"blob","state":"'
    with pytest.raises(ValueError):
        json.loads(text)


def test_a_quote_inside_the_state_is_not_json_at_the_character_after_it() -> None:
    line = rec(node="p1", lsn=3, kind="checkpoint", state=BIG)
    bad = line.replace(BIG, BIG[:10] + '"' + BIG[10:])  # a byte flipped to a quote
    text, problem = cut(bad)
    assert problem is None and text == b'{"node":"p1","lsn":3,"kind":"checkpoint","state":"' + b'"' + BIG[10:11].encode()
    with pytest.raises(ValueError):
        json.loads(text)


def test_valid_escapes_are_read_as_json_and_emptied_a_bad_one_kept() -> None:
    good = '{"node":"p1","lsn":2,"kind":"checkpoint","state":"a\\/b\\u00e9' + BIG + '","epoch":2}'
    assert cut(good) == (b'{"node":"p1","lsn":2,"kind":"checkpoint","state":"","epoch":2}', None)
    bad = '{"node":"p1","lsn":2,"kind":"checkpoint","state":"a\\/' + BIG + '\\x' + BIG + '"}'
    text, problem = cut(bad)
    assert problem is None and text.endswith(b'"state":"\\x')


def test_no_state_key_within_the_bound_is_a_problem_not_a_text() -> None:
    text, problem = cut(rec(node="p1", lsn=1, kind="command", command=BIG))
    assert text == b"" and "no top-level state key" in problem


def test_recover_counts_lines_as_the_reader_does_and_checks_the_head() -> None:
    long = rec(node="p1", lsn=3, kind="init", state=BIG).encode()
    data = b"\xef\xbb\xbf" + long + b"\r\nshort\rother\n" + long + b"\nlast"
    head = long[:4096]
    targets = {1: (4096, zlib.crc32(head)), 4: (4096, zlib.crc32(head))}
    for size in (5, 4096, 1 << 20):
        chunks = (data[i : i + size] for i in range(0, len(data), size))
        got = recover(chunks, targets, 4096)
        assert got == {1: (long.replace(BIG.encode(), b""), None), 4: (long.replace(BIG.encode(), b""), None)}
    with pytest.raises(ValueError):
        recover(iter([data]), {1: (4096, zlib.crc32(b"x" + head[1:]))}, 4096)
