"""A timed model of the three snapshot modes on production node machines: counters, not clocks.

`python -m bench.mode_model '{"rate": 3800}'` prints, per mode (classic, overtake,
hybrid), the snapshot latency in simulated ms, the early copies a hybrid node sent and
dropped, and how many entries the reports carried. The node machines are production
code (`Node`, `HybridNode`); the rest is a queueing model of the shell around them:

  - each node is one CPU, a FIFO of jobs with a cost (a client batch, a frame, an ack,
    a durable callback, a timer tick), as the node's one event loop;
  - each log commits in groups: one fsync (F) at a time, of everything appended before;
  - each channel is one stream: frames pushed queue at the sender and leave merged
    (<= MAX_MERGED messages, services/node/channels.py) when the last write is done,
    at `bandwidth` messages/s, then arrive after D as one job on dst's CPU, early
    markers applied first (services/node/servicer.py);
  - `early_at_head`: an early marker joins the head of its stream's queue, not its tail.

Time is simulated and the client load comes from one seeded generator, so a run is
the same every time: a figure from it compares the modes, not this machine's load.
"""
from __future__ import annotations

import heapq
import itertools
import random
import statistics
import sys
from collections import deque

from snapmesh.app import load_app
from snapmesh.protocol.hybrid import HybridNode
from snapmesh.protocol.node import machine
from snapmesh.protocol.node.recovery import fresh
from snapmesh.services.node.channels import MAX_MERGED

BANK = load_app("bank")  # every node hosts an app (node rule N10)

C_SEND = 100e-6  # CPU per transfer a client sends (scaled up: fewer events to simulate)
C_RECV = 100e-6  # ... per message a frame applies
C_OTHER = 50e-6  # ... per ack, durable callback or tick
F = 0.004  # one log round
D = 0.0005  # one way on the wire


