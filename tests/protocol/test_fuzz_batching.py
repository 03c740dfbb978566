"""The fault fuzzer with the gRPC node's frame handling of issue 35 (sim/network.py,
`batching`): data frames merged on the wire as the sender's smart batching merges
them (services/node/channels.py), and every frame's early markers applied first
(receive-side marker priority, services/node/servicer.py). Every invariant must
hold in each snapshot mode, and the reordering must actually happen.

Knob: SNAPMESH_FUZZ_CASES (a tenth of it per mode, at least 30).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from snapmesh.fuzzer import fuzz

CASES = max(30, int(os.environ.get("SNAPMESH_FUZZ_CASES", "10000")) // 10)


@pytest.mark.parametrize("mode", [None, "classic", "overtake", "hybrid"])
def test_merged_frames_with_early_markers_first_hold_every_invariant(mode: str | None) -> None:
    ran, failure = fuzz.fuzz(0, CASES, mode=mode, batching=True)
    if failure is not None:
        seed, why = failure
        pytest.fail(f"seed {seed} (batching): {why}", pytrace=False)
    assert ran == CASES


def test_batching_moves_early_markers_and_only_when_asked() -> None:
    seen: Counter[str] = Counter()
    for seed in range(200):
        seen += fuzz.run_case(seed, mode="overtake", batching=True).faults
    assert seen["early marker applied first"] > 0
    assert seen["overtaken transfers recorded"] > 0
    plain: Counter[str] = Counter()
    for seed in range(50):
        plain += fuzz.run_case(seed, mode="overtake").faults
    assert plain["early marker applied first"] == 0  # without the flag every seed replays as before
