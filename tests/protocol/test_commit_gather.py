"""The group commit's gather rule (services/node/commitgather.py), as a table of events."""

from __future__ import annotations

import pytest

from snapmesh.services.node.commitgather import CommitGather


def rounds_of(gather: CommitGather, *callers: int) -> None:
    for n in callers:
        for _ in range(n):
            gather.caller(0.0)
        gather.round_started()


def test_a_lone_caller_never_waits_and_the_log_is_not_concurrent() -> None:
    gather = CommitGather()
    rounds_of(gather, 1, 1, 0)
    assert not gather.concurrent and gather.expected == 0
    assert gather.wait_s(now=5.0, started=5.0) is None


def test_a_round_with_two_callers_makes_the_next_wait_for_as_many() -> None:
    gather = CommitGather(gap_s=0.003, max_s=0.02)
    rounds_of(gather, 2)
    assert gather.concurrent and gather.expected == 2
    assert gather.wait_s(now=1.0, started=1.0) == pytest.approx(0.02)  # nobody yet: they are on their way
    assert gather.wait_s(now=1.019, started=1.0) == pytest.approx(0.001)
    assert gather.caller(1.001) is False
    assert gather.wait_s(now=1.001, started=1.0) == pytest.approx(0.003)  # one came: a gap more for the next
    assert gather.caller(1.002) is True  # the second: the round has all it waits for
    assert gather.wait_s(now=1.002, started=1.0) is None


def test_the_target_is_the_busiest_recent_round_not_the_last() -> None:
    """With the last round's count as the target, one round cut short (here 10
    of 16) set the next target to 10, and the callers split into cohorts."""
    gather = CommitGather(rounds=8)
    rounds_of(gather, 16, 10, 6)
    assert gather.expected == 16
    rounds_of(gather, *[3] * 5)
    assert gather.expected == 16  # still among the last 8 rounds
    rounds_of(gather, 3)
    assert gather.expected == 10  # the 16 fell out of the window


def test_the_round_waits_while_callers_keep_coming_and_goes_after_a_quiet_gap() -> None:
    gather = CommitGather(gap_s=0.003, max_s=0.02)
    rounds_of(gather, 16)
    started = 10.0
    now = started
    for _ in range(5):  # a caller every 2 ms: each resets the gap
        now += 0.002
        gather.caller(now)
        assert gather.wait_s(now, started) == pytest.approx(0.003)
    assert gather.wait_s(now + 0.0029, started) == pytest.approx(0.0001)
    assert gather.wait_s(now + 0.003, started) is None  # quiet for a gap: the callers that came go


def test_a_round_nobody_comes_for_goes_after_max_s() -> None:
    gather = CommitGather(gap_s=0.003, max_s=0.02)
    rounds_of(gather, 4)
    assert gather.wait_s(now=0.0199, started=0.0) == pytest.approx(0.0001)
    assert gather.wait_s(now=0.02, started=0.0) is None


def test_no_round_waits_longer_than_max_s_however_the_callers_trickle() -> None:
    gather = CommitGather(gap_s=0.003, max_s=0.02)
    rounds_of(gather, 64)
    started, now = 0.0, 0.0
    while (wait := gather.wait_s(now, started)) is not None:
        now += min(wait, 0.001)
        gather.caller(now)
    assert now == pytest.approx(0.02)
    assert gather.joined < 64


def test_a_snapshot_record_makes_its_round_go_at_once_and_only_that_round() -> None:
    gather = CommitGather(gap_s=0.003, max_s=0.02)
    rounds_of(gather, 16)
    gather.caller(0.0)
    gather.hurry()
    assert gather.wait_s(now=0.0, started=0.0) is None
    gather.round_started()
    assert gather.wait_s(now=0.0, started=0.0) == pytest.approx(0.02)  # the next waits for its callers again


def test_callers_counted_during_a_round_belong_to_the_next() -> None:
    gather = CommitGather()
    gather.caller(0.0)
    gather.caller(0.0)
    assert gather.round_started() == 2
    assert gather.joined == 0
    gather.caller(0.1)
    assert gather.round_started() == 1


@pytest.mark.parametrize("kw", [{"rounds": 0}, {"gap_s": -1.0}, {"max_s": -0.5}])
def test_bad_settings_are_refused_naming_them(kw: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        CommitGather(**kw)
