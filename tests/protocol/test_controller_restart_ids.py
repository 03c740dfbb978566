"""A restarted controller whose wall clock is behind: its ids keep increasing (the
machine's I1, snapshot_ids.py) and `--keep` never retires the snapshot a COMPLETE
just finished (K2, retention.py). Before, the id clock started from zero in every
process: the next id sorted before the older ones, and with keep 2 it was retired,
its files deleted, the moment it completed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.retention import Retention
from snapmesh.protocol.controller.snapshot_ids import StartClock, new_snapshot_id, snapshot_id_micros
from snapmesh.protocol.controller.tracker import COMPLETE, Now
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

T = Now(mono=100.0, wall=1_800_000_000.0)  # the first process's clock
BEHIND = Now(mono=5.0, wall=T.wall - 3_600.0)  # the restarted one's: an hour behind


def controller(keep: int) -> M.Controller:
    return M.Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=5.0), keep=keep)


def part(sid: str, node: str, balance: int) -> pb.FullState:
    other = "b" if node == "a" else "a"
    return bank.report(sid, node, balance, channels=[pb.ChannelState(src=other, dst=node)])


def finish(m: M.Controller, sid: str, now: Now) -> list[M.Effect]:
    """Both nodes report `sid` (started): it completes; the effects of the last report."""
    m.reported(part(sid, "a", 60), now)
    m.drain()
    m.reported(part(sid, "b", 40), now)
    return m.drain()


def run(m: M.Controller, now: Now, entropy: bytes, journal: list[R.Record]) -> str:
    """A client's snapshot, started and completed at `now`; its records appended to `journal`."""
    sid = m.start("a", now, entropy).snapshot_id
    effects = m.drain() + finish(m, sid, now)
    journal += [e.record for e in effects if isinstance(e, M.Journal)]
    return sid


def first_process(keep: int) -> tuple[list[str], list[R.Record]]:
    """Three snapshots one second apart at T: the journal the restart reads back."""
    m, journal = controller(keep), []
    ids = [run(m, Now(T.mono + i, T.wall + i), bytes([i, 0, 0, 0, 0, 0, 0, 0]), journal) for i in range(3)]
    return ids, journal


def test_after_a_restart_with_the_clock_behind_the_next_id_sorts_after_the_journals() -> None:
    ids, journal = first_process(keep=0)
    again = controller(keep=0)
    again.replayed(journal, BEHIND)
    again.drain()
    # a burst at the restart: every id after the newest before it, each after the last, whatever the suffix
    started = [again.start("a", BEHIND, bytes([255 - i, 0, 0, 0, 0, 0, 0, 0])).snapshot_id for i in range(3)]
    assert ids == sorted(ids) and started == sorted(started) and started[0] > ids[-1]
    assert snapshot_id_micros(started[0]) == snapshot_id_micros(ids[-1]) + 1  # the newest's time, a microsecond on
    assert again.ids() == sorted([*ids, *started])


def test_the_ids_loaded_from_the_files_count_too() -> None:
    source, journal = controller(keep=0), []
    newest = [run(source, Now(T.mono + i, T.wall + i), bytes(8), journal) for i in range(2)][-1]
    again = controller(keep=0)
    again.loaded([source.get(newest)])  # filed: its records are gone from the journal
    again.replayed([], BEHIND)
    assert again.start("a", BEHIND, bytes(8)).snapshot_id > newest


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_restart_with_the_clock_behind_never_retires_the_snapshot_it_completes(keep: int) -> None:
    ids, journal = first_process(keep)
    again = controller(keep)
    again.replayed(journal, BEHIND)
    again.drain()
    newest = run(again, BEHIND, bytes(8), [])
    assert newest not in {e.snapshot_id for e in again.drain() if isinstance(e, M.Retire)}
    assert again.status(newest) == COMPLETE and again.ids()[-1] == newest
    later = run(again, Now(BEHIND.mono + 1, BEHIND.wall + 1), bytes(8), [])
    assert again.ids()[-2:] == [newest, later]  # and the next one keeps it, as the newest but one


def test_a_complete_never_retires_the_snapshot_it_completed_whatever_its_id() -> None:
    """K2 alone: ids given by the caller (as the fuzzer's, or another controller's) that
    do not sort in start order; the late one goes only at a later COMPLETE."""
    def stamp(seconds: float) -> str:
        return new_snapshot_id(T.wall + seconds, b"\x01")

    m, retired = controller(keep=2), []
    for sid in (stamp(10), stamp(20), stamp(30), stamp(1), stamp(40)):  # stamp(1) starts last, sorts first
        m.trigger(sid, "a", T)
        m.drain()
        effects = finish(m, sid, T)
        assert M.Retire(sid) not in effects, f"{sid} retired by its own completion"
        retired += [e.snapshot_id for e in effects if isinstance(e, M.Retire)]
    assert retired == [stamp(10), stamp(1), stamp(20)]  # stamp(1) went at stamp(40)'s COMPLETE


def test_retention_protects_several_ids_and_lets_each_go_once_unprotected() -> None:
    r = Retention()
    for sid in ("a", "b", "c", "d", "e"):
        r.add(sid, complete=True)
    assert r.retire(2, ("a", "c")) == ["b"]
    assert r.retire(2, ("c",)) == ["a"]
    assert r.retire(2) == ["c"] and r.retire(2) == []


def test_an_id_reads_back_as_the_time_it_names() -> None:
    for micros in (0, 1, 951_782_400_123_456, 1_767_268_800_000_000, 4_107_542_399_999_999):  # 2000-02-29, 2100
        sid = new_snapshot_id(micros / 1_000_000, b"\xab\xcd")
        assert snapshot_id_micros(sid) == micros
        assert sid.startswith((datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros))
                              .strftime("%Y%m%dT%H%M%S.%f"))
    assert snapshot_id_micros("s1") is None and snapshot_id_micros("../20260101T120000.000000Z-1a") is None


def test_the_start_clock_continues_after_the_ids_it_is_given_and_ignores_other_text() -> None:
    clock = StartClock()
    clock.after(["s9", new_snapshot_id(T.wall, b"\x01"), "not an id"])
    sid, wall = clock.start(BEHIND.wall, b"\x02")
    assert sid > new_snapshot_id(T.wall, b"\xff") and wall == pytest.approx(T.wall + 1e-6)
    clock.after([new_snapshot_id(BEHIND.wall, b"\x01")])  # an older id moves nothing back
    assert clock.start(BEHIND.wall, b"\x02")[0] > sid
