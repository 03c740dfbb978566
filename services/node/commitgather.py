"""When a round of the transfer log waits for callers (services/node/translog.py's group commit).

Pure: the log tells it what happened (a caller came, a round started) and
the time, and asks how long the round may still wait. No asyncio here, so the
rule is tested as a table of events (tests/protocol/test_commit_gather.py).

The rule (Postgres' commit_siblings, with the siblings counted, not guessed):
- The log is *concurrent* for ROUNDS rounds after a round that two or more
  callers (`wait_durable`, i.e. clients' calls) waited for. Otherwise a round
  goes at once: a lone caller, a snapshot's hop, a frame at low load never
  waits for company.
- A concurrent round waits until as many callers have come as the most any
  of the last ROUNDS rounds had (`expected`). The most, not the last: with the
  last, one round cut short by the timer set the next one's target lower, and
  the callers split into cohorts that never met again (64 unary callers made
  10-11 records a commit, 16 per node being possible).
- Until its first caller comes, it waits (at most MAX_S): a concurrent
  round starts as soon as anything is buffered, usually a peer's message
  received right after the last round answered its callers, and those
  callers are still on their way back through the client. With a fixed
  5 ms timer such rounds went with the received records alone, and the
  callers made a round of their own: two fsyncs where one would do
  (measured, 64 unary callers on 4 nodes: 10-11 records a commit; with this
  rule 27, and 0.96 of raw gRPC's unary rate against 0.80, same machine).
- Once callers come, it stops waiting as soon as none has come for GAP_S:
  those that were coming have come. Under load a node takes each call after
  a few hundred microseconds of its own work, so the gap lets the round go
  on while they stream in, and no longer.
- It never waits more than MAX_S in all: a round's first caller may be
  slow, but nobody else waits long for it.
- A round that holds a snapshot's record (a cut, a marker sent or received,
  a report's save) waits for nobody (`hurry`): every hop of a snapshot
  waits for its round, and a snapshot's latency is the sum of its hops,
  while a client's call gains nothing from the marker's company.
Waiting never lets anything out early: the log makes a round durable before
anyone is answered, whatever this says.
"""

from __future__ import annotations

from collections import deque

ROUNDS = 8  # rounds the log stays concurrent after one with two or more callers
GAP_S = 0.003  # a concurrent round goes once no caller has come for this long
MAX_S = 0.02  # ... and in any case after this long


class CommitGather:
    """Counts the callers of the next round and says how long it may wait."""

    def __init__(self, *, rounds: int = ROUNDS, gap_s: float = GAP_S, max_s: float = MAX_S) -> None:
        if rounds < 1 or gap_s < 0 or max_s < 0:
            raise ValueError(f"rounds {rounds} must be >= 1, gap_s {gap_s} and max_s {max_s} >= 0")
        self.gap_s, self.max_s = gap_s, max_s
        self.joined = 0  # callers come since the last round started, each counted once
        self._recent: deque[int] = deque(maxlen=rounds)  # callers of the last rounds (0 for a lone one)
        self._last_join = float("-inf")
        self._hurried = False  # the next round holds a record that must not wait (a snapshot's)

    @property
    def concurrent(self) -> bool:
        """A round among the last ROUNDS had two or more callers."""
        return any(callers > 1 for callers in self._recent)

    @property
    def expected(self) -> int:
        """The callers a concurrent round waits for: the most of the last rounds (0 when not concurrent)."""
        most = max(self._recent, default=0)
        return most if most > 1 else 0

    def caller(self, now: float) -> bool:
        """A caller of the next round came; returns whether the round now has all it waits for."""
        self.joined += 1
        self._last_join = now
        return self.joined >= self.expected

    def hurry(self) -> None:
        """The next round holds a record that waits for nobody (a snapshot's hop)."""
        self._hurried = True

    def round_started(self) -> int:
        """A round took the buffer: returns its callers, and the next round counts afresh."""
        callers, self.joined, self._hurried = self.joined, 0, False
        self._recent.append(callers)
        return callers

    def wait_s(self, now: float, started: float) -> float | None:
        """How long a round that began waiting at `started` may still wait
        before it asks again; None: it goes now."""
        if self.joined >= self.expected or self._hurried:  # also: not concurrent (expected 0)
            return None
        left = started + self.max_s - now
        if left <= 0:
            return None
        if self.joined == 0:  # nobody yet: the last round's callers are on their way back
            return left
        quiet = self.gap_s - (now - max(self._last_join, started))
        if left <= 0 or quiet <= 0:
            return None
        return min(left, quiet)
