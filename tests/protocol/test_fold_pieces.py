"""A second snapshot's check costs what changed (View.fold, lazystates L5, foldmemo.py
FM1-FM5, kvshard's every key exactly once): the tracker judges kvshard's listed states
by pieces, and at the next snapshot reads only the blocks of the pieces that changed,
while a change that breaks the invariant is still found and named."""

from __future__ import annotations

import pytest

from snapmesh.app import BLOCK_BYTES, Context, NodeInfo, View
from snapmesh.protocol import blocks
from snapmesh.protocol.appstate import AppChecker, digest
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller.foldmemo import FoldMemo
from snapmesh.protocol.controller.tracker import Now, Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.services.app import kvshard
from snapmesh.v1 import snapmesh_pb2 as pb

NODES = ("a", "b")
AT = Now(1.0, 1000.0)


def machines(keys: int = 400) -> dict[str, kvshard.KVShard]:
    made = {}
    for node in NODES:
        other = tuple(n for n in NODES if n != node)
        made[node] = kvshard.KVShard(NodeInfo(node_id=node, peers_out=other, peers_in=other, params={}))
        for i in range(keys):
            put(made[node], f"{node}/k{i:05d}", "v" * 1000)
    return made


def put(machine: kvshard.KVShard, key: str, value: str) -> None:
    machine.on_command(kvshard.encode({"op": "put", "key": key, "value": value}), Context(machine.me, machine.peers_out))


class Store:
    """The controller's blocks, counting the ones read."""

    def __init__(self) -> None:
        self.held: dict[bytes, bytes] = {}
        self.read: list[bytes] = []

    def get(self, name: bytes) -> bytes | None:
        self.read.append(name)
        return self.held.get(name)


def snapshot(tracker: Tracker, store: Store, sid: str, states: dict[str, list[bytes]]) -> pb.Snapshot:
    """A COMPLETE snapshot of the states (each as snapshot_blocks' parts), reported as block lists."""
    tracker.start(sid, "a", AT)
    done = None
    for node, parts in states.items():
        state = b"".join(parts)
        named = blocks.names(state, [len(p) for p in parts])[0]
        for name, (start, end) in zip(named.names, named.bounds, strict=True):
            store.held[name] = state[start:end]
        report = pb.FullState(snapshot_id=sid, node_id=node, state=state, app_name="kvshard", app_version=1,
                              channels=[pb.ChannelState(src=n, dst=node) for n in NODES if n != node])
        report = blockforms.listed_report(report, named.names)
        sizes = tuple(end - start for start, end in named.bounds)
        tracker.forms.note(report, blockforms.BlockList(tuple(named.names), sizes, digest(state)))
        done = tracker.report(report, AT).snapshot
    assert done is not None and all(node.HasField("state_blocks") for node in done.nodes)
    return done


def new_tracker(store: Store) -> Tracker:
    tracker = Tracker(topology=Topology(nodes=NODES, channels=(("a", "b"), ("b", "a"))), deadline_s=5.0,
                      checker=AppChecker("kvshard", kvshard.app))
    tracker.forms.reader = lambda: store.get
    return tracker


def verdict(snapshot: pb.Snapshot) -> list[str]:
    return [p for result in snapshot.app.invariants for p in result.problems]


def test_a_second_snapshot_reads_only_the_changed_piece():
    nodes, store = machines(), Store()
    tracker = new_tracker(store)
    first = snapshot(tracker, store, "s1", {n: m.snapshot_blocks() for n, m in nodes.items()})
    assert first.app.invariants[0].ok
    every = sum(len(node.state_blocks.hashes) for node in first.nodes)
    before = {blocks.block_hash(b) for part in nodes["a"].snapshot_blocks() for b in blocks.split(part)}
    put(nodes["a"], "a/k00123", "w" * 1000)
    parts = nodes["a"].snapshot_blocks()
    changed = [part for part in parts[1:] if '"a/k00123"' in part.decode()]  # parts[0]: the names
    assert len(changed) == 1 and len(changed[0]) > 4 * BLOCK_BYTES
    new = {blocks.block_hash(b) for b in blocks.split(changed[0])} - before
    assert 1 <= len(new) <= 2
    store.read.clear()
    second = snapshot(tracker, store, "s2", {n: m.snapshot_blocks() for n, m in nodes.items()})
    assert second.app.invariants[0].ok
    # the changed part's changed blocks only (foldmemo FM6: the others' shares are kept, by block),
    # not the part's other blocks nor any other of the 2 states' blocks
    assert set(store.read) == new, (len(store.read), every)
    assert every > 50 * len(store.read)  # a check of the states whole reads every one


