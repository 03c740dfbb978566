"""examples/shop's app without a cluster: the warehouses' commands, the invariants over a
cut (they hold through a seeded run with replays and restores, and each names what a
doctored cut breaks), the view rows' rules, and the SQL invariants, run by DuckDB over
the same rows (the Spark run is tests/deploy/test_wheel_shop.py's)."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import pytest

from snapmesh.app import Refused, View, check_invariants
from snapmesh.app.testing import Cluster, run, view_row_problems
from snapmesh.examples.shop import app
from snapmesh.examples.shop.warehouse import encode

NODES = ("p1", "p2", "p3")


def mesh() -> Cluster:
    return Cluster(app, channels=[(a, b) for a in NODES for b in NODES if a != b])


def command(cluster: Cluster, node: str, **fields) -> dict:
    return json.loads(cluster.command(node, encode(fields)))


def test_an_order_is_filled_where_there_is_stock_else_it_travels_on():
    cluster = mesh()
    assert command(cluster, "p1", op="order", item="pear", qty=30) == {
        "order": "p1-1", "status": "fulfilled", "warehouse": "p1"}
    assert command(cluster, "p1", op="order", item="pear", qty=90) == {
        "order": "p1-2", "status": "forwarded", "warehouse": "p2"}
    assert check_invariants(app, cluster.view()) == {"stock conserved": [], "each order once": []}
    assert [json.loads(p)["order"] for *_, p in cluster.view().in_flight] == ["p1-2"]


def test_an_order_no_warehouse_can_fill_ends_unfilled_after_visiting_each():
    cluster = mesh()
    assert command(cluster, "p2", op="order", item="plum", qty=500)["status"] == "forwarded"
    cluster.drain()
    states = {n: json.loads(s) for n, s in cluster.view().states.items()}
    assert [n for n, s in states.items() if s["orders"]] == ["p1"]  # p2 -> p3 -> p1, which keeps it
    assert states["p1"]["orders"] == {"p2-1": ["plum", 500, "unfilled"]}


@pytest.mark.parametrize("fields, code", [
    ({"op": "order", "item": "kiwi", "qty": 1}, "INVALID_ARGUMENT"),
    ({"op": "order", "item": "pear", "qty": 0}, "INVALID_ARGUMENT"),
    ({"op": "order", "item": "pear", "qty": "3"}, "INVALID_ARGUMENT"),
    ({"op": "steal", "item": "pear", "qty": 1}, "INVALID_ARGUMENT"),
    ({"op": "move", "item": "pear", "qty": 1, "to": "p1"}, "INVALID_ARGUMENT"),
    ({"op": "move", "item": "pear", "qty": 101, "to": "p2"}, "FAILED_PRECONDITION"),
])
def test_a_bad_command_is_refused_and_changes_nothing(fields, code):
    cluster = mesh()
    before = cluster.view().states
    with pytest.raises(Refused) as refused:
        cluster.command("p1", encode(fields))
    assert refused.value.code == code
    assert cluster.view().states == before


def test_a_query_reads_the_stock():
    cluster = mesh()
    command(cluster, "p1", op="move", item="apple", qty=10, to="p3")
    assert json.loads(cluster.query("p1", encode({"op": "stock"}))) == {
        "placed": 0, "stock": {"apple": 90, "pear": 100, "plum": 100}, "warehouse": "p1"}
    with pytest.raises(Refused):
        cluster.query("p1", b"stock")


def test_the_invariants_hold_through_a_seeded_run_with_replays_and_restores():
    cluster = mesh()
    run(cluster, seed=11, steps=1500, replay_share=0.02, restore_share=0.02)
    assert check_invariants(app, cluster.view()) == {"stock conserved": [], "each order once": []}


def busy_view() -> View:
    """A cut with orders ended, an order in flight and stock moving."""
    cluster = mesh()
    command(cluster, "p1", op="order", item="pear", qty=5)
    command(cluster, "p2", op="move", item="apple", qty=7, to="p3")
    command(cluster, "p3", op="order", item="plum", qty=150)
    command(cluster, "p3", op="restock", item="plum", qty=4)
    return dataclasses.replace(cluster.view(), snapshot_id="s1")


def doctored(view: View, node: str, change) -> View:
    states = dict(view.states)
    state = json.loads(states[node])
    change(state)
    states[node] = encode(state)
    return dataclasses.replace(view, states=states)


def broken_views() -> dict[str, tuple[View, str]]:
    view = busy_view()
    return {
        "stock conserved": (doctored(view, "p2", lambda s: s["stock"].update(apple=s["stock"]["apple"] + 1)),
                            "apple: held + moving + shipped is +1 off"),
        "each order once": (dataclasses.replace(view, in_flight=[m for m in view.in_flight if b'"order"' not in m[3]]),
                            "order p3-1 is in 0 places"),  # the order in flight lost: it carries no stock
        "no order from nowhere": (doctored(view, "p2", lambda s: s["orders"].update({"p9-1": ["pear", 1, "unfilled"]})),
                                  "order p9-1 at p2, which no warehouse took"),
    }


def test_the_invariants_name_what_a_doctored_cut_breaks():
    assert check_invariants(app, busy_view()) == {"stock conserved": [], "each order once": []}
    for name, (view, said) in broken_views().items():
        found = check_invariants(app, view)
        broken = {k: v for k, v in found.items() if v}
        assert list(broken) == [name if name in found else "each order once"], found
        assert any(said in problem for problem in next(iter(broken.values()))), found


def test_the_view_rows_keep_the_rules():
    assert view_row_problems(app, [busy_view()]) == []


def sql_violations(view: View) -> dict[str, list]:
    """Each SQL invariant over the view's rows: the rows it returns (each is a violation)."""
    db = duckdb.connect()
    for table, rows_of in app.views.items():
        rows = rows_of(view)
        columns = list(rows[0])
        types = ", ".join(f"{c} {'BIGINT' if isinstance(rows[0][c], int) else 'VARCHAR'}" for c in columns)
        db.execute(f"CREATE TABLE {table} ({types})")
        db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' for _ in columns)})",
                       [[row[c] for c in columns] for row in rows])
    return {name: db.execute(query).fetchall() for name, query in app.sql_invariants.items()}


def test_the_sql_invariants_find_nothing_in_a_good_cut_and_each_its_own_break():
    assert sql_violations(busy_view()) == {name: [] for name in app.sql_invariants}
    for name, (view, _) in broken_views().items():
        found = {k: v for k, v in sql_violations(view).items() if v}
        assert list(found) == [name], found
        assert all(row[0] == "s1" for row in found[name]), found  # each violation names its snapshot
