"""Hand-computed scenarios: exact output of `snapmesh sim run` for examples/*.json.

Each expected result below was worked out by hand, step by step, from the rules
at the top of snapmesh/protocol/node/core.py; the comments show the working. Steps are
numbered from 0. "M" is a marker. Channel lists in the comments show what is
waiting on a channel, oldest first.
"""

from __future__ import annotations

import contextlib
import os
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from snapmesh.checking.steps import StepChecker  # noqa: E402
from snapmesh.checking.trace import check_trace  # noqa: E402
from snapmesh.bank.trace import BANK, Ledger  # noqa: E402

from snapmesh import cli  # noqa: E402
from snapmesh.sim import loads, simulate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def snapmesh_command() -> list[str]:
    script = Path(sys.executable).parent / "snapmesh"
    return [str(script)] if script.exists() else [sys.executable, "-m", "snapmesh.cli"]


def run_subprocess(path: Path, seed: int | None = None) -> str:
    args = snapmesh_command() + ["sim", "run", str(path)] + ([] if seed is None else ["--seed", str(seed)])
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def run_in_process(path: Path, seed: int | None = None) -> str:
    out, err = io.StringIO(), io.StringIO()
    argv = ["sim", "run", str(path)] + ([] if seed is None else ["--seed", str(seed)])
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()
    return out.getvalue()


def expected_text(expected: dict) -> str:
    # The documented format: indent=2, keys in topology order, one trailing newline.
    return json.dumps(expected, indent=2) + "\n"


def snap(id_, initiators, nodes, channels, markers, complete=True):
    return {
        "id": id_,
        "initiators": initiators,
        "complete": complete,
        "nodes": nodes,
        "channels": channels,
        "markers": markers,
    }


# two_process.json: A=100, B=50, full mesh (A->B, B->A).
#  0 send A B 10   A=90,  A->B [10]
#  1 deliver A B   B=60
#  2 send A B 20   A=70,  A->B [20]
#  3 send B A 5    B=55,  B->A [5]
#  4 snapshot A s1 A records 70; A->B [20, M]
#  5 deliver A B   B=75: 20 was sent before A's cut and arrives before the marker,
#                  so it is part of B's recorded balance (not channel state)
#  6 deliver A B   M: B records 75, sends M (B->A [5, M]); A->B recorded []; B done
#  7 deliver B A   A=75; A is recording s1 and B->A is open: B->A state [5]
#  8 deliver B A   M: B->A recorded [5]; A done
# Check: 70 + 75 + 5 = 150 = 100 + 50. Markers: one per channel = 2.
TWO_PROCESS = {
    "seed": 0,
    "snapshots": [snap("s1", ["A"], {"A": 70, "B": 75}, {"A->B": [], "B->A": [5]}, 2)],
    "final": {"A": 75, "B": 75},
}

# bank_in_flight.json: three branches A, B, C with 1000 each, full mesh.
#  0 send A B 50    A=950, A->B [50]
#  1 snapshot A s1  A records 950; A->B [50, M], A->C [M]
#  2 deliver A C    M: C records 1000; C->A [M], C->B [M]; A->C recorded []
#  3 deliver C B    M: B records 1000 (the $50 has not arrived); B->A [M], B->C [M];
#                   C->B recorded []
#  4 deliver A B    B=1050; B is recording and A->B is open: A->B state [50]
#  5 deliver A B    M: A->B recorded [50]; B done (A->B and C->B closed)
#  6 run            only markers remain (C->A, B->A, B->C): whatever the order, each
#                   closes its channel empty, so the result does not depend on the seed
# Check: 950 + 1000 + 1000 + 50 in flight = 3000. Markers: 6 channels = 6.
BANK_IN_FLIGHT = {
    "seed": 0,
    "snapshots": [
        snap(
            "s1",
            ["A"],
            {"A": 950, "B": 1000, "C": 1000},
            {"A->B": [50], "A->C": [], "B->A": [], "B->C": [], "C->A": [], "C->B": []},
            6,
        )
    ],
    "final": {"A": 950, "B": 1050, "C": 1000},
}

