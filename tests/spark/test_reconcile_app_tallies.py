"""An app's records without the bank's tallies, and an app's figures by its describe.

An app's log records leave the tally's key out (schema.APP_MARKS: they used to
carry `"balance":0` and `"amount":0`): the job and the baseline reconcile such a log
as they reconcile the same log with the old zeros, while a native record without its
tally stays bad input. `figures.figures_of` reads an app's describe (F1-F3): the
bank app's conservation, a claimed total that is not the app's, a describe that
raises; kvshard's describe gives no figures.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from snapmesh.app import View, load_app
from snapmesh.reconcile import baseline, figures
from snapmesh.reconcile import job as reconcile_main
from snapmesh.reconcile.schema import APP_MARKS, TALLY_KEYS
from snapmesh.synth import apps as synth_apps
from snapmesh.synth import writer as synth
from support.spark_fixtures import spark  # noqa: F401

pytestmark = [pytest.mark.spark]

def add_zeros(data_dir) -> int:  # noqa: ANN001
    """Give every app record (one with its APP_MARKS key) the tally's 0 logs carried before; how many."""
    added = 0
    for log in data_dir.glob("*.log*.jsonl"):
        lines = []
        for line in log.read_text().splitlines(keepends=True):
            record = json.loads(line)
            key = TALLY_KEYS.get(record["kind"])
            if key is not None and key not in record and APP_MARKS[record["kind"]] in record:
                record[key] = 0
                line = json.dumps(record, separators=(",", ":")) + "\n"
                added += 1
            lines.append(line)
        log.write_text("".join(lines))
    return added


def test_an_app_log_with_the_old_tallies_zeros_reconciles_as_without_them(spark, tmp_path):  # noqa: F811
    data = tmp_path / "bare"  # as an app's nodes write it: no tallies
    synth_apps.generate_app(str(data), nodes=3, messages=200, snapshots=3, seed=7, doctor=("lost-inflight",))
    sends = [line for f in data.glob("*.log.jsonl") for line in f.read_text().splitlines() if '"kind":"send"' in line]
    assert sends and not [line for line in sends if '"amount"' in line]
    zeros = tmp_path / "zeros"
    shutil.copytree(data, zeros)
    assert add_zeros(zeros) > 200

    with_zeros, without = reconcile_main.reconcile(spark, str(zeros)), reconcile_main.reconcile(spark, str(data))
    assert not without.bad_input and without.verdicts == with_zeros.verdicts
    assert [v["consistent"] for v in without.verdicts if v["scope"] == "snapshot"].count(False) == 1  # the doctored one
    assert baseline.reconcile(str(data)) == baseline.reconcile(str(zeros))


def test_a_native_send_without_its_amount_is_still_bad_input(spark, tmp_path):  # noqa: F811
    data = tmp_path / "native"
    synth.generate(str(data), nodes=3, transfers=50, snapshots=1)
    log = data / "p1.log.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "send")
    lines[at] = re.sub(r',"amount":\d+', "", lines[at])
    log.write_text("".join(lines))

    outcome = reconcile_main.reconcile(spark, str(data))
    assert [(b["line"], b["problem"]) for b in outcome.bad_input] == [(at + 1, "send record without 'amount'")]
    with pytest.raises(baseline.BadInput) as caught:
        baseline.reconcile(str(data))
    assert [(line, problem) for _, line, problem in caught.value.problems] == [(at + 1, "send record without 'amount'")]


def view(states: dict[str, bytes], in_flight=(), params=None) -> View:  # noqa: ANN001
    return View(snapshot_id="s1", states=states, in_flight=list(in_flight), params=params or {})


BANK = load_app("bank")
HELD = view({"p1": b"900", "p2": b"1050"}, [("p1", "p2", 3, b"50")])  # 2000 in all, 50 of it in flight


def test_the_bank_apps_describe_gives_its_conservation():
    assert figures.figures_of(BANK, HELD, {}) == figures.Figures(expected=2000, observed=2000, in_flight=50)
    made = view({"p1": b"901", "p2": b"1050"}, [("p1", "p2", 3, b"50")])
    assert figures.figures_of(BANK, made, {"total": 2001}) == figures.Figures(
        expected=2000, observed=2001, in_flight=50, problems=((64, "bank's describe: total 2001, expected_total 2000"),))


def test_an_export_claiming_other_figures_than_the_apps_is_a_discrepancy():
    got = figures.figures_of(BANK, HELD, {"total": 2000, "expected_total": 3000})
    assert got.problems == ((65, "snapshot says expected_total 3000, bank's describe says 2000"),)


def test_a_describe_that_raises_is_a_discrepancy_and_kvshard_has_no_figures():
    broken = view({"p1": b"lots"})
    [(_, text)] = figures.figures_of(BANK, broken, {}).problems
    assert text.startswith("bank's describe raised ValueError: the state of p1 is not decimal ASCII")
    kv = load_app("kvshard")
    empty = b'{"created":[],"deleted":[],"keys":{},"moved":{}}'
    assert figures.figures_of(kv, view({"p1": empty}), {}) == figures.Figures()


def test_the_app_whose_describe_reads_a_snapshot():
    spec = "snapmesh.services.app.bank:app"
    assert figures.app_for(spec, "bank", None, "") is not None  # a built-in the export names
    assert figures.app_for("token_ring:app", "token_ring", None, "") is None  # never imported from the data
    assert figures.app_for("token_ring:app", "token_ring", BANK, "bank") is None  # --app is another app
    assert figures.app_for(spec, "bank", BANK, "bank") is BANK
