"""A command that does not go through leaves the app as it was (apphost.H4, node rule N12).

The app here changes its state first and fails after: the worst an app can do.
Each test drives a node machine over an in-memory log and checks two things:
the live app is as if the failed command never ran (the next reply shows it),
and a restart from the log (recovery's replay) agrees with the live node, where
a kept change used to make it refuse to start, "not deterministic", for good.
"""

from __future__ import annotations


import pytest

from snapmesh.app import App
from snapmesh.protocol import wal
from snapmesh.protocol.node import apphost, core, link, undo
from support.undo_driver import APP, ME, PEERS, Careless, Driver



FAILURES = [
    (b"add-then-raise", core.Refusal.APP_FAILED, "UNKNOWN", "half done"),
    (b"add-then-refuse", core.Refusal.APP_REFUSED, "FAILED_PRECONDITION", "changed my mind"),
    (b"add-then-str", core.Refusal.APP_FAILED, "UNKNOWN", "returned str, not bytes"),
]


@pytest.mark.parametrize(("failing", "kind", "code", "text"), FAILURES, ids=[f[0].decode() for f in FAILURES])
def test_a_command_that_changes_the_state_then_fails_is_taken_back(failing, kind, code, text) -> None:
    d = Driver()
    assert d.command(b"add") == b"1"
    d.hear("p2", 1, b"hello")  # a peer's message since the base: the rebuild replays it too
    logged = len(d.log)
    with pytest.raises(core.AppRefusal) as info:
        d.command(failing)
    assert (info.value.kind, info.value.code) == (kind, code) and text in str(info.value)
    assert len(d.log) == logged, "a refused command logs nothing"
    assert d.state() == {"n": 1, "heard": ["p2:hello"]}, "the app is as it was"
    assert d.command(b"add") == b"2", "the next reply is as if the failed command never ran"
    assert d.command(b"add") == b"3"
    live = d.state()
    assert d.restart() and d.state() == live, "recovery finds the history the live node had"
    assert d.command(b"get") == b"3"


def test_a_failing_command_among_successive_ones_takes_back_only_itself() -> None:
    d = Driver()
    replies = []
    for command in (b"add", b"add", b"add-then-raise", b"add", b"add-then-refuse", b"add-then-refuse", b"add"):
        try:
            replies.append(d.command(command))
        except core.AppRefusal:
            replies.append(None)
    assert replies == [b"1", b"2", None, b"3", None, None, b"4"]
    assert sum(isinstance(r, wal.Command) for r in d.log) == 4
    d.restart()
    assert d.state()["n"] == 4


def test_the_brick_a_kept_change_made_is_gone_after_a_restart() -> None:
    """The report: a raising command, later commands logged with replies built on
    its change, a kill -9, and a restart that refused to start for good."""
    d = Driver()
    d.command(b"add")
    with pytest.raises(core.AppRefusal):
        d.command(b"add-then-raise")
    d.command(b"add")
    d.command(b"send:p2")
    d.restart()  # used to raise NonDeterministic "p1.log.jsonl:3 ... replied b'2'; the log holds b'3'"
    assert d.state()["n"] == 3


def test_a_full_channel_refuses_only_the_commands_that_send_on_it() -> None:
    d = Driver(bound=5)
    for n in range(1, 6):  # p3 is paused: nothing it is sent is acknowledged
        assert d.command(b"send:p3") == str(n).encode()
    assert d.node.senders["p3"].unacked == 5
    with pytest.raises(link.ChannelFull, match="channel p1->p3 holds 5 unacknowledged messages") as info:
        d.command(b"send:p3")
    assert info.value.kind is core.Refusal.CHANNEL_FULL  # RESOURCE_EXHAUSTED at the servicer
    assert d.state()["n"] == 5, "the refused command is taken back"
    assert d.command(b"get") == b"5", "a command that sends nothing goes on"
    assert d.command(b"send:p2") == b"6", "a send to a healthy peer goes on"
    assert d.node.submit(b"send:p2").sent_to == ("p2",), "the shell slows the client on that channel only"
    d.route()
    assert d.command(b"add") == b"8"
    d.restart()
    assert d.state()["n"] == 8