def test_a_changed_piece_that_breaks_the_invariant_is_found_and_named():
    nodes, store = machines(), Store()
    tracker = new_tracker(store)
    assert snapshot(tracker, store, "s1", {n: m.snapshot_blocks() for n, m in nodes.items()}).app.invariants[0].ok
    doctored = nodes["b"].snapshot_blocks()
    doctored[3] = doctored[3].replace(b'"b/k', b'"b/x', 1)  # a key renamed: lost, and one never created
    states = {"a": nodes["a"].snapshot_blocks(), "b": doctored}
    lost = "b/k" + doctored[3].split(b'"b/x', 1)[1].split(b'"', 1)[0].decode()
    problems = verdict(snapshot(tracker, store, "s2", states))
    assert f"key {lost} seen 0 times (lost)" in problems
    assert any(p.startswith("key b/x") and "not a live key" in p for p in problems)


def test_the_memo_counts_and_reads_a_piece_of_changed_blocks_only():
    parts = [b"h" * 100, b"x" * (3 * BLOCK_BYTES + 5), b"y" * (2 * BLOCK_BYTES), b"z" * 7]
    state = b"".join(parts)
    named = blocks.names(state, [len(p) for p in parts])[0]
    held = {name: state[start:end] for name, (start, end) in zip(named.names, named.bounds, strict=True)}
    memo, seen = FoldMemo(), []
    fold = lambda piece: seen.append(piece) or len(piece)  # noqa: E731
    assert memo.fold(named.names, held.__getitem__, "k", fold) == [100, 3 * BLOCK_BYTES + 5, 2 * BLOCK_BYTES + 7]
    assert seen == [parts[0], parts[1], parts[2] + parts[3]]  # a part of whole blocks joins the next (FM1)
    seen.clear()
    memo.blocks_read = 0
    parts[1] = b"x" * BLOCK_BYTES + b"X" + b"x" * (2 * BLOCK_BYTES + 4)
    state = b"".join(parts)
    named = blocks.names(state, [len(p) for p in parts])[0]
    held.update({name: state[start:end] for name, (start, end) in zip(named.names, named.bounds, strict=True)})
    assert memo.fold(named.names, held.__getitem__, "k", fold) == [100, 3 * BLOCK_BYTES + 5, 2 * BLOCK_BYTES + 7]
    assert seen == [parts[1]]
    assert memo.blocks_read == 1 + 3  # the changed block, then its piece's (the first read twice: not held)
    assert memo.fold(named.names, held.__getitem__, "other", len) == [100, 3 * BLOCK_BYTES + 5, 2 * BLOCK_BYTES + 7]
    assert memo.pieces_folded == 3 + 1 + 3  # another key is another function: folded afresh


def test_bounded_results_are_folded_again():
    memo = FoldMemo(max_results=1, max_sizes=1)
    parts = [b"p" * 10, b"q" * 10]
    named = blocks.names(b"".join(parts), [10, 10])[0]
    held = dict(zip(named.names, parts, strict=True))
    for _ in range(2):
        assert memo.fold(named.names, held.__getitem__, "k", bytes.upper) == [b"P" * 10, b"Q" * 10]
    assert memo.pieces_folded == 4


