"""examples/token_ring.py, the tutorial's one-file app (docs/apps.md): exactly one token at every cut.

Loaded the way a user loads it, `--app token_ring:app` from its own directory.
Pure: snapmesh.app.testing's FIFO channels, seeded runs that name their seed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import random
import re
import sys
from pathlib import Path

import pytest

from snapmesh.app import App, AppError, NodeInfo, Refused, check_invariants, load_app
from snapmesh.app.testing import Cluster, run, sql_violations

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SOURCE = EXAMPLES / "token_ring.py"
MESH = [(a, b) for a in ("p1", "p2", "p3", "p4") for b in ("p1", "p2", "p3", "p4") if a != b]
RING = [("p1", "p2"), ("p2", "p3"), ("p3", "p4"), ("p4", "p1")]


@pytest.fixture(scope="module")
def app():
    # As `cd examples && snapmesh cluster up --app token_ring:app` does: the working directory, no sys.path entry.
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(EXAMPLES)
        patch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(EXAMPLES))])
        yield load_app("token_ring:app")
    sys.modules.pop("token_ring", None)


def holders(cluster):
    return [n for n in sorted(cluster.machines) if cluster.snapshot(n) != b"0"]


def test_the_example_is_one_short_file_on_the_contract_alone():
    source = SOURCE.read_text(encoding="utf-8")
    assert len(source.splitlines()) < 100
    modules = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in modules if m not in sys.stdlib_module_names} == {"snapmesh.app"}, modules


def test_the_tutorial_shows_the_example_as_it_is():
    # docs/apps.md quotes the file part by part; each quoted block must still be in it, word for word.
    doc = (EXAMPLES.parent / "docs" / "apps.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n# examples/token_ring.py\n(.*?)```", doc, flags=re.S)
    source = SOURCE.read_text(encoding="utf-8")
    assert len(blocks) >= 5
    assert [b[:60] for b in blocks if b not in source] == []


def test_the_holder_passes_and_the_others_are_refused(app):
    cluster = Cluster(app, RING)
    assert holders(cluster) == ["p1"]
    assert cluster.command("p1", b"pass") == b"passed to p2"
    view = cluster.view()
    assert view.states == {"p1": b"0", "p2": b"0", "p3": b"0", "p4": b"0"}
    assert list(view.in_flight) == [("p1", "p2", 1, b"token")]
    assert check_invariants(app, view) == {"one token": []}
    assert app.describe(view) == {"token": ["in flight p1->p2 (seq 1)"]}
    with pytest.raises(Refused) as caught:
        cluster.command("p2", b"pass")  # the token is still on its way
    assert (caught.value.code, caught.value.text) == ("FAILED_PRECONDITION", "p2 does not hold the token")
    cluster.deliver("p1", "p2")
    assert cluster.command("p2", b"has") == b"1"
    with pytest.raises(Refused, match="INVALID_ARGUMENT: unknown command b'take'"):
        cluster.command("p2", b"take")


def test_the_next_node_wraps_around_and_the_holder_is_a_parameter(app):
    cluster = Cluster(app, MESH, params={"holder": "p4"})
    assert holders(cluster) == ["p4"]
    cluster.command("p4", b"pass")
    assert [d for _, d, _, _ in cluster.view().in_flight] == ["p1"]


@pytest.mark.parametrize("topology", ["mesh", "ring"])
@pytest.mark.parametrize("seed", range(6))
def test_every_cut_holds_exactly_one_token(app, topology, seed):
    cluster = Cluster(app, MESH if topology == "mesh" else RING)
    for part in range(4):
        stats = run(cluster, seed=seed * 10 + part, steps=150, replay_share=0.03, restore_share=0.03)
        assert stats.commands > stats.refused.get("FAILED_PRECONDITION", 0) > 0, stats
    cluster.drain()
    assert len(holders(cluster)) == 1


def test_two_tokens_or_none_fail_the_invariant_and_its_sql(app):
    cluster = Cluster(app, RING)
    cluster.command("p1", b"pass")
    cut = cluster.view("s1")
    two = dataclasses.replace(cut, snapshot_id="s2", states={**cut.states, "p3": b"1"})
    none = dataclasses.replace(cut, snapshot_id="s3", in_flight=[])
    assert check_invariants(app, two) == {"one token": ["2 tokens: at p3, in flight p1->p2 (seq 1)"]}
    assert check_invariants(app, none) == {"one token": ["0 tokens: none anywhere"]}
    assert sorted(sql_violations(app, [cut, two, none])["one token"]) == [("s2", 2), ("s3", 0)]


def test_a_restore_with_the_token_in_flight_leaves_exactly_one(app):
    cluster = Cluster(app, RING)
    cluster.command("p1", b"pass")
    cut = cluster.view("s1")
    cluster.deliver("p1", "p2")
    cluster.command("p2", b"pass")
    cluster.restore(cut)  # a fresh p2 restored with 0 tokens, then the recorded token through on_message
    assert holders(cluster) == ["p2"] and cluster.pending() == []
    assert check_invariants(app, cluster.view()) == {"one token": []}


def test_the_same_seed_gives_the_same_run(app):
    def once(seed):
        cluster = Cluster(app, MESH)
        return run(cluster, seed=seed, steps=300, replay_share=0.05, restore_share=0.05), cluster.view()

    assert once(5) == once(5)
    assert once(5)[1] != once(6)[1] or once(5)[0] != once(6)[0]


def test_a_variant_that_draws_a_random_number_is_caught_by_replay(app):
    # The issue's own example of a broken app: random() in on_message. Its sends differ on replay.
    rng = random.Random(1)
    machine_class = app.new

    class Jumpy(machine_class):
        def on_message(self, src, payload, ctx):
            super().on_message(src, payload, ctx)
            if rng.random() < 0.5:  # forbidden: randomness outside the logged inputs
                self.tokens -= 1
                ctx.send(self.next, payload)

    cluster = Cluster(App(name="jumpy", new=Jumpy), RING)
    with pytest.raises(AppError) as caught:
        for _ in range(50):
            holder = holders(cluster) or [None]
            if holder[0]:
                cluster.command(holder[0], b"pass")
            cluster.drain()
            for node in cluster.machines:
                cluster.replay(node)
    assert re.fullmatch(r"node p\d: replay of log position \d+ \(message\) sent .*: not deterministic", str(caught.value))


def test_the_workload_makes_passes_and_reads(app):
    infos = [NodeInfo(node_id=n, peers_out=(), peers_in=()) for n in ("p1", "p2")]
    commands = app.workload(infos, random.Random(0))
    made = [next(commands) for _ in range(100)]
    assert {node for node, _ in made} == {"p1", "p2"} and {c for _, c in made} == {b"pass", b"has"}
    json.dumps(app.describe(Cluster(app, RING).view()))  # JSON-able
