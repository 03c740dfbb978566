"""The controller machine's start-up (snapmesh/protocol/controller/replay.py): `loaded`, then
`replayed`, decide what is filed again, what the journal forgets and what retention
retires; the engine only carries the effects out, in order.

The oracle is the shell's own start-up before issue 33 (services/controller/process.py's
`_recover`), transcribed here over the same pure pieces: the machine must ask for exactly
what that code did, in the same order.
"""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, Now
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

T0 = Now(mono=100.0, wall=1_700_000_000.0)
RESTART = Now(mono=500.0, wall=1_700_000_400.0)


def controller(keep: int = 0) -> M.Controller:
    return M.Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=5.0), keep=keep)


def part(sid: str, node: str, balance: int) -> pb.FullState:
    other = "b" if node == "a" else "a"
    return bank.report(sid, node, balance, channels=[pb.ChannelState(src=other, dst=node)])


def completed(sid: str) -> list[R.Record]:
    return [
        R.Started(snapshot_id=sid, initiator="a", wall=T0.wall),
        R.Reported(state=part(sid, "a", 60), wall=T0.wall),
        R.Reported(state=part(sid, "b", 40), wall=T0.wall),
        R.Finished(snapshot_id=sid, status=COMPLETE, reason="", wall=T0.wall),
    ]


def failed(sid: str) -> list[R.Record]:
    return [
        R.Started(snapshot_id=sid, initiator="b", wall=T0.wall),
        R.Finished(snapshot_id=sid, status=FAILED, reason="initiator b unreachable", wall=T0.wall),
    ]


def files_of(records: list[R.Record]) -> dict[str, pb.Snapshot]:
    """The snapshots these records finish, as their files hold them."""
    source = controller()
    source.replayed(records, T0)
    return {s.snapshot_id: s for s in source.all()}


# Filed before the crash: s1 (both files), s3 (its JSON export lost), s5 (only its JSON,
# from before the compact store). The journal still holds s1's dead records, finished s2
# and s4 that were not filed yet, and s6 still in progress.
ON_DISK = files_of([*completed("s1"), *completed("s3"), *failed("s5")])
MISSING = {"s3": (False, True), "s5": (True, False)}
JOURNAL = [
    *completed("s1"), *completed("s2"), *completed("s3"), *failed("s4"),
    R.Started(snapshot_id="s6", initiator="a", wall=T0.wall), R.Reported(state=part("s6", "a", 60), wall=T0.wall),
]


def started(keep: int) -> tuple[M.Controller, M.Replayed, list[M.Effect]]:
    m = controller(keep)
    m.loaded(ON_DISK.values(), missing=MISSING)
    replayed = m.replayed(JOURNAL, RESTART)
    return m, replayed, m.drain()


def test_a_restart_forgets_the_filed_files_the_missing_and_the_unfiled_then_retires_in_that_order() -> None:
    m, replayed, effects = started(keep=0)
    assert effects == [
        M.Forget("s1"),
        M.Forget("s3"), M.File(m.get("s3"), compact=False, json=True),  # S2: only the lost export
        M.Forget("s5"), M.File(m.get("s5"), compact=True, json=False),  # S2: only the compact file
        M.File(m.get("s2")), M.File(m.get("s4")),  # S3: finished in the journal, in its order
    ]
    assert replayed == M.Replayed(finished=["s2", "s4"], in_progress=["s6"], warnings=[], filed=["s1", "s3", "s5"])
    assert (m.get("s4").status, m.get("s6").status, m.next_deadline()) == (FAILED, pb.Snapshot.IN_PROGRESS, RESTART.mono + 5)


def test_what_retention_retires_at_a_restart_is_neither_filed_nor_forgotten_but_retired_last() -> None:
    m, replayed, effects = started(keep=1)
    retired = [e.snapshot_id for e in effects if isinstance(e, M.Retire)]
    assert retired == ["s1", "s2"] and all(isinstance(e, M.Retire) for e in effects[-len(retired):])
    touched = {e.snapshot_id if isinstance(e, M.Forget) else e.snapshot.snapshot_id for e in effects[:-len(retired)]}
    assert touched == {"s3", "s4", "s5"} and (replayed.finished, replayed.filed) == (["s4"], ["s3", "s5"])


def test_a_compact_file_written_is_an_event_whose_records_the_journal_then_forgets() -> None:
    m, _, _ = started(keep=0)
    m.filed("s2")
    assert m.drain() == [M.Forget("s2")] and m.get("s2").status == COMPLETE


def carried_out(effects: list[M.Effect]) -> list[tuple]:
    """What the engine's loop does with start-up's effects (services/controller/engine.py)."""
    done: list[tuple] = []
    for effect in effects:
        if isinstance(effect, M.File):
            done.append(("submit", effect.snapshot.snapshot_id, effect.compact, effect.json))
        elif isinstance(effect, M.Forget):
            done.append(("forget", effect.snapshot_id))
        elif isinstance(effect, M.Retire):
            done += [("forget", effect.snapshot_id), ("discard", effect.snapshot_id)]
        else:  # pragma: no cover
            raise TypeError(effect)
    return done


def before_issue_33(keep: int) -> tuple[list[tuple], M.Controller]:
    """process.py's start-up before the machine decided it: the files restored into the
    tracker, the replay told what to skip, then `_recover`'s calls, then the engine's
    first step carrying out the replay's Retire effects."""
    m = controller(keep)
    for snapshot in ON_DISK.values():
        m.tracker.restore(snapshot)
    filed = set(ON_DISK)
    finished, _ = R.replay(JOURNAL, m.tracker, RESTART, skip=filed)
    restores, _ = R.restores(JOURNAL)
    m.taken_back(restores)
    m.tracker.restarted(RESTART)
    retired = m.tracker.retired(keep) if keep else []
    done: list[tuple] = []
    for sid in sorted(filed - set(retired)):
        done.append(("forget", sid))
        compact, json = MISSING.get(sid, (False, False))
        if compact or json:
            done.append(("submit", sid, compact, json))
    done += [("submit", sid, True, True) for sid in finished if sid not in retired]
    done += [step for sid in retired for step in (("forget", sid), ("discard", sid))]
    return done, m


@pytest.mark.parametrize("keep", [0, 1, 2, 3])
def test_loaded_then_replayed_asks_for_what_the_shell_did_before(keep: int) -> None:
    m, _, effects = started(keep)
    expected, old = before_issue_33(keep)
    assert carried_out(effects) == expected
    assert m.all() == old.all() and m.next_deadline() == old.next_deadline()
