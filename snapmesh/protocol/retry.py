"""When a shell calls a peer again, decided: a call's retry policy as data.

An effect that asks a shell to call a node carries its `Retry`; the shell's one
call loop (snapmesh/serving/calls.py) asks it after each failure whether to try
again and when, and hands what it gave up on back to the machine as a `Failed`.

T1. A refusal (REFUSALS: the node said no) is final: asking again gets the same answer.
T2. Any other failure is tried again, `tries` tries in all at most (0: no limit)
    and until `for_s` have passed since the first: after PAUSE_S, or at once and
    waiting for the channel with `wait` (a channel that met the node before it
    served sits in reconnect backoff, at most 2 s in serving/runtime.py, and
    fails calls at once).
T3. The first try waits `timeout_s` for its answer, a later one at most `for_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

REFUSALS = ("FAILED_PRECONDITION", "INVALID_ARGUMENT")  # gRPC status names
PAUSE_S = 0.25


@dataclass(frozen=True, slots=True)
class Failed:
    """A call given up on: its last status (a gRPC status name) and details."""

    code: str
    details: str

    def __str__(self) -> str:
        return f"{self.code}: {self.details}"


@dataclass(frozen=True, slots=True)
class Retry:
    timeout_s: float
    for_s: float = 0.0
    tries: int = 0
    wait: bool = False

    def timeout(self, tried: int) -> float:
        """T3, for try number `tried` (from 1)."""
        return self.timeout_s if tried == 1 else min(self.timeout_s, self.for_s)

    def waits(self, tried: int) -> bool:
        """Whether try number `tried` waits for the channel (T2)."""
        return self.wait and tried > 1

    def again(self, failed: Failed, tried: int, elapsed_s: float) -> float | None:
        """After try number `tried` failed, `elapsed_s` after the first began: the
        pause before the next (T2), or None to give up (T1, T2)."""
        if failed.code in REFUSALS or tried == self.tries or elapsed_s >= self.for_s:
            return None
        return 0.0 if self.wait else PAUSE_S

    def gave_up(self, failed: Failed) -> str:
        """Why the call failed, in words: a refusal as the node said it, else how long it was tried."""
        return str(failed) if failed.code in REFUSALS else f"unreachable for {self.for_s:g}s ({failed})"
