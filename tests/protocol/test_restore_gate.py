"""RestoreGate (snapmesh/protocol/controller/restoregate.py): who may start a restore, as a pure state machine.

One restore at a time, and a key never rolls back twice."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller.restoregate import MAX_KEY_BYTES, Answer, Busy, Join, Refuse, RestoreGate, Start, key_problem


def test_a_call_with_nothing_running_claims_the_restore_in_the_same_step() -> None:
    gate = RestoreGate()
    decision = gate.request("s1", "k1", 5.0)
    assert decision == Start("s1", "k1", 5.0)
    assert gate.running == decision
    # The very next call sees the claim: no second Start, whatever it asks for.
    assert gate.request("s2", "k2", 5.0) == Busy("s1")
    assert gate.request("s2", "", 5.0) == Busy("s1")


def test_busy_is_a_failed_precondition_naming_the_running_restore() -> None:
    gate = RestoreGate()
    gate.request("s1", "", 0.0)
    busy = gate.request("s2", "", 1.0)
    assert isinstance(busy, Busy)
    assert busy.code == "FAILED_PRECONDITION"
    assert "s1" in busy.message


def test_the_same_key_or_the_same_snapshot_joins_the_running_restore() -> None:
    gate = RestoreGate()
    gate.request("s1", "k1", 0.0)
    assert gate.request("s1", "k1", 1.0) == Join("s1")  # a retry while it runs
    assert gate.request("s1", "", 1.0) == Join("s1")  # no key, the same snapshot
    assert gate.request("s1", "k9", 1.0) == Join("s1", "k9")  # another key, the same snapshot: it joins for good
    assert gate.running == Start("s1", "k1", 0.0)  # none of them claimed anything


def test_a_retry_after_the_restore_finished_gets_its_answer_and_rolls_nothing_back() -> None:
    gate = RestoreGate()
    gate.request("s1", "k1", 0.0)
    gate.finished(("RESTORED", "s1", 7))
    assert gate.running is None
    assert gate.request("s1", "k1", 9.0) == Answer(("RESTORED", "s1", 7))
    assert gate.running is None
    # Without a key (or with a new one) it is an explicit new request: a new restore.
    assert gate.request("s1", "", 10.0) == Start("s1", "", 10.0)
    gate.finished("again")
    assert gate.request("s1", "k2", 11.0) == Start("s1", "k2", 11.0)


def test_a_failed_restore_answers_its_retry_with_the_failure() -> None:
    gate = RestoreGate()
    gate.request("s1", "k1", 0.0)
    gate.finished(("FAILED", "node n2 unreachable"))
    assert gate.request("s1", "k1", 1.0) == Answer(("FAILED", "node n2 unreachable"))


def test_a_key_reused_for_another_snapshot_is_refused_while_running_and_after() -> None:
    gate = RestoreGate()
    gate.request("s1", "k1", 0.0)
    refused = gate.request("s2", "k1", 1.0)
    assert isinstance(refused, Refuse) and refused.code == "INVALID_ARGUMENT"
    assert "k1" in refused.message and "s1" in refused.message and "s2" in refused.message
    gate.finished("done")
    refused = gate.request("s2", "k1", 2.0)
    assert isinstance(refused, Refuse) and refused.code == "INVALID_ARGUMENT"
    assert gate.running is None


def test_a_key_too_long_is_refused_before_anything_else() -> None:
    gate = RestoreGate()
    long_key = "x" * (MAX_KEY_BYTES + 1)
    refused = gate.request("s1", long_key, 0.0)
    assert refused == Refuse("INVALID_ARGUMENT", f"request_id is longer than {MAX_KEY_BYTES} bytes")
    assert gate.running is None
    assert isinstance(gate.request("s1", "x" * MAX_KEY_BYTES, 0.0), Start)  # the limit itself is fine
    # Bytes, not characters: 43 three-byte characters are 129 bytes.
    assert key_problem("€" * 43) is not None and key_problem("€" * 42) is None
    assert isinstance(RestoreGate(max_key_bytes=4).request("s1", "abcde", 0.0), Refuse)


def test_an_unrestorable_snapshot_is_refused_with_its_problem_and_claims_nothing() -> None:
    gate = RestoreGate()
    refused = gate.request("s1", "k1", 0.0, problem="snapshot s1 is FAILED, not COMPLETE")
    assert refused == Refuse("FAILED_PRECONDITION", "snapshot s1 is FAILED, not COMPLETE")
    assert gate.running is None
    # The key was not used up by the refusal: it may start a restore of another snapshot.
    assert gate.request("s2", "k1", 1.0) == Start("s2", "k1", 1.0)


def test_a_keyed_retry_is_answered_even_if_the_snapshot_later_cannot_be_restored() -> None:
    gate = RestoreGate()
    gate.request("s1", "k1", 0.0)
    gate.finished("restored s1")
    assert gate.request("s1", "k1", 1.0, problem="snapshot s1 was deleted") == Answer("restored s1")


def test_finished_without_a_running_restore_changes_nothing() -> None:
    gate = RestoreGate()
    gate.finished("stray")
    assert gate.running is None
    assert gate.request("s1", "", 0.0) == Start("s1", "", 0.0)


def test_taken_back_resumes_a_running_restore_after_a_controller_restart() -> None:
    gate = RestoreGate()
    gate.taken_back("s3", "k3", None, running=True)
    assert gate.running == Start("s3", "k3", 0.0)
    assert gate.request("s3", "k3", 1.0) == Join("s3")
    assert gate.request("s4", "k4", 1.0) == Busy("s3")
    gate.finished("restored s3")
    assert gate.request("s3", "k3", 2.0) == Answer("restored s3")


def test_taken_back_answers_a_finished_restore_and_refuses_its_key_elsewhere() -> None:
    gate = RestoreGate()
    gate.taken_back("s3", "k3", "restored s3", running=False)
    assert gate.running is None
    assert gate.request("s3", "k3", 1.0) == Answer("restored s3")
    assert isinstance(gate.request("s4", "k3", 1.0), Refuse)
    assert gate.request("s4", "k4", 1.0) == Start("s4", "k4", 1.0)


def test_the_key_window_keeps_the_newest_keys_and_forgets_the_oldest_first() -> None:
    gate = RestoreGate(keys_kept=3)
    for i in range(1, 5):
        gate.request(f"s{i}", f"k{i}", float(i))
        gate.finished(f"restored s{i}")
    assert len(gate._by_key) == 3
    # k1 is forgotten: a retry is a new request (a new restore), as documented for old keys.
    assert gate.request("s1", "k1", 9.0) == Start("s1", "k1", 9.0)
    gate.finished("restored s1 again")
    # k2 was the oldest left, and it went when k1 came back; k3 and k4 still answer.
    assert gate.request("s2", "k2", 10.0) == Start("s2", "k2", 10.0)
    gate.finished("restored s2 again")
    assert gate.request("s4", "k4", 11.0) == Answer("restored s4")
    assert len(gate._by_key) == 3


def test_a_repeated_key_moves_to_the_newest_end_of_the_window() -> None:
    gate = RestoreGate(keys_kept=2)
    gate.taken_back("s1", "k1", "r1", running=False)
    gate.taken_back("s2", "k2", "r2", running=False)
    gate.taken_back("s1", "k1", "r1", running=False)  # k1 again: now the newest
    gate.taken_back("s3", "k3", "r3", running=False)  # pushes out k2, not k1
    assert gate.request("s1", "k1", 0.0) == Answer("r1")
    assert gate.request("s2", "k2", 0.0) == Start("s2", "k2", 0.0)


@pytest.mark.parametrize("key", ["", "k1"])
def test_only_one_of_a_burst_of_calls_starts(key: str) -> None:
    gate = RestoreGate()
    decisions = [gate.request(sid, f"{key}{n}" if key else "", 0.0) for n, sid in enumerate(["s1", "s2", "s1", "s3"])]
    assert [type(d) for d in decisions] == [Start, Busy, Join, Busy]


def test_a_key_that_joins_a_running_restore_is_answered_by_it_and_never_starts_another() -> None:
    """Issue 33, bug 1: K2 joined K1's restore of s1; a retry of K2 after the restore
    ended used to start a second rollback (K2 had never been remembered)."""
    gate = RestoreGate()
    assert gate.request("s1", "k1", 0.0) == Start("s1", "k1", 0.0)
    assert gate.request("s1", "k2", 1.0) == Join("s1", "k2")  # a new key: to be journaled
    assert gate.request("s1", "k2", 2.0) == Join("s1")  # its retry while it runs: already known
    gate.finished("restored s1")
    assert gate.request("s1", "k2", 3.0) == Answer("restored s1")  # not a second Start
    assert gate.running is None
    refused = gate.request("s2", "k2", 4.0)  # a joined key belongs to that restore, like the claim's
    assert isinstance(refused, Refuse) and refused.code == "INVALID_ARGUMENT" and "s1" in refused.message


def test_a_joined_key_is_answered_after_a_restart_whether_the_restore_ran_or_ended() -> None:
    gate = RestoreGate()
    gate.taken_back("s1", "k1", "restored s1", running=False, joined=["k2"])
    gate.taken_back("s3", "k3", None, running=True, joined=["k4", "", "k3"])  # blanks and repeats are harmless
    assert gate.running == Start("s3", "k3", 0.0) and gate.running_keys == ["k3", "k4"]
    assert gate.request("s1", "k2", 1.0) == Answer("restored s1")
    assert gate.request("s3", "k4", 1.0) == Join("s3")
    gate.finished("restored s3")
    assert gate.request("s3", "k4", 2.0) == Answer("restored s3")
    assert gate.request("s3", "k3", 2.0) == Answer("restored s3")


def test_joined_keys_take_their_place_in_the_window() -> None:
    gate = RestoreGate(keys_kept=2)
    gate.request("s1", "k1", 0.0)
    gate.request("s1", "k2", 0.0)
    gate.request("s1", "k3", 0.0)  # k1 goes: the window holds the two newest keys
    gate.finished("r1")
    assert gate.request("s1", "k3", 1.0) == Answer("r1")
    assert gate.request("s1", "k2", 1.0) == Answer("r1")
    assert gate.request("s1", "k1", 1.0) == Start("s1", "k1", 1.0)


def test_a_window_of_no_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="keys_kept must be at least 1, got 0"):
        RestoreGate(keys_kept=0)


def test_a_missing_snapshot_is_not_found_after_the_key_checks_and_a_keyed_retry_still_gets_its_answer() -> None:
    gate = RestoreGate()
    long_key = "x" * (MAX_KEY_BYTES + 1)
    assert gate.request("gone", long_key, 0.0, missing=True).code == "INVALID_ARGUMENT"  # the key first
    assert gate.request("gone", "k0", 0.0, missing=True) == Refuse("NOT_FOUND", "no snapshot 'gone'")
    gate.request("s1", "k1", 0.0)
    gate.finished("restored s1")
    # s1's file was deleted since (retention): a retry of its key still gets its answer
    assert gate.request("s1", "k1", 1.0, missing=True) == Answer("restored s1")
    assert gate.request("s2", "k1", 1.0, missing=True).code == "INVALID_ARGUMENT"  # k1 is s1's
    assert gate.request("s1", "", 1.0, missing=True).code == "NOT_FOUND"
    assert gate.running is None


def test_a_refusal_raised_keeps_its_status_and_words() -> None:
    from snapmesh.protocol.controller.restoregate import Refused

    busy = Refused(Busy("s1"))
    assert (busy.code, str(busy)) == ("FAILED_PRECONDITION", "a restore to s1 is running")
    refused = Refused(Refuse("NOT_FOUND", "no snapshot s9"))
    assert (refused.code, str(refused)) == ("NOT_FOUND", "no snapshot s9")
