"""`snapmesh synth --app` (snapmesh/synth/apps.py): an app's logs and snapshots, consistent by
construction, each doctoring caught by `cut` with `cut.Payloads` by the rule it breaks and
the snapshots left alone passing, over many seeds (SNAPMESH_PROP_CASES / 10 of them; each
failure names the seed that reproduces it, SNAPMESH_SYNTH_APP_SEED the first)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from support.app_cut import CAUGHT_BY, pure_verdicts

from snapmesh.synth import apps as synth_apps
from snapmesh.synth.writer import main as synth_main

CASES = max(5, int(os.environ.get("SNAPMESH_PROP_CASES", "200")) // 10)
FIRST = int(os.environ.get("SNAPMESH_SYNTH_APP_SEED") or random.randrange(1, 100_000))


def test_every_doctoring_is_caught_and_nothing_else(tmp_path: Path) -> None:
    checked = 0
    for seed in range(FIRST, FIRST + CASES):
        data = tmp_path / f"s{seed}"
        try:
            result = synth_apps.generate_app(str(data), nodes=random.Random(seed).randrange(2, 5), messages=200,
                                             snapshots=5, seed=seed, doctor=tuple(synth_apps.DOCTORINGS))
        except ValueError as refused:  # too few messages in flight at the snapshots for every doctoring
            assert "no snapshot left" in str(refused), f"seed {seed}: {refused}"
            continue
        doctored = {where["snapshot_id"]: kind for kind, where in result.doctored.items()}
        verdicts = pure_verdicts(data)
        assert sorted(verdicts) == sorted(result.snapshots), f"seed {seed} (SNAPMESH_SYNTH_APP_SEED={seed} replays)"
        for sid, verdict in verdicts.items():
            want = (False, CAUGHT_BY[doctored[sid]]) if sid in doctored else (True, None)
            assert verdict == want, f"seed {seed} (SNAPMESH_SYNTH_APP_SEED={seed} replays): {sid}"
        checked += 1
    assert checked >= CASES // 2, f"seeds {FIRST}..{FIRST + CASES - 1}: only {checked} could carry every doctoring"


def test_an_undoctored_app_run_is_consistent_and_exported_as_an_apps(tmp_path: Path) -> None:
    result = synth_apps.generate_app(str(tmp_path), nodes=3, messages=100, snapshots=2, seed=7)
    assert result.doctored == {} and pure_verdicts(tmp_path) == dict.fromkeys(result.snapshots, (True, None))
    doc = json.loads((tmp_path / "snapshots" / f"{result.snapshots[0]}.json").read_text())
    assert doc["app"]["spec"] == synth_apps.APP_SPEC and all(n["state_digest"].startswith("sha256:") for n in doc["nodes"])


def test_the_cli_writes_an_app_and_refuses_mixed_modes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert synth_main(["--data-dir", str(tmp_path), "--app", "--nodes", "3", "--transfers", "200", "--snapshots", "4",
                       "--seed", "5", "--doctor", "wrong-state"]) == 0
    assert "doctored: wrong-state" in capsys.readouterr().out
    assert synth_main(["--data-dir", str(tmp_path), "--doctor", "wrong-state"]) == 2
    assert synth_main(["--data-dir", str(tmp_path), "--app", "--corrupt", "balance"]) == 2
    assert "--doctor needs --app" in capsys.readouterr().err
