"""The fuzzer with reports as blocks (snapmesh/sim/blockstore.py): a lost, duplicated or stale block
reference is caught at a fixed seed, and the same seeds are clean without the mutation: in the
manifest a node sends, in the controller's pins (SB4), and in a restore sent as blocks.

Each mutation breaks the manifest a node sends (blocks.referenced_report, B4): the
controller then rebuilds a state that is not the one the node recorded at its cut,
and the fuzzer must say so (SB1, or the checker's cut digest, A2). A failure
prints the seed and the command that replays it.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from snapmesh.fuzzer import fuzz
from snapmesh.protocol import blocks, restoreblocks
from snapmesh.protocol.controller import journal
from snapmesh.protocol.controller.blockpins import BlockPins
from snapmesh.protocol.controller.blockrefs import BlockRefs
from snapmesh.services.app import kvshard
from snapmesh.sim.blockstore import SimBlocks
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb


def _mutated(change):
    """blocks.referenced_report with `change(report, manifest)` applied to the manifest of each report sent as blocks."""
    made = blocks.referenced_report

    def broken(report, held, known=None):
        sent, names = made(report, held, known)
        if sent is not None:
            hashes = list(sent.state_blocks.hashes)
            sent.state_blocks.ClearField("hashes")
            sent.state_blocks.hashes.extend(change(report, hashes))
        return sent, names

    return broken


def _lost(report, hashes: list[bytes]) -> list[bytes]:
    """A block left out of the manifest (its last)."""
    return hashes[:-1] if len(hashes) > 1 else hashes


def _duplicated(report, hashes: list[bytes]) -> list[bytes]:
    """A block named twice (its first, again)."""
    return hashes[:1] + hashes


def _stale() -> object:
    """A block of the node's older state named in place of the first one that changed
    (the same for every copy of a report: a repeat is the report sent again)."""
    last: dict[str, tuple[str, list[bytes], list[bytes]]] = {}  # node -> (snapshot, the manifest before it, its own)

    def change(report, hashes: list[bytes]) -> list[bytes]:
        node, sid = report.node_id, report.snapshot_id
        if node not in last or last[node][0] != sid:
            last[node] = (sid, last[node][2] if node in last else [], list(hashes))
        before = last[node][1]
        out = list(hashes)
        for i, (old, new) in enumerate(zip(before, hashes, strict=False)):  # a state may have grown
            if old != new:
                out[i] = old
                break
        return out

    return change


MUTANTS = {"lost": lambda: _lost, "duplicated": lambda: _duplicated, "stale": _stale}



# (app, mutation, the seed that catches it, what the failure says). The bank's stale one is
# pinned where the stale block has the new one's size: only its content tells it apart.
CAUGHT = [
    ("bank", "lost", 25, "SB1: snapshot s5: n2's state rebuilt from its 1 block reference(s) (1 bytes)"),
    ("bank", "duplicated", 11, "SB1: snapshot s3: n0's state rebuilt from its 1 block reference(s) (2 bytes)"),
    ("bank", "stale", 55, "SB1: snapshot s5: n0's state rebuilt from its 1 block reference(s) (2 bytes)"),
    ("kvshard", "lost", 11, "SB1: snapshot s4: n4's state rebuilt from its 1 block reference(s) (35 bytes)"),
    ("kvshard", "duplicated", 11, "SB1: snapshot s4: n4's state rebuilt from its 1 block reference(s) (161 bytes)"),
    ("kvshard", "stale", 9, "SB1: snapshot s1: n2's state rebuilt from its 1 block reference(s) (140 bytes)"),
]
APPS = {"bank": None, "kvshard": kvshard.app}


@pytest.mark.parametrize(("app", "name", "seed", "caught"), CAUGHT, ids=[f"{a}-{n}" for a, n, _, _ in CAUGHT])
def test_the_fuzzer_catches_each_bad_block_reference(
    app: str, name: str, seed: int, caught: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(blocks, "referenced_report", _mutated(MUTANTS[name]()))
    ran, failure = fuzz.fuzz(seed, 1, APPS[app])
    assert failure is not None, f"block reference {name!r} survived seed {seed} ({app})"
    print(f"block reference {name} ({app}): caught at seed {seed}: {failure[1][:200]}\n"
          f"replay: {fuzz.replay_command(seed, '' if app == 'bank' else app)}")
    assert failure[0] == seed and caught in failure[1]
    monkeypatch.undo()
    monkeypatch.setattr(blocks, "referenced_report", _mutated(MUTANTS[name]()))  # a fresh one: the stale one remembers
    assert fuzz.fuzz(seed, 1, APPS[app]) == (1, failure)  # the seed replays: the same case fails the same way
    monkeypatch.undo()
    assert fuzz.fuzz(seed, 1, APPS[app]) == (1, None)  # and passes with the manifests as made


@pytest.mark.parametrize("app", APPS)
def test_reports_go_as_blocks_under_the_faults(app: str) -> None:
    seen: Counter[str] = Counter()
    for seed in range(60):
        seen += fuzz.run_case(seed, APPS[app]).faults
    for kind in ("report taken as blocks", "report refused: missing blocks, sent whole", "snapshot filed as blocks"):
        assert seen[kind] > 0, f"no case exercised {kind!r}: {dict(seen)}"


# --------------------------------------------------------------- the store's rules, one at a time


def _store(grain: int = 1) -> SimBlocks:
    store = SimBlocks(random.Random(0), Counter())
    store.grain = grain
    return store


def _report(sid: str, state: bytes, node: str = "n0") -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id=node, state=state)


def _filed(store: SimBlocks, sid: str, state: bytes, node: str = "n0") -> None:
    snapshot = pb.Snapshot(snapshot_id=sid, nodes=[pb.NodeBalance(node_id=node, state=state)])
    assert store.filed(snapshot, {node: state}) == {node: state}


def test_the_next_report_as_blocks_is_taken_before_the_first_snapshot_is_filed() -> None:
    store = _store()
    whole, _ = store.take(store.form("n0", _report("s1", b"abc")))  # nothing taken yet: whole
    store.accepted("n0", whole)
    sent = store.form("n0", _report("s2", b"abd"))
    assert sent.HasField("state_blocks") and list(sent.blocks) == [b"d"]
    taken, _ = store.take(sent)  # s1 is not filed: its blocks were written and pinned when taken (J1)
    assert taken is not None and taken.state == b"abd"
    store.accepted("n0", taken)
    sent = store.form("n0", _report("s3", b"xbd"))
    assert list(sent.blocks) == [b"x"] and store.take(sent)[0] is not None  # s2's carried block is held too


def test_a_report_naming_a_block_the_controller_lacks_is_refused_then_sent_whole() -> None:
    store = _store()
    whole, _ = store.take(store.form("n0", _report("s1", b"abc")))  # nothing taken yet: whole
    store.accepted("n0", whole)
    store.failed("s1")  # unfiled: its pins go, and its blocks with them
    assert store.disk == {}
    sent = store.form("n0", _report("s2", b"abd"))
    assert sent.HasField("state_blocks") and list(sent.blocks) == [b"d"]
    assert store.take(sent)[0] is None  # s1's blocks are nowhere (SB2)
    store.refused("n0")
    assert not store.form("n0", _report("s2", b"abd")).HasField("state_blocks")


def test_a_filed_snapshots_blocks_make_the_next_report_whole() -> None:
    store = _store()
    store.accepted("n0", store.take(store.form("n0", _report("s1", b"abc")))[0])
    _filed(store, "s1", b"abc")
    sent = store.form("n0", _report("s2", b"abd"))
    whole, _ = store.take(sent)
    assert whole is not None and whole.state == b"abd" and list(sent.blocks) == [b"d"]


def test_a_filed_state_not_the_one_recorded_is_named() -> None:
    store = _store()
    snapshot = pb.Snapshot(snapshot_id="s1", nodes=[pb.NodeBalance(node_id="n0", state=b"ab")])
    with pytest.raises(Violation, match=r"SB1: snapshot s1: n0's state rebuilt .* \(2 bytes\) is not the state"):
        store.filed(snapshot, {"n0": b"ba"})


def test_a_retired_snapshots_blocks_go_once_no_other_holds_them() -> None:
    store = _store()
    _filed(store, "s1", b"ab")
    _filed(store, "s2", b"ab")
    store.retired("s1")
    assert set(store.disk.values()) == {b"ab"}  # s2's too (SB3)
    store.retired("s2")
    assert store.disk == {}


def test_a_journaled_report_whose_blocks_are_gone_is_dropped_at_a_restart() -> None:
    store = _store()
    store.accepted("n0", store.take(store.form("n0", _report("s1", b"ab")))[0])
    _filed(store, "s1", b"ab")
    sent = store.form("n0", _report("s2", b"ab"))
    assert sent.HasField("state_blocks") and not sent.blocks  # every block held: none carried
    whole, _ = store.take(sent)
    record = journal.Reported(state=whole, wall=1.0, sent=sent)  # type: ignore[arg-type]
    store.retired("s1")  # pinned by s2's journaled report: kept (J2)
    assert [r.state.state for r in store.replayed([record])] == [b"ab"]  # type: ignore[attr-defined]
    store.disk.clear()  # the disk lost them: the snapshot is dropped whole, never taken short (J3)
    assert store.replayed([record]) == []
    assert store.faults["journaled report dropped: its blocks are gone"] == 1
    store.failed("s2")  # its FAILED record is durable: read back from its file, as it is
    assert store.replayed([record]) == [record]


def test_a_restart_with_a_report_journaled_whole_takes_the_nodes_next_report_as_blocks() -> None:
    """JB3: the blocks of a report that came whole are pinned again at a restart, so the
    node's next report, naming them, is taken as blocks, not refused once and sent whole."""
    store = _store()
    whole, _ = store.take(store.form("n0", _report("s1", b"abc")))  # nothing taken yet: whole
    store.accepted("n0", whole)
    record = journal.Reported(state=whole, wall=1.0)  # type: ignore[arg-type]
    store.crashed()
    assert [r.state.state for r in store.replayed([record])] == [b"abc"]  # type: ignore[attr-defined]
    assert set(store.disk.values()) == {b"a", b"b", b"c"}  # pinned, so not swept
    sent = store.form("n0", _report("s2", b"abd"))
    assert sent.HasField("state_blocks") and list(sent.blocks) == [b"d"]
    taken, _ = store.take(sent)
    assert taken is not None and taken.state == b"abd"
    assert store.faults["report refused: missing blocks, sent whole"] == 0


