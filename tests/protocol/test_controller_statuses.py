"""What an error of a Controller RPC answers (snapmesh/protocol/controller/statuses.py, S1-S3)."""

from __future__ import annotations

import pytest

from snapmesh.protocol import chunking
from snapmesh.protocol.controller import listing, restoregate, statuses
from snapmesh.protocol.controller.refusals import StaleReport, TooManySnapshots, UnknownInitiator
from snapmesh.protocol.controller.tracker import UnknownSnapshot


@pytest.mark.parametrize(("error", "code"), [
    (TooManySnapshots("full"), "RESOURCE_EXHAUSTED"),
    (UnknownInitiator("who"), "INVALID_ARGUMENT"),
    (StaleReport("old"), "FAILED_PRECONDITION"),
    (UnknownSnapshot("none"), "NOT_FOUND"),
    (listing.Damaged("s1", "bad crc"), "DATA_LOSS"),
    (listing.BadRequest("bad"), "INVALID_ARGUMENT"),
    (listing.TooLarge("big"), "RESOURCE_EXHAUSTED"),
    (chunking.ChunkError("pieces"), "INVALID_ARGUMENT"),
])
def test_a_refusal_is_its_own_code_with_its_words_journaling_or_not(error: Exception, code: str) -> None:
    assert statuses.status(error) == statuses.status(error, "report") == (code, str(error))


def test_a_restore_gate_refusal_is_the_decisions_code() -> None:
    refused = restoregate.Refused(restoregate.Refuse("ALREADY_EXISTS", "taken"))
    assert statuses.status(refused, "restore") == ("ALREADY_EXISTS", "taken")


def test_a_record_not_journaled_is_unavailable_only_where_the_rpc_journals() -> None:
    assert statuses.status(OSError("disk full"), "snapshot") == ("UNAVAILABLE", "cannot journal the snapshot: disk full")
    assert statuses.status(OSError("disk full")) is None


def test_anything_else_is_no_answer() -> None:
    assert statuses.status(ValueError("a bug")) is None
    assert statuses.status(RuntimeError("x"), "restore") is None


def test_a_watcher_that_fell_behind_is_dropped_saying_where_to_read_what_it_missed() -> None:
    assert statuses.dropped("fell 1001 updates behind") == (
        "RESOURCE_EXHAUSTED",
        "this watcher fell 1001 updates behind and was dropped; watch again "
        "(ListSnapshots or GetSnapshot has what it missed)",
    )
