"""deploy/compose/rules.yml's alerts over time, with `promtool test rules` (Debian's
prometheus package; Prometheus' own rule unit tests on series given here): when
each fires and when it must not. tests/deploy/test_dashboard.py checks the same rules
against a real scrape of a running cluster.

SnapmeshNoCompleteSnapshot counts from the controller's start while it has no
COMPLETE snapshot yet (its gauge is 0 then): a cluster started a minute ago is not
"without a COMPLETE snapshot for 10 minutes" (the alert, read literally,
fired one minute after every fresh start, saying the last one was 56 years ago)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from support.helpers_deploy import prometheus_bin

RULES = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "rules.yml"
CONTROLLER = 'job="snapmesh-controller",instance="controller:9100"'
ALERT = "SnapmeshNoCompleteSnapshot"


def no_complete_case(last_complete: str, started: str, eval_time: str, fires: str | None) -> dict:
    """Series are per minute from t=0 (Unix time 0 in promtool); `_` is no sample.
    `fires`: how long ago the description says (None: the alert must not fire)."""
    description = (f"No snapshot has completed for {fires} (since the newest COMPLETE one, or since the "
                   "controller started if it has none). Without a recent snapshot a restore loses more; check "
                   "the controller's log and snapmesh_snapshots_total{status=\"FAILED\"}.")
    expected = [{"exp_labels": {"severity": "warning"},
                 "exp_annotations": {"summary": "No COMPLETE snapshot for 10 minutes", "description": description}}]
    expected = expected if fires else []
    return {
        "interval": "1m",
        "input_series": [
            {"series": f"snapmesh_last_complete_snapshot_timestamp_seconds{{{CONTROLLER}}}", "values": last_complete},
            {"series": f"process_start_time_seconds{{{CONTROLLER}}}", "values": started},
        ],
        "alert_rule_test": [{"eval_time": eval_time, "alertname": ALERT, "exp_alerts": expected}],
    }


def promtool_test(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "rules_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    promtool = Path(prometheus_bin()).with_name("promtool")
    return subprocess.run([str(promtool), "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)


def test_a_controller_started_minutes_ago_without_a_snapshot_does_not_alert(tmp_path):
    # Started at 50 min (Unix 3000); no COMPLETE snapshot yet (the gauge is 0); 5 minutes later.
    result = promtool_test(tmp_path, [no_complete_case("_x49 0x20", "_x49 3000x20", "55m", fires=None)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_complete_snapshot_for_ten_minutes_alerts(tmp_path):
    result = promtool_test(tmp_path, [
        # started at 0, never a COMPLETE snapshot: 12 minutes on
        no_complete_case("0x20", "0x20", "12m", fires="12m 0s"),
        # the last COMPLETE one at 60 min, none since: 15 minutes on
        no_complete_case("0x59 3600x30", "0x90", "75m", fires="15m 0s"),
        # a COMPLETE one every minute: never
        no_complete_case("0+60x90", "0x90", "80m", fires=None),
    ])
    assert result.returncode == 0, result.stdout + result.stderr