# ring.json: A=10 B=20 C=30 D=40, ring A->B->C->D->A (one incoming channel each).
#  0 send A B 5     A=5,  A->B [5]
#  1 send C D 10    C=20, C->D [10]
#  2 snapshot B r1  B records 20; B->C [M]
#  3 deliver B C    M: C records 20; C->D [10, M]; B->C recorded []; C done
#  4 deliver C D    D=50: sent before C's cut, received before D's cut -> in D's balance
#  5 send D A 7     D=43, D->A [7]   (D has not recorded yet: before D's cut)
#  6 deliver C D    M: D records 43; D->A [7, M]; C->D recorded []; D done
#  7 deliver D A    A=12, before A's cut -> in A's balance
#  8 deliver D A    M: A records 12; A->B [5, M]; D->A recorded []; A done
#  9 deliver A B    B=25; B is recording, A->B open: A->B state [5]
# 10 deliver A B    M: A->B recorded [5]; B done
# Check: 12 + 20 + 20 + 43 + 5 = 100 = 10 + 20 + 30 + 40. Markers: 4 channels = 4.
RING = {
    "seed": 0,
    "snapshots": [
        snap(
            "r1",
            ["B"],
            {"A": 12, "B": 20, "C": 20, "D": 43},
            {"A->B": [5], "B->C": [], "C->D": [], "D->A": []},
            4,
        )
    ],
    "final": {"A": 12, "B": 25, "C": 20, "D": 43},
}

# concurrent.json: A=100, B=100; s1 from A and s2 from B, overlapping.
#  0 snapshot A s1  A records s1=100; A->B [M1]
#  1 send A B 10    A=90,  A->B [M1, 10]   (after A's s1 cut; before A's s2 cut)
#  2 send B A 20    B=80,  B->A [20]       (before B's s1 and s2 cuts)
#  3 snapshot B s2  B records s2=80; B->A [20, M2]
#  4 deliver A B    M1: B records s1=80; B->A [20, M2, M1]; s1 A->B recorded []; B done with s1
#  5 deliver A B    B=90; s2 is recording at B with A->B open: s2 A->B state [10]
#                   (s1 is done at B, so the 10 sent after A's s1 cut is not in s1)
#  6 deliver B A    A=110; s1 is recording at A with B->A open: s1 B->A state [20]
#  7 deliver B A    M2: A records s2=110; A->B [M2]; s2 B->A recorded []; A done with s2
#  8 deliver B A    M1: s1 B->A recorded [20]; A done with s1
#  9 deliver A B    M2: s2 A->B recorded [10]; B done with s2
# Check s1: 100 + 80 + 20 = 200; s2: 110 + 80 + 10 = 200. Markers: 2 each.
CONCURRENT = {
    "seed": 0,
    "snapshots": [
        snap("s1", ["A"], {"A": 100, "B": 80}, {"A->B": [], "B->A": [20]}, 2),
        snap("s2", ["B"], {"A": 110, "B": 80}, {"A->B": [10], "B->A": []}, 2),
    ],
    "final": {"A": 110, "B": 90},
}

# two_initiators.json: A, B, C with 100 each, full mesh; "s" started at A and B.
#  0 send A C 30    A=70, A->C [30]
#  1 snapshot A s   A records 70; A->B [M], A->C [30, M]
#  2 send B C 40    B=60, B->C [40]        (B has not heard of s yet)
#  3 snapshot B s   B has not recorded s: it records 60 and is a second initiator;
#                   B->A [M], B->C [40, M]
#  4 deliver A B    M: B already recorded s, so this only closes A->B: []
#  5 deliver B C    C=140 (before C's cut)
#  6 deliver A C    C=170 (before C's cut)
#  7 deliver A C    M: C records 170; C->A [M], C->B [M]; A->C recorded []
#  8 run            only markers remain (B->A, B->C, C->A, C->B): all close empty
#  9 snapshot C s   C already finished s: a no-op, C is not an initiator
# Check: 70 + 60 + 170 = 300, nothing in flight. One snapshot, 6 markers
# (each process sends one per outgoing channel once, however many initiators).
TWO_INITIATORS = {
    "seed": 0,
    "snapshots": [
        snap(
            "s",
            ["A", "B"],
            {"A": 70, "B": 60, "C": 170},
            {"A->B": [], "A->C": [], "B->A": [], "B->C": [], "C->A": [], "C->B": []},
            6,
        )
    ],
    "final": {"A": 70, "B": 60, "C": 170},
}

