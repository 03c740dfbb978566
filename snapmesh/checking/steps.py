"""The trace checker fed event by event (`trace` has the events' format).

`StepChecker`: feed the events in the order they happened (the simulator's trace
is in that order) and it checks after every step, so a violation is caught at
the step that causes it. What the values mean is the app's: its `ledger`, which
also names the keys its events hold them under (the bank's is snapmesh/bank/trace.py's
`Ledger`, which its callers hand in).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

from snapmesh.checking.trace import Channel, Event, InvariantViolation, _name, _validate, fields_of


class StepChecker:
    """Feed events in the order they happened; each `feed` checks what can be
    checked at that moment, `check_state` compares with the real system."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.fields = fields_of(ledger)
        self.state_key, self.content_key, self.contents_key = ledger.state_key, ledger.content_key, ledger.contents_key
        self.queues: dict[Channel, deque[tuple[str, Any, Any]]] = {}  # (kind, msg|sid, content)
        self.sent_at: dict[str, tuple[Channel, int]] = {}  # msg -> (channel, pos)
        self.cuts: dict[tuple[str, str], int] = {}  # (sid, node) -> pos
        self.markers_sent: Counter[tuple[str, Channel]] = Counter()
        self.markers_received: Counter[tuple[str, Channel]] = Counter()
        self.open_recordings: dict[tuple[str, Channel], list[tuple[str, Any]]] = {}
        self.recorded: set[tuple[str, Channel]] = set()
        self.completed: set[tuple[str, str]] = set()
        self.last_pos: dict[str, int] = {}
        self.fed = 0

    def feed_all(self, events: Sequence[Event]) -> None:
        """Feed the events not fed yet (a growing trace list)."""
        for event in events[self.fed :]:
            self.feed(event)

    def feed(self, event: Event) -> None:
        index = self.fed
        self.fed += 1
        kind = _validate(index, event, self.fields)

        def fail(problem: str) -> InvariantViolation:
            return InvariantViolation(f"event #{index} {dict(event)!r}: {problem}")

        if kind == "node":
            self.ledger.declared(event["node"], event[self.state_key])
            return
        if kind == "channel":
            self.queues[(event["src"], event["dst"])] = deque()
            return
        if "pos" in event:
            node = event["node"]
            if node in self.last_pos and event["pos"] <= self.last_pos[node]:
                raise fail(f"position does not increase at {node}")
            self.last_pos[node] = event["pos"]
        if kind in ("send", "marker_sent"):
            channel = (event["node"], event["dst"])
        elif kind in ("receive", "marker_received", "channel_recorded"):
            channel = (event["src"], event.get("dst", event.get("node")))
        else:
            channel = None
        if channel is not None and channel not in self.queues:
            raise fail(f"the topology has no channel {_name(channel)}")

        if kind == "send":
            if problem := self.ledger.sent(event["node"], event[self.content_key]):
                raise fail(problem)
            self.queues[channel].append(("transfer", event["msg"], event[self.content_key]))
            self.sent_at[event["msg"]] = (channel, event["pos"])
        elif kind == "marker_sent":
            key = (event["snapshot"], channel)
            self.markers_sent[key] += 1
            if self.markers_sent[key] > 1:
                raise fail(f"second marker for {key[0]} on {_name(channel)}")
            if (event["snapshot"], event["node"]) not in self.cuts:
                raise fail("marker sent before the sender recorded its state")
            self.queues[channel].append(("marker", event["snapshot"], None))
        elif kind in ("receive", "marker_received"):
            queue = self.queues[channel]
            expected = ("transfer", event["msg"]) if kind == "receive" else ("marker", event["snapshot"])
            if not queue or queue[0][:2] != expected:
                raise fail(f"not FIFO: head of {_name(channel)} is {queue[0] if queue else 'nothing'}")
            _, _, content = queue.popleft()
            if kind == "receive":
                if problem := self.ledger.changed(content, event[self.content_key]):
                    raise fail(problem)
                self._receive(event, channel, fail)
            else:
                key = (event["snapshot"], channel)
                self.markers_received[key] += 1
                if self.markers_received[key] > 1:
                    raise fail(f"second marker for {key[0]} received on {_name(channel)}")
        elif kind == "cut":
            key = (event["snapshot"], event["node"])
            if key in self.cuts:
                raise fail("second cut for the same snapshot at the same node")
            if problem := self.ledger.cut(event["node"], event[self.state_key]):
                raise fail(problem)
            self.cuts[key] = event["pos"]
            for c in self.queues:
                if c[1] == event["node"]:
                    self.open_recordings[(event["snapshot"], c)] = []
        elif kind == "channel_recorded":
            key = (event["snapshot"], channel)
            if key in self.recorded:
                raise fail("channel recorded twice")
            if key not in self.open_recordings:
                raise fail("channel recorded before the receiver recorded its state")
            got = list(zip(event["msgs"], event[self.contents_key], strict=True))
            want = self.open_recordings.pop(key)
            if got != want:
                raise fail(f"recorded {got}, but after the cut the channel delivered {want}")
            if self.markers_received[key] != 1:
                raise fail("channel recorded before its marker arrived")
            self.recorded.add(key)
        elif kind == "completed":
            key = (event["snapshot"], event["node"])
            if key in self.completed:
                raise fail("completed twice")
            if any(c[1] == event["node"] and (event["snapshot"], c) not in self.recorded for c in self.queues):
                raise fail("completed with an incoming channel still open")
            self.completed.add(key)

    def _receive(self, event: Event, channel: Channel, fail: Any) -> None:
        src, dst = channel
        msg, content = event["msg"], event[self.content_key]
        self.ledger.received(dst, content)
        _, send_pos = self.sent_at[msg]
        for (sid, node), pos in self.cuts.items():
            if node != src or send_pos < pos:
                continue
            # Sent after src's cut for sid: dst must already have cut, or this
            # transfer would enter dst's recorded state.
            if (sid, dst) not in self.cuts:
                raise fail(f"snapshot {sid}: sent after {src}'s cut, received before {dst}'s cut")
        for (sid, c), items in self.open_recordings.items():
            if c == channel:
                if (sid, src) in self.cuts and send_pos > self.cuts[(sid, src)]:
                    raise fail(f"snapshot {sid}: a transfer sent after {src}'s cut would be recorded in flight")
                items.append((msg, content))

    def check_state(
        self,
        states: Mapping[str, Any] | None = None,
        in_flight: Mapping[Channel, Sequence[Any]] | None = None,
    ) -> None:
        """The app's rules now, per the trace and, when given, per the real system's
        node `states` (which must agree with the trace); the channels' contents must
        agree with the trace's."""
        on_channels = {c: [content for kind, _, content in q if kind == "transfer"] for c, q in self.queues.items()}
        for problem in self.ledger.now(on_channels, states):
            raise InvariantViolation(problem)
        if in_flight is not None:
            actual = {c: list(v) for c, v in in_flight.items()}
            if actual != on_channels:
                raise InvariantViolation(f"channel contents {actual} differ from the trace's {on_channels}")
        for key, count in self.markers_sent.items():
            if count > 1:  # pragma: no cover - feed already refuses this
                raise InvariantViolation(f"{count} markers for {key[0]} on {_name(key[1])}")
