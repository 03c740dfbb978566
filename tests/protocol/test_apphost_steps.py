"""The Host's per-step path (apphost.H1, H5): what its inlined parts must keep.

`Host.command` and `Host.message` build each step's Context without calling
Context.__init__ and record the undo input without `UndoLog.took`, to save a
call each on the per-command path. These tests hold them to what the calls
did: a Context per step equal to `Context(node_id, peers_out)`, never shared
with another step, and an undo log whose count and size move its base as
`UndoLog.took` and `full` would.
"""

from __future__ import annotations

import pytest

from snapmesh.app import App, Context, NodeInfo, StepEnded
from snapmesh.protocol.node import apphost, core

PEERS = ("p2", "p3")


class Watcher:
    """Records each step's Context as the step found it, and misuses a kept one on request."""

    def __init__(self, info: NodeInfo) -> None:
        self.seen: list[tuple[Context, dict]] = []
        self.kept: Context | None = None

    def _step(self, ctx: Context) -> None:
        self.seen.append((ctx, dict(vars(ctx), sends=list(ctx.sends))))
        if self.kept is not None and getattr(ctx, "mark", None) is not None:
            raise AssertionError("an attribute set on an earlier step's Context is seen in this one")

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        self._step(ctx)
        if command == b"keep":
            self.kept = ctx
            ctx.mark = "mine"  # type: ignore[attr-defined]  (what a careless app might do)
            ctx.send("p2", b"kept")
        elif command == b"use-kept":
            self.kept.send("p3", b"late")  # type: ignore[union-attr]
        elif command == b"send":
            ctx.send("p3", b"now")
        return b"ok"

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        self._step(ctx)
        if payload == b"echo":
            ctx.send(src, b"back")

    def snapshot(self) -> bytes:
        return b""

    def restore(self, state: bytes) -> None:
        pass


APP = App(name="watcher", new=Watcher)


def _host() -> apphost.Host:
    return apphost.Host(APP, node_id="p1", incoming=PEERS, outgoing=PEERS)


def test_each_step_gets_a_fresh_context_equal_to_one_context_init_makes() -> None:
    host = _host()
    assert host.command(b"send") == (b"ok", [("p3", b"now")])
    assert host.message("p2", b"echo") == [("p2", b"back")]
    assert host.command(b"plain") == (b"ok", [])
    host.message("p3", b"quiet")
    seen = host.machine.seen
    expected = vars(Context("p1", PEERS))
    assert [found for _, found in seen] == [expected] * 4, "each step starts as Context(node_id, peers_out) does"
    assert all(type(ctx) is Context for ctx, _ in seen)
    assert len({id(ctx) for ctx, _ in seen}) == 4, "no Context serves two steps"
    assert all(not ctx.open for ctx, _ in seen), "each is closed once its step returned"


def test_a_context_kept_from_a_step_cannot_reach_a_later_one() -> None:
    host = _host()
    reply, sends = host.command(b"keep")
    assert sends == [("p2", b"kept")]
    host.message("p2", b"echo")  # its Context must not carry the kept one's attribute (Watcher._step)
    with pytest.raises(core.AppRefusal, match="StepEnded") as info:
        host.command(b"use-kept")
    assert info.value.code == "UNKNOWN"
    with pytest.raises(StepEnded):
        host.machine.kept.send("p2", b"after")
    assert host.command(b"send") == (b"ok", [("p3", b"now")]), "the next step's sends are its own"


def test_the_undo_log_counts_each_step_and_rebases_on_its_byte_bound() -> None:
    host = _host()
    host.command(b"abc")
    host.message("p2", b"hello")
    assert list(host.undo) == [("", b"abc"), ("p2", b"hello")] and host.undo.size == 8
    host.undo.size_limit = 10  # the next step's input takes it to the bound: the base moves up before the one after
    host.command(b"xy")
    assert len(host.undo) == 3 and host.undo.size == 10 and host.undo.full
    host.message("p3", b"z")
    assert list(host.undo) == [("p3", b"z")] and host.undo.base == b"", "moved up before the step (H5)"
    host.undo.steps_limit = 1
    host.command(b"q")
    assert list(host.undo) == [("", b"q")], "and on its step bound"
