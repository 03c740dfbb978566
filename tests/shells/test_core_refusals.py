"""Each refusal of the core carries its kind (`core.Refusal`), and the node
servicer's one table gives every kind a status code."""

from __future__ import annotations

import grpc
import pytest

from snapmesh.services.node.servicer import REFUSAL_STATUS
from snapmesh.protocol.node import core


def process() -> core.Process:
    return core.Process(node_id="P", incoming=["X"], outgoing=["X"])


@pytest.mark.parametrize(
    ("call", "kind", "words"),
    [
        (lambda p: p.start_snapshot(""), core.Refusal.INVALID_INPUT, "snapshot id"),
        (lambda p: core.Process(node_id="P", incoming=[], outgoing=[], mode="fast"), core.Refusal.INVALID_INPUT, "mode"),
    ],
)
def test_each_refusal_names_its_kind_and_changes_nothing(call, kind, words) -> None:
    p = process()
    with pytest.raises(core.LocalProtocolError) as info:
        call(p)
    assert info.value.kind is kind and words in str(info.value)
    assert p.in_progress() == ()


def test_every_refusal_kind_has_a_status_code() -> None:
    assert set(REFUSAL_STATUS) == set(core.Refusal)
    assert REFUSAL_STATUS[core.Refusal.INVALID_INPUT] == grpc.StatusCode.INVALID_ARGUMENT
    assert REFUSAL_STATUS[core.Refusal.RESTORING] == grpc.StatusCode.UNAVAILABLE
