"""The log's fast writers (`wal.Encoder`, the node's log dispatching through `Encoder.lines`)
write exactly the bytes of the general encoder and of json.dumps over the format's fields.

One seeded generator drives each test; the seed is printed first (set WAL_LINES_SEED to replay one).
"""

from __future__ import annotations

import json
import os
import random

from snapmesh.protocol import fastrecords, wal

_IDS = ["p1", "p2", "node-17", "a" * 40, "x:y", "p_3.z"]
_ODD = ['q"x', "z\\y", "n-\u00fc", "tab\there", "\x7f", "\x00nul", "\u2028", "e\U0001f600"]  # JSON's escapes


def _seed() -> random.Random:
    seed = int(os.environ.get("WAL_LINES_SEED") or random.randrange(2**32))
    print(f"WAL_LINES_SEED={seed}")
    return random.Random(seed)


def _reference(record: wal.Record, node_id: str) -> str:
    """The format's line by json.dumps: node, lsn, kind, then SPEC order, an optional field
    left out when empty unless it is the kind's mark. Shares no code with wal's encoders."""
    kind = type(record).KIND
    line: dict = {"node": node_id, "lsn": record.lsn, "kind": kind}
    for (name, _, required), attr in zip(wal.SPEC[kind], wal.ATTRS[kind], strict=True):
        value = getattr(record, attr)
        if required or value or name == wal.APP_MARKS.get(kind):
            line[name] = value
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n"


def _text(rng: random.Random, odd: bool) -> str:
    roll = rng.random()
    if roll < 0.25:
        return ""
    if roll < 0.75:
        return wal.pack(rng.randbytes(rng.choice([0, 1, 2, 3, 4, 6, 64, 1000])))  # base64, empty included
    if odd and roll < 0.85:
        return rng.choice(_ODD)
    return "".join(rng.choice("abcXYZ019-_:./ ") for _ in range(rng.randrange(1, 30)))


def _records(rng: random.Random, odd: bool):
    ids = _IDS + (_ODD if odd else [])
    for _ in range(2_000):
        lsn, seq = rng.choice([1, rng.randrange(1, 10**6), rng.randrange(1, 2**63), 10**30]), rng.randrange(1, 2**40)
        src, dst = rng.choice(ids), rng.choice(ids)
        msg_id = f"{src}:{dst}:{seq}" if rng.random() < 0.7 else _text(rng, odd)
        payload = wal.pack(rng.randbytes(rng.randrange(0, 300)))
        yield fastrecords.send_record(lsn, msg_id, src, dst, seq, _text(rng, odd), rng.choice([payload, _text(rng, odd)]))
        yield fastrecords.recv_record(lsn, msg_id, src, dst, seq, rng.choice([payload, "", _text(rng, odd)]))
        yield fastrecords.command_record(lsn, _text(rng, odd), _text(rng, odd), _text(rng, odd))


def test_the_fast_writers_write_the_general_encoders_bytes_and_json_dumps_over_the_format():
    rng = _seed()
    for odd in (False, True):
        node_id = rng.choice(_IDS + (_ODD if odd else []))
        encoder = wal.Encoder(node_id)
        for record in _records(rng, odd):
            fast = encoder.lines[type(record)](record)  # as the node's log calls it
            assert fast == encoder.record(record) == wal.encode(record, node_id) == _reference(record, node_id), (
                record, node_id)
            assert wal.parse(fast, "here", node_id=node_id) == record


def test_pack_is_base64_of_the_bytes_as_text():
    import base64

    rng = _seed()
    for size in (0, 1, 2, 3, 4, 57, 58, 1000, 4096):
        data = rng.randbytes(size)
        assert wal.pack(data) == base64.b64encode(data).decode("ascii")
        assert type(wal.pack(data)) is str and wal.unpack(wal.pack(data), "here") == data
