"""A state's pieces' results joined incrementally (View.fold_joined, foldmemo.py FM9,
jointree.py JT1-JT3) give what a fresh fold joined gives, over random change sequences,
re-joining only the changed pieces' paths; kvshard's every key exactly once, checked so,
gives the same verdict as the check over the states whole, a violation that appears in a
changed block, or leaves it, included."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Mapping

from snapmesh.app import BLOCK_BYTES, Context, NodeInfo, View
from snapmesh.protocol import blocks
from snapmesh.protocol.controller.foldmemo import FoldMemo
from snapmesh.protocol.controller.jointree import JoinTree
from snapmesh.services.app import kvcheck, kvshard


class Hashes:
    """A piece's result: its hash, as a tuple; joined by concatenation (associative, not commutative:
    a join out of order is seen). Counts its joins."""

    def __init__(self) -> None:
        self.joins = 0

    def __call__(self, piece: bytes) -> tuple[str, ...]:
        return (hashlib.sha256(piece).hexdigest()[:12],)

    def join(self, parts: list[tuple[str, ...]]) -> tuple[str, ...]:
        self.joins += 1
        return tuple(h for part in parts for h in part)


def listed(parts: list[bytes]) -> tuple[list[bytes], dict[bytes, bytes]]:
    state = b"".join(parts)
    named = blocks.names(state, [len(p) for p in parts])[0]
    return list(named.names), {name: state[start:end] for name, (start, end) in zip(named.names, named.bounds,
                                                                                       strict=True)}


def test_a_tree_root_is_the_join_of_all_its_results_and_a_set_rejoins_a_path():
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    for n in (0, 1, 2, 3, 7, 64, 1000):
        fn = Hashes()
        results = [(f"r{i}",) for i in range(n)]
        tree = JoinTree(results, fn.join)
        assert tree.root() == fn.join(results), (seed, n)
        for _ in range(5 if n else 0):
            fn.joins = 0
            changed = rng.sample(range(n), min(n, rng.randrange(1, 4)))
            for i in changed:
                results[i] = (f"x{rng.random()}",)
                tree.set(i, results[i])
            assert tree.root() == tuple(r for result in results for r in result), (seed, n, changed)
            assert fn.joins <= len(changed) * (math.ceil(math.log2(n)) + 1), (seed, n, fn.joins)


def changes(rng: random.Random, parts: list[bytes]) -> Iterator[tuple[str, list[bytes]]]:
    """A change of a state's parts at each step: a block's bytes rewritten in place (the same pieces),
    or a part grown, shrunk, added or dropped (pieces move)."""
    while True:
        parts = list(parts)
        roll, at = rng.random(), rng.randrange(len(parts))
        if roll < 0.6:
            for _ in range(rng.randrange(1, 4)):
                at = rng.randrange(len(parts))
                offset = rng.randrange(len(parts[at]))
                parts[at] = parts[at][:offset] + rng.randbytes(1) + parts[at][offset + 1:]
            kind = "rewritten"
        elif roll < 0.75:
            parts[at] += rng.randbytes(rng.choice([1, BLOCK_BYTES - len(parts[at]) % BLOCK_BYTES, 3000]))
            kind = "grown"
        elif roll < 0.85 and len(parts[at]) > 1:
            parts[at] = parts[at][:rng.randrange(1, len(parts[at]))]
            kind = "shrunk"
        elif roll < 0.95 or len(parts) == 1:
            parts.insert(at, rng.randbytes(rng.choice([5, BLOCK_BYTES, 2 * BLOCK_BYTES + 9])))
            kind = "added"
        else:
            del parts[at]
            kind = "dropped"
        yield kind, parts


def test_a_fold_joined_over_random_changes_is_the_fresh_fold_joined():
    """FM9: each state of a random sequence, folded joined by one memo, is what a memo that never saw
    the states before gives; a state of blocks rewritten in place re-joins about its pieces' paths."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    sizes = [rng.choice([100, BLOCK_BYTES, 3 * BLOCK_BYTES + 5, 9000, 40]) for _ in range(120)]
    parts = [rng.randbytes(size) for size in sizes]
    memo, fn = FoldMemo(), Hashes()
    names, held = listed(parts)
    assert memo.fold_joined(names, held.__getitem__, "k", fn) == fn.join(FoldMemo().fold(names, held.__getitem__,
                                                                                         "k", fn))
    rejoined = 0
    for step, (kind, changed) in zip(range(60), changes(rng, parts), strict=False):
        names, held = listed(changed)
        fresh = fn.join(FoldMemo().fold(names, held.__getitem__, "k", fn))
        fn.joins, memo.pieces_folded = 0, 0
        assert memo.fold_joined(names, held.__getitem__, "k", fn) == fresh, (seed, step, kind)
        if kind == "rewritten" and memo.pieces_folded <= 3:
            rejoined += 1  # a few pieces folded again: their paths re-joined, not the whole tree
            assert fn.joins <= memo.pieces_folded * (math.ceil(math.log2(len(changed))) + 1), (seed, step)
    assert rejoined > 10, seed


