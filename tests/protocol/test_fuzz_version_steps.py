"""The fuzzer's version steps: run, stop with a snapshot, upgrade or rescale on restore, run on.

Upgrade (snapmesh/fuzzer/steps.py):

kvshard runs under every fault, stops with a snapshot (nodes crashing before their
fence, and between it and their STOP, coming back open: fence.py F7), every node
restarts fenced under a version 2 of it with another state encoding
(snapmesh/sim/versioned.py), the stop snapshot is restored into it with the upgrade
run on the controller (nodes crashing during it), and the run goes on
under version 2. Fresh seeds are clean; an upgrade that drops a field is caught
at a pinned seed, naming the node and the field; the CLI prints the failing seed
and the line that replays it.

Rescale (snapmesh/fuzzer/rescale_steps.py): the same run and stop, then the
stop snapshot is restored onto 2 to 6 other nodes with kvshard's rescale, nodes
restarting while stopped and during the restore, and the run goes on on the new
node set. Fresh seeds are clean; a rescale that drops a key in flight is caught
at a pinned seed, naming the key.

Knobs (environment): SNAPMESH_FUZZ_STEPS_CASES (default 60), SNAPMESH_FUZZ_STEPS_BASE
(first seed, default 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Sequence

import pytest

from snapmesh.app import NodeInfo, View
from snapmesh.commands import sim as cli
from snapmesh.fuzzer import rescale_steps, steps
from snapmesh.services.app import bank, kvshard
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
    for kind in ("stop snapshot complete", "restore with an upgrade", "crash before a fence", "crash before a stop",
                 "restart while stopped", "crash during a restore", "crash", "command answered"):
        assert seen[kind] > 0, f"{kind!r} never happened in 20 cases: {dict(seen)}"
    assert seen["stop snapshot complete"] == seen["restore with an upgrade"] == 20


def test_version_2_has_another_state_encoding_and_reads_back_the_same_fields() -> None:
    v2 = versioned.second(kvshard.app)
    old = kvshard.encode({"keys": {"n0/k0": {"value": 1, "created_at": "n0"}}, "moved": {}, "created": ["n0/k0"],
                          "deleted": []})
    new = v2.upgrade(old, 1)  # type: ignore[misc]
    assert v2.version == 2 and new != old and new.startswith(versioned.PREFIX)
    assert versioned.fields(new) == versioned.fields(old)


def test_the_bank_upgrades_too_its_balance_in_the_value_encoding() -> None:
    v2 = versioned.second(bank.app)
    assert v2.upgrade(b"871", 1) == b"v2v871" and versioned.fields(b"v2v871") == versioned.fields(b"871")  # type: ignore[misc]
    ran, failure = steps.fuzz_steps(BASE, CASES)  # no app named: the bank, its [app] table drawn
    assert failure is None, f"seed {failure[0]}: {failure[1]}"


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


def test_the_cli_runs_the_steps_of_the_bank_without_an_app(capsys) -> None:
    assert cli.main(["fuzz", "--steps", "upgrade", "--cases", "2"]) == 0
    assert "ok: 2 cases, seeds 0..1, app bank, steps upgrade" in capsys.readouterr().out
    assert cli.main(["fuzz", "--steps", "rescale", "--broadcast", "--cases", "1"]) == 2
    assert "--steps rescale: takes none of --broadcast, --mode, --topology" in capsys.readouterr().err


# -- rescale: the same stop, restored onto another node set with the app's rescale


def drops_a_key_in_flight(view: View, nodes: Sequence[NodeInfo]) -> dict[str, bytes]:
    """kvshard's rescale, wrong: the first handoff in flight at the cut is left out."""
    handoffs = [i for i, (*_, payload) in enumerate(view.in_flight) if json.loads(payload)["type"] == "handoff"]
    kept = [item for i, item in enumerate(view.in_flight) if i not in handoffs[:1]]
    return dict(kvshard.rescale(dataclasses.replace(view, in_flight=kept), nodes))


def test_kvshard_rescales_through_a_stop_snapshot_on_every_seed() -> None:
    ran, failure = rescale_steps.fuzz_steps(BASE, CASES, kvshard.app)
    assert failure is None, f"seed {failure[0]}: {failure[1]}"
    assert ran == CASES


def test_the_bank_rescales_through_a_stop_snapshot_on_every_seed() -> None:
    # No app named: the bank app, its [app] total drawn with its balances (the new node count keeps it).
    ran, failure = rescale_steps.fuzz_steps(BASE, CASES)
    assert failure is None, f"seed {failure[0]}: {failure[1]}"
    assert ran == CASES


def drops_money_in_flight(view: View, nodes: Sequence[NodeInfo]) -> dict[str, bytes]:
    """The bank's rescale, wrong: the first amount in flight at the cut is left out."""
    return dict(bank.rescale(dataclasses.replace(view, in_flight=list(view.in_flight)[1:]), nodes))


def test_a_bank_rescale_that_drops_money_in_flight_is_caught_at_a_pinned_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bank, "app", dataclasses.replace(bank.app, rescale=drops_money_in_flight))  # what load_app finds
    with pytest.raises(Violation, match=r"R1: the rescale of \S+ onto 4 nodes was refused: .*conserved: "
                                         r"balances 29 \+ in flight 0 = 29, not the total 30"):
        rescale_steps.run_case(0)
    monkeypatch.undo()
    rescale_steps.run_case(0)  # the right rescale, same seed: clean


def test_every_rescale_step_and_the_restarts_around_it_happen() -> None:
    seen: Counter[str] = Counter()
    sizes: Counter[int] = Counter()
    for seed in range(BASE, BASE + 20):
        world = rescale_steps.run_case(seed, kvshard.app)
        seen.update(world.faults)
        sizes[len(world.ids)] += 1
    for kind in ("rescale", "rescale with messages in flight", "restart while stopped", "crash during a restore",
                 "crash", "command answered"):
        assert seen[kind] > 0, f"{kind!r} never happened in 20 cases: {dict(seen)}"
    assert seen["rescale"] == 20
    assert min(sizes) == 2 and max(sizes) >= 5, sizes  # shrinks and grows


def test_a_rescale_that_drops_a_key_in_flight_is_caught_at_a_pinned_seed() -> None:
    wrong = dataclasses.replace(kvshard.app, rescale=drops_a_key_in_flight)
    with pytest.raises(Violation, match=r"R1: the rescale of \S+ onto 5 nodes was refused: .*every key exactly once: "
                                         r"key n2/k1 seen 0 times \(lost\)"):
        rescale_steps.run_case(1, wrong)
    rescale_steps.run_case(1, kvshard.app)  # the right rescale, same seed: clean


def test_the_cli_runs_the_rescale_steps_and_refuses_an_app_without_rescale(capsys) -> None:
    assert cli.main(["fuzz", "--app", "kvshard", "--steps", "rescale", "--seed", "5", "--cases", "2"]) == 0
    assert "ok: 2 cases, seeds 5..6, app kvshard, steps rescale" in capsys.readouterr().out
    assert cli.main(["fuzz", "--app", "examples.token_ring:app", "--steps", "rescale", "--cases", "1"]) == 2
    assert "--steps rescale: app 'token_ring' has no rescale(view, nodes)" in capsys.readouterr().err