@pytest.mark.parametrize("states", [{"a": b"{}"}, {}])
def test_elsewhere_a_state_is_one_piece(states):
    view = View(snapshot_id="s", states=states, in_flight=[])
    for node, state in states.items():
        assert view.fold(node, "k", len) == [len(state)]


def test_a_kvshard_state_read_by_runs_of_parts_has_the_names_read_whole():
    """kvscan S4: any run of whole parts, the head's, the ranges', the end's; a cut amid a part is refused."""
    from snapmesh.services.app import kvscan

    machine = machines(keys=300)["a"]
    put(machine, "a/k00007", 12)  # a value not a string: the general path
    machine.on_command(kvshard.encode({"op": "move", "key": "a/k00009", "to": "b"}), Context("a", ("b",)))
    parts = machine.snapshot_blocks()
    whole = list(kvscan.names(machine.snapshot()))
    for run in (1, 2, 3, len(parts)):
        got = [name for i in range(0, len(parts), run) for name in kvscan.piece_names(b"".join(parts[i:i + run]))]
        assert got == whole
    for cut in (parts[1][:-5], parts[0][:-3], parts[-1][7:], parts[-1] + b"}"):
        with pytest.raises(ValueError):
            list(kvscan.piece_names(cut))


def listed(parts: list[bytes]) -> tuple[list[bytes], dict[bytes, bytes]]:
    state = b"".join(parts)
    named = blocks.names(state, [len(p) for p in parts])[0]
    return list(named.names), {name: state[start:end] for name, (start, end) in zip(named.names, named.bounds,
                                                                                       strict=True)}


def varied_machine(seed: int) -> kvshard.KVShard:
    """A kvshard node whose entries take every path of kvscan: plain values, cut by the blocks' ends
    anywhere, and values the plain reading leaves to the general one (numbers, objects, escapes, longer
    than a block), with pointers at the end."""
    import random

    rng = random.Random(seed)
    machine = kvshard.KVShard(NodeInfo(node_id="a", peers_out=("b",), peers_in=("b",), params={}))
    for i in range(600):
        kind = rng.randrange(200)
        value = ("v" * rng.randrange(1, 1500) if kind < 160 else rng.randrange(-10**6, 10**6) if kind < 190
                 else {"created_at": "x", "value": '"q"\\'} if kind < 194 else "é\"" * 50 if kind < 198
                 else "w" * 9000)
        put(machine, f"a/k{i:05d}", value)
    for i in range(0, 600, 97):
        machine.on_command(kvshard.encode({"op": "move", "key": f"a/k{i:05d}", "to": "b"}), Context("a", ("b",)))
    return machine


@pytest.mark.parametrize("seed", range(3))
def test_a_kvshard_piece_folded_block_by_block_is_folded_as_whole(seed):
    """foldmemo FM6 with kvcheck's steps (kvscan S5): each piece's share is the one _piece gives it
    whole, at a first fold and after changes, which step only through the blocks that changed."""
    from snapmesh.services.app import kvcheck

    machine, stepped = varied_machine(seed), FoldMemo()
    for round_ in range(3):
        names, held = listed(machine.snapshot_blocks())
        whole = FoldMemo().fold(names, held.__getitem__, "k", kvcheck._piece)
        assert stepped.fold(names, held.__getitem__, "k", kvcheck._BY_PIECE) == whole
        for key in [k for k, entry in sorted(machine.keys.items()) if isinstance(entry["value"], str)][round_::40]:
            put(machine, key, "z" * len(machine.keys[key]["value"]))  # the same length: the blocks after it stay
        put(machine, f"a/k{300 + round_:05d}", round_)
    assert stepped.pieces_stepped > 0 and stepped.blocks_kept > 0
    assert stepped.pieces_folded > 0  # the head, and the pieces with a value longer than MAX_CARRY: whole


@pytest.mark.parametrize("doctor", [(b'},"a/k00', b'}"a/k00'), (b',"a/k00', b' , "a/k00'), (b'"v', b'"\xc3\xa9'),
                                    (b'"a/k00', b'"a/k\\u0030'), (b'},"a/k00', b'},,"a/k00')])
