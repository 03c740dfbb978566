"""The Spark job and the pure checker (snapmesh/checking/cut.py, with the bank's reading) on the same
generated corruptions (`snapmesh synth --corrupt`, every kind that leaves the input
readable, and none): per COMPLETE snapshot they agree on consistent or not and, when
both name a problem, on its kind; and the plain-Python baseline, which asks `cut`,
gives the job's verdict rows exactly. The seed is printed (SNAPMESH_AGREE_SEED
replays)."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest
from support.spark_fixtures import spark  # noqa: F401

from snapmesh.checking import cut
from snapmesh.checking.node_logs import read_logs
import snapmesh.bank.cut as bank_cut
from snapmesh.reconcile import baseline
from snapmesh.synth import writer as synth
from snapmesh.reconcile import job
from snapmesh.reconcile import messages as M

pytestmark = pytest.mark.spark

SEED = int(os.environ.get("SNAPMESH_AGREE_SEED") or random.randrange(1, 10_000))
CASES = [None] + sorted(kind for kind in synth.CORRUPTIONS if kind != "truncated")


def rule_of(text: str) -> str:
    """The rule whose message `text` is (the first whose template matches)."""
    for name in [*dir(cut), *bank_cut.RULES]:
        message = getattr(M, name, None)
        if name.isupper() and isinstance(message, M.Message):
            pattern = re.escape(message.template).replace(re.escape("%s"), ".*?").replace("%s", ".*?")
            if re.fullmatch(pattern, text):
                return name
    raise AssertionError(f"no rule words {text!r}")


def pure_verdicts(data: Path) -> dict[str, tuple[bool, str | None]]:
    """snapshot id -> (consistent, kind of the first problem) by `cut` alone."""
    logs = read_logs(data)
    reading = bank_cut.Reading()
    logs = {node: [cut.record(r, older=reading.older) for r in records] for node, records in logs.items()}
    index = cut.LogIndex.of(logs, reading=reading)
    out = {}
    for path in sorted((data / "snapshots").glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("status") != "COMPLETE":
            continue
        verdict = cut.check_snapshot(index, baseline.snapshot_of(doc))
        first = min((getattr(M, p.rule).format(*p.args) for p in verdict.problems), default=None)
        out[doc["snapshot_id"]] = (verdict.consistent, rule_of(first[1]) if first else None)
    return out


def _generated(tmp_path: Path, corruption: str | None):
    """(seed, data dir, synth's result) for the first seed from SEED whose run can
    carry `corruption`: some runs cannot (no transfer sent after the chosen cut, for
    extra-inflight), and synth refuses those with ValueError."""
    for seed in range(SEED, SEED + 20):
        data = tmp_path / f"data-{seed}"
        try:
            return seed, data, synth.generate(str(data), nodes=3, transfers=300, snapshots=4, failed=1, seed=seed,
                                              corrupt=corruption)
        except ValueError as refused:
            if corruption is None:
                raise
            print(f"seed {seed}: {refused}; the next seed")
    raise AssertionError(f"seeds {SEED}..{SEED + 19}: no run could carry {corruption}")


@pytest.mark.parametrize("corruption", CASES, ids=lambda c: c or "none")
def test_the_spark_job_and_the_pure_checker_agree(spark, tmp_path: Path, corruption: str | None) -> None:  # noqa: F811
    seed, data, result = _generated(tmp_path, corruption)
    print(f"seed {seed} (SNAPMESH_AGREE_SEED={seed} replays), corruption {corruption or '-'}")
    print(f"synth: {result.corruption or 'consistent'}")
    outcome = job.reconcile(spark, str(data))
    assert not outcome.bad_input, f"seed {seed}: {outcome.bad_input}"
    by_spark = {
        v["snapshot_id"]: (v["consistent"], rule_of(v["first_discrepancy"]) if v["first_discrepancy"] else None)
        for v in outcome.verdicts
        if v["scope"] == "snapshot" and v["status"] == "COMPLETE"
    }
    by_cut = pure_verdicts(data)
    print(f"spark {by_spark}\ncut   {by_cut}")
    assert by_spark == by_cut, f"seed {seed}, corruption {corruption}"
    # The plain-Python baseline (cut plus the whole-log checks) gives the job's rows, field for field.
    rows = {(v["scope"], v["snapshot_id"]): v for v in outcome.verdicts}
    assert {(v["scope"], v["snapshot_id"]): v for v in baseline.reconcile(str(data))} == rows, f"seed {seed}"
    if corruption in ("balance", "missing-inflight", "extra-inflight", "missing-node"):
        assert by_cut[result.detail["snapshot_id"]][0] is False, f"seed {seed}: the corruption went unseen"
