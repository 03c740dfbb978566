"""What a read of snapshots answers (snapmesh/protocol/controller/listing.py), without a server:
refusals (L1), the merged id order (L2), page ends and tokens (L3), GetSnapshot's size (L4)."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller import listing
from snapmesh.v1 import snapmesh_pb2 as pb

COMPLETE, FAILED = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED


def _snapshot(sid: str, status: int = COMPLETE, in_flight: int = 0) -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id=sid, status=status)
    if in_flight:
        snapshot.channels.add(src="a", dst="b").in_flight.add(payload=b"x" * in_flight)
    return snapshot


@pytest.mark.parametrize(
    "request_, text",
    [
        (pb.ListSnapshotsRequest(page_size=-1), "page_size must not be negative, got -1"),
        (pb.ListSnapshotsRequest(status=99), "status 99 is not a Snapshot.Status"),
        (pb.ListSnapshotsRequest(page_token="nonsense"), "page_token 'nonsense' is not a next_page_token"),
        (pb.ListSnapshotsRequest(page_token=listing.page_token("s1", FAILED), status=COMPLETE), "same status filter"),
        (pb.ListSnapshotsRequest(page_token=listing.page_token("", 0)), "is not a next_page_token"),
    ],
)
def test_a_bad_request_is_refused_in_words(request_: pb.ListSnapshotsRequest, text: str) -> None:
    with pytest.raises(listing.BadRequest, match=text.replace("(", r"\(")):
        listing.list_start(request_)


def test_a_token_continues_after_its_id_with_its_filter() -> None:
    token = listing.page_token("s7", FAILED)
    assert listing.page_after(token, FAILED) == "s7"
    assert listing.page_after(token, 0) is None
    start = listing.list_start(pb.ListSnapshotsRequest(page_token=token, status=FAILED, page_size=5000))
    assert start == listing.Start(after="s7", limit=listing.MAX_PAGE_SIZE, batch=listing.MAX_PAGE_SIZE + 1)
    assert listing.list_start(pb.ListSnapshotsRequest()).batch == listing.LOAD_BATCH


def test_the_merge_gives_the_working_set_and_the_index_in_id_order_a_batch_at_a_time() -> None:
    merge = listing.Merge(["b", "e", "z"], "", batch=3)
    assert merge.take(["a", "c", "d"]) == ["a", "b", "c", "d"]  # "e" waits: the index may have more before it
    assert (merge.cursor, merge.done) == ("d", False)
    assert merge.take(["f"]) == ["e", "f", "z"]  # the index has no more: the rest of the working set
    assert merge.done


def test_an_empty_listing_is_done_at_once() -> None:
    merge = listing.Merge([], "x", batch=2)
    assert merge.take([]) == [] and merge.done


def test_a_page_ends_at_its_size_with_a_token_for_the_last_one_taken() -> None:
    page = listing.Page(listing.Start(after="", limit=2, batch=3), 0)
    assert page.offer(_snapshot("a")) and page.offer(None) and page.offer(_snapshot("b"))
    assert not page.offer(_snapshot("c"))
    assert [s.snapshot_id for s in page.response.snapshots] == ["a", "b"]
    assert listing.page_after(page.response.next_page_token, 0) == "b"


def test_a_page_skips_another_status_and_has_no_token_when_everything_fit() -> None:
    page = listing.Page(listing.Start(after="", limit=None, batch=256), FAILED)
    assert page.offer(_snapshot("a")) and page.offer(_snapshot("b", FAILED))
    assert [s.snapshot_id for s in page.response.snapshots] == ["b"] and not page.response.next_page_token


def test_a_page_ends_before_page_bytes_and_a_snapshot_larger_than_a_page_comes_without_in_flight() -> None:
    page = listing.Page(listing.Start(after="", limit=None, batch=256), 0)
    assert page.offer(_snapshot("a", in_flight=listing.PAGE_BYTES))  # alone: taken, without its in-flight lists
    first = page.response.snapshots[0]
    assert first.in_flight_omitted and not first.channels[0].in_flight
    assert page.offer(_snapshot("b", in_flight=listing.PAGE_BYTES // 2))
    assert not page.offer(_snapshot("c", in_flight=listing.PAGE_BYTES // 2))  # the two would pass PAGE_BYTES
    assert listing.page_after(page.response.next_page_token, 0) == "b"


def test_get_snapshot_sizes() -> None:
    assert listing.max_bytes_problem(-3) == "max_bytes must not be negative, got -3"
    assert listing.max_bytes_problem(0) == ""
    assert listing.too_large("s1", listing.CLIENT_DEFAULT_BYTES, 0) == ""
    text = listing.too_large("s1", 2000, 1000)
    assert text.startswith("snapshot s1 is 2000 bytes, more than the 1000 this client takes")
    assert "GetSnapshotChunks" in text and "set max_bytes to 2000" in text


def test_an_rpc_naming_a_snapshot_is_refused_for_a_text_that_is_not_an_id() -> None:
    sid = "20260101T120000.000000Z-1a2b3c4d"
    listing.check_id(sid)
    listing.check_get(pb.GetSnapshotRequest(snapshot_id=sid, max_bytes=10))
    for request_, text in [
        (pb.GetSnapshotRequest(snapshot_id=""), "snapshot_id is empty"),
        (pb.GetSnapshotRequest(snapshot_id="../etc"), "is not a snapshot id"),
        (pb.GetSnapshotRequest(snapshot_id=sid, max_bytes=-3), "max_bytes must not be negative, got -3"),
    ]:
        with pytest.raises(listing.BadRequest, match=text) as refused:
            listing.check_get(request_)
        assert refused.value.code == "INVALID_ARGUMENT"


def test_the_working_set_a_listing_names_l2() -> None:
    status = {"a": pb.Snapshot.COMPLETE, "b": pb.Snapshot.FAILED, "c": pb.Snapshot.COMPLETE}.__getitem__
    start = listing.list_start(pb.ListSnapshotsRequest())
    assert listing.held(["a", "b", "c"], status, start, 0) == ["a", "b", "c"]
    assert listing.held(["a", "b", "c"], status, start, pb.Snapshot.COMPLETE) == ["a", "c"]
    after_a = listing.list_start(pb.ListSnapshotsRequest(page_token=listing.page_token("a", pb.Snapshot.COMPLETE),
                                                         status=pb.Snapshot.COMPLETE))
    assert listing.held(["a", "b", "c"], status, after_a, pb.Snapshot.COMPLETE) == ["c"]


def test_a_snapshot_in_chunks_is_its_encoding_in_order_l4() -> None:
    big = pb.Snapshot(snapshot_id="s1", reason="x" * (2 * listing.CHUNK_BYTES + 10))
    pieces = listing.chunks(big)
    assert len(pieces) == 3 and all(len(p.data) <= listing.CHUNK_BYTES for p in pieces)
    assert pb.Snapshot.FromString(b"".join(p.data for p in pieces)) == big
    assert listing.chunks(pb.Snapshot()) == [pb.SnapshotChunk()]  # nothing: one empty piece


def test_a_damaged_snapshot_is_said_so_l5() -> None:
    damaged = listing.Damaged("s1", "bad crc")
    assert (damaged.code, str(damaged)) == ("DATA_LOSS", "snapshot s1 is damaged on disk: bad crc")
    assert str(listing.Damaged("s1", "bad crc", restoring=True)) == (
        "snapshot s1 is damaged on disk, not restored (nothing changed): bad crc")
    with pytest.raises(listing.TooLarge) as too_large:
        listing.check_size("s1", 2000, 1000)
    assert too_large.value.code == "RESOURCE_EXHAUSTED" and str(too_large.value) == listing.too_large("s1", 2000, 1000)
    listing.check_size("s1", 1000, 1000)


def test_a_snapshot_is_the_working_sets_else_the_stores_else_not_found_or_damaged() -> None:
    from snapmesh.protocol.controller.tracker import UnknownSnapshot

    held = {"s1": _snapshot("s1")}
    stored = {"s1": _snapshot("s1", FAILED), "s2": _snapshot("s2")}
    loads: list[str] = []

    def get(sid: str) -> pb.Snapshot:
        if sid not in held:
            raise UnknownSnapshot(sid)
        return held[sid]

    def load(sid: str) -> pb.Snapshot | None:
        loads.append(sid)
        return stored.get(sid)

    assert listing.find("s1", get, load).status == COMPLETE and loads == [], "the store was read for a held one"
    assert listing.find("s2", get, load) == stored["s2"] and loads == ["s2"]
    assert listing.find("s2", get, None) is None and loads == ["s2"], "read the disk when told not to"
    damaged = {"s3": "bad crc"}.get
    assert listing.look_up("s2", get, load, damaged) == stored["s2"]
    with pytest.raises(listing.Damaged, match="^snapshot s3 is damaged on disk: bad crc$") as refused:
        listing.look_up("s3", get, load, damaged)
    assert refused.value.code == "DATA_LOSS"
    with pytest.raises(UnknownSnapshot, match="^no snapshot 's4'$") as missing:
        listing.look_up("s4", get, load, damaged)
    assert missing.value.code == "NOT_FOUND" and not isinstance(missing.value, listing.Damaged)