def test_a_doctored_piece_stepped_is_refused_or_read_as_whole(doctor):
    """A piece folded block by block (FM6) raises ValueError where the whole one does, and otherwise
    gives the same share, so the invariant's slow path is taken for the same pieces."""
    from snapmesh.services.app import kvcheck

    parts = varied_machine(0).snapshot_blocks()
    parts = [parts[0]] + [part.replace(*doctor) for part in parts[1:]]
    names, held = listed(parts)

    def folded(fn):
        try:
            return FoldMemo().fold(names, held.__getitem__, "k", fn)
        except ValueError:
            return "ValueError"

    assert folded(kvcheck._BY_PIECE) == folded(kvcheck._piece)


def test_a_changed_block_is_stepped_and_its_neighbours_kept():
    """FM6: a piece's shares kept by block; a change steps through the changed block, then the next
    only while the carry it leaves differs; bytes_folded counts them (the old fold: the whole piece)."""
    class Words:  # a piece's words, space separated: a word cut by a block's end is carried
        def __call__(self, piece):
            return piece.split()

        def step(self, carry, block, last):
            text = (carry or b"") + block
            cut = len(text) if last else text.rfind(b" ") + 1
            return text[:cut].split(), text[cut:]

        def join(self, parts):
            return [word for part in parts for word in part]

    words = [b"w%05d" % i for i in range(6 * BLOCK_BYTES // 7)]
    state = b" ".join(words)
    memo, fold = FoldMemo(), Words()
    names, held = listed([state])
    assert memo.fold(names, held.__getitem__, "k", fold) == [words]
    assert memo.blocks_stepped == len(names) == 6 and memo.pieces_folded == 0
    memo.bytes_folded = memo.blocks_stepped = 0
    words[3 * BLOCK_BYTES // 7 + 10] = b"W" * 6  # the same length: one block changes, its carry does not
    names, held = listed([b" ".join(words)])
    assert memo.fold(names, held.__getitem__, "k", fold) == [words]
    assert (memo.blocks_stepped, memo.bytes_folded, memo.blocks_kept) == (1, BLOCK_BYTES, 5)
    words[BLOCK_BYTES // 7] = b"X" * 6  # the word cut by the first block's end: the next block is stepped too
    names, held = listed([b" ".join(words)])
    assert memo.fold(names, held.__getitem__, "k", fold) == [words]
    assert memo.blocks_stepped == 1 + 2


@pytest.mark.parametrize("max_held", [0, 1 << 20])
def test_a_fold_in_bulk_or_block_by_block_reads_and_gives_the_same(max_held, monkeypatch):
    """FM7: a state of few unknown blocks is walked in bulk, any other block by block; the two
    read the same blocks, once each but a changed piece's others (not held), and give the same."""
    import hashlib

    from snapmesh.protocol.controller import foldmemo

    monkeypatch.setattr(foldmemo, "MAX_HELD", max_held)
    sizes = [100, 3 * BLOCK_BYTES + 5, 2 * BLOCK_BYTES, 7, BLOCK_BYTES]
    parts = [hashlib.shake_256(b"%d" % i).digest(size) for i, size in enumerate(sizes)]
    names, held = listed(parts)
    memo = FoldMemo()
    assert memo.fold(names, held.__getitem__, "k", len) == [100, 3 * BLOCK_BYTES + 5, 2 * BLOCK_BYTES + 7, BLOCK_BYTES]
    assert memo.blocks_read == len(names) == 9 and list(memo._sizes) == names
    parts[1] = b"X" + parts[1][1:]
    names, held = listed(parts)
    memo.blocks_read = 0
    assert memo.fold(names, held.__getitem__, "k", len) == [100, 3 * BLOCK_BYTES + 5, 2 * BLOCK_BYTES + 7, BLOCK_BYTES]
    assert memo.blocks_read == 1 + 3 and memo.pieces_kept == 3  # the changed block, then its piece's others
    assert set(names) <= set(memo._sizes)


def test_a_state_folded_against_its_base_gives_what_a_fresh_fold_gives():
    """FM8: states changed a little (blocks rewritten, parts grown and shrunk, so pieces move),
    folded one after the other with a memo that keeps bases, give each what a memo that never
    saw them gives; and an unchanged piece of a state like its base is neither read nor hashed."""
    import hashlib
    import random

    rng = random.Random(5)
    memo = FoldMemo()

    def fn(piece: bytes) -> str:
        return hashlib.sha256(piece).hexdigest()[:8]

    parts = [rng.randbytes(rng.choice([BLOCK_BYTES, 3 * BLOCK_BYTES, 2 * BLOCK_BYTES + 11, 500])) for _ in range(40)]
    for round_ in range(30):
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(parts))
            change = rng.random()
            if change < 0.5:  # a byte rewritten in place
                part = bytearray(parts[at])
                part[rng.randrange(len(part))] ^= 0xFF
                parts[at] = bytes(part)
            elif change < 0.75:  # grown or shrunk: its blocks, and maybe the pieces, move
                parts[at] = rng.randbytes(rng.choice([BLOCK_BYTES, 2 * BLOCK_BYTES, BLOCK_BYTES + 7, 90]))
            else:  # a part added or taken away: another length (no base of the same)
                parts.insert(at, rng.randbytes(300)) if rng.random() < 0.5 and len(parts) < 60 else parts.pop(at)
        state = b"".join(parts)
        named = blocks.names(state, [len(p) for p in parts])[0]
        held = {name: state[start:end] for name, (start, end) in zip(named.names, named.bounds, strict=True)}
        fresh = FoldMemo().fold(named.names, held.__getitem__, "k", fn)
        read_before, folded_before = memo.blocks_read, memo.pieces_folded
        assert memo.fold(named.names, held.__getitem__, "k", fn) == fresh, f"round {round_}"
        if round_:  # after the first: at most the pieces the changes touched, and their blocks
            assert memo.pieces_folded - folded_before <= 3 * 3
            assert memo.blocks_read - read_before <= 3 * 3 * 4
    same = list(named.names)
    memo._results.clear()  # the pieces' results by their names let go (FM4): the base still has them
    kept_before, folded_before = memo.pieces_kept, memo.pieces_folded
    assert memo.fold(same, held.__getitem__, "k", fn) == fresh
    assert memo.pieces_folded == folded_before and memo.pieces_kept - kept_before == len(fresh)


def test_a_breakage_in_a_changed_block_is_found_and_its_repair_clears_the_verdict():
    """Through the tracker (lazystates L6, foldmemo FM9: the pieces' shares joined in a tree kept
    across snapshots): a key renamed in one block of a range part, then put back, then a key of
    one node copied into the other's: each verdict is the one a check of the states whole gives."""
    nodes, store = machines(), Store()
    tracker = new_tracker(store)
    whole = lambda states: kvshard.every_key_exactly_once(  # noqa: E731
        View(snapshot_id="w", states={n: b"".join(p) for n, p in states.items()}, in_flight=[]))
    good = {n: m.snapshot_blocks() for n, m in nodes.items()}
    renamed = {**good, "b": [*good["b"][:3], good["b"][3].replace(b'"b/k', b'"b/x', 1), *good["b"][4:]]}
    entry = good["a"][2][good["a"][2].index(b'"a/k'):]
    doubled = {**good, "b": [*good["b"][:2], good["b"][2] + b"," + entry[:entry.index(b"}") + 1], *good["b"][3:]]}
    for sid, states in (("s1", good), ("s2", renamed), ("s3", good), ("s4", doubled), ("s5", good)):
        problems = verdict(snapshot(tracker, store, sid, states))
        assert problems == whole(states), sid
        assert bool(problems) == (states is not good), sid
    # each state after the first re-joined its changed pieces' paths only (FM9), their blocks' shares kept
    assert tracker.forms.folds.pieces_rejoined > 0 and tracker.forms.folds.blocks_kept > 0
