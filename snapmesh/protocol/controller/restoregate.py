"""Who may start a restore: the controller's claim logic as a pure state machine.

One restore at a time, and a key never rolls back twice.

The controller machine (snapmesh/protocol/controller/machine.py) asks this gate before it
rolls anything back, and the fault simulator (snapmesh/sim) drives the same gate with
concurrent and retried restores. No I/O, no clock: time is passed in.

Events in:
  request(snapshot_id, request_id, now, problem, missing)  a RestoreSnapshot call;
      `problem` says why the snapshot cannot be restored (not COMPLETE, not
      conserved), or ""; `missing`: there is no such snapshot (NOT_FOUND, unless
      the key answers it: a retry after the snapshot's file was deleted).
  finished(result)    the running restore ended (RESTORED or FAILED), with its answer.
  taken_back(...)     after a controller restart: the journal's restores, oldest
                      first, each with the keys that joined it.

Decisions out (exactly one per request):
  Start      nothing runs: this call claims the restore in the same step as the
             check (no other call can claim in between) and must run it.
  Join       the restore asked for is the one running (same key, or same snapshot):
             wait for its answer, start nothing. A new key joins it for good:
             `joined_key` names it, to be journaled, and from now on that key
             is that restore's (its retry joins it, or once it ended gets its answer).
  Answer     the key names a finished restore: its answer, nothing rolled back again.
  Refuse     INVALID_ARGUMENT (a key too long, or a key that started another
             snapshot's restore), NOT_FOUND (no such snapshot) or
             FAILED_PRECONDITION (the snapshot's problem). The key is checked
             here only, before anything else.
  Busy       another snapshot's restore runs (FAILED_PRECONDITION).

The newest `keys_kept` keys are kept (oldest forgotten first), whether they
started a restore or joined one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

KEYS_KEPT = 1_000  # the idempotency keys of the newest restores, answered from memory
MAX_KEY_BYTES = 128


@dataclass(frozen=True, slots=True)
class Start:
    snapshot_id: str
    request_id: str
    at: float  # `now` of the claiming call


@dataclass(frozen=True, slots=True)
class Join:
    snapshot_id: str  # the running restore, the one asked for
    joined_key: str = ""  # a key that joins it for the first time (to be journaled); "" for none


@dataclass(frozen=True, slots=True)
class Answer:
    result: Any  # the earlier restore's answer (as given to `finished`)


@dataclass(frozen=True, slots=True)
class Refuse:
    code: str  # a gRPC status name
    message: str


@dataclass(frozen=True, slots=True)
class Busy:
    running: str  # the snapshot whose restore runs

    code = "FAILED_PRECONDITION"

    @property
    def message(self) -> str:
        return f"a restore to {self.running or '?'} is running"


class Refused(Exception):
    """A Refuse or Busy decision raised, for a caller that answers it as an error;
    `code` names its gRPC status."""

    def __init__(self, decision: Refuse | Busy) -> None:
        super().__init__(decision.message)
        self.code = decision.code


Decision = Start | Join | Answer | Refuse | Busy


def key_problem(request_id: str, max_key_bytes: int = MAX_KEY_BYTES) -> Refuse | None:
    if len(request_id.encode()) > max_key_bytes:
        return Refuse("INVALID_ARGUMENT", f"request_id is longer than {max_key_bytes} bytes")
    return None


class RestoreGate:
    """One restore at a time; a key answers its own restore, never starts another."""

    def __init__(self, *, keys_kept: int = KEYS_KEPT, max_key_bytes: int = MAX_KEY_BYTES) -> None:
        if keys_kept < 1:
            raise ValueError(f"keys_kept must be at least 1, got {keys_kept}")
        self.keys_kept = keys_kept
        self.max_key_bytes = max_key_bytes
        self.running: Start | None = None  # the claimed restore, until `finished`
        self.running_keys: list[str] = []  # every key of the running restore: its claim's, then those that joined
        self._by_key: OrderedDict[str, tuple[str, Any]] = OrderedDict()  # key -> (snapshot_id, answer or None)

    def request(
        self, snapshot_id: str, request_id: str, now: float, problem: str = "", *, missing: bool = False
    ) -> Decision:
        refused = key_problem(request_id, self.max_key_bytes)
        if refused is not None:
            return refused
        running = self.running
        if request_id and request_id in self._by_key:
            earlier, answer = self._by_key[request_id]
            if earlier != snapshot_id:
                return Refuse(
                    "INVALID_ARGUMENT", f"request_id {request_id!r} started the restore of {earlier}, not {snapshot_id}"
                )
            if running is not None and request_id in self.running_keys:
                return Join(snapshot_id)
            return Answer(answer)  # a retry of a finished restore: nothing rolled back
        if missing:
            return Refuse("NOT_FOUND", f"no snapshot {snapshot_id!r}")
        if problem:
            return Refuse("FAILED_PRECONDITION", problem)
        if running is not None:
            if running.snapshot_id != snapshot_id:
                return Busy(running.snapshot_id)
            if not request_id:
                return Join(snapshot_id)
            self.running_keys.append(request_id)  # this key is the running restore's from now on
            self._keep(request_id, snapshot_id, None)
            return Join(snapshot_id, request_id)
        claim = self.running = Start(snapshot_id, request_id, now)  # the check and the claim: one step
        self.running_keys = [request_id] if request_id else []
        self._keep(request_id, snapshot_id, None)
        return claim

    def finished(self, result: Any) -> None:
        """The running restore ended with `result`: the answer to a retry of every key it has."""
        claim, self.running = self.running, None
        keys, self.running_keys = self.running_keys, []
        if claim is not None:
            for key in keys:
                self._keep(key, claim.snapshot_id, result)

    def taken_back(
        self, snapshot_id: str, request_id: str, result: Any, *, running: bool, joined: Iterable[str] = ()
    ) -> None:
        """After a restart: a journaled restore (call it oldest first), with the keys
        that `joined` it; `running` resumes it."""
        keys = [k for k in dict.fromkeys((request_id, *joined)) if k]
        if running:
            self.running = Start(snapshot_id, request_id, 0.0)
            self.running_keys = keys
        for key in keys:
            self._keep(key, snapshot_id, None if running else result)

    def _keep(self, request_id: str, snapshot_id: str, result: Any) -> None:
        if request_id:
            self._by_key.pop(request_id, None)
            self._by_key[request_id] = (snapshot_id, result)
            while len(self._by_key) > self.keys_kept:
                self._by_key.popitem(last=False)
