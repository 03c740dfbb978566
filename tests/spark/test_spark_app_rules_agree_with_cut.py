"""The Spark job's rules for an app's snapshots (snapmesh/reconcile/apps.py over the
bank's channel rules) and the pure checker (snapmesh/checking/cut.py with `cut.Payloads`,
an app's reading) on the same app logs, written by `snapmesh.synth.apps` with every
doctoring on a snapshot of its own: per COMPLETE snapshot they agree on consistent or
not and on the rule of the first problem (Spark's app rules said in cut's names:
a payload is IN_FLIGHT_CONTENT, a state digest or state bytes STATE), and every
doctored snapshot is caught, by the rule its doctoring breaks. The seed is printed
(SNAPMESH_APP_AGREE_SEED replays)."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest
from support.spark_fixtures import spark  # noqa: F401

from support.app_cut import CAUGHT_BY, pure_verdicts

from snapmesh.checking import cut
from snapmesh.reconcile import job
from snapmesh.reconcile import messages as M
from snapmesh.synth import apps as synth_apps

pytestmark = pytest.mark.spark

SEED = int(os.environ.get("SNAPMESH_APP_AGREE_SEED") or random.randrange(1, 10_000))

# Spark's app rules (apps.py), by the cut rule an app's reading breaks for the same snapshot.
AS_CUT = {"IN_FLIGHT_PAYLOAD": cut.IN_FLIGHT_CONTENT, "NO_PAYLOAD": cut.IN_FLIGHT_CONTENT,
          "STATE_DIGEST": cut.STATE, "STATE_BYTES": cut.STATE, "NO_STATE": cut.STATE, "NO_CUT_DIGEST": cut.STATE}


def rule_of(text: str) -> str:
    """The rule whose message `text` is (the first whose template matches), in cut's names."""
    for name in [*(n for n in dir(cut) if n.isupper()), *AS_CUT]:
        message = getattr(M, name, None)
        if isinstance(message, M.Message):
            pattern = re.escape(message.template).replace(re.escape("%s"), ".*?").replace("%s", ".*?")
            if re.fullmatch(pattern, text):
                return AS_CUT.get(name, name)
    raise AssertionError(f"no rule words {text!r}")


def generated(tmp_path: Path) -> tuple[int, Path, synth_apps.AppResult]:
    """(seed, data dir, what synth wrote) for the first seed from SEED whose run can carry
    every doctoring (a run with too few messages in flight at the snapshots cannot)."""
    for seed in range(SEED, SEED + 20):
        data = tmp_path / f"data-{seed}"
        try:
            return seed, data, synth_apps.generate_app(str(data), nodes=3, messages=400, snapshots=6, seed=seed,
                                                       doctor=tuple(synth_apps.DOCTORINGS))
        except ValueError as refused:
            print(f"seed {seed}: {refused}; the next seed")
    raise AssertionError(f"seeds {SEED}..{SEED + 19}: no run could carry every doctoring")


def test_the_spark_app_rules_and_cut_with_payloads_agree(spark, tmp_path: Path) -> None:  # noqa: F811
    seed, data, result = generated(tmp_path)
    print(f"seed {seed} (SNAPMESH_APP_AGREE_SEED={seed} replays); doctored {result.doctored}")
    outcome = job.reconcile(spark, str(data))
    assert not outcome.bad_input, f"seed {seed}: {outcome.bad_input}"
    rows = [v for v in outcome.verdicts if v["scope"] == "snapshot" and v["status"] == "COMPLETE"]
    by_spark = {v["snapshot_id"]: (v["consistent"], rule_of(v["first_discrepancy"]) if v["first_discrepancy"] else None)
                for v in rows}
    by_cut = pure_verdicts(data)
    print(f"spark {by_spark}\ncut   {by_cut}")
    assert by_spark == by_cut, f"seed {seed}"
    # The whole-log checks find nothing in an app's logs: the doctorings are the snapshots'.
    assert [v["first_discrepancy"] for v in outcome.verdicts if v["scope"] == "logs" and v["consistent"] is False] == []
    # Every doctoring is caught, by its rule, and the snapshots left alone pass.
    doctored = {where["snapshot_id"]: kind for kind, where in result.doctored.items()}
    assert set(doctored.values()) == set(synth_apps.DOCTORINGS), f"seed {seed}"
    for sid, verdict in by_cut.items():
        want = (False, CAUGHT_BY[doctored[sid]]) if sid in doctored else (True, None)
        assert verdict == want, f"seed {seed}: {sid} ({doctored.get(sid, 'left alone')})"
    assert len(by_cut) == len(result.snapshots) > len(doctored), f"seed {seed}"
