"""The node machine hosting an app (node rule N10): pure, two or three nodes over in-memory links.

The token ring (examples/token_ring.py) is the app: one token, passed by the
command b"pass". A snapshot taken while the node machines run must find exactly
one token in the states plus in flight; recovery replays the log through the
app and refuses a non-deterministic one, naming the lsn.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from snapmesh.app import App, View, check_invariants
from snapmesh.protocol.node import core, recovery
from snapmesh.protocol import wal
from snapmesh.protocol.node.machine import Node, state_digest
from snapmesh.protocol.node.effects import Ack, Append, Finished, Report, Seal, Transmit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import token_ring  # noqa: E402

IDS = ("p1", "p2", "p3")


class Mesh:
    """Full mesh of node machines; `deliver` moves one frame at a time, in a seeded order."""

    def __init__(self, app: App, rng: random.Random, *, segment_records: int = 10**6) -> None:
        self.app, self.rng, self.segment_records = app, rng, segment_records
        self.logs: dict[str, list[wal.Record]] = {i: [] for i in IDS}
        self.wires: dict[tuple[str, str], list] = {}
        self.reports: dict[str, dict[str, core.FullState]] = {}
        self.finished: dict[tuple[str, str], core.FullState] = {}  # (snapshot id, node) -> part, until Report
        self.digests: dict[tuple[str, str], str] = {}  # (snapshot id, node) -> the digest its Finished said
        self.nodes = {i: self.start(i) for i in IDS}

    def peers(self, me: str) -> tuple[str, ...]:
        return tuple(i for i in IDS if i != me)

    def start(self, me: str) -> Node:
        records = [(f"{me}.log:{n}", r) for n, r in enumerate(self.logs[me], 1)]
        state = recovery.recover(
            records, node_id=me, incoming=self.peers(me), outgoing=self.peers(me), app=self.app
        )
        node = Node(
            node_id=me, incoming=self.peers(me), outgoing=self.peers(me), recovered=state, app=self.app,
            segment_records=self.segment_records,
        )
        self.route(me, node)
        for dst in self.peers(me):
            node.connect(dst, 1)
            self.wires.setdefault((me, dst), [])
        self.route(me, node)
        return node

    def route(self, me: str, node: Node) -> None:
        while effects := node.drain():
            self._carry_out(me, node, effects)

    def _carry_out(self, me: str, node: Node, effects: list) -> None:
        for effect in effects:
            if isinstance(effect, Append):
                self.logs[me].append(effect.record)
                node.durable(effect.record.lsn)  # every record durable at once: the disk is not the subject here
            elif isinstance(effect, Transmit):
                self.wires.setdefault((me, effect.dst), []).append(effect.entries)
            elif isinstance(effect, Seal):  # one segment here: its checkpoint is the next record
                self.logs[me].append(effect.checkpoint)
                node.durable(effect.checkpoint.lsn)
            elif isinstance(effect, Finished):
                self.finished[effect.state.snapshot_id, me] = effect.state
                self.digests[effect.state.snapshot_id, me] = effect.digest
            elif isinstance(effect, Report):
                self.reports.setdefault(effect.snapshot_id, {})[me] = self.finished.pop((effect.snapshot_id, me))
            elif isinstance(effect, Ack):  # straight back to the sender (the ack's wire is not the subject)
                sender = self.nodes.get(effect.src) if hasattr(self, "nodes") else None
                if sender is not None:
                    sender.acked(me, effect.conn_no, effect.seq)
                    self.route(effect.src, sender)
            else:  # EndStreams: this mesh's wires carry no connection number, and it delivers no more after a restore
                assert type(effect).__name__ in ("ReportCancelled", "EndStreams"), effect

    def deliver(self) -> bool:
        busy = [k for k, frames in self.wires.items() if frames]
        if not busy:
            return False
        src, dst = self.rng.choice(busy)
        node = self.nodes[dst]
        node.opened(src, 1)
        for e in self.wires[(src, dst)].pop(0):
            node.received(src, 1, e.seq, last_seq=e.last_seq, snapshot_id=e.snapshot_id, payload=e.payload)
        node.end_frame()
        self.route(dst, node)
        return True

    def command(self, me: str, command: bytes) -> bytes | None:
        node = self.nodes[me]
        try:
            answer = node.submit(command)
        except core.AppRefusal:
            return None
        self.route(me, node)
        return answer.reply

    def snapshot(self, sid: str) -> None:
        node = self.nodes[self.rng.choice(IDS)]
        node.start_snapshot(sid)
        self.route(node.node_id, node)

    def view(self, sid: str) -> View:
        parts = self.reports[sid]
        in_flight = [
            (src, dst, t.seq, t.payload) for dst, part in parts.items() for src, ts in part.channels.items() for t in ts
        ]
        return View(snapshot_id=sid, states={n: p.state for n, p in parts.items()}, in_flight=in_flight)


def run(seed: int, mesh: Mesh, steps: int = 300) -> list[str]:
    rng, taken = random.Random(seed), []
    for step in range(steps):
        roll = rng.random()
        if roll < 0.3:
            mesh.command(rng.choice(IDS), b"pass")
        elif roll < 0.33:
            taken.append(f"s{step}")
            mesh.snapshot(taken[-1])
        else:
            mesh.deliver()
    while mesh.deliver():
        pass
    return taken


@pytest.mark.parametrize("seed", range(30))
def test_every_snapshot_of_the_ring_finds_one_token(seed: int) -> None:
    print(f"seed {seed}")
    mesh = Mesh(token_ring.app, random.Random(seed))
    taken = run(seed, mesh)
    assert taken, "the run took no snapshot"
    for sid in taken:
        assert set(mesh.reports[sid]) == set(IDS), f"{sid} did not complete"
        view = mesh.view(sid)
        assert check_invariants(token_ring.app, view) == {"one token": []}, (seed, sid)
        for node_id, part in mesh.reports[sid].items():  # the cut record holds the state's digest
            cut = next(r for r in mesh.logs[node_id] if isinstance(r, wal.Cut) and r.snapshot_id == sid)
            assert cut.digest == state_digest(part.state)
            assert mesh.digests[sid, node_id] == cut.digest  # handed out with it: the report need not hash it
    tokens = sum(int(n.app_state()) for n in mesh.nodes.values())
    assert tokens == 1


def test_a_snapshot_can_hold_the_token_in_flight() -> None:
    mesh = Mesh(token_ring.app, random.Random(1))
    assert mesh.command("p1", b"pass") == b"passed to p2"  # on p1->p2's wire now
    mesh.nodes["p2"].start_snapshot("s")  # p2 cuts holding nothing; p1's marker follows the token
    mesh.route("p2", mesh.nodes["p2"])
    while mesh.deliver():
        pass
    view = mesh.view("s")
    assert [(s, d, p) for s, d, _, p in view.in_flight] == [("p1", "p2", token_ring.TOKEN)]
    assert check_invariants(token_ring.app, view) == {"one token": []}


def test_a_refused_command_logs_nothing_and_sends_nothing() -> None:
    mesh = Mesh(token_ring.app, random.Random(2))
    before = list(mesh.logs["p2"])
    with pytest.raises(core.AppRefusal) as info:
        mesh.nodes["p2"].submit(b"pass")
    assert info.value.kind is core.Refusal.APP_REFUSED and info.value.code == "FAILED_PRECONDITION"
    assert "does not hold the token" in str(info.value)
    mesh.route("p2", mesh.nodes["p2"])
    assert mesh.logs["p2"] == before and not any(mesh.wires[("p2", d)] for d in ("p1", "p3"))


def test_a_retried_request_id_gets_the_first_reply_and_runs_once() -> None:
    mesh = Mesh(token_ring.app, random.Random(3))
    first = mesh.nodes["p1"].submit(b"pass", "r-1", wall=10.0)
    again = mesh.nodes["p1"].submit(b"pass", "r-1", wall=11.0)
    assert (again.reply, again.repeated) == (first.reply, True)
    mesh.route("p1", mesh.nodes["p1"])
    assert sum(wal.step_command(r) is not None for r in mesh.logs["p1"]) == 1
    mesh.nodes["p1"] = mesh.start("p1")  # and after a restart, from the log
    assert mesh.nodes["p1"].submit(b"pass", "r-1", wall=12.0).reply == first.reply


@pytest.mark.parametrize("segment_records", [5, 10**6])
def test_recovery_replays_the_log_through_the_app(segment_records: int) -> None:
    mesh = Mesh(token_ring.app, random.Random(4), segment_records=segment_records)
    run(4, mesh, steps=120)
    before = {i: n.app_state() for i, n in mesh.nodes.items()}
    for i in IDS:
        if segment_records == 5:  # recovery reads the active segment: from its checkpoint on
            last = max(k for k, r in enumerate(mesh.logs[i]) if isinstance(r, wal.Checkpoint | wal.Init))
            mesh.logs[i] = mesh.logs[i][last:]
        mesh.nodes[i] = mesh.start(i)
    assert {i: n.app_state() for i, n in mesh.nodes.items()} == before


class Dice(token_ring.TokenRing):
    """Not deterministic: where it echoes depends on something outside its state and
    inputs (`outside`, as a clock or random() would be), which differs between runs."""

    outside = 0

    def on_message(self, src, payload, ctx):
        super().on_message(src, payload, ctx)
        ctx.send(sorted(ctx.peers_out)[Dice.outside], b"echo")


def test_a_non_deterministic_app_refuses_to_recover_naming_the_lsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Dice, "outside", 0)
    mesh = Mesh(App(name="dice", new=Dice), random.Random(5))
    mesh.command("p1", b"pass")
    while not any(isinstance(r, wal.Send) for r in mesh.logs["p2"]):
        assert mesh.deliver(), "p2 never got the token"
    send = next(r for r in mesh.logs["p2"] if isinstance(r, wal.Send))
    monkeypatch.setattr(Dice, "outside", 1)  # another run, another answer from outside
    with pytest.raises(recovery.NonDeterministic) as info:
        mesh.start("p2")
    print(info.value)
    assert str(info.value).startswith("p2.log:") and "deterministic" in str(info.value)
    assert f"lsn {send.lsn}:" in str(info.value), "it names the send that differs"
    assert f"to {send.dst}" in str(info.value)


def test_a_record_of_an_older_format_in_an_app_nodes_log_is_corrupt() -> None:
    # An older log is its app's reader's (App.old_logs); replayed as the app's, it is refused.
    records = [("l:1", wal.Init(lsn=1, app="token_ring")),
               ("l:2", wal.parse('{"node":"p1","lsn":2,"kind":"recv","msg_id":"p2:p1:1","src":"p2","dst":"p1",'
                                 '"seq":1,"amount":5}', "l:2"))]
    with pytest.raises(recovery.CorruptLog, match="l:2: a record of an older log format"):
        recovery.recover(records, node_id="p1", incoming=("p2",), outgoing=("p2",), app=token_ring.app)


def test_app_records_round_trip_through_the_log_format() -> None:
    for record in (
        wal.Send(lsn=3, msg_id="a:b:1", src="a", dst="b", seq=1, payload=""),
        wal.Send(lsn=4, msg_id="a:b:2", src="a", dst="b", seq=2, payload=wal.pack(b"\x00hi")),
        wal.Recv(lsn=5, msg_id="b:a:1", src="b", dst="a", seq=1, payload=wal.pack(b"x")),
        wal.Command(lsn=6, request_id="r", command=wal.pack(b"pass"), reply=wal.pack(b"ok")),
        wal.Send(lsn=6, msg_id="a:b:3", src="a", dst="b", seq=3, request_id="r", payload="", command=""),
        wal.Send(lsn=6, msg_id="a:b:3", src="a", dst="b", seq=3, payload="eA==", command="cA==", reply="b2s="),
        wal.Cut(lsn=7, snapshot_id="s", digest=state_digest(b"1")),
    ):
        line = wal.Encoder("a").record(record)
        assert wal.parse(line, "f:1", node_id="a") == record, line
    with pytest.raises(wal.CorruptRecord, match="not base64"):
        wal.unpack("%%%", "f:9")


def test_a_node_without_an_app_is_refused_naming_the_bank() -> None:
    with pytest.raises(TypeError, match="`app` is required.*load_app\\('bank'\\)"):
        Node(node_id="p1", incoming=["p2"], outgoing=["p2"], recovered=recovery.fresh(
            incoming=["p2"], outgoing=["p2"]))


def test_an_app_that_raises_on_a_message_stops_the_step_with_its_text() -> None:
    class Fragile(token_ring.TokenRing):
        def on_message(self, src, payload, ctx):
            raise RuntimeError("cannot take it")

    mesh = Mesh(App(name="fragile", new=Fragile), random.Random(7))
    mesh.command("p1", b"pass")
    with pytest.raises(core.AppFailed, match="cannot take it"):
        while mesh.deliver():
            pass


def test_an_app_whose_snapshot_is_not_bytes_fails_before_the_node_starts() -> None:
    class Stringy(token_ring.TokenRing):
        def snapshot(self):
            return "1"

    with pytest.raises(core.AppFailed, match="returned str, not bytes"):
        Mesh(App(name="stringy", new=Stringy), random.Random(8))


def test_restore_puts_the_in_flight_token_back_through_on_message() -> None:
    mesh = Mesh(token_ring.app, random.Random(9))
    mesh.command("p1", b"pass")
    mesh.nodes["p2"].start_snapshot("s")
    mesh.route("p2", mesh.nodes["p2"])
    while mesh.deliver():
        pass
    view = mesh.view("s")
    mesh.command("p2", b"pass")  # work after the snapshot, which the restore takes back
    for node_id, part in mesh.reports["s"].items():
        node = mesh.nodes[node_id]
        in_flight = [(src, t.msg_id, t.seq, 0, t.payload) for src, ts in part.channels.items() for t in ts]
        assert node.restore(snapshot_id="s", epoch=2, in_flight=in_flight, state=part.state)
        mesh.route(node_id, node)
    assert {i: n.app_state() for i, n in mesh.nodes.items()} == {"p1": b"0", "p2": b"1", "p3": b"0"}
    assert view.in_flight  # the token was in flight at the cut, and is held again after the restore
    with pytest.raises(core.RemoteProtocolError, match="without app state"):
        mesh.nodes["p1"].restore(snapshot_id="s", epoch=3, in_flight=[], state=None)
