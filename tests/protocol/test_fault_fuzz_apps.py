"""The fault fuzzer running an app (snapmesh/sim/apps.py): kvshard under every fault, both snapshot modes.

Each case is one seed (even seeds classic, odd seeds overtake); a failure prints
the seed and the command that replays it:

    snapmesh sim fuzz --seed N --cases 1 --app kvshard

Knobs (environment): SNAPMESH_FUZZ_APP_CASES (default 500 per mode),
SNAPMESH_FUZZ_APP_BASE (first seed, default 0).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from snapmesh.services.app import kvshard
from snapmesh.app import App
from snapmesh.protocol.node import apphost
from snapmesh.commands import sim as cli
from snapmesh.fuzzer import fuzz

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.mutations import MUTATIONS

CASES = int(os.environ.get("SNAPMESH_FUZZ_APP_CASES", "500"))
BASE = int(os.environ.get("SNAPMESH_FUZZ_APP_BASE", "0"))
MODES = {"classic": 0, "overtake": 1}  # a seed's parity picks its mode (sim/world.py)


@pytest.mark.parametrize("mode", MODES)
def test_kvshard_loses_and_doubles_no_key(mode: str) -> None:
    seeds = [s for s in range(BASE, BASE + 2 * CASES) if s % 2 == MODES[mode]]
    for seed in seeds:
        ran, failure = fuzz.fuzz(seed, 1, kvshard.app)
        if failure is not None:
            pytest.fail(f"seed {seed}: {failure[1]}\nreplay: {fuzz.replay_command(seed, 'kvshard')}", pytrace=False)


def test_every_fault_kind_happens_to_kvshard() -> None:
    seen: Counter[str] = Counter()
    for seed in range(300):
        world = fuzz.run_case(seed, kvshard.app)
        assert world.mode == ("overtake" if seed % 2 else "classic")
        seen += world.faults
    print(dict(seen))
    for kind in (
        "crash", "torn write", "node restart", "restart from a checkpoint", "segment sealed", "connection cut",
        "stale frame delivered", "partition", "controller crash", "snapshot failed: controller restarted",
        "snapshot failed: deadline", "snapshot complete", "restore", "crash during a restore",
        "overtaken transfers recorded", "request refused: request-id window full",
        "request refused: request outcome unknown",
        "restore call started a restore", "restore call joined the running restore",
        "restore retry answered, not rolled back", "restore refused: another restore runs",
        "restore refused: key of another snapshot", "restore refused: not restorable",
        # the app's own: commands answered, retried, refused, and its messages inside snapshots
        "command answered", "retry answered, not run again", "command refused: channel full",
        "command taken back by a restore",
        "command refused by the app: FAILED_PRECONDITION", "command refused by the app: NOT_FOUND",
        "snapshot complete with app messages in flight", "restore part with app messages in flight",
    ):
        assert seen[kind] > 0, f"no case exercised {kind!r}: {dict(seen)}"


# --------------------------------------------------------------- mutations
# Each breaks one guarantee; the fuzzer must fail on it at a fixed seed, and name it.


class KeepsMovedKeys(kvshard.KVShard):
    """The broken kvshard: a move sends the handoff but forgets to delete the key here (a duplicate)."""

    def on_command(self, command, ctx):
        kept = dict(self.keys)
        reply = super().on_command(command, ctx)
        if json.loads(command).get("op") == "move":
            self.keys = kept
        return reply


KEEPS_MOVED_KEYS = App(
    name="kvshard-keeps-moved-keys", new=KeepsMovedKeys, invariants=kvshard.app.invariants, workload=kvshard.workload
)


def _restore_drops_the_app_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken node machine: a restore makes a fresh app instance and never restores the recorded state."""
    monkeypatch.setattr(apphost.Host, "restore", lambda self, state: setattr(self, "machine", self._new()))


