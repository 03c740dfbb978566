"""The simulated controller's restore side: the restore's parts at the nodes, and the RestoreSnapshot calls.

A mixin of `sim.controller.SimController`, split out to keep one module per
concern short; it reads and writes the controller shell's own fields
(`machine`, `journal`, `world`, `parts`, `waiting`, `restoring`, `settling`, ...).

The restore's parts: `restore_one` hands one node its part (RestoreAt) and
sometimes crashes it right after; `restored` takes the node's RestoreReply
back to the machine; `crashed` sends a crashed node's part again (the real
restorer retries). Once the restore ended, the machine hears it settled at
the next `restore_one`, so calls can come in between.

RestoreSnapshot calls come from their own generator (`restore_rng`): bursts
of concurrent calls, new keys joining the running restore, retries with the
same key (while it runs, after it ended, and after a controller restart), a
key reused for another snapshot, snapshots that cannot be restored. A key
that started or joined a restore never starts another while the gate's
window holds it, across controller restarts too. Each call's answer is judged
by sim/restore_answers.py (the machine's R5).
"""

from __future__ import annotations

import random

from snapmesh.protocol.controller import journal as records
from snapmesh.protocol.controller import restoregate
from snapmesh.protocol.controller.tracker import COMPLETE
from snapmesh.protocol.node import machine as node_mod
from snapmesh.sim import apps
from snapmesh.sim.invariants import Violation
from snapmesh.sim.restore_answers import AnswerCheck
from snapmesh.v1 import snapmesh_pb2 as pb


