"""A query (on_query, snapmesh.app A7) is a read: not logged, never a send, never a change.

The node machine over an in-memory log (test_node_undo's Driver): a query leaves
the log as it was and answers from the live state; one that sends through a
Context kept from a step, or raises after changing the machine, is refused and
the machine is put back (apphost.H7); an app without on_query is UNIMPLEMENTED.
`snapmesh.app.testing.Cluster.query` also finds a query that changes the machine
without sending, which the node does not look for.
"""

from __future__ import annotations

import pytest

from snapmesh.app import App, AppError, StepEnded
from snapmesh.app.testing import Cluster
from snapmesh.protocol.node import core
from snapmesh.services.app import kvshard

from support.undo_driver import Careless, Driver


class Reader(Careless):
    """Careless, with reads: `get`, and the faulty `send` (through a kept Context), `bump`, `bump-then-raise`."""

    def on_command(self, command, ctx):
        self.kept = ctx  # what a careless app might do
        return super().on_command(command, ctx)

    def on_query(self, query):
        if query == b"get":
            return str(self.n).encode()
        if query == b"send":
            self.n += 100
            self.kept.send("p2", b"from a query")
        if query == b"bump":
            self.n += 1
            return b"bumped"
        self.n += 1000
        raise RuntimeError(f"no query {query!r}")


READER = App(name="reader", new=Reader)


def test_a_query_answers_from_the_state_and_logs_nothing() -> None:
    d = Driver(READER)
    d.command(b"add")
    logged = len(d.log)
    reply, lsn, _ = d.node.query(b"get")
    assert reply == b"1"
    assert lsn == d.log[-1].lsn, "the answer rests on the last step applied: the shell waits for it to be durable"
    assert len(d.log) == logged, "a query is not logged"


@pytest.mark.parametrize(("query", "code", "text"), [
    (b"send", "FAILED_PRECONDITION", "must not send"),
    (b"oops", "UNKNOWN", "raised in on_query"),
])
def test_a_query_that_sends_or_raises_is_refused_and_the_machine_put_back(query, code, text) -> None:
    d = Driver(READER)
    d.command(b"add")
    logged = len(d.log)
    with pytest.raises(core.AppRefusal) as info:
        d.node.query(query)
    assert info.value.code == code and text in str(info.value)
    d.route()
    assert len(d.log) == logged, "nothing is logged, and nothing leaves"
    assert d.node.query(b"get")[0] == b"1", "the change the query made before it failed is gone"
    assert d.command(b"add") == b"2"


def test_an_app_without_on_query_is_unimplemented_and_the_bank_has_none() -> None:
    with pytest.raises(core.AppRefusal) as info:
        Driver().node.query(b"get")
    assert info.value.code == "UNIMPLEMENTED"


def test_testing_finds_a_query_that_changes_the_machine_or_sends() -> None:
    cluster = Cluster(READER, channels=[("p1", "p2"), ("p2", "p1")])
    cluster.command("p1", b"add")
    assert cluster.query("p1", b"get") == b"1"
    with pytest.raises(StepEnded, match="must not send"):
        cluster.query("p1", b"send")
    with pytest.raises(AppError, match="changed the machine"):
        cluster.query("p1", b"bump")
    assert cluster.query("p1", b"get") == b"1", "put back after each"
    assert cluster.pending() == []


def test_kvshard_and_token_ring_answer_queries_without_changing() -> None:
    from snapmesh.examples import token_ring

    ring = Cluster(token_ring.app, channels=[("p1", "p2"), ("p2", "p1")])
    assert (ring.query("p1", b"has"), ring.query("p2", b"has")) == (b"1", b"0")
    ring.command("p1", b"pass")
    ring.drain()
    assert (ring.query("p1", b"has"), ring.query("p2", b"has")) == (b"0", b"1")
    kv = Cluster(kvshard.app, channels=[("p1", "p2"), ("p2", "p1")])
    kv.command("p1", b'{"op": "put", "key": "p1/a", "value": 7}')
    assert kv.query("p1", b'{"op": "get", "key": "p1/a"}') == b'{"at":"p1","key":"p1/a","value":7}'
    with pytest.raises(Exception, match="NOT_FOUND"):
        kv.query("p2", b'{"op": "get", "key": "p1/a"}')
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):
        kv.query("p1", b'{"op": "put", "key": "p1/a", "value": 8}')
