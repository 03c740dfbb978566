"""The checkers' indexes (snapmesh/checking/trace.py `_ChannelLine` and `trace_logs`,
the trace as logs; snapmesh/checking/cut.py `LogIndex`) answer each snapshot's questions
without a scan of the whole trace; here each answer is compared with the definition,
computed by brute force, on random channels: FIFO or not, some transfers never
received, cuts anywhere (or none). A failure prints the seed that reproduces it."""

from __future__ import annotations

import random

import pytest

from snapmesh.checking import cut
from snapmesh.checking.trace import INFINITY, _ChannelLine, _Send, trace_logs
import snapmesh.bank.cut as bank_cut
from snapmesh.bank.trace import BANK
from snapmesh.bank import v1records
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
    sent, _ = _channel(rng)
    line = _ChannelLine(sent)
    for _ in range(10):
        low, high = sorted((_cut(rng), _cut(rng)))
        assert list(line.sent_between(low, high)) == [i for i, (_, s) in enumerate(sent) if low < s.pos < high], (
            f"seed {seed}"
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_the_trace_as_logs_gives_the_balance_and_seqs_before_each_cut(seed: int) -> None:
    """`trace_logs`: a node's balance at a cut is its initial balance plus the moves
    at positions before it; a channel's sends are seqs 1..n in position order and a
    receive takes its send's seq, so the highest seq before a cut counts the sends
    (or receives) before it."""
    rng = random.Random(seed)
    sent, receives = _channel(rng)
    at_a = [(s.pos, "send", {"dst": "b", "msg": m, "amount": s.content}) for m, s in sent]
    amount = {m: s.content for m, s in sent}
    at_b = [(pos, "receive", {"src": "a", "msg": m, "amount": amount[m]}) for m, (_, pos, _) in receives.items()]
    cuts = {}
    for node, history in (("a", at_a), ("b", at_b)):
        taken = {pos for pos, _, _ in history}
        for k in range(rng.randint(0, 3)):
            pos = rng.choice([p for p in range(0, 202) if p not in taken])
            taken.add(pos)
            history.append((pos, "cut", {"snapshot": f"s{k}", "balance": 0}))
            cuts[(f"s{k}", node)] = pos
        history.sort(key=lambda item: item[0])
    index, seq_of = trace_logs({"a": 500, "b": 7}, {"a": at_a, "b": at_b}, {sid for sid, _ in cuts}, BANK)
    assert [seq_of[(("a", "b"), m)] for m, _ in sent] == list(range(1, len(sent) + 1)), f"seed {seed}"
    for (sid, node), pos in cuts.items():
        state = index.cut(sid, node)
        if node == "a":
            before = [s for _, s in sent if s.pos < pos]
            assert index.reading.state(node, state) == 500 - sum(s.content for s in before), f"seed {seed}"
            assert state.links.get(("out", "b"), (0, 0, 0))[:2] == (len(before), len(before)), f"seed {seed}"
        else:
            got = [m for m, (_, p, _) in receives.items() if p < pos]
            assert index.reading.state(node, state) == 7 + sum(amount[m] for m in got), f"seed {seed}"
            top = max((seq_of[(("a", "b"), m)] for m in got), default=0)
            assert state.links.get(("in", "a"), (0, 0, 0))[:2] == (len(got), top), f"seed {seed}"


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
        a_log: list = [v1records.Init(lsn=1, tally=1000)]
        for i, (msg, send) in enumerate(sent):
            if i == a_cut:
                a_log.append(wal.Cut(lsn=len(a_log) + 1, snapshot_id="s"))
            a_log.append(v1records.Send(lsn=len(a_log) + 1, msg_id=msg, src="a", dst="b", seq=seq_of[msg], tally=send.content))
        if a_cut == len(sent):
            a_log.append(wal.Cut(lsn=len(a_log) + 1, snapshot_id="s"))
        b_log: list = [wal.Init(lsn=1)]
        got = sorted(receives, key=lambda m: receives[m][1])
        for i, msg in enumerate(got):
            if i == b_cut:
                b_log.append(wal.Cut(lsn=len(b_log) + 1, snapshot_id="s"))
            tally = dict(sent)[msg].content
            b_log.append(v1records.Recv(lsn=len(b_log) + 1, msg_id=msg, src="a", dst="b", seq=seq_of[msg], tally=tally))
        if b_cut == len(got):
            b_log.append(wal.Cut(lsn=len(b_log) + 1, snapshot_id="s"))
        verdict = cut.check_snapshot(cut.LogIndex.of({"a": a_log, "b": b_log}, reading=bank_cut.Reading()),
                                     cut.Snapshot("s", [], []))
        before = set(got[:b_cut])
        expected = [(m, s.content, seq_of[m]) for m, s in sent[:a_cut] if m not in before]
        rules = {p.rule for p in verdict.problems}
        assert cut.RECEIVER_NOT_PREFIX in rules or verdict.expected.get(("a", "b"), []) == expected, f"seed {seed}"
