"""The smallest app worth measuring: a command sends one message to the next node.

The bench's stand-in for a user's app (`bench.submit_batch`): every command is
one step that logs a command record and one send, and every message one step
at its receiver, so a command costs the framework's path and nothing of its own.
The state is two counters, so a snapshot has something to check.
"""

from __future__ import annotations

from snapmesh.app import App, Context, NodeInfo, View


class Relay:
    def __init__(self, info: NodeInfo) -> None:
        later = sorted(p for p in info.peers_out if p > info.node_id)
        self.next = (later or sorted(info.peers_out))[0]  # the next id along, wrapping
        self.sent = self.received = 0

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        ctx.send(self.next, command)
        self.sent += 1
        return b""

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        self.received += 1

    def snapshot(self) -> bytes:
        return f"{self.sent} {self.received}".encode()

    def restore(self, state: bytes) -> None:
        sent, received = state.split()
        self.sent, self.received = int(sent), int(received)


def every_message_once(view: View) -> list[str]:
    """Messages sent = messages received + messages in flight, over the whole cut."""
    sent = sum(int(state.split()[0]) for state in view.states.values())
    received = sum(int(state.split()[1]) for state in view.states.values())
    if sent != received + len(view.in_flight):
        return [f"{sent} sent, {received} received, {len(view.in_flight)} in flight"]
    return []


app = App(name="minimal", new=Relay, invariants={"every message once": every_message_once})