class RestoreCalls:
    """Mixed into `sim.controller.SimController`: these methods use its fields."""

    def _restore_calls_begin(self, seed: int) -> None:
        """The fields of the RestoreSnapshot calls (see the module doc), and what the fuzzer checks of the answers."""
        self.restore_rng = random.Random(seed * 104_729 + 2)
        self.key_snapshot: dict[str, str] = {}  # key -> the snapshot its first call named
        self.answered: dict[str, str] = {}  # key -> the snapshot of the restore it started or joined (never forgotten)
        self.answered_at: dict[str, int] = {}  # key -> the journal's length once its record is in
        self.keys_at_restart: set[str] = set()  # the keys answered before the newest controller restart
        self.next_restore_key = 0
        self.answers = AnswerCheck()  # the machine's R5, judged

    def _restore_calls_restarted(self) -> None:
        """A controller restart: a key whose record was still pending was never answered (the machine rightly forgot it)."""
        self.answered = {k: v for k, v in self.answered.items() if self.answered_at[k] <= len(self.journal.durable)}
        self.keys_at_restart = set(self.answered)
        # ... and a key it forgot may start another snapshot's restore: which snapshot it names is open again
        self.key_snapshot = {k: v for k, v in self.key_snapshot.items() if k in self.answered}

    def restore_one(self, rng: random.Random, crash: bool = True) -> None:
        """The controller's RestoreState reaches one node that has not taken its part yet
        (or, once the restore ended, the machine hears it settled)."""
        if self.restoring is None or not self.up:
            return
        if self.settling:
            self.settling = False
            self.restoring = None
            self.machine.restore_settled()
            self.carry_out()
            return
        ready = sorted(n for n in self.parts if self.world.nodes[n] is not None)
        if not ready:
            return
        node_id = rng.choice(ready)
        request = self.parts.pop(node_id)
        node = self.world.nodes[node_id]
        in_flight, app = apps.restore_part(request)  # the app's state and payloads
        if "state" in app:  # sent as blocks where the node holds some (sim/blockrestores.py SB5), else whole
            app["state"] = self.restore_blocks.state_for(node_id, request)
        if in_flight:
            self.faults["restore part with app messages in flight"] += 1
        self.waiting[node_id] = request  # the node's RestoreReply answers it (`restored`)
        node.restore(  # type: ignore[union-attr]
            snapshot_id=request.snapshot_id, epoch=request.epoch, in_flight=in_flight,
            reply_to=request, **app,
        )
        self.world.fences[node_id].restored()  # F5
        self.world.route(node_id)  # its EndStreams ends the older epoch's connections
        if crash and rng.random() < 0.25:
            self.faults["crash during a restore"] += 1
            self.world.crash(node_id, rng)

    def restored(self, node_id: str, reply: node_mod.RestoreReply) -> None:
        """`node_id`'s RestoreReply: the answer goes back (a call this process no longer waits for is gone)."""
        if self.waiting.get(node_id) is not reply.to:
            return
        del self.waiting[node_id]
        if self.up:
            answer = pb.RestoreStateResponse(epoch=reply.epoch)
            self.machine.node_restored(node_id, answer, self.now())
            self.carry_out()

    def crashed(self, node_id: str) -> None:
        """`node_id` died: a restore answer it owed is lost, and its part is sent again."""
        self.restore_blocks.node_crashed(node_id)  # it keeps what its shelf kept (RB4)
        waiting = self.waiting.pop(node_id, None)
        if waiting is not None and self.up:
            self.parts[node_id] = waiting

    def start_restore(self, rng: random.Random) -> None:
        complete = [s.snapshot_id for s in self.machine.all() if s.status == COMPLETE]
        if not self.up or self.restoring is not None or not complete:
            return
        sid = rng.choice(complete)
        if isinstance(self.machine.restore(self.machine.get(sid), "", self.now()), restoregate.Start):
            self._started(sid, "")

    def restore_onto(self, sid: str, nodes: list[str], key: str) -> restoregate.Decision:
        """A RestoreSnapshot call naming a target node set (RestoreSnapshotRequest.nodes; [] none), for the version steps."""
        decision = self.machine.restore(self.machine.get(sid), key, self.now(), nodes=nodes)
        if isinstance(decision, restoregate.Start):
            self._started(sid, key)
        return decision

    def _started(self, sid: str, key: str) -> None:
        """The machine said Start: it rolls back to `sid` in a new epoch."""
        if self.restoring is not None:
            raise Violation(f"restore: a second restore ({sid}) started while the restore of {self.restoring} runs")
        if key in self.answered and len(self.answered) <= self.machine.gate.keys_kept:
            raise Violation(
                f"restore: request_id {key!r} rolled back a second time (to {sid}); it already started or joined"
                f" the restore of {self.answered[key]}"
            )
        self.restoring = sid
        self.faults["restore"] += 1
        self.reports.extendleft(self.resent)  # the late copies arrive now, from the epoch before
        self.resent.clear()
        self.parts.clear()
        self.waiting.clear()
        self.carry_out()
        if key:
            self.answered[key] = sid
            self.answered_at[key] = self.journal.appended  # its RESTORING record

    def restore_calls(self, *, always: bool = False) -> None:
        """Clients call RestoreSnapshot: one call, a retry, or a burst of concurrent calls."""
        rng = self.restore_rng
        ids = self.machine.ids()
        if (not always and rng.random() >= 0.04) or not self.up or not ids:
            return
        for _ in range(rng.choice([1, 1, 2, 3])):
            keys = list(self.key_snapshot)
            roll = rng.random()
            if keys and roll < 0.4:  # a retry of an earlier call
                key = rng.choice(keys)
                sid = self.key_snapshot[key]
            elif keys and roll < 0.5:  # an earlier key, another snapshot
                key, sid = rng.choice(keys), self._restore_target(rng, ids)
            elif self.restoring is not None and roll < 0.65:  # a new key for the restore that runs: it joins
                self.next_restore_key += 1
                key, sid = f"k{self.next_restore_key}", self.restoring
            else:
                sid = self._restore_target(rng, ids)
                key = ""
                if rng.random() < 0.7:
                    self.next_restore_key += 1
                    key = f"k{self.next_restore_key}"
            self.restore_call(sid, key)

    def _restore_target(self, rng: random.Random, ids: list[str]) -> str:
        """Mostly a COMPLETE snapshot (so calls start, join, get answers and Busy), sometimes
        any, now and then one that does not exist."""
        complete = [sid for sid in ids if self.machine.status(sid) == COMPLETE]
        roll = rng.random()
        if complete and roll < 0.85:
            return rng.choice(complete)
        return "gone" if roll > 0.97 else rng.choice(ids)

    def restore_call(self, sid: str, key: str) -> None:
        known = self.key_snapshot.get(key) if key else None
        snapshot = self.machine.get(sid) if sid in self.machine.ids() else None
        call = self.answers.call(sid, key)
        decision = self.machine.restore(snapshot, key, self.now(), snapshot_id=sid, call=call)
        self.answers.decided(call, decision)
        kind = type(decision)
        if kind is restoregate.Start:
            if key:  # the gate did not know the key (never durable, or out of its window): it is this restore's now
                self.key_snapshot[key] = sid
            self._started(sid, key)
            self.faults["restore call started a restore"] += 1
        elif kind is restoregate.Join:
            if self.restoring != sid:
                raise Violation(f"restore: a call for {sid} joined the restore of {self.restoring}")
            self.faults["restore call joined the running restore"] += 1
            if key and key not in self.answered:  # the key is this restore's from now on, journaled
                if decision.joined_key != key:
                    raise Violation(f"restore: the new key {key!r} joined the restore of {sid} unjournaled")
                self.key_snapshot[key] = sid
                self.answered[key] = sid
                self.answered_at[key] = self.journal.appended + 1  # its joined record, journaled just below
                self.faults["restore call joined under its own key"] += 1
                if self.settling:
                    self.faults["restore call joined under its own key after the restore ended"] += 1
            self.carry_out()
            if decision.joined_key and not any(  # R4: answered only once its joined record is durable
                type(r) is records.Joined and r.request_id == key
                for r in reversed([*self.journal.durable[-4:], *self.journal.pending][-4:])
            ):
                raise Violation(f"restore: {key!r} joined the restore of {sid} and no joined record is journaled")
        elif kind is restoregate.Answer:
            if decision.result is None or decision.result.snapshot_id != sid:
                raise Violation(f"restore: a retry of {key!r} for {sid} was answered {decision.result!r}")
            self.faults["restore retry answered, not rolled back"] += 1
            self.carry_out()
            if key in self.keys_at_restart:
                self.faults["restore retry answered across a controller restart"] += 1
        elif kind is restoregate.Busy:
            if self.restoring is None or self.restoring == sid:
                raise Violation(f"restore: a call for {sid} refused busy while {self.restoring} runs")
            self.faults["restore refused: another restore runs"] += 1
        elif decision.code == "INVALID_ARGUMENT":
            if known is None or known == sid:
                raise Violation(f"restore: {key!r} for {sid} refused: {decision.message}")
            self.faults["restore refused: key of another snapshot"] += 1
        elif decision.code == "NOT_FOUND":
            if snapshot is not None:
                raise Violation(f"restore: {sid}, which exists, refused NOT_FOUND: {decision.message}")
            self.faults["restore refused: no such snapshot"] += 1
        else:
            self.faults["restore refused: not restorable"] += 1
