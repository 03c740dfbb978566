"""A fault the backend could not apply (FaultNotApplied: `docker pause` that never
takes) is recorded as skipped with the backend's reason, and the campaign goes on
to the next fault; the figures count it as skipped, never as applied or recovered.

No cluster runs: a real LocalBackend is made (its cluster file, its ports) but
never started, and its pause is scripted to fail the way the compose backend's
does, because the engine's "unable to freeze" cannot be made on demand."""

from __future__ import annotations

from snapmesh.chaos import campaign as campaign_module
from snapmesh.chaos import checks, schedule
from snapmesh.chaos.campaign import Campaign, FaultNotApplied, Options
from snapmesh.chaos.local import LocalBackend

REASON = "docker pause failed 3 times: unable to freeze"


class PauseNeverTakes(LocalBackend):
    cut: list[str] = []

    def pause_node(self, node: str) -> None:
        raise FaultNotApplied(REASON)

    def resume_node(self, node: str) -> None:
        raise AssertionError("a pause that was not applied was resumed")

    def cut_streams(self, node: str) -> None:
        self.cut.append(node)


def test_a_fault_not_applied_is_skipped_with_its_reason_and_the_campaign_goes_on(tmp_path, monkeypatch):
    planned = [schedule.Fault(0, schedule.PAUSE, ("p2",), 0.0, 0.0),
               schedule.Fault(1, schedule.CUT, ("p1",), 0.0, 0.0)]
    monkeypatch.setattr(campaign_module.sched, "faults", lambda *args, **kwargs: iter(planned))
    monkeypatch.setattr(Campaign, "_recovered", lambda self, repaired, fault: 0.25)
    said: list[str] = []
    run = Campaign(Options(nodes=3, seed=7, duration=0.0, workdir=tmp_path / "run"), PauseNeverTakes, said.append)
    run.backend.disk_skip = "no small disk (not started)"

    run._apply_schedule()

    pause, cut = run.outcome.faults
    assert (pause.kind, pause.skipped, pause.recover_s) == ("pause", REASON, None)
    assert (cut.kind, cut.skipped, cut.recover_s) == ("cut_streams", "", 0.25), "the campaign stopped at the skip"
    assert PauseNeverTakes.cut == ["p1"]
    assert any(f"skipped: {REASON}" in line for line in said), said
    fig = checks.figures(run.outcome)
    assert fig["skipped_why"] == {"pause": REASON}
    assert fig["faults"] == {"cut_streams": 1} and fig["faults_total"] == 1
    assert "pause" not in fig["recovery"]