class Listed(Mapping[str, bytes]):
    """A snapshot's states held as block lists, folded through one memo kept across snapshots, as the
    controller's (lazystates.NodeStates over blockforms.BlockForms)."""

    def __init__(self, memo: FoldMemo, states: dict[str, list[bytes]]) -> None:
        self.memo, self.listed = memo, {node: listed(parts) for node, parts in states.items()}

    def __getitem__(self, node: str) -> bytes:
        names, held = self.listed[node]
        return b"".join(held[name] for name in names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.listed)

    def __len__(self) -> int:
        return len(self.listed)

    def fold(self, node: str, key: str, fn):
        names, held = self.listed[node]
        return self.memo.fold(names, held.__getitem__, key, fn)

    def fold_joined(self, node: str, key: str, fn):
        names, held = self.listed[node]
        return self.memo.fold_joined(names, held.__getitem__, key, fn)


NODES = ("a", "b", "c")


def cluster(keys: int) -> dict[str, kvshard.KVShard]:
    made = {}
    for node in NODES:
        others = tuple(n for n in NODES if n != node)
        made[node] = kvshard.KVShard(NodeInfo(node_id=node, peers_out=others, peers_in=others, params={}))
        for i in range(keys):
            command(made[node], {"op": "put", "key": f"{node}/k{i:05d}", "value": "v" * 300})
    return made


def command(machine: kvshard.KVShard, request: dict) -> list[tuple[str, bytes]]:
    ctx = Context(machine.me, machine.peers_out)
    machine.on_command(kvshard.encode(request), ctx)
    return ctx.sends


def doctored(rng: random.Random, nodes: dict[str, kvshard.KVShard]) -> tuple[str, dict[str, list[bytes]]]:
    """The nodes' states, one of them maybe broken in one of its key ranges (a changed block's)."""
    states = {node: machine.snapshot_blocks() for node, machine in nodes.items()}
    roll = rng.random()
    node = rng.choice(NODES)
    last = len(states[node]) - 1  # its pointers too: a renamed pointer breaks nothing
    ranges = [i for i, part in enumerate(states[node]) if 0 < i < last and f'"{node}/k'.encode() in part]
    if roll < 0.5 or not ranges:
        return "whole", states
    at = rng.choice(ranges)
    part = states[node][at]
    if roll < 0.75:  # a key renamed: one lost, one never created
        states[node][at] = part.replace(f'"{node}/k'.encode(), f'"{node}/x'.encode(), 1)
        return "renamed", states
    other = rng.choice([n for n in NODES if n != node])  # a key at two nodes: its entry copied to another's range
    entry = part[part.index(f'"{node}/k'.encode()):]
    entry = entry[:entry.index(b"}") + 1]
    target = next((i for i, p in enumerate(states[other]) if i and p.endswith(b"}")), None)
    if target is None or target == len(states[other]) - 1:
        return "whole", states
    states[other][target] += b"," + entry  # a key that sorts out of place, at a range's end
    return "doubled", states


def test_kvshard_verdicts_checked_incrementally_are_the_whole_checks_over_random_changes():
    """Over random changes (updates, creates, moves, deletes) and random breakages that appear in a
    changed block and leave at the next snapshot, the check by View.fold_joined through one memo
    gives, at every snapshot, the verdict of the check over the states whole, word for word."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    nodes, memo = cluster(120), FoldMemo()
    in_flight: list[tuple[str, str, int, bytes]] = []
    broken = 0
    for step in range(40):
        for _ in range(rng.randrange(1, 6)):
            node = rng.choice(NODES)
            machine = nodes[node]
            if not machine.keys:
                continue
            key = rng.choice(sorted(machine.keys))
            roll = rng.random()
            if roll < 0.6:
                value = "w" * len(machine.keys[key]["value"]) if roll < 0.45 else "u" * rng.randrange(1, 900)
                command(machine, {"op": "put", "key": key, "value": value})
            elif roll < 0.75:
                command(machine, {"op": "put", "key": f"{node}/n{step:03d}{rng.randrange(1000):03d}", "value": "n"})
            elif roll < 0.9:
                to = rng.choice(machine.peers_out)
                for dst, payload in command(machine, {"op": "move", "key": key, "to": to}):
                    if rng.random() < 0.5:
                        nodes[dst].on_message(node, payload, Context(dst, nodes[dst].peers_out))
                    else:  # in flight at the cut: taken by the next step's machines, then
                        in_flight.append((node, dst, step, payload))
            else:
                command(machine, {"op": "delete", "key": key})
        kind, states = doctored(rng, nodes)
        incremental = kvcheck.every_key_exactly_once(View(snapshot_id=f"s{step}", states=Listed(memo, states),
                                                          in_flight=list(in_flight)))
        whole = kvcheck.every_key_exactly_once(View(snapshot_id=f"s{step}", states={n: b"".join(p) for n, p in states.items()},
                                                    in_flight=list(in_flight)))
        assert incremental == whole, (seed, step, kind)
        assert bool(whole) == (kind != "whole"), (seed, step, kind, whole[:3])
        broken += kind != "whole"
        for src, dst, _, payload in in_flight:
            nodes[dst].on_message(src, payload, Context(dst, nodes[dst].peers_out))
        in_flight = []
    assert broken > 5, seed
    assert memo.pieces_kept > 0 or memo.blocks_kept > 0, seed  # the unchanged pieces were not folded again
