"""`bench state` (bench/state.py): its kvshard subject (bench/kv_app.py), the batches its
changes go in, and one tiny run of the kvshard mesh that measures every figure."""

import json
import math
import random

import pytest

from bench import hop_split, kv_app, state, state_mesh
from snapmesh.app import NodeInfo
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.services.node.edge import MAX_BATCH_BYTES, MAX_BATCH_COMMANDS


def machine(mib: float, node_id: str = "p1") -> kv_app.FilledKV:
    return kv_app.app.new(NodeInfo(node_id=node_id, peers_out=("p2",), peers_in=("p2",), params={"mib": mib}))


def test_the_filled_kvshard_holds_about_its_size_in_keys_it_created() -> None:
    for mib in (0.25, 1, 3):
        node = machine(mib)
        size = len(node.snapshot())
        assert abs(size - mib * kv_app.MIB) < 2 * (kv_app.VALUE_BYTES + 64), (mib, size)
        assert len(node.keys) == kv_app.key_count("p1", {"mib": mib}) == len(node.created)
        assert b"".join(node.snapshot_blocks()) == node.snapshot()
        name = kv_app.key("p1", 7)
        assert node.keys[name] == {"value": kv_app.value(name), "created_at": "p1"}


def test_a_restore_replaces_the_fill_and_the_keys_are_made_once() -> None:
    node = machine(1)
    assert node._due is not None  # nothing made until first used
    other = machine(1, "p2")
    other.restore(machine(0.25).snapshot())
    assert other._due is None and sorted(other.keys) == sorted(machine(0.25).keys)
    assert node.keys is node.keys


def test_an_update_keeps_the_state_s_length_and_changes_one_part_in_at_most_two_blocks() -> None:
    node = machine(1)
    before = node.snapshot_blocks()
    name = kv_app.key("p1", 500)
    reply = node.on_command(kv_app.put(name, random.Random(0).randbytes(kv_app.VALUE_BYTES // 2).hex()), None)
    assert json.loads(reply) == {"key": name, "updated_at": "p1"}
    after = node.snapshot_blocks()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and len(changed[0][0]) == len(changed[0][1])
    a, b = changed[0]
    blocks = [i for i in range(0, len(a), BLOCK_BYTES) if a[i:i + BLOCK_BYTES] != b[i:i + BLOCK_BYTES]]
    assert 1 <= len(blocks) <= 2


def test_changes_go_in_batches_within_the_node_s_bounds_in_order() -> None:
    big = [bytes([i % 256]) * (MAX_BATCH_BYTES // 3) for i in range(7)]
    cut = list(state_mesh.batches(big))
    assert [len(b.items) for b in cut] == [3, 3, 1]
    assert [item.command for b in cut for item in b.items] == big
    small = [b"x"] * (MAX_BATCH_COMMANDS + 1)
    assert [len(b.items) for b in state_mesh.batches(small)] == [MAX_BATCH_COMMANDS, 1]
    assert list(state_mesh.batches([])) == []


def test_the_changes_are_a_thousandth_of_the_state() -> None:
    rng = random.Random(0)
    assert len(state.blob_changes("p1", 64, rng)) == 66  # 64 MiB / 1000 in runs of 1 KiB
    assert len(state.blob_changes("p1", 0.25, rng)) == 1
    count = kv_app.key_count("p1", {"mib": 64})
    updates = state.kv_changes("p1", 64, rng)
    assert len(updates) == round(count / 1000) and len({json.loads(u)["key"] for u in updates}) == len(updates)


def test_another_change_rate_changes_that_share_and_names_its_figures() -> None:
    rng = random.Random(0)
    assert len(state.blob_changes("p1", 64, rng, 0.01)) == 655  # ten times the goal's share
    count = kv_app.key_count("p1", {"mib": 64})
    assert len(state.kv_changes("p1", 64, rng, 0.1)) == round(count / 10)
    assert [state.rate_label(c) for c in (state.CHANGED, 0.01, 0.005, 0.1)] == ["", "_1pct", "_0p5pct", "_10pct"]


@pytest.mark.parametrize("changed", ["0", "0.9", "x", ","])
def test_a_share_changed_out_of_range_is_refused_by_name(changed: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        state.main(["--changed", changed, "--no-write"])
    assert exit_.value.code == 2
    assert "--changed" in capsys.readouterr().err


def test_a_tiny_kvshard_run_measures_every_figure() -> None:
    out = state.measure(state.SUBJECTS["kvshard"], 0.25, rounds=3)
    names = ["sent_fraction", "stored_fraction", "export_fraction", "first_snapshot_s", "snapshot_s", "restore_s",
             "snapshot_max_s", "sent_bytes", "stored_bytes", "restore_received_bytes", "controller_peak_rss_mib",
             "controller_rss_bound_mib", "snapshot_controller_cpu_s", "snapshot_nodes_cpu_s",
             "snapshot_controller_sys_cpu_s", "snapshot_nodes_sys_cpu_s",
             "nodes_peak_rss_mib", *(f"hop_mean_ms_{hop}" for hop in hop_split.HOPS)]
    assert sorted(out) == sorted(f"state_kv_{n}_0_25mib" for n in names)
    cpu = {name for name in out if "_cpu_s_" in name}  # clock ticks of 10 ms: a small snapshot may take none
    assert all(math.isfinite(v) and (v >= 0 if name in cpu else v > 0) for name, v in out.items()), out
    # the median round's time, at most the slowest's; every hop of the path observed in the rounds
    assert out["state_kv_snapshot_s_0_25mib"] <= out["state_kv_snapshot_max_s_0_25mib"]
    assert out["state_kv_controller_rss_bound_mib_0_25mib"] == 512.25
    assert out["state_kv_sent_fraction_0_25mib"] < 0.2  # one key changed per node, out of ~240
