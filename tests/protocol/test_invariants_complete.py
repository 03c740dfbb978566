"""The fault fuzzer's judge on a COMPLETE snapshot (snapmesh/sim/invariants.py
`check_complete`) asks snapmesh/checking/cut.py over payloads (`cut.Payloads`, A2 of
snapmesh/sim/apps.py): an honest snapshot passes, and a state not the logs', a dropped
in-flight message, a payload not the sender's and a snapshot of the wrong epoch fail
with the judge's words. Every case runs an app (the bank's too): no tally is read."""

from __future__ import annotations

import re

import pytest

from snapmesh.app import App
from snapmesh.protocol import wal
from snapmesh.protocol.node import core
from snapmesh.protocol.node.steps import state_digest
from snapmesh.sim import apps
from snapmesh.sim.invariants import Checker

# An app's run (A2): p1 sends b"hi" to p2 before its cut; p2 cuts before it arrives.
APP_LOGS = {
    "p1": [wal.Init(lsn=1),
           wal.Send(lsn=2, msg_id="p1:p2:1", src="p1", dst="p2", seq=1, payload=wal.pack(b"hi")),
           wal.Cut(lsn=3, snapshot_id="s1", digest=state_digest(b"one"))],
    "p2": [wal.Init(lsn=1), wal.Cut(lsn=2, snapshot_id="s1", digest=state_digest(b"two")),
           wal.Recv(lsn=3, msg_id="p1:p2:1", src="p1", dst="p2", seq=1, payload=wal.pack(b"hi"))],
}
NO_INVARIANTS = App(name="no-invariants", new=lambda info: None)


def app_reports(p1: bytes = b"one", payload: bytes | None = b"hi") -> dict:
    """The parts p1 and p2 report; `payload` None: the in-flight message left out."""
    sent = () if payload is None else (core.Transfer(msg_id="p1:p2:1", seq=1, payload=payload),)
    return {
        "p1": core.FullState(node_id="p1", snapshot_id="s1", channels={"p2": ()}, state=p1),
        "p2": core.FullState(node_id="p2", snapshot_id="s1", channels={"p1": sent}, state=b"two"),
    }


def checker() -> Checker:
    judge = Checker(["p1", "p2"], [("p1", "p2"), ("p2", "p1")], ttl=10.0, app=NO_INVARIANTS)
    judge.fold.apply = lambda node, record: None  # no machine to fold: A6 is not what is judged here
    for node, log in APP_LOGS.items():
        judge.logs[node] = list(log)
    return judge


def test_an_honest_snapshot_passes_the_judge() -> None:
    checker().check_complete("s1", app_reports())


@pytest.mark.parametrize(
    ("lie", "words"),
    [
        (app_reports(p1=b"other"), "p1 reported a state whose digest is not its cut record's"),
        (app_reports(payload=None), "p1->p2 recorded seqs [], the logs say [1]"),
    ],
)
def test_a_lie_is_caught_in_the_judges_words(lie: dict, words: str) -> None:
    with pytest.raises(apps.AppViolation, match=re.escape(words)):
        checker().check_complete("s1", lie)


def test_a_snapshot_is_judged_against_the_log_of_its_epoch() -> None:
    with pytest.raises(apps.AppViolation, match="UNKNOWN_NODE"):
        checker().check_complete("s1", app_reports(), epoch=2)


def a2(reports: dict) -> None:
    apps.check_complete(NO_INVARIANTS, "s1", reports, [("p1", "p2"), ("p2", "p1")], {}, APP_LOGS)


def test_an_honest_app_snapshot_passes_a2() -> None:
    a2(app_reports())


@pytest.mark.parametrize(
    ("lie", "words"),
    [
        (app_reports(p1=b"other"), "p1 reported a state whose digest is not its cut record's"),
        (app_reports(payload=b"ho"), "p1->p2 seq 1 recorded payload b'ho', the sender logged 'aGk='"),
    ],
)
def test_an_app_snapshots_lie_is_caught_by_a2_through_cut(lie: dict, words: str) -> None:
    with pytest.raises(apps.AppViolation, match=re.escape(words)):
        a2(lie)
