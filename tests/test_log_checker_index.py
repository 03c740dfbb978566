"""The log checker's indexes (snapmesh/checking/logcheck.py `_ChannelLine`, `_TraceIndex`,
`_LogIndex`) answer each snapshot's questions by binary search instead of a scan
of the whole trace; here each answer is compared with the definition, computed
by brute force, on random channels: FIFO or not, some transfers never received,
cuts anywhere (or none). A failure prints the seed that reproduces it."""

from __future__ import annotations

import random

import pytest

from snapmesh.checking.logcheck import INFINITY, _ChannelLine, _LogIndex, _Send, _TraceIndex

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
def test_the_log_index_in_flight_is_sent_before_the_cut_minus_received_before_the_cut(seed: int) -> None:
    rng = random.Random(seed)
    sent, receives = _channel(rng)
    logs = {"a": [{"lsn": 1, "kind": "init", "balance": 100}], "b": [{"lsn": 1, "kind": "init", "balance": 0}]}
    for msg, send in sent:
        logs["a"].append({"lsn": send.pos + 1, "kind": "send", "dst": "b", "msg_id": msg, "amount": send.amount,
                          "seq": int(msg[1:]) + 1})
    for msg, (_, pos, _) in sorted(receives.items(), key=lambda kv: kv[1][1]):
        logs["b"].append({"lsn": pos + 1, "kind": "recv", "src": "a", "msg_id": msg, "amount": 1})
    index = _LogIndex(logs)
    for _ in range(10):
        sender_cut, receiver_cut = rng.randint(0, 202), rng.randint(0, 202)
        got = {m for m, (_, pos, _) in receives.items() if pos + 1 < receiver_cut}
        expected = [(m, s.amount, int(m[1:]) + 1) for m, s in sent if s.pos + 1 < sender_cut and m not in got]
        assert index.in_flight(("a", "b"), sender_cut, receiver_cut) == expected, f"seed {seed}"
