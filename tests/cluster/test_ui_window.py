"""The page reads a bounded window of each node's log around a cut, however large its segment.

An active segment of ~24 MiB (what `segment_records` alone let an app's log grow to,
in small) with one snapshot's records in its middle:

- `read_around`, what `trace.svg` draws from, holds a block and the window, not
  the file: its peak allocation stays under a few window sizes, and the records
  it parses are those of `window_bytes` around the cut (counted), not the
  segment's. The code this replaced read every file that names the snapshot
  whole (an 800 MiB segment took the page from 259 to 1,683 MiB).
- The stuck-snapshot view (`Source.log_records`) finds the snapshot's lines a
  block at a time: the same bound.
- `snapmesh ui --window-bytes` is the setting, refused below its floor.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from snapmesh.trace.logs import read_around
from snapmesh.ui import server
from snapmesh.ui.source import Source

SID = "20260101T000000.000000Z-00000001"
WINDOW = 256 * 1024
RECORDS = 200_000


def _segment(tmp_path: Path) -> int:
    """a.log.jsonl: RECORDS send records, the snapshot's cut and marker in the middle; its size."""
    middle = RECORDS // 2
    lines = []
    for lsn in range(1, RECORDS + 1):
        if lsn == middle:
            record = {"node": "a", "lsn": lsn, "kind": "cut", "snapshot_id": SID, "balance": 5}
        elif lsn == middle + 50:
            record = {"node": "a", "lsn": lsn, "kind": "marker_recv", "snapshot_id": SID, "src": "b", "dst": "a",
                      "seq": 9}
        else:
            record = {"node": "a", "lsn": lsn, "kind": "send", "msg_id": f"a:b:{lsn}", "src": "a", "dst": "b",
                      "seq": lsn, "amount": 1, "request_id": f"client-request-{lsn:012d}"}
        lines.append(json.dumps(record, separators=(",", ":")))
    path = tmp_path / "a.log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path.stat().st_size


def test_the_picture_reads_a_bounded_window_of_a_large_segment(tmp_path: Path) -> None:
    size = _segment(tmp_path)
    assert size > 20 * 1024 * 1024
    tracemalloc.start()
    try:
        found = read_around(tmp_path, SID, margin=10**9, window_bytes=WINDOW)  # the byte budget alone bounds it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    records = found["a"]
    read = sum(len(json.dumps(r, separators=(",", ":"))) + 1 for r in records)
    assert read <= WINDOW, read
    assert len(records) < WINDOW // 100  # ~130 bytes a record: ~2,000 of the segment's 200,000
    lsns = [r["lsn"] for r in records]
    assert lsns == list(range(lsns[0], lsns[-1] + 1))  # whole lines, in order, none cut
    assert lsns[0] < RECORDS // 2 < RECORDS // 2 + 50 < lsns[-1]  # the cut and the marker, with lines either side
    # Parsed records take a few times their bytes; the file is 80 times the window.
    assert peak < 16 * WINDOW, f"peak {peak} bytes reading a {size}-byte segment with a {WINDOW}-byte window"

    # The line margin still applies inside the window.
    assert [r["lsn"] for r in read_around(tmp_path, SID, margin=3, window_bytes=WINDOW)["a"]] == [
        *range(RECORDS // 2 - 3, RECORDS // 2 + 54)]


def test_a_stuck_snapshots_lines_are_found_a_block_at_a_time(tmp_path: Path) -> None:
    _segment(tmp_path)
    source = Source("127.0.0.1:1", None, tmp_path, window_bytes=WINDOW)
    tracemalloc.start()
    try:
        found, note = source.log_records(["a"], SID)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        source.close()
    assert note == "" and [r["kind"] for r in found["a"]] == ["cut", "marker_recv"]
    assert peak < 8 * 1024 * 1024, peak  # a block or two (1 MiB), not the 24 MiB file


def test_window_bytes_is_the_pages_setting() -> None:
    assert server._parser().parse_args(["--window-bytes", "1048576"]).window_bytes == 1024 * 1024
    assert server._parser().parse_args([]).window_bytes == 4 * 1024 * 1024
    with pytest.raises(SystemExit):
        server._parser().parse_args(["--window-bytes", "10"])
