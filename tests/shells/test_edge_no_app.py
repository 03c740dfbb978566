"""edge.py E5: a machine that hosts no app runs no command and no query.

A `Node` always hosts an app (machine.py N10), so only an engine a test stands in
meets the rule: `submit`, `submit_many` and `query` refuse UNIMPLEMENTED, naming the
node and the call, before the fence or a size limit is asked (the stand-in has neither).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from snapmesh.app import Refused
from snapmesh.services.node.edge import MAX_COMMAND_BYTES, Edge


class NoApp:
    """An engine whose machine hosts no app; any other question is a failure of the rule's order."""

    node_id = "p1"
    node = SimpleNamespace(host=None)

    def __getattr__(self, name: str):
        raise AssertionError(f"E5 asks nothing before refusing, but the edge asked the engine for {name!r}")


TOO_BIG = b"x" * (MAX_COMMAND_BYTES + 1)  # over the limit: the size check would say INVALID_ARGUMENT


@pytest.mark.parametrize("rpc, call", [
    ("Submit", lambda edge: edge.submit(TOO_BIG, request_id="r")),
    ("SubmitBatch", lambda edge: edge.submit_many([])),  # empty: E3 would say INVALID_ARGUMENT
    ("Query", lambda edge: edge.query(TOO_BIG)),
])
def test_a_machine_without_an_app_refuses_every_call_unimplemented(rpc, call):
    with pytest.raises(Refused) as refused:
        asyncio.run(call(Edge(NoApp())))
    assert (refused.value.code, refused.value.text) == ("UNIMPLEMENTED", f"node p1 hosts no app: nothing answers {rpc}")
