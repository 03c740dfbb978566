"""A token ring: one token passed from node to node; a snapshot must always find exactly one.

Run it (docs/apps.md): `cd examples && snapmesh cluster up --app token_ring:app`.
Command b"pass" at the holder sends the token to the next node; anywhere else it
is refused. A node's state is the number of tokens it holds, as decimal ASCII.
A query (the Query RPC, not logged) b"has" answers that number, as the command does.
The examples ship in the wheel: `snapmesh examples` prints where they are.
"""

from __future__ import annotations

from snapmesh.app import App, Context, NodeInfo, Refused, View

TOKEN = b"token"


class TokenRing:
    def __init__(self, info: NodeInfo):
        self.me = info.node_id
        later = sorted(p for p in info.peers_out if p > self.me)
        self.next = (later or sorted(info.peers_out) or [None])[0]  # the next id along, wrapping
        # [app] holder = "p2" picks the first holder; by default the smallest id this node knows
        # (right for a full mesh, such as the default cluster, and for a ring in id order).
        holder = info.params.get("holder") or min({self.me, *info.peers_out, *info.peers_in})
        self.tokens = 1 if holder == self.me else 0

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        if command == b"has":
            return str(self.tokens).encode()
        if command != b"pass":
            ctx.refuse("INVALID_ARGUMENT", f"unknown command {command[:40]!r}; try b'pass' or b'has'")
        if self.tokens == 0:
            ctx.refuse("FAILED_PRECONDITION", f"{self.me} does not hold the token")
        if self.next is None:
            ctx.refuse("FAILED_PRECONDITION", f"{self.me} has no channel to pass the token on")
        ctx.send(self.next, TOKEN)
        self.tokens -= 1
        return f"passed to {self.next}".encode()

    def on_query(self, query: bytes) -> bytes:  # a read: never changes the machine, never sends
        if query != b"has":
            raise Refused("INVALID_ARGUMENT", f"unknown query {query[:40]!r}; try b'has'")
        return str(self.tokens).encode()

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        if payload != TOKEN:
            raise ValueError(f"{self.me}: unexpected message {payload[:40]!r} from {src}")
        self.tokens += 1

    def snapshot(self) -> bytes:
        return str(self.tokens).encode()

    def restore(self, state: bytes) -> None:
        self.tokens = int(state)


def where_tokens_are(view: View) -> list[str]:
    held = [f"at {node}" for node, state in sorted(view.states.items()) for _ in range(int(state))]
    return held + [f"in flight {src}->{dst} (seq {seq})" for src, dst, seq, p in view.in_flight if p == TOKEN]


def one_token(view: View) -> list[str]:
    places = where_tokens_are(view)
    return [] if len(places) == 1 else [f"{len(places)} tokens: {', '.join(places) or 'none anywhere'}"]


def token_rows(view: View) -> list[dict]:
    rows = [{"snapshot_id": view.snapshot_id, "place": node, "tokens": int(state)} for node, state in view.states.items()]
    return rows + [{"snapshot_id": view.snapshot_id, "place": f"{src}->{dst}", "tokens": 1}
                   for src, dst, _, payload in view.in_flight if payload == TOKEN]


def workload(nodes: list[NodeInfo], rng):
    while True:  # only the holder's b"pass" goes through; the others are refused, which is fine
        yield rng.choice(nodes).node_id, rng.choice([b"pass", b"pass", b"has"])


app = App(
    name="token_ring",
    new=TokenRing,
    invariants={"one token": one_token},
    describe=lambda view: {"token": where_tokens_are(view)},
    views={"tokens": token_rows},
    sql_invariants={"one token": "SELECT snapshot_id, SUM(tokens) AS tokens FROM tokens "
                                 "GROUP BY snapshot_id HAVING SUM(tokens) <> 1"},
    workload=workload,
)