class Sim:
    def __init__(self, mode, *, n=8, rate=3200.0, bandwidth=1e9, align=0.05, seed=1, snapshots=20, gap=0.25,
                 early_at_head=False):
        """`rate`: transfers/s each node's clients send; `align`: hybrid's timeout (s); a snapshot
        every `gap` s from node n0."""
        self.rng = random.Random(seed)
        self.q = []
        self.seq = itertools.count()
        self.now = 0.0
        self.ids = [f"n{i}" for i in range(n)]
        self.mode, self.rate, self.bw = mode, rate, bandwidth
        self.early_at_head = early_at_head
        self.report_entries = self.recorded = 0
        self.owed = dict.fromkeys([f"n{i}" for i in range(n)], 0.0)
        self.nodes = {}
        for i in self.ids:
            others = [o for o in self.ids if o != i]
            kw = dict(node_id=i, incoming=others, outgoing=others,
                      recovered=fresh(incoming=others, outgoing=others),
                      recording_ttl=30.0, bound=10**9, mark=10**9, app=BANK, app_params={"initial_balance": 10**12})
            self.nodes[i] = HybridNode(align_timeout=align, **kw) if mode == "hybrid" else machine.Node(
                snapshot_mode=mode, **kw)
        self.cpu_q = {i: deque() for i in self.ids}
        self.cpu_busy = dict.fromkeys(self.ids, False)
        self.busy_time = dict.fromkeys(self.ids, 0.0)
        self.fsyncing = dict.fromkeys(self.ids, False)
        self.appended = dict.fromkeys(self.ids, 0)
        self.pipe = {(s, d): deque() for s in self.ids for d in self.ids if s != d}
        self.pipe_busy = dict.fromkeys(self.pipe, False)
        self.timer_at = dict.fromkeys(self.ids, None)
        self.snap = {}  # sid -> dict(start, cuts{}, reports{})
        self.marker_wait = []  # per channel: cut at src -> marker (either copy) closes at dst
        self.frames = 0
        self.snapshots, self.gap = snapshots, gap
        for i in self.ids:
            for o in self.ids:
                if o != i:
                    self.nodes[i].connect(o, 1)
                    self.nodes[o].opened(i, 1)
        for i in self.ids:
            self.route(i)
            self.at(0.0005 * self.ids.index(i), self.client, i)
        for k in range(snapshots):
            self.at(0.5 + k * gap, self.job, "n0", C_OTHER, self.start_snapshot, f"s{k}")

    def at(self, t, fn, *args):
        heapq.heappush(self.q, (t, next(self.seq), fn, args))

    def job(self, node, cost, fn, *args):
        self.cpu_q[node].append((cost, fn, args))
        if not self.cpu_busy[node]:
            self._next_job(node)

    def _next_job(self, node):
        if not self.cpu_q[node]:
            self.cpu_busy[node] = False
            return
        self.cpu_busy[node] = True
        cost, fn, args = self.cpu_q[node].popleft()
        self.nodes[node].tick(self.now, 1000 + self.now)
        extra = fn(node, *args) or 0.0
        self.route(node)
        self.busy_time[node] += cost + extra
        self.at(self.now + cost + extra, self._next_job, node)

    def run(self, until):
        while self.q:
            t, _, fn, args = heapq.heappop(self.q)
            if t > until:
                break
            self.now = t
            fn(*args)

    # -- inputs
    def client(self, node):
        self.owed[node] += self.rate * 0.001
        k = int(self.owed[node])
        self.owed[node] -= k

        def batch(n):
            m = self.nodes[n]
            for _ in range(k):
                dst = self.rng.choice([o for o in self.ids if o != n])
                m.submit(b"1 " + dst.encode())  # the bank app's compact command: pay 1 to dst
            return 0.0
        if k:
            self.job(node, k * C_SEND, batch)
        self.at(self.now + 0.001, self.client, node)

    def start_snapshot(self, node, sid):
        self.snap[sid] = {"start": self.now, "cuts": {}, "reports": {}}
        self.nodes[node].start_snapshot(sid)

    def durable(self, node, lsn):
        self.nodes[node].durable(lsn)

    def fsync_done(self, node, lsn):
        self.fsyncing[node] = False
        self.job(node, C_OTHER, self.durable, lsn)
        self.maybe_fsync(node)

    def maybe_fsync(self, node):
        if not self.fsyncing[node] and self.appended[node] > 0:
            self.fsyncing[node] = True
            self.appended[node] = 0
            self.at(self.now + F, self.fsync_done, node, self.nodes[node].last_lsn)

    def on_timer(self, node, at):
        if self.timer_at[node] == at:
            self.timer_at[node] = None
            self.job(node, C_OTHER, lambda n: 0.0)  # the tick is what every job starts with

    def receive(self, node, src, entries):
        m = self.nodes[node]
        early = [e for e in entries if e.seq == 0]
        rest = [e for e in entries if e.seq != 0]
        for e in early + rest:
            if e.snapshot_id:
                m.received(src, 1, e.seq, snapshot_id=e.snapshot_id, last_seq=e.last_seq)
            else:
                m.received(src, 1, e.seq, payload=e.payload)
        m.end_frame()
        return 0.0

    def ack(self, node, dst, seq):
        self.nodes[node].acked(dst, 1, seq)

    # -- effects
    def route(self, node):
        m = self.nodes[node]
        for eff in m.drain():
            k = type(eff)
            if k is machine.Append:
                self.appended[node] += 1
                rec = eff.record
                if type(rec).__name__ == "Cut":
                    self.snap[rec.snapshot_id]["cuts"][node] = self.now
            elif k is machine.Transmit:
                early = tuple(e for e in eff.entries if e.seq == 0)
                rest = tuple(e for e in eff.entries if e.seq != 0)
                if early and self.early_at_head:
                    self.pipe[(node, eff.dst)].appendleft(early)
                    if rest:
                        self.pipe[(node, eff.dst)].append(rest)
                else:
                    self.pipe[(node, eff.dst)].append(eff.entries)
                self.pump(node, eff.dst)
            elif k is machine.Ack:
                self.at(self.now + D, self.job, eff.src, C_OTHER, self.ack, node, eff.seq)
            elif k is machine.Finished:
                recorded = sum(len(v) for v in eff.state.channels.values())
                self.recorded += recorded
                self.report_entries += recorded + sum(len(v) for v in eff.state.outbox.values())
            elif k is machine.Report:
                s = self.snap[eff.snapshot_id]
                s["reports"][node] = self.now
        self.maybe_fsync(node)
        at = m.next_timer()
        if at is not None and at != self.timer_at[node]:
            self.timer_at[node] = at
            self.at(max(at, self.now), self.on_timer, node, at)

    def pump(self, src, dst):
        ch = (src, dst)
        if self.pipe_busy[ch] or not self.pipe[ch]:
            return
        merged = []
        while self.pipe[ch] and (not merged or len(merged) + len(self.pipe[ch][0]) <= MAX_MERGED):
            merged += self.pipe[ch].popleft()
        self.pipe_busy[ch] = True
        self.frames += 1
        t = len(merged) / self.bw
        self.at(self.now + t, self.pipe_free, ch)
        self.at(self.now + t + D, self.job, dst, len(merged) * C_RECV, self.receive, src, merged)

    def pipe_free(self, ch):
        self.pipe_busy[ch] = False
        self.pump(*ch)


def run(mode, **kw):
    """One mode's figures (ms simulated; `max` is the p99 of a few snapshots)."""
    s = Sim(mode, **kw)
    end = 0.5 + s.snapshots * s.gap + 1.0
    s.run(end)
    lat, last_cut, tail = [], [], []
    for v in s.snap.values():
        if len(v["reports"]) == len(s.ids):
            lat.append((max(v["reports"].values()) - v["start"]) * 1e3)
            lc = max(v["cuts"].values())
            last_cut.append((lc - v["start"]) * 1e3)
            tail.append((max(v["reports"].values()) - lc) * 1e3)
    util = statistics.mean(b / end for b in s.busy_time.values())
    early = (sum(getattr(n, "early_sent", 0) for n in s.nodes.values()),
             sum(getattr(n, "early_dropped", 0) for n in s.nodes.values()))
    out = dict(mode=mode, done=len(lat), util=round(util, 2), p50=round(statistics.median(lat), 1),
               max=round(max(lat), 1), last_cut_max=round(max(last_cut), 1), tail_max=round(max(tail), 1),
               frames=s.frames, early_sent_dropped=early,
               report_entries=s.report_entries, recorded=s.recorded)
    return out


if __name__ == "__main__":
    import json
    kw = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    for mode in ("classic", "overtake", "hybrid"):
        print(run(mode, **kw), flush=True)