def _drop_frees_every_block(self: BlockRefs, snapshot_id: str) -> set[bytes]:
    """The broken count (G2): a snapshot dropped frees every block it referenced, however many others do."""
    held = self._held.names(snapshot_id)
    self._held.release([snapshot_id])
    return set(held)


@pytest.mark.parametrize(("app", "seed"), [("bank", 75), ("kvshard", 709)])
def test_the_fuzzer_catches_retention_deleting_a_block_still_referenced(
    app: str, seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(BlockRefs, "drop", _drop_frees_every_block)
    ran, failure = fuzz.fuzz(seed, 1, APPS[app])
    assert failure is not None, f"retention deleting referenced blocks survived seed {seed} ({app})"
    print(f"retention deleting referenced blocks ({app}): caught at seed {seed}: {failure[1][:200]}")
    assert failure[0] == seed and failure[1].startswith("SB3: a kept snapshot lost a block to retention")
    monkeypatch.undo()
    assert fuzz.fuzz(seed, 1, APPS[app]) == (1, None)


def test_a_kept_snapshot_missing_a_block_is_named() -> None:
    store = _store()
    _filed(store, "s1", b"ab")
    store.disk.clear()
    with pytest.raises(Violation, match=r"SB3: a kept snapshot lost a block to retention: snapshot s1, node n0"):
        store.check_kept()


# --------------------------------------------------------------- the pins' release (SB4)

_UNPIN = BlockPins.unpin


def _unpin_nothing(self: BlockPins, snapshot_id: str, call: int | None = None) -> set[bytes]:
    """A stale pin: the release lets nothing go, so a dead report's blocks stay forever."""
    return set()


def _unpin_too_much(self: BlockPins, snapshot_id: str, call: int | None = None) -> set[bytes]:
    """A lost pin: one call's release lets every call of the snapshot go."""
    return _UNPIN(self, snapshot_id, None)


def _unpin_twice(self: BlockPins, snapshot_id: str, call: int | None = None) -> set[bytes]:
    """A duplicated release: the blocks the call pinned are let go by another call that still pins them too."""
    going = {c for c in self._calls.get(snapshot_id, set()) if call is None or c == call}
    names = frozenset().union(*(self._held.names((snapshot_id, c)) for c in going))
    freed = _UNPIN(self, snapshot_id, call)
    for holder in list(self._held._sets):
        if shared := self._held.names(holder) & names:
            freed |= self._held.hold(holder, self._held.names(holder) - shared)
            break
    return freed


UNPINS = {"nothing": _unpin_nothing, "too-much": _unpin_too_much, "twice": _unpin_twice}
# (app, mutation, the seed that catches it, what the failure says). Without SB4's audit none of
# these is caught in the first 200 seeds of either app.
STALE, LOST = "is pinned, but no live report names it (a stale pin)", "is named by a live report, but not pinned (a pin lost)"
UNPIN_CAUGHT = [
    ("bank", "nothing", 0, STALE),
    ("kvshard", "nothing", 1, STALE),
    ("bank", "too-much", 96, LOST),
    ("kvshard", "too-much", 122, LOST),
    ("bank", "twice", 11, LOST),
    ("kvshard", "twice", 7, LOST),
]


@pytest.mark.parametrize(("app", "name", "seed", "caught"), UNPIN_CAUGHT, ids=[f"{a}-{n}" for a, n, _, _ in UNPIN_CAUGHT])
def test_the_fuzzer_catches_each_broken_unpin(
    app: str, name: str, seed: int, caught: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(BlockPins, "unpin", UNPINS[name])
    ran, failure = fuzz.fuzz(seed, 1, APPS[app])
    assert failure is not None, f"unpin {name!r} survived seed {seed} ({app})"
    print(f"unpin {name} ({app}): caught at seed {seed}: {failure[1][:200]}\n"
          f"replay: {fuzz.replay_command(seed, '' if app == 'bank' else app)}")
    assert failure[0] == seed and failure[1].startswith("SB4: block sha256:") and caught in failure[1]
    assert fuzz.fuzz(seed, 1, APPS[app]) == (1, failure)  # the seed replays: the same case fails the same way
    monkeypatch.undo()
    assert fuzz.fuzz(seed, 1, APPS[app]) == (1, None)  # and passes with the release as written


@pytest.mark.parametrize("app", APPS)
def test_fresh_seeds_keep_the_pins_exact(app: str) -> None:
    """SB4 holds on seeds no mutation test pins (a false alarm would fail here, naming its seed)."""
    ran, failure = fuzz.fuzz(1000, 40, APPS[app])
    replay = "" if failure is None else fuzz.replay_command(failure[0], "" if app == "bank" else app)
    assert failure is None, f"seed {failure[0]} ({app}): {failure[1][:300]}\nreplay: {replay}"


def test_the_audit_names_a_stale_pin_a_lost_pin_and_a_block_nothing_needs() -> None:
    store = _store()
    store.take(store.form("n0", _report("s1", b"ab")))
    store.check_held()  # as taken: exact
    store.pins.pin("s9", {b"z" * 32}, 7)  # a name no report gave, pinned behind the audit's back
    with pytest.raises(Violation, match=r"SB4: 3 block\(s\) pinned, but live reports name 2"):
        store.check_held()
    store.pins.unpin("s9")
    store.audit.unpinned("s1")  # the report is dead; its pins stay
    with pytest.raises(Violation, match=r"SB4: block sha256:\w+ is pinned, but no live report names it"):
        store.check_held()
    store.audit.pinned("s1", {b"z" * 32}, 3)  # a live report names a block nothing pins
    with pytest.raises(Violation, match=r"SB4: block sha256:(7a)+ is named by a live report, but not pinned"):
        store.check_held()
    store = _store()
    store.take(store.form("n0", _report("s1", b"ab")))
    store.disk[b"q" * 32] = b"q"
    with pytest.raises(Violation, match=r"SB4: block sha256:(71)+ is on the controller's disk, but nothing needs it"):
        store.check_held()
    del store.disk[b"q" * 32]
    store.disk.pop(next(iter(store.disk)))
    with pytest.raises(Violation, match=r"SB4: block sha256:\w+ is needed, but not on the controller's disk"):
        store.check_held()


# --------------------------------------------------------------- restores as blocks (SB5)

_REFERENCED, _WHOLE = restoreblocks.referenced_restore, restoreblocks.whole_restore


def _restore_lost(request, held, parts=()):
    """RB2 broken: the last block the node lacks is not sent."""
    sent, names = _REFERENCED(request, held, parts)
    if sent is not None and len(sent.blocks):
        del sent.blocks[-1]
    return sent, names


def _restore_duplicated(request, held, parts=()):
    """RB2 broken: the manifest names its first block twice."""
    sent, names = _REFERENCED(request, held, parts)
    if sent is not None:
        hashes = list(sent.state_blocks.hashes)
        sent.state_blocks.ClearField("hashes")
        sent.state_blocks.hashes.extend(hashes[:1] + hashes)
    return sent, names


def _restore_short(request, held):
    """RB3 broken: a block neither sent nor held is taken as empty, and the digest is not checked."""
    unchecked = pb.RestoreStateRequest()
    unchecked.CopyFrom(request)
    unchecked.ClearField("state_digest")
    return _WHOLE(unchecked, lambda name: block if (block := held(name)) is not None else b"")


RESTORES = {"lost": ("referenced_restore", _restore_lost), "duplicated": ("referenced_restore", _restore_duplicated),
            "short": ("whole_restore", _restore_short)}
# (app, mutation, the seed that catches it, what the failure says). The lost one needs a part that
# carries a block: the kvshard's first 400 seeds send none that a node lacks, so it is the bank's only.
RESTORE_CAUGHT = [
    ("bank", "lost", 142, "was neither sent nor taken to be held there"),
    ("bank", "duplicated", 2, "the node refused a state it was sent or holds every block of"),
    ("kvshard", "duplicated", 5, "the node refused a state it was sent or holds every block of"),
    ("bank", "short", 9, "is not the plan's (2 bytes)"),
    ("kvshard", "short", 9, "is not the plan's (67 bytes)"),
]


@pytest.mark.parametrize(("app", "name", "seed", "caught"), RESTORE_CAUGHT, ids=[f"{a}-{n}" for a, n, _, _ in RESTORE_CAUGHT])
def test_the_fuzzer_catches_each_bad_restore_as_blocks(
    app: str, name: str, seed: int, caught: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    attribute, broken = RESTORES[name]
    monkeypatch.setattr(restoreblocks, attribute, broken)
    ran, failure = fuzz.fuzz(seed, 1, APPS[app])
    assert failure is not None, f"restore {name!r} survived seed {seed} ({app})"
    print(f"restore as blocks {name} ({app}): caught at seed {seed}: {failure[1][:200]}\n"
          f"replay: {fuzz.replay_command(seed, '' if app == 'bank' else app)}")
    assert failure[0] == seed and failure[1].startswith("SB5: the restore of ") and caught in failure[1]
    assert fuzz.fuzz(seed, 1, APPS[app]) == (1, failure)  # the seed replays: the same case fails the same way
    monkeypatch.undo()
    assert fuzz.fuzz(seed, 1, APPS[app]) == (1, None)  # and passes with the restore as made


@pytest.mark.parametrize("app", APPS)
def test_restores_go_as_blocks_under_the_faults(app: str) -> None:
    seen: Counter[str] = Counter()
    for seed in range(60):
        seen += fuzz.run_case(seed, APPS[app]).faults
    for kind in ("restore part sent as blocks", "restore part refused as blocks (missing), sent whole"):
        assert seen[kind] > 0, f"no case exercised {kind!r}: {dict(seen)}"


def test_a_crash_loses_the_unsynced_blocks_a_durable_record_carries_and_the_replay_writes_them_back() -> None:
    """SB5 (blockdir.py D8, JB3): a report's carried blocks are written unsynced, its record durable;
    a crash before its snapshot is filed loses them, and the replay writes them back from the
    record before it rebuilds it (or the next report naming them as held)."""
    store = _store()
    store.accepted("n0", store.take(store.form("n0", _report("s1", b"abc")))[0])
    _filed(store, "s1", b"abc")
    sent = store.form("n0", _report("s2", b"abd"))
    whole, _ = store.take(sent)
    assert list(sent.blocks) == [b"d"] and store.unsynced == {blocks.block_hash(b"d")}
    record = journal.Reported(state=whole, wall=1.0, sent=sent)  # type: ignore[arg-type]
    store.crashed([record])
    assert blocks.block_hash(b"d") not in store.disk
    assert [r.state.state for r in store.replayed([record])] == [b"abd"]  # type: ignore[attr-defined]
    assert store.disk[blocks.block_hash(b"d")] == b"d"
    assert store.faults["block written back from the journal at a restart"] == 1
    store.accepted("n0", whole)
    assert store.take(store.form("n0", _report("s3", b"abd")))[0] is not None  # named as held: taken