def test_a_step_that_would_take_a_channel_past_its_bound_is_refused() -> None:
    class Twice(Careless):
        def on_command(self, command, ctx):
            reply = super().on_command(command, ctx)
            if command.startswith(b"send:"):
                ctx.send(command[5:].decode(), b"again")
            return reply

    d = Driver(App(name="twice", new=Twice), bound=5)
    d.command(b"send:p3")
    d.command(b"send:p3")  # 4 unacknowledged
    with pytest.raises(link.ChannelFull, match=r"p1->p3 holds 4 .*bound 5; the step sends 2 more"):
        d.command(b"send:p3")
    assert d.state()["n"] == 2


def test_a_reply_over_max_reply_bytes_is_taken_back_and_refused() -> None:
    d = Driver(max_reply_bytes=100)
    assert d.command(b"big:100") == b"x" * 100
    logged = len(d.log)
    with pytest.raises(core.LocalProtocolError, match=r"reply holds 101 bytes, over max_reply_bytes \(100\)") as info:
        d.command(b"big:101")
    assert info.value.kind is core.Refusal.REPLY_TOO_LARGE
    assert len(d.log) == logged and d.state()["n"] == 1
    assert d.command(b"add") == b"2"
    d.restart()
    assert d.state()["n"] == 2


def test_an_undo_across_rebases_and_a_checkpoint_replays_what_came_after_them(monkeypatch) -> None:
    monkeypatch.setattr(undo, "REBASE_STEPS", 3)
    d = Driver(segment_records=11)  # seals (a checkpoint: snapshot(), a new base) as it goes
    seq, longest = 0, 0
    for n in range(1, 41):
        assert d.command(b"add") == str(n).encode()
        if n % 2:
            seq += 1
            d.hear("p2", seq, b"m%d" % seq)
        longest = max(longest, len(d.node.host.undo))
        if n % 5 == 0:  # inputs since the base to replay: 0 to 3 of them
            with pytest.raises(core.AppRefusal):
                d.command(b"add-then-raise")
            assert d.state() == {"n": n, "heard": [f"p2:m{i}" for i in range(1, seq + 1)]}
    assert longest == 3, "the undo log stays bounded (H5), and was used up to its bound"
    assert d.node.host.undone == 8
    assert any(isinstance(r, wal.Checkpoint) for r in d.log)
    live = d.state()
    d.restart()
    assert d.state() == live


def test_an_app_that_cannot_be_put_back_stops_the_node() -> None:
    """The rebuild replays the inputs since the base; an app whose replay raises
    is not deterministic: AppFailed, the node must stop, its log is right."""
    calls = iter(range(100))

    class Moody(Careless):
        def on_message(self, src, payload, ctx):
            if next(calls) > 0:  # fine the first time only: state outside the machine
                raise RuntimeError("not today")
            super().on_message(src, payload, ctx)

    host = apphost.Host(App(name="moody", new=Moody), node_id=ME, incoming=PEERS, outgoing=PEERS)
    host.message("p2", b"hi")
    with pytest.raises(core.AppFailed, match="replayed from the undo log raised RuntimeError: not today"):
        host.command(b"add-then-raise")


def test_the_undo_log_rebases_at_snapshot_and_costs_the_success_path_one_append() -> None:
    host = apphost.Host(APP, node_id=ME, incoming=PEERS, outgoing=PEERS)
    host.command(b"add")
    host.message("p2", b"x")
    assert [tuple(i) for i in host.undo] == [("", b"add"), ("p2", b"x")] and host.undo.base is None
    state = host.snapshot()
    assert host.undo.base == state and len(host.undo) == 0
    with pytest.raises(core.AppRefusal):
        host.command(b"add-then-refuse")
    assert host.undone == 1 and host.snapshot() == state
