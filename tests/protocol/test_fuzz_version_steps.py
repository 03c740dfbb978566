"""The fuzzer's version steps (snapmesh/fuzzer/steps.py): run, stop with a snapshot, upgrade on restore, run on.

kvshard runs under every fault, stops with a snapshot (nodes crashing before their
fence), every node restarts fenced under a version 2 of it with another state
encoding (snapmesh/sim/versioned.py), the stop snapshot is restored into it with
the upgrade run on the controller (nodes crashing during it), and the run goes on
under version 2. Fresh seeds are clean; an upgrade that drops a field is caught
at a pinned seed, naming the node and the field; the CLI prints the failing seed
and the line that replays it.

Knobs (environment): SNAPMESH_FUZZ_STEPS_CASES (default 60), SNAPMESH_FUZZ_STEPS_BASE
(first seed, default 0).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from snapmesh.commands import sim as cli
from snapmesh.fuzzer import steps
from snapmesh.services.app import kvshard
from snapmesh.sim import versioned
from snapmesh.sim.invariants import Violation

CASES = int(os.environ.get("SNAPMESH_FUZZ_STEPS_CASES", "60"))
BASE = int(os.environ.get("SNAPMESH_FUZZ_STEPS_BASE", "0"))


def test_kvshard_upgrades_through_a_stop_snapshot_on_every_seed() -> None:
    ran, failure = steps.fuzz_steps(BASE, CASES, kvshard.app)
    assert failure is None, f"seed {failure[0]}: {failure[1]}"
    assert ran == CASES


def test_every_version_step_and_the_restarts_around_them_happen() -> None:
    seen: Counter[str] = Counter()
    for seed in range(BASE, BASE + 20):
        seen.update(steps.run_case(seed, kvshard.app).faults)
    for kind in ("stop snapshot complete", "restore with an upgrade", "crash before a fence", "restart while stopped",
                 "crash during a restore", "crash", "command answered"):
        assert seen[kind] > 0, f"{kind!r} never happened in 20 cases: {dict(seen)}"
    assert seen["stop snapshot complete"] == seen["restore with an upgrade"] == 20


def test_version_2_has_another_state_encoding_and_reads_back_the_same_fields() -> None:
    v2 = versioned.second(kvshard.app)
    old = kvshard.encode({"keys": {"n0/k0": {"value": 1, "created_at": "n0"}}, "moved": {}, "created": ["n0/k0"],
                          "deleted": []})
    new = v2.upgrade(old, 1)  # type: ignore[misc]
    assert v2.version == 2 and new != old and new.startswith(versioned.PREFIX)
    assert versioned.fields(new) == versioned.fields(old)


def test_an_upgrade_that_drops_a_field_is_caught_at_a_pinned_seed() -> None:
    with pytest.raises(Violation, match=r"V3: n0: the restore of \S+ into version 2 gives field 'moved' as \(none\); "
                                         r"the stop snapshot recorded \{'n0/k2': 'n2'\}"):
        steps.run_case(1, kvshard.app, drop="moved")


def test_the_cli_prints_the_failing_seed_and_its_replay(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    wrong = versioned.second
    monkeypatch.setattr(versioned, "second", lambda app, drop="": wrong(app, drop="moved"))
    assert cli.main(["fuzz", "--app", "kvshard", "--steps", "upgrade", "--seed", "1", "--cases", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAIL seed 1 (case 1 of 3): V3: n0:" in out
    assert "replay: snapmesh sim fuzz --seed 1 --cases 1 --app kvshard --steps upgrade\n" in out
    monkeypatch.undo()
    assert cli.main(["fuzz", "--app", "kvshard", "--steps", "upgrade", "--seed", "1", "--cases", "3"]) == 0
    assert "ok: 3 cases, seeds 1..3, app kvshard, steps upgrade" in capsys.readouterr().out


def test_the_cli_refuses_steps_without_an_app(capsys) -> None:
    assert cli.main(["fuzz", "--steps", "upgrade", "--cases", "1"]) == 2
    assert "--steps upgrade: needs --app" in capsys.readouterr().err