@pytest.mark.parametrize(
    ("name", "seed", "caught"),
    [
        ("kvshard forgets to delete a moved key", 0, "invariant 'every key exactly once': key n1/k0 seen 2 times"),
        ("kvshard forgets to delete a moved key", 8, "in flight n0->n1 seq 1"),  # at a COMPLETE snapshot, mid-move
        ("a restore drops the app state", 5, "app state in memory"),
        ("a restore keeps every request id", 8, "answered (lsn 17) after a restore took its run back"),
    ],
)
def test_the_fuzzer_catches_each_app_mutation(name: str, seed: int, caught: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = kvshard.app
    if name.startswith("kvshard"):
        app = KEEPS_MOVED_KEYS
    elif name == "a restore drops the app state":
        _restore_drops_the_app_state(monkeypatch)
    else:
        MUTATIONS["request-restore"](monkeypatch)  # a retry of a command a restore took back gets the old reply
    ran, failure = fuzz.fuzz(seed, 1, app)
    assert failure is not None, f"mutation {name!r} survived seed {seed}"
    print(f"mutation {name}: caught at seed {seed}: {failure[1]}")
    assert failure[0] == seed and caught in failure[1]
    assert fuzz.fuzz(seed, 1, app) == (1, failure)  # the seed replays: the same case fails the same way
    monkeypatch.undo()
    assert fuzz.fuzz(seed, 1, kvshard.app) == (1, None)  # and the same case passes without the mutation


# The fuzzer's mutations of the framework (tests/protocol/test_fault_fuzz.py, run there under the bank
# app), under kvshard: each fails a fixed seed.
BANK_MUTATIONS_SEEDS = {
    "controller-restore-plan": 5, "controller-overtake-merge": 9, "controller-stale-report": 9,
    "controller-admission": 1, "controller-abort-on-fail": 0, "restore-claim-two-steps": 5,
    "restore-forgets-finished-keys": 10, "restore-forgets-joined-keys": 5, "restore-joins-not-replayed": 874,
    "restore-join-after-the-end": 11, "restore-replays-newest-key-only": 874, "request-window": 1,
    "request-restore": 8, "overtake-outbox": 9, "overtake-positions": 9, "resend": 7, "duplicate-drop": 0,
    "recovery-outbox": 0, "recovery-aborts": 1, "restore-replay": 5, "node-report-before-durable": 15,
    "controller-retention-off-by-one": 49, "controller-retention-protect": 224, "controller-retention-just-completed": 84,
    "controller-start-before-durable": 6, "controller-finish-before-durable": 118,
    "controller-replay-not-restarted": 0, "controller-replay-no-fresh-deadline": 2, "node-open-ignores-epoch": 5,
    "node-restore-answer-before-durable": 10, "node-restore-keeps-streams": 8,
    "controller-replay-no-resume": 9, "restore-answers-join-at-once": 5,
    "controller-trigger-answer-before-durable": 0, "controller-trigger-answer-dropped": 24,
    "report-leaves-out-a-recorded-channel": 2, "node-reply-before-durable": 1, "recovery-receipts": 3,
    "recovery-replays": 86, "controller-held-not-journaled": 2, "controller-held-never-answered": 1,
    "report-rests-past-its-marker": 1,
}


def test_the_bank_mutations_that_touch_apps_are_caught_under_kvshard(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(MUTATIONS) == set(BANK_MUTATIONS_SEEDS)
    for name, seed in BANK_MUTATIONS_SEEDS.items():
        with monkeypatch.context() as patched:
            MUTATIONS[name](patched)
            ran, failure = fuzz.fuzz(seed, 1, kvshard.app)
        assert failure is not None, f"mutation {name!r} survived seed {seed} under kvshard"
        print(f"mutation {name}: caught under kvshard at seed {seed}: {failure[1][:160]}")


def test_cli_runs_kvshard_and_prints_the_replay_command(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert cli.main(["fuzz", "--app", "kvshard", "--seed", "3", "--cases", "10"]) == 0
    assert "ok: 10 cases, seeds 3..12, app kvshard" in capsys.readouterr().out
    _restore_drops_the_app_state(monkeypatch)
    assert cli.main(["fuzz", "--app", "kvshard", "--cases", "50"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL seed ")
    seed = int(out.split()[2])
    assert f"replay: snapmesh sim fuzz --seed {seed} --cases 1 --app kvshard\n" in out
    assert cli.main(["fuzz", "--seed", str(seed), "--cases", "1", "--app", "kvshard"]) == 1
    replay = capsys.readouterr().out
    assert replay.startswith(f"seed {seed}: nodes ") and " app kvshard " in replay.splitlines()[0]
    assert f"FAIL seed {seed} " in replay


def test_cli_passes_app_params_and_names_a_broken_start(capsys) -> None:
    # token_ring's default first holder suits a full mesh only: on seed 16's topology two nodes start with a token.
    ring = ["fuzz", "--app", "examples.token_ring:app", "--seed", "16"]
    assert cli.main([*ring, "--cases", "1"]) == 1
    assert "at the start: app 'token_ring' invariant 'one token': 2 tokens" in capsys.readouterr().out
    assert cli.main([*ring, "--app-param", "holder=n0", "--cases", "20"]) == 0
    assert "ok: 20 cases, seeds 16..35, app token_ring" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        cli.main(["fuzz", "--app", "kvshard", "--app-param", "keys"])
    assert info.value.code == 2 and "expected KEY=VALUE" in capsys.readouterr().err


def test_cli_refuses_an_app_that_does_not_load(capsys) -> None:
    assert cli.main(["fuzz", "--app", "no_such_module:app", "--cases", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("snapmesh sim: --app no_such_module:app: no module named 'no_such_module'") and err.count("\n") == 1