# after_cut.json: A=100, B=100.
#  0 snapshot A s1  A records 100; A->B [M]
#  1 send A B 25    A=75, A->B [M, 25]: sent after A's cut
#  2 send B A 5     B=95, B->A [5]
#  3 run            any order: FIFO puts M before 25 on A->B, so B records 95 before
#                   the 25 arrives, and A->B closes empty; B's marker follows the 5 on
#                   B->A and A is recording, so B->A state is [5].
# The 25 appears nowhere: not in A (100), not in B (95), not in flight.
# Check: 100 + 95 + 5 = 200. Same snapshot for every seed.
AFTER_CUT = {
    "seed": 0,
    "snapshots": [snap("s1", ["A"], {"A": 100, "B": 95}, {"A->B": [], "B->A": [5]}, 2)],
    "final": {"A": 80, "B": 120},
}

CASES = {
    "two_process.json": TWO_PROCESS,
    "bank_in_flight.json": BANK_IN_FLIGHT,
    "ring.json": RING,
    "concurrent.json": CONCURRENT,
    "two_initiators.json": TWO_INITIATORS,
    "after_cut.json": AFTER_CUT,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_output_in_process(name: str) -> None:
    first = run_in_process(EXAMPLES / name)
    assert json.loads(first) == CASES[name]
    assert first == expected_text(CASES[name])
    assert run_in_process(EXAMPLES / name) == first  # byte-identical on a second run


@pytest.mark.parametrize("name", sorted(CASES))
def test_invariants_hold_on_the_hand_computed_traces(name: str) -> None:
    sim = simulate(loads((EXAMPLES / name).read_text()), 0)
    report = check_trace(sim.trace, app=BANK)
    assert all(report.snapshots.values()) and report.snapshots
    step = StepChecker(Ledger())
    step.feed_all(sim.trace)
    step.check_state()


def test_exact_output_through_the_real_command() -> None:
    for name in ("two_process.json", "bank_in_flight.json"):
        first = run_subprocess(EXAMPLES / name)
        assert first == expected_text(CASES[name])
        assert run_subprocess(EXAMPLES / name) == first


@pytest.mark.parametrize("seed", [1, 7, 12345])
def test_after_cut_is_the_same_snapshot_for_every_seed(seed: int) -> None:
    out = json.loads(run_in_process(EXAMPLES / "after_cut.json", seed))
    assert out == {**AFTER_CUT, "seed": seed}
    out = json.loads(run_in_process(EXAMPLES / "bank_in_flight.json", seed))
    assert out == {**BANK_IN_FLIGHT, "seed": seed}


def test_bank_demo_scenario_is_deterministic_and_consistent() -> None:
    path = EXAMPLES / "bank.json"
    for seed in (0, 1, 2, 99):
        first = run_subprocess(path, seed) if seed == 0 else run_in_process(path, seed)
        assert run_in_process(path, seed) == first
        out = json.loads(first)
        total = 3000
        assert [s["id"] for s in out["snapshots"]] == ["morning", "noon", "evening"]
        for s in out["snapshots"]:
            assert s["complete"] and s["markers"] == 6
            assert sum(s["nodes"].values()) + sum(sum(v) for v in s["channels"].values()) == total
        assert sum(out["final"].values()) == total
        check_trace(simulate(loads(path.read_text()), seed).trace, app=BANK)


def test_incomplete_snapshot_lists_only_what_was_recorded() -> None:
    # A, B, C full mesh. 0: A records s (100), markers on A->B and A->C.
    # 1: B receives A's marker: records 100, closes A->B []; its marker to A and C waits.
    # Nothing else is delivered: C never recorded; only A->B has a state.
    scenario = loads(
        json.dumps(
            {
                "nodes": {"A": 100, "B": 100, "C": 100},
                "steps": [["snapshot", "A", "s"], ["deliver", "A", "B"]],
            }
        )
    )
    out = simulate(scenario, 5).output()
    assert out == {
        "seed": 5,
        "snapshots": [snap("s", ["A"], {"A": 100, "B": 100}, {"A->B": []}, 4, complete=False)],
        "final": {"A": 100, "B": 100, "C": 100},
    }


def test_output_does_not_depend_on_the_hash_seed() -> None:
    # Byte-identical across processes whose string hashing differs (no set/dict-order leaks).
    outputs = set()
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            snapmesh_command() + ["sim", "run", str(EXAMPLES / "bank.json"), "--seed", "42"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1
