"""The checkers' indexes (snapmesh/checking/trace.py `_ChannelLine`, `_TraceIndex`;
snapmesh/checking/cut.py `LogIndex`) answer each snapshot's questions by binary search instead of a scan
of the whole trace; here each answer is compared with the definition, computed
by brute force, on random channels: FIFO or not, some transfers never received,
cuts anywhere (or none). A failure prints the seed that reproduces it."""

from __future__ import annotations

import random

import pytest

from snapmesh.checking import cut
from snapmesh.checking.trace import INFINITY, _ChannelLine, _Send, _TraceIndex
from snapmesh.protocol import wal

SEEDS = range(300)


def _channel(rng: random.Random) -> tuple[list[tuple[str, _Send]], dict]:
    n = rng.randint(0, 25)
    positions = sorted(rng.sample(range(1, 200), n))
    sent = [(f"m{i}", _Send(("a", "b"), pos, rng.randint(1, 9))) for i, pos in enumerate(positions)]
    received = [msg for msg, _ in sent[: rng.randint(0, n)]]
    if rng.random() < 0.3:
        rng.shuffle(received)  # not FIFO
    if received and rng.random() < 0.2:
        received.pop(rng.randrange(len(received)))  # a hole
    recv_positions = sorted(rng.sample(range(1, 200), len(received)))
    receives = {msg: (("a", "b"), pos, 0) for msg, pos in zip(received, recv_positions, strict=True)}
    return sent, receives


def _cut(rng: random.Random) -> float:
    return INFINITY if rng.random() < 0.1 else rng.randint(0, 201)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_channel_line_answers_as_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    sent, receives = _channel(rng)
    line = _ChannelLine(sent, receives)
    recv_pos = {msg: receives[msg][1] for msg in receives}
    for _ in range(10):
        sender_cut, receiver_cut = _cut(rng), _cut(rng)
        expected = [(m, s.amount) for m, s in sent if s.pos <= sender_cut and recv_pos.get(m, -1) > receiver_cut]
        assert line.in_flight(sender_cut, receiver_cut) == expected, f"seed {seed}"
        start = rng.randint(0, len(sent))
        late = [i for i in range(start, len(sent)) if recv_pos.get(sent[i][0], INFINITY) < receiver_cut]
        assert line.received_before_from(start, receiver_cut) == late, f"seed {seed}"
        low, high = sorted((_cut(rng), _cut(rng)))
        assert list(line.sent_between(low, high)) == [i for i, (_, s) in enumerate(sent) if low < s.pos < high], (
            f"seed {seed}"
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_a_balance_before_a_cut_is_the_sum_of_the_moves_before_it(seed: int) -> None:
    rng = random.Random(seed)
    history = []
    for pos in sorted(rng.sample(range(1, 100), rng.randint(0, 30))):
        kind = rng.choice(["send", "receive", "cut", "marker_sent"])
        history.append((pos, kind, {"amount": rng.randint(1, 9)}))
    index = _TraceIndex(
        nodes=["a"], channels=[], initial={"a": 50}, sends={}, receives={}, at_node={"a": history}, cuts={},
        markers_sent={}, markers_received={}, recorded={}, completed={},
    )
    for pos in range(0, 101, 7):
        moves = [(-1 if k == "send" else 1) * e["amount"] for p, k, e in history if p < pos and k in ("send", "receive")]
        assert index.balance_before("a", pos) == 50 + sum(moves), f"seed {seed}"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_expected_in_flight_is_sent_before_the_cut_minus_received_before_the_cut(seed: int) -> None:
    """`cut.check_snapshot` answers "in flight" as the seq range (b, a]; unless the
    receiver's seqs before its cut are not 1..n (a rule of their own, reported),
    that is the definition: sent before the sender's cut minus received before the
    receiver's cut, in seq order."""
    rng = random.Random(seed)
    sent, receives = _channel(rng)
    seq_of = {msg: i + 1 for i, (msg, _) in enumerate(sent)}
    for _ in range(10):
        a_cut, b_cut = rng.randint(0, len(sent)), rng.randint(0, len(receives))
        a_log: list = [wal.Init(lsn=1, balance=1000)]
        for i, (msg, send) in enumerate(sent):
            if i == a_cut:
                a_log.append(wal.Cut(lsn=len(a_log) + 1, snapshot_id="s", balance=0))
            a_log.append(wal.Send(lsn=len(a_log) + 1, msg_id=msg, src="a", dst="b", seq=seq_of[msg], amount=send.amount))
        if a_cut == len(sent):
            a_log.append(wal.Cut(lsn=len(a_log) + 1, snapshot_id="s", balance=0))
        b_log: list = [wal.Init(lsn=1, balance=0)]
        got = sorted(receives, key=lambda m: receives[m][1])
        for i, msg in enumerate(got):
            if i == b_cut:
                b_log.append(wal.Cut(lsn=len(b_log) + 1, snapshot_id="s", balance=0))
            amount = dict(sent)[msg].amount
            b_log.append(wal.Recv(lsn=len(b_log) + 1, msg_id=msg, src="a", dst="b", seq=seq_of[msg], amount=amount))
        if b_cut == len(got):
            b_log.append(wal.Cut(lsn=len(b_log) + 1, snapshot_id="s", balance=0))
        verdict = cut.check_snapshot(cut.LogIndex.of({"a": a_log, "b": b_log}), cut.Snapshot("s", [], []))
        before = set(got[:b_cut])
        expected = [(m, s.amount, seq_of[m]) for m, s in sent[:a_cut] if m not in before]
        rules = {p.rule for p in verdict.problems}
        assert cut.RECEIVER_NOT_PREFIX in rules or verdict.expected.get(("a", "b"), []) == expected, f"seed {seed}"
