"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

from snapmesh.reconcile.schema import SNAPSHOT
from support.spark_fixtures import spark  # noqa: F401
import json
from pathlib import Path
from snapmesh.reconcile.schema import segment_file_name


IDS = ("ok", "bal", "miss", "extra", "node")


def send(msg: str, src: str, dst: str, seq: int, amount: int) -> dict:
    return dict(kind="send", msg_id=msg, src=src, dst=dst, seq=seq, amount=amount)


def recv(msg: str, src: str, dst: str, seq: int, amount: int) -> dict:
    return dict(kind="recv", msg_id=msg, src=src, dst=dst, seq=seq, amount=amount)


def marker(kind: str, src: str, dst: str, seq: int) -> dict:
    return dict(kind=kind, snapshot_id="ok", src=src, dst=dst, seq=seq)


def cuts(balance: int) -> list[dict]:
    return [dict(kind="cut", snapshot_id=sid, balance=balance) for sid in IDS]


LOGS: dict[str, list[dict]] = {
    "p1": [
        dict(kind="init", balance=100),
        send("p1:p2:1", "p1", "p2", 1, 10),
        *cuts(90),
        marker("marker_sent", "p1", "p2", 2),
        marker("marker_sent", "p1", "p3", 1),
        send("p1:p2:3", "p1", "p2", 3, 5),  # after p1's cut: not in flight
        marker("marker_recv", "p2", "p1", 1),
        marker("marker_recv", "p3", "p1", 1),
    ],
    "p2": [
        dict(kind="init", balance=100),
        marker("marker_recv", "p3", "p2", 1),
        *cuts(100),
        marker("marker_sent", "p2", "p1", 1),
        marker("marker_sent", "p2", "p3", 1),
        recv("p1:p2:1", "p1", "p2", 1, 10),  # after p2's cut: in flight
        marker("marker_recv", "p1", "p2", 2),
        dict(kind="restart"),  # unknown kinds are ignored
        recv("p1:p2:3", "p1", "p2", 3, 5),
    ],
    "p3": [
        dict(kind="init", balance=100),
        marker("marker_recv", "p1", "p3", 1),
        *cuts(100),
        marker("marker_sent", "p3", "p1", 1),
        marker("marker_sent", "p3", "p2", 1),
        marker("marker_recv", "p2", "p3", 1),
    ],
}


def snapshot_doc(
    sid: str, order: int, *, balances=None, p1_p2=None, status="COMPLETE", reason="", epoch=None
) -> tuple:
    balances = {"p1": 90, "p2": 100, "p3": 100} if balances is None else balances
    p1_p2 = [("p1:p2:1", 10, 1)] if p1_p2 is None else p1_p2
    channels = [
        (src, dst, [(m, str(a), str(q)) for m, a, q in (p1_p2 if (src, dst) == ("p1", "p2") else [])])
        for src in ("p1", "p2", "p3")
        for dst in ("p1", "p2", "p3")
        if src != dst
    ]
    doc = dict(
        snapshot_id=sid,
        initiator="p1",
        status=status,
        reason=reason,
        nodes=[(n, str(b)) for n, b in balances.items()] if status == "COMPLETE" else [],
        channels=channels if status == "COMPLETE" else [],
        total="300",
        conserved=True,
        expected_total="300",
        started_at=f"2026-11-21T20:00:0{order}.000Z",
        finished_at=None,
        epoch=epoch,
    )
    return tuple(doc.get(name) for name in SNAPSHOT.fieldNames())


def restore(balance: int, deliveries: int) -> dict:
    return dict(kind="restore", snapshot_id="ok", epoch=2, balance=balance, deliveries=deliveries)


REPLAY = dict(kind="replay", snapshot_id="ok", msg_id="p1:p2:1", src="p1", dst="p2", seq=1, amount=10)


def two_epochs(*, p3_restored_to: int = 100, replay: bool = True) -> dict[str, list[dict]]:
    epoch1 = {n: [r for r in rs if r["kind"] != "cut" or r["snapshot_id"] == "ok"] for n, rs in LOGS.items()}
    e2 = lambda b: dict(kind="cut", snapshot_id="e2", balance=b)  # noqa: E731
    return {
        "p1": epoch1["p1"] + [restore(90, 0), e2(90), send("p1:p2:1", "p1", "p2", 1, 7)],
        "p2": epoch1["p2"] + [restore(100, 1), *([REPLAY] if replay else []), e2(110),
                              recv("p1:p2:1", "p1", "p2", 1, 7)],
        "p3": epoch1["p3"] + [restore(p3_restored_to, 0), e2(100)],
    }


SIZE = dict(nodes=3, transfers=300, snapshots=3, seed=11)


CUTS = (70, 140)  # each node's log: [1, 70) [70, 140) sealed, the rest active


def split_logs(data: Path, cuts: tuple[int, ...] = CUTS) -> None:
    """Seal each active <node>.log.jsonl up to each lsn of ``cuts`` (the rest stays active)."""
    for log in sorted(data.glob("*.log.jsonl")):
        stem = log.name.removesuffix(".log.jsonl")
        lines = log.read_text().splitlines(keepends=True)
        first = json.loads(lines[0])["lsn"]
        starts = [first, *(c for c in cuts if first < c < first + len(lines))]
        for start, end in zip(starts, [*starts[1:], None], strict=True):
            if end is None:
                log.write_text("".join(lines[start - first :]))
            else:
                (data / segment_file_name(stem, start)).write_text("".join(lines[start - first : end - first]))
