"""A node's fence for a stop with a snapshot (the Node service's Fence; the controller's stopping.py).

A pure object the node's shell holds beside its machine: it says which calls
the node refuses, and when the log is to end in a `stop` record. No I/O.

States: OPEN (everything answered), FENCED(sid) (a stop snapshot is coming: new
commands refused), STOPPED(sid) (the log ends in the COMPLETE stop snapshot sid:
the node stops, or, restarted, answers only health, Fence and RestoreState).

Rules:
F1. FENCE(sid) from OPEN or FENCED: FENCED(sid) (a newer stop replaces an older
    one whose controller went away). Commands (Transfer, TransferBatch, Submit,
    SubmitBatch) are refused UNAVAILABLE, "stopping for a snapshot"; everything
    else (channels, markers, queries, reports) goes on, so the snapshot completes.
F2. LIFT(sid), or the snapshot's AbortSnapshot, from FENCED(sid): OPEN. A lift of
    another snapshot, or in another state, changes nothing (a late or repeated one).
F3. STOP(sid) from FENCED(sid): STOPPED(sid), and the shell logs the `stop` record
    (`stop` returns True once). A repeat changes nothing; STOP in any other state is
    the controller's mistake (FenceRefused: FAILED_PRECONDITION), changing nothing.
F4. STOPPED refuses every call but health, Fence and RestoreState (UNAVAILABLE,
    naming the snapshot to restore); FENCE in STOPPED is refused too.
F5. A restore (RestoreState taken) opens the fence from any state.
F6. A FENCE may say how long it holds without a STOP (`lift_after`, seconds from
    `now`): past that, FENCED is OPEN again (a node that missed its LIFT, or
    whose controller went away mid-stop, takes commands again). Time is an
    argument: `now` from the shell's monotonic clock.
F7. The fence is not logged: a node restarted between its FENCE and the STOP
    comes back OPEN (and may take commands). STOP(sid) from OPEN is still taken
    (STOPPED(sid), the `stop` logged) when the shell says the node is `quiet`:
    its log holds its cut of sid and no client command after it (the node
    machine's `quiet_since_cut`; checkpoints carry the last command's lsn). The
    stop snapshot then holds every command the node took, as if F1 had held.
    Otherwise STOP is refused (FenceRefused, naming why): a command the node took
    after its cut is in no snapshot, and stopping would lose it.
"""

from __future__ import annotations

from typing import Final

OPEN: Final = "open"
FENCED: Final = "fenced"
STOPPED: Final = "stopped"

COMMANDS = frozenset({"Transfer", "TransferBatch", "Submit", "SubmitBatch"})  # F1
WHILE_STOPPED = frozenset({"Fence", "RestoreState", "RestoreStateChunks"})  # F4 (health is its own service)


class FenceRefused(Exception):
    """F3, F4: a Fence step the node cannot take in its state; nothing changed."""

    code = "FAILED_PRECONDITION"


class Fence:
    def __init__(self, node_id: str, *, stopped: str = "") -> None:
        """`stopped`: the stop snapshot the node's log ends in (a restart: STOPPED at once)."""
        self.node_id = node_id
        self.state = STOPPED if stopped else OPEN
        self.snapshot_id = stopped
        self.until: float | None = None  # F6: FENCED holds until this `now` (None: until lifted)

    def close(self, snapshot_id: str, *, now: float = 0.0, lift_after: float = 0.0) -> None:
        """F1 (F4: refused when STOPPED); F6: `lift_after` seconds from `now` (0: until lifted)."""
        if self.state == STOPPED:
            raise FenceRefused(f"node {self.node_id} is stopped for snapshot {self.snapshot_id}: restore it first")
        self.state, self.snapshot_id = FENCED, snapshot_id
        self.until = now + lift_after if lift_after > 0 else None

    def tick(self, now: float) -> None:
        """F6: a fence past its time is lifted."""
        if self.state == FENCED and self.until is not None and now >= self.until:
            self.lift(self.snapshot_id)

    def lift(self, snapshot_id: str) -> bool:
        """F2: whether the fence opened."""
        if self.state != FENCED or snapshot_id != self.snapshot_id:
            return False
        self.state, self.snapshot_id = OPEN, ""
        return True

    def stop(self, snapshot_id: str, *, now: float = 0.0, quiet: bool = False) -> bool:
        """F3: True when the `stop` record is to be logged now (once). F7: `quiet`, the
        shell's word that the node logged its cut of `snapshot_id` and no command after it."""
        self.tick(now)
        if self.state == STOPPED and snapshot_id == self.snapshot_id:
            return False
        if self.state == OPEN:  # F7: restarted (or lifted) between FENCE and STOP
            if quiet:
                self.state, self.snapshot_id = STOPPED, snapshot_id
                return True
            raise FenceRefused(f"node {self.node_id} cannot stop for snapshot {snapshot_id}: it is open (restarted "
                               "since its fence?) and its log does not show its cut with no command after it, so "
                               "the snapshot may not hold every command it took")
        if self.state != FENCED or snapshot_id != self.snapshot_id:
            held = f"fenced for {self.snapshot_id}" if self.state == FENCED else self.state
            raise FenceRefused(f"node {self.node_id} cannot stop for snapshot {snapshot_id}: it is {held}, "
                               "and stops only for the snapshot it was fenced for")
        self.state = STOPPED
        return True

    def restored(self) -> None:
        """F5."""
        self.state, self.snapshot_id = OPEN, ""

    def refusal(self, rpc: str, now: float = 0.0) -> str:
        """Why `rpc` (a Node service method's name) is refused at `now` ("": it is not) (F1, F4, F6)."""
        self.tick(now)
        if self.state == STOPPED and rpc not in WHILE_STOPPED:
            return (f"node {self.node_id} is stopped for snapshot {self.snapshot_id}: it answers only health and "
                    f"RestoreState until it is restored (snapmesh restore {self.snapshot_id})")
        if self.state == FENCED and rpc in COMMANDS:
            return (f"node {self.node_id} is stopping for a snapshot ({self.snapshot_id}): no new commands; "
                    "retry once the cluster is restored, or once the stop fails and the node accepts them again")
        return ""
