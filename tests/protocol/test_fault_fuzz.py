"""The fault fuzzer (snapmesh/fuzzer/fuzz.py): 10,000 cases of the bank app, and proof that its checker bites.

Each case is one seed; a failure prints the seed and the command that replays it:

    snapmesh sim fuzz --seed N --cases 1

Knobs (environment): SNAPMESH_FUZZ_CASES (default 10000, split over CHUNKS
tests), SNAPMESH_FUZZ_BASE (first seed, default 0).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from snapmesh.commands import sim as cli
from snapmesh.fuzzer import fuzz
from support.mutations import (
    MUTATIONS,
    _no_duplicate_drop,
)

CASES = int(os.environ.get("SNAPMESH_FUZZ_CASES", "10000"))
BASE = int(os.environ.get("SNAPMESH_FUZZ_BASE", "0"))
CHUNKS = 4


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fuzz_cases_hold_every_invariant(chunk: int) -> None:
    per = -(-CASES // CHUNKS)
    first = BASE + chunk * per
    count = max(0, min(per, BASE + CASES - first))
    ran, failure = fuzz.fuzz(first, count)
    if failure is not None:
        seed, why = failure
        pytest.fail(f"seed {seed}: {why}\nreplay: {fuzz.replay_command(seed)}", pytrace=False)
    assert ran == count


def test_every_fault_kind_happens() -> None:
    seen: Counter[str] = Counter()
    for seed in range(300):
        seen += fuzz.run_case(seed).faults
    for kind in (
        "crash", "torn write", "node restart", "restart from a checkpoint", "segment sealed", "connection cut",
        "stale frame delivered", "partition", "controller crash", "snapshot failed: controller restarted",
        "snapshot failed: deadline", "snapshot complete", "command refused: channel full",
        "retry answered, not run again", "command refused by the app: FAILED_PRECONDITION",
        "snapshot complete with app messages in flight", "restore part with app messages in flight",
        "restore", "crash during a restore", "overtaken transfers recorded",
        "request refused: request-id window full", "request refused: request outcome unknown",
        # RestoreSnapshot calls through the controller's gate (one restore at a time)
        "restore call started a restore", "restore call joined the running restore",
        "restore retry answered, not rolled back", "restore refused: another restore runs",
        "restore refused: key of another snapshot", "restore refused: not restorable",
        "restore call joined under its own key", "restore retry answered across a controller restart",
        "stale report refused", "snapshot refused: too many in progress",
        "restore call joined under its own key after the restore ended",
        "restore refused: no such snapshot", "snapshot retired (--keep)", "controller journal lagged",
        "stale epoch refused",  # a channel open the receiving node's machine refused (N8)
        # ReportState calls the controller holds until their snapshot ends (held.py H1-H4)
        "report held until its snapshot ends", "held reports answered at their snapshot's end",
        "a repeat joined a held report", "reports sent again after a controller crash",
        # TriggerSnapshot with wait (W1): answered once the snapshot's end is durable, or lost with its controller
        "waiting trigger answered COMPLETE", "waiting trigger answered FAILED: deadline",
        "waiting trigger answered FAILED: StartSnapshot failed", "waiting trigger answered FAILED: restored to",
        "waiting trigger lost in a controller crash",
    ):
        assert seen[kind] > 0, f"no case exercised {kind!r}: {dict(seen)}"


# --------------------------------------------------------------- mutations
# Each breaks one guarantee of the code under test; the fuzzer must notice.




























































# The first seed of a mutation whose cases from 0 miss it: a restore joined twice needs a run of
# restores that the first 500 cases' scenarios do not draw.
FROM = {"restore-joins-not-replayed": 700, "restore-replays-newest-key-only": 700}


@pytest.mark.parametrize("name", MUTATIONS)
def test_the_fuzzer_catches_each_mutation(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    MUTATIONS[name](monkeypatch)
    ran, failure = fuzz.fuzz(FROM.get(name, 0), 500)
    assert failure is not None, f"mutation {name!r} survived 500 cases"
    seed, why = failure
    assert not why.startswith("TypeError"), f"mutation {name!r}: its wrapper broke, it was not caught: {why}"
    print(f"mutation {name}: caught at seed {seed} ({ran} cases): {why}")
    # The failing seed replays: the same case fails the same way.
    assert fuzz.fuzz(seed, 1) == (1, (seed, why))


def test_cli_prints_the_seed_and_the_replay_command(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert cli.main(["fuzz", "--seed", "3", "--cases", "20"]) == 0
    assert "ok: 20 cases, seeds 3..22" in capsys.readouterr().out
    _no_duplicate_drop(monkeypatch)
    assert cli.main(["fuzz", "--cases", "500"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL seed ")
    seed = int(out.split()[2])
    assert f"replay: snapmesh sim fuzz --seed {seed} --cases 1\n" in out
    assert cli.main(["fuzz", "--seed", str(seed), "--cases", "1"]) == 1
    replay = capsys.readouterr().out
    assert replay.startswith(f"seed {seed}: nodes ")  # the derived configuration first
    assert f"FAIL seed {seed} " in replay


def test_cli_refuses_bad_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["fuzz", "--cases", "0"])
    assert info.value.code == 2
    assert "--cases: must be at least 1" in capsys.readouterr().err
