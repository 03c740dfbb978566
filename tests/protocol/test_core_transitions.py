"""The core's whole transition table, and every protocol violation.

For every (phase, input) pair: either the transition the rules in
snapmesh/protocol/node/core.py describe, with exactly the effects they imply, or the right
typed error, and an error never changes the process (its whole internal state
is compared before and after). A hypothesis test then drives a process with
random input sequences, valid and invalid, against a small reference model
written here from the rules, not from the code.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapmesh.protocol.node import core
from snapmesh.protocol.node.core import (
    ChannelRecorded,
    LocalProtocolError,
    LocalStateRecorded,
    Marker,
    MessageSent,
    Phase,
    Process,
    RemoteProtocolError,
    SnapshotCompleted,
    StaleMarkerDropped,
    Transfer,
)

INCOMING = ("X", "Y")
OUTGOING = ("X", "Z")
S = "s"


def make(abandoned: tuple[str, ...] = ()) -> Process:
    return Process(node_id="P", incoming=INCOMING, outgoing=OUTGOING, abandoned=abandoned)


def state_of(p: Process) -> Any:
    """Everything the process holds (a deep copy, so later changes do not leak in)."""
    return copy.deepcopy(vars(p))


def markers_out(sid: str) -> list[MessageSent]:
    return [MessageSent(dst=d, message=Marker(snapshot_id=sid)) for d in OUTGOING]


# ---------------------------------------------------------- reaching a phase

# Each way of putting snapshot S into a phase (several per phase: how a phase was
# reached must not matter). Returns the process and the incoming channels already
# closed for S.
def idle() -> tuple[Process, set[str]]:
    return make(), set()


def recording_by_start() -> tuple[Process, set[str]]:
    p = make()
    p.start_snapshot(S)
    return p, set()


def recording_by_marker() -> tuple[Process, set[str]]:
    p = make()
    p.receive(src="Y", message=Marker(snapshot_id=S))
    return p, {"Y"}


def completed() -> tuple[Process, set[str]]:
    p = make()
    p.start_snapshot(S)
    p.receive(src="X", message=Marker(snapshot_id=S))
    p.receive(src="Y", message=Marker(snapshot_id=S))
    return p, {"X", "Y"}


def abandoned_while_recording() -> tuple[Process, set[str]]:
    p, _ = recording_by_start()
    p.abort_snapshot(S)
    return p, set()


def abandoned_while_idle() -> tuple[Process, set[str]]:
    p = make()
    p.abort_snapshot(S)
    return p, set()


def abandoned_by_restart() -> tuple[Process, set[str]]:
    return make(abandoned=(S,)), set()


SETUPS = {
    Phase.IDLE: [idle],
    Phase.RECORDING: [recording_by_start, recording_by_marker],
    Phase.COMPLETED: [completed],
    Phase.ABANDONED: [abandoned_while_recording, abandoned_while_idle, abandoned_by_restart],
}

# The inputs that move a snapshot's phase; a marker on each incoming channel.
INPUTS = {
    "start": lambda p: p.start_snapshot(S),
    "marker X": lambda p: p.receive(src="X", message=Marker(snapshot_id=S)),
    "marker Y": lambda p: p.receive(src="Y", message=Marker(snapshot_id=S)),
    "abort": lambda p: p.abort_snapshot(S),
}


def expected(phase: Phase, name: str, closed: set[str]) -> tuple[Phase, list[Any]] | type:
    """The rules, restated: the phase after the input and its effects, or an error type."""
    src = name.split()[-1] if name.startswith("marker") else None
    if phase is Phase.IDLE:
        if name == "start":
            return Phase.RECORDING, [LocalStateRecorded(snapshot_id=S), *markers_out(S)]
        if src:
            return Phase.RECORDING, [
                LocalStateRecorded(snapshot_id=S),
                *markers_out(S),
                ChannelRecorded(snapshot_id=S, src=src, transfers=()),
            ]
        return Phase.ABANDONED, []
    if phase is Phase.RECORDING:
        if name == "start":
            return Phase.RECORDING, []
        if name == "abort":
            return Phase.ABANDONED, []
        if src in closed:
            return RemoteProtocolError
        effects: list[Any] = [ChannelRecorded(snapshot_id=S, src=src, transfers=())]
        if closed | {src} == set(INCOMING):
            return Phase.COMPLETED, effects + ["completed"]
        return Phase.RECORDING, effects
    if phase is Phase.COMPLETED:
        return RemoteProtocolError if src else (Phase.COMPLETED, [])
    # ABANDONED
    return (Phase.ABANDONED, [StaleMarkerDropped(snapshot_id=S, src=src)]) if src else (Phase.ABANDONED, [])


def test_the_core_table_names_every_pair() -> None:
    assert set(core._TRANSITIONS) == {(ph, inp) for ph in core.Phase for inp in core.Input}
    for handler in core._TRANSITIONS.values():
        assert callable(getattr(Process, handler))


CASES = [(phase, setup, name) for phase, setups in SETUPS.items() for setup in setups for name in INPUTS]


@pytest.mark.parametrize("phase,setup,name", CASES, ids=[f"{p.value}-{s.__name__}-{n}" for p, s, n in CASES])
def test_every_phase_input_pair(phase: Phase, setup: Any, name: str) -> None:
    p, closed = setup()
    assert p.phase(S) is phase
    want = expected(phase, name, closed)
    before = state_of(p)
    if isinstance(want, type):
        with pytest.raises(want):
            INPUTS[name](p)
        assert state_of(p) == before, "a refused input changed the process"
        return
    next_phase, effects = want
    got = INPUTS[name](p)
    assert p.phase(S) is next_phase
    if effects and effects[-1] == "completed":
        *effects, _ = effects
        assert got[:-1] == effects
        (done,) = got[-1:]
        assert isinstance(done, SnapshotCompleted)
        assert done.state.node_id == "P" and done.state.snapshot_id == S
        assert dict(done.state.channels) == {"X": (), "Y": ()}
        assert list(done.state.channels) == list(INCOMING)
        assert S not in p.in_progress()
    else:
        assert got == effects
    if next_phase is Phase.RECORDING:
        assert S in p.in_progress()
    else:
        assert S not in p.in_progress()


# --------------------------------------------------------- protocol violations


def assert_refused(p: Process, error: type, call: Any) -> None:
    before = state_of(p)
    with pytest.raises(error):
        call()
    assert state_of(p) == before


def test_message_on_a_channel_the_topology_lacks_is_remote() -> None:
    p, _ = recording_by_start()
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="Z", message=Transfer(msg_id="t", payload=b"1")))
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="Z", message=Marker(snapshot_id=S)))
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="P", message=Marker(snapshot_id="new")))


def test_second_marker_on_the_same_channel_is_remote() -> None:
    p, _ = recording_by_marker()  # Y closed, X open
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="Y", message=Marker(snapshot_id=S)))
    p, _ = completed()
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="X", message=Marker(snapshot_id=S)))


def test_a_marker_for_another_snapshot_on_a_closed_channel_is_fine() -> None:
    p, _ = recording_by_marker()
    effects = p.receive(src="Y", message=Marker(snapshot_id="other"))
    assert effects[0] == LocalStateRecorded(snapshot_id="other")


@pytest.mark.parametrize("payload", [None, "3", 3, bytearray(b"3")])
def test_a_message_whose_payload_is_not_bytes_is_remote(payload: Any) -> None:
    p, _ = recording_by_start()
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="X", message=Transfer(msg_id="t", payload=payload)))


@pytest.mark.parametrize("sid", ["", None, 7])
def test_invalid_snapshot_ids(sid: Any) -> None:
    p = make()
    assert_refused(p, LocalProtocolError, lambda: p.start_snapshot(sid))
    # The same id from a peer is the peer's fault, and must not be recorded or relayed.
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="X", message=Marker(snapshot_id=sid)))


def test_unknown_message_type_is_remote() -> None:
    p = make()
    assert_refused(p, RemoteProtocolError, lambda: p.receive(src="X", message="hello"))  # type: ignore[arg-type]


def test_stale_marker_after_abort_is_dropped_and_reported() -> None:
    p, _ = recording_by_start()
    p.receive(src="X", message=Transfer(msg_id="t", payload=b"5"))
    assert p.abort_snapshot(S) == []
    assert p.phase(S) is Phase.ABANDONED and p.in_progress() == ()
    assert p.receive(src="X", message=Marker(snapshot_id=S)) == [StaleMarkerDropped(snapshot_id=S, src="X")]
    assert p.receive(src="Y", message=Marker(snapshot_id=S)) == [StaleMarkerDropped(snapshot_id=S, src="Y")]
    # Starting it again is a no-op: an abandoned id is never reused as a new snapshot.
    assert p.start_snapshot(S) == []
    assert p.phase(S) is Phase.ABANDONED


def test_restart_with_abandoned_ids() -> None:
    p = make(abandoned=("old1", "old2"))
    assert p.phase("old1") is p.phase("old2") is Phase.ABANDONED
    assert p.receive(src="Y", message=Marker(snapshot_id="old1")) == [StaleMarkerDropped(snapshot_id="old1", src="Y")]
    assert p.start_snapshot("old2") == []
    assert p.in_progress() == ()
    # Other ids work as usual after the restart.
    assert p.receive(src="Y", message=Marker(snapshot_id="new"))[:3] == [
        LocalStateRecorded(snapshot_id="new"),
        *markers_out("new"),
    ]
    assert p.phase("new") is Phase.RECORDING


def test_channel_state_is_what_arrives_between_cut_and_marker() -> None:
    p = make()
    p.receive(src="X", message=Transfer(msg_id="before", payload=b"1"))  # before the cut: not recorded
    p.start_snapshot(S)
    p.receive(src="X", message=Transfer(msg_id="a", payload=b"2"))
    p.receive(src="Y", message=Transfer(msg_id="b", payload=b"3"))
    p.receive(src="X", message=Transfer(msg_id="c", payload=b"4"))
    assert p.receive(src="X", message=Marker(snapshot_id=S)) == [
        ChannelRecorded(
            snapshot_id=S, src="X", transfers=(Transfer(msg_id="a", payload=b"2"), Transfer(msg_id="c", payload=b"4"))
        )
    ]
    p.receive(src="X", message=Transfer(msg_id="after", payload=b"5"))  # after X's marker: not recorded
    (recorded, done) = p.receive(src="Y", message=Marker(snapshot_id=S))
    assert recorded == ChannelRecorded(snapshot_id=S, src="Y", transfers=(Transfer(msg_id="b", payload=b"3"),))
    assert isinstance(done, SnapshotCompleted)
    assert dict(done.state.channels) == {"X": recorded_x(), "Y": (Transfer(msg_id="b", payload=b"3"),)}


def recorded_x() -> tuple[Transfer, ...]:
    return (Transfer(msg_id="a", payload=b"2"), Transfer(msg_id="c", payload=b"4"))


def test_one_node_topology_completes_at_once() -> None:
    p = Process(node_id="solo", incoming=(), outgoing=())
    effects = p.start_snapshot(S)
    assert effects[0] == LocalStateRecorded(snapshot_id=S)
    assert isinstance(effects[1], SnapshotCompleted) and dict(effects[1].state.channels) == {}
    assert p.phase(S) is Phase.COMPLETED


# ------------------------------------------- random sequences vs a model


@dataclass
class ModelRecording:
    open: dict[str, list[Transfer]]
    closed: dict[str, tuple[Transfer, ...]] = field(default_factory=dict)


@dataclass
class Model:
    """The rules of snapmesh/protocol/node/core.py, restated as simply as possible."""

    phases: dict[str, Phase] = field(default_factory=dict)
    recordings: dict[str, ModelRecording] = field(default_factory=dict)

    def phase(self, sid: str) -> Phase:
        return self.phases.get(sid, Phase.IDLE)

    def record(self, sid: str) -> list[Any]:
        self.phases[sid] = Phase.RECORDING
        self.recordings[sid] = ModelRecording({c: [] for c in INCOMING})
        return [LocalStateRecorded(snapshot_id=sid), *markers_out(sid)]

    def close(self, sid: str, src: str) -> list[Any]:
        rec = self.recordings[sid]
        rec.closed[src] = tuple(rec.open.pop(src))
        effects: list[Any] = [ChannelRecorded(snapshot_id=sid, src=src, transfers=rec.closed[src])]
        if not rec.open:
            del self.recordings[sid]
            self.phases[sid] = Phase.COMPLETED
            effects.append(("completed", sid, {c: rec.closed[c] for c in INCOMING}))
        return effects

    def apply(self, op: tuple) -> list[Any] | type:
        kind = op[0]
        if kind == "transfer":
            _, src, payload, msg_id = op
            if src not in INCOMING or not isinstance(payload, bytes):
                return RemoteProtocolError
            for rec in self.recordings.values():
                if src in rec.open:
                    rec.open[src].append(Transfer(msg_id=msg_id, payload=payload))
            return []
        if kind == "marker":
            _, src, sid = op
            if src not in INCOMING or not isinstance(sid, str) or not sid:
                return RemoteProtocolError
            phase = self.phase(sid)
            if phase is Phase.IDLE:
                return self.record(sid) + self.close(sid, src)
            if phase is Phase.RECORDING:
                if src in self.recordings[sid].closed:
                    return RemoteProtocolError
                return self.close(sid, src)
            if phase is Phase.COMPLETED:
                return RemoteProtocolError
            return [StaleMarkerDropped(snapshot_id=sid, src=src)]
        if kind == "start":
            _, sid = op
            if not isinstance(sid, str) or not sid:
                return LocalProtocolError
            return self.record(sid) if self.phase(sid) is Phase.IDLE else []
        if kind == "abort":
            _, sid = op
            if self.phase(sid) in (Phase.IDLE, Phase.RECORDING):
                self.recordings.pop(sid, None)
                self.phases[sid] = Phase.ABANDONED
            return []
        raise AssertionError(op)


def _normalise(effects: list[Any]) -> list[Any]:
    out = []
    for e in effects:
        if isinstance(e, SnapshotCompleted):
            out.append(("completed", e.state.snapshot_id, dict(e.state.channels)))
        else:
            out.append(e)
    return out


SIDS = st.sampled_from(["s1", "s2", "s3"])
PAYLOADS = st.one_of(st.binary(max_size=3), st.sampled_from([None, "3", 3]))
OPS = st.one_of(
    st.tuples(st.just("transfer"), st.sampled_from(["X", "Y", "Z"]), PAYLOADS),
    st.tuples(st.just("marker"), st.sampled_from(["X", "Y", "Y", "X", "Z"]), st.one_of(SIDS, st.sampled_from(["", None]))),
    st.tuples(st.just("start"), st.one_of(SIDS, st.sampled_from(["", None]))),
    st.tuples(st.just("abort"), SIDS),
)


@settings(max_examples=400, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    abandoned=st.lists(SIDS, max_size=1),
    ops=st.lists(OPS, max_size=60),
)
def test_random_inputs_follow_the_model(abandoned: list[str], ops: list[tuple]) -> None:
    p = make(abandoned=tuple(abandoned))
    model = Model({sid: Phase.ABANDONED for sid in abandoned})
    for i, op in enumerate(ops):
        if op[0] == "transfer":
            op = (*op, f"m{i}")
        before = state_of(p)
        want = model.apply(op)
        if isinstance(want, type):
            with pytest.raises(want):
                _call(p, op)
            assert state_of(p) == before, f"refused {op} changed the process"
        else:
            assert _normalise(_call(p, op)) == want, op
        for sid in ("s1", "s2", "s3"):
            assert p.phase(sid) is model.phase(sid)
        assert set(p.in_progress()) == set(model.recordings)


def _call(p: Process, op: tuple) -> list[Any]:
    kind = op[0]
    if kind == "transfer":
        return p.receive(src=op[1], message=Transfer(msg_id=op[3], payload=op[2]))
    if kind == "marker":
        return p.receive(src=op[1], message=Marker(snapshot_id=op[2]))
    if kind == "start":
        return p.start_snapshot(op[1])
    return p.abort_snapshot(op[1])


# ------------------------------------------------------------ overtake mode (R6)


def _pair(mode: str) -> core.Process:
    return core.Process(node_id="b", incoming=["a"], outgoing=["a"], mode=mode)


def test_overtake_mode_ignores_the_second_marker_of_a_channel_classic_refuses_it() -> None:
    for mode in ("classic", "overtake"):
        p = _pair(mode)
        done = p.receive(src="a", message=core.Marker(snapshot_id="s1"))
        assert any(isinstance(e, core.SnapshotCompleted) for e in done)
        if mode == "classic":
            with pytest.raises(core.RemoteProtocolError, match="second marker"):
                p.receive(src="a", message=core.Marker(snapshot_id="s1"))
        else:
            assert p.receive(src="a", message=core.Marker(snapshot_id="s1")) == []
        assert p.phase("s1") is Phase.COMPLETED


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(core.LocalProtocolError, match="unknown snapshot mode 'fast'"):
        _pair("fast")


def test_passed_is_receive_without_effects_and_steps_aside_while_recording() -> None:
    p = core.Process(node_id="b", incoming=["a", "c"], outgoing=["a"])
    assert p.passed(src="a", payload=b"5") is True
    with pytest.raises(core.RemoteProtocolError):
        p.passed(src="a", payload="5")  # type: ignore[arg-type]
    with pytest.raises(core.RemoteProtocolError):
        p.passed(src="x", payload=b"1")
    p.start_snapshot("s1")
    assert p.passed(src="a", payload=b"5") is False  # the caller must use receive: it is recorded
