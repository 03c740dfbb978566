"""An app's version and upgrade fields, and the round trip `snapmesh.app.testing` checks."""

from __future__ import annotations

import json

import pytest

from snapmesh.app import App, AppError
from snapmesh.app.testing import Cluster, RoundTripBroken, run
from snapmesh.services.app import kvshard


class Stack:
    """Pops what was pushed last; `snapshot()` sorts the list, so a restored stack pops another item."""

    def __init__(self, info, *, sort: bool):
        self.items: list[int] = []
        self.sort = sort

    def on_command(self, command, ctx):
        if command == b"pop":
            return str(self.items.pop() if self.items else -1).encode()
        self.items.append(int(command))
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return json.dumps(sorted(self.items) if self.sort else self.items).encode()

    def restore(self, state):
        self.items = json.loads(state)


def stack_app(sort: bool) -> App:
    return App(name="stack", new=lambda info: Stack(info, sort=sort))


@pytest.mark.parametrize("version", [0, -1, "2", 1.5, True, None])
def test_a_version_that_is_not_a_positive_int_is_one_line(version):
    with pytest.raises(AppError, match=r"^App 'x': version must be a positive int \(1, 2, \.\.\.\), got "):
        App(name="x", new=lambda info: None, version=version)


def test_version_defaults_to_1_and_upgrade_must_be_callable():
    assert App(name="x", new=lambda info: None).version == 1
    assert App(name="x", new=lambda info: None, version=3, upgrade=lambda s, v: s).version == 3
    with pytest.raises(AppError, match="upgrade must be callable or None, got int"):
        App(name="x", new=lambda info: None, upgrade=3)
    with pytest.raises(AppError, match="upgrade_message must be callable or None, got str"):
        App(name="x", new=lambda info: None, upgrade_message="f")


def test_a_snapshot_that_drops_the_order_fails_the_round_trip_at_the_first_input_that_differs():
    cluster = Cluster(stack_app(sort=True), channels=[("a", "b")])
    for n in (b"3", b"1"):
        cluster.command("a", n)
    cluster.shadow("a")
    cluster.command("a", b"7")  # both push: the same reply
    assert cluster.command("a", b"pop") == b"7"
    with pytest.raises(RoundTripBroken, match=r"node a: input 3 after snapshot\(\) \(the command b'pop'\): "
                       r"the machine restored from snapshot\(\) replied b'3' .* the original replied b'1' .*"
                       r"do not round-trip"):
        cluster.command("a", b"pop")


def test_a_state_that_round_trips_passes_and_run_shadows_nodes():
    cluster = Cluster(stack_app(sort=False), channels=[("a", "b")])
    cluster.shadow("a")
    for command in (b"3", b"1", b"pop", b"pop", b"pop"):
        cluster.command("a", command)
    stats = run(Cluster(kvshard.app, channels=[("p1", "p2"), ("p2", "p1")]), seed=3, steps=400, shadow_share=0.1)
    assert stats.shadows > 0


def test_run_finds_a_snapshot_that_does_not_round_trip():
    commands = iter([("a", c) for c in (b"5", b"9", b"2", b"1", b"pop", b"pop")] * 100)
    with pytest.raises(RoundTripBroken, match="seed 1, step .*do not round-trip"):
        run(Cluster(stack_app(sort=True), channels=[("a", "b")]), seed=1, steps=300, commands=commands,
            shadow_share=0.5)
