"""The shop's app: warehouses that hold stock, take orders and move stock to each other.

Each node is a warehouse. It holds a count of each item, takes orders, and moves
stock to another warehouse on request. An order it cannot fill from its own stock
goes on to the next warehouse, as a message, and so on until one fills it or every
warehouse has seen it ("unfilled", kept where it ends). Commands, messages, queries
and the state are JSON (keys sorted, so the bytes are the same every time):

    {"op": "order", "item": "pear", "qty": 3}            -> {"order": "p1-7", "status": "fulfilled", "warehouse": "p1"}
    {"op": "move", "item": "pear", "qty": 5, "to": "p2"} -> {"item": "pear", "left": 95}
    {"op": "restock", "item": "pear", "qty": 20}         -> {"item": "pear", "left": 115}
    query {"op": "stock"}                                -> {"placed": 7, "stock": {...}, "warehouse": "p1"}

An order's id is the warehouse that took it and its count there ("p1-7"), so ids
never clash; a client's retry is exactly once through the node's request id.

The invariants read a snapshot (a consistent cut):
- "stock conserved": per item, the stock at the warehouses, plus the stock moving
  between them (in flight), plus what fulfilled orders shipped, is the initial
  stock plus what was restocked;
- "each order once": every order a warehouse took is in exactly one place: filled
  or unfilled at one warehouse, or in flight to the next one; and no other order is.

`[app]` params: `items` (default apple, pear, plum) and `stock` (each warehouse's
starting count of each item, default 100). Every warehouse keeps its orders (the
invariant sees each one); a real shop would archive them.
"""

from __future__ import annotations

import json

from snapmesh.app import App, Context, NodeInfo, Refused, View

ITEMS = ("apple", "pear", "plum")
STOCK = 100
MAX_QTY = 1_000_000


def encode(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def items_of(params: dict) -> list[str]:
    return sorted(params.get("items") or ITEMS)


def stock_of(params: dict) -> int:
    return int(params.get("stock", STOCK))


class Warehouse:
    """One warehouse: its stock, its count of orders taken, and the orders that ended here."""

    def __init__(self, info: NodeInfo):
        self.me = info.node_id
        self.peers = set(info.peers_out)
        later = sorted(p for p in info.peers_out if p > self.me)
        self.next = (later or sorted(info.peers_out) or [None])[0]  # where an order goes on to, wrapping
        self.hops = len({self.me, *info.peers_out, *info.peers_in}) - 1  # an order visits each warehouse once
        self.items = items_of(info.params)
        self.stock = {item: stock_of(info.params) for item in self.items}
        self.restocked = {item: 0 for item in self.items}
        self.placed = 0
        self.orders: dict[str, list] = {}  # order id -> [item, qty, "fulfilled" | "unfilled"]

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        request = self._parse(command, ctx)
        op, item, qty = request.get("op"), request.get("item"), request.get("qty")
        if op not in ("order", "move", "restock"):
            ctx.refuse("INVALID_ARGUMENT", f"unknown op {op!r}; try order, move or restock")
        if item not in self.stock:
            ctx.refuse("INVALID_ARGUMENT", f"unknown item {item!r}; this shop has {', '.join(self.items)}")
        if type(qty) is not int or not 0 < qty <= MAX_QTY:
            ctx.refuse("INVALID_ARGUMENT", f"qty must be a whole number from 1 to {MAX_QTY}, not {qty!r}")
        if op == "order":
            self.placed += 1
            return encode(self._take(f"{self.me}-{self.placed}", item, qty, self.hops, ctx))
        if op == "restock":
            self.stock[item] += qty
            self.restocked[item] += qty
            return encode({"item": item, "left": self.stock[item]})
        to = request.get("to")
        if to not in self.peers:
            ctx.refuse("INVALID_ARGUMENT", f"{self.me} cannot move stock to {to!r}; it reaches {sorted(self.peers)}")
        if self.stock[item] < qty:
            ctx.refuse("FAILED_PRECONDITION", f"{self.me} has {self.stock[item]} {item}, not {qty}")
        self.stock[item] -= qty
        ctx.send(to, encode({"kind": "stock", "item": item, "qty": qty}))
        return encode({"item": item, "left": self.stock[item]})

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        message = json.loads(payload)
        if message["kind"] == "stock":
            self.stock[message["item"]] += message["qty"]
        elif message["kind"] == "order":
            self._take(message["order"], message["item"], message["qty"], message["hops"], ctx)
        else:
            raise ValueError(f"{self.me}: unexpected message {payload[:60]!r} from {src}")

    def _take(self, order: str, item: str, qty: int, hops: int, ctx: Context) -> dict:
        """Fill the order here, pass it on, or keep it as unfilled when no warehouse is left."""
        if self.stock[item] >= qty:
            self.stock[item] -= qty
            self.orders[order] = [item, qty, "fulfilled"]
            return {"order": order, "status": "fulfilled", "warehouse": self.me}
        if hops > 0 and self.next is not None:
            ctx.send(self.next, encode({"kind": "order", "order": order, "item": item, "qty": qty, "hops": hops - 1}))
            return {"order": order, "status": "forwarded", "warehouse": self.next}
        self.orders[order] = [item, qty, "unfilled"]
        return {"order": order, "status": "unfilled", "warehouse": self.me}

    def on_query(self, query: bytes) -> bytes:
        try:
            request = json.loads(query)
        except ValueError:
            request = None
        if not isinstance(request, dict) or request.get("op") not in ("stock", "order"):
            raise Refused("INVALID_ARGUMENT", 'a query is {"op": "stock"} or {"op": "order", "order": ID}')
        if request["op"] == "stock":
            return encode({"warehouse": self.me, "stock": self.stock, "placed": self.placed})
        if request.get("order") not in self.orders:
            raise Refused("NOT_FOUND", f"order {request.get('order')!r} did not end at {self.me}")
        item, qty, status = self.orders[request["order"]]
        return encode({"order": request["order"], "item": item, "qty": qty, "status": status, "warehouse": self.me})

    def _parse(self, command: bytes, ctx: Context) -> dict:
        try:
            request = json.loads(command)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            ctx.refuse("INVALID_ARGUMENT", f'a command is a JSON object such as {{"op": "order", "item": '
                                           f'"{self.items[0]}", "qty": 1}}, not {command[:40]!r}')
        return request

    def snapshot(self) -> bytes:
        return encode({"stock": self.stock, "restocked": self.restocked, "placed": self.placed, "orders": self.orders})

    def restore(self, state: bytes) -> None:
        saved = json.loads(state)
        self.stock, self.restocked = saved["stock"], saved["restocked"]
        self.placed, self.orders = saved["placed"], saved["orders"]


# ---- the cut: what the invariants, the page and Spark read --------------------------------


def moving(view: View, kind: str) -> list[tuple[str, dict]]:
    """The messages of one kind in flight at the cut, with their channel."""
    found = []
    for src, dst, _, payload in view.in_flight:
        message = json.loads(payload)
        if message.get("kind") == kind:
            found.append((f"{src}->{dst}", message))
    return found


def stock_rows(view: View) -> list[dict]:
    """The ledger of every item at the cut: held, moving and shipped count up, the initial
    stock and the restocks count down, so a conserved item's rows sum to 0."""
    states = {node: json.loads(state) for node, state in view.states.items()}
    rows = [{"place": "", "item": item, "kind": "initial", "qty": -stock_of(view.params) * len(states)}
            for item in items_of(view.params)]
    for node, state in sorted(states.items()):
        shipped = {item: 0 for item in state["stock"]}
        for item, qty, status in state["orders"].values():
            shipped[item] += qty if status == "fulfilled" else 0
        rows += [{"place": node, "item": item, "kind": "held", "qty": n} for item, n in sorted(state["stock"].items())]
        rows += [{"place": node, "item": item, "kind": "shipped", "qty": n} for item, n in sorted(shipped.items())]
        rows += [{"place": node, "item": item, "kind": "restocked", "qty": -n}
                 for item, n in sorted(state["restocked"].items())]
    rows += [{"place": channel, "item": m["item"], "kind": "moving", "qty": m["qty"]} for channel, m in moving(view, "stock")]
    return [{"snapshot_id": view.snapshot_id, **row} for row in rows]


def order_rows(view: View) -> list[dict]:
    """Where each order is at the cut: ended at a warehouse, or in flight to the next."""
    rows = []
    for node, state in sorted(view.states.items()):
        rows += [{"order_id": order, "place": node, "status": status}
                 for order, (_, _, status) in sorted(json.loads(state)["orders"].items())]
    rows += [{"order_id": m["order"], "place": channel, "status": "in flight"} for channel, m in moving(view, "order")]
    return [{"snapshot_id": view.snapshot_id, **row} for row in rows]


def placed_rows(view: View) -> list[dict]:
    """Every order a warehouse took: ids p1-1 .. p1-n for n orders at p1."""
    return [{"snapshot_id": view.snapshot_id, "order_id": f"{node}-{k}", "warehouse": node}
            for node, state in sorted(view.states.items()) for k in range(1, json.loads(state)["placed"] + 1)]


def stock_conserved(view: View) -> list[str]:
    off: dict[str, int] = {}
    for row in stock_rows(view):
        off[row["item"]] = off.get(row["item"], 0) + row["qty"]
    return [f"{item}: held + moving + shipped is {n:+} off the initial stock plus restocks"
            for item, n in sorted(off.items()) if n != 0]


def each_order_once(view: View) -> list[str]:
    places: dict[str, list[str]] = {row["order_id"]: [] for row in placed_rows(view)}
    unknown = []
    for row in order_rows(view):
        (places[row["order_id"]] if row["order_id"] in places else unknown).append(f"{row['order_id']} at {row['place']}")
    return [f"order {order} is in {len(found)} places: {', '.join(found) or 'none'}"
            for order, found in sorted(places.items()) if len(found) != 1] + \
        [f"order {where}, which no warehouse took" for where in unknown]


def describe(view: View) -> dict:
    states = {node: json.loads(state) for node, state in view.states.items()}
    return {
        "stock": {node: state["stock"] for node, state in sorted(states.items())},
        "orders taken": sum(state["placed"] for state in states.values()),
        "moving": [f"{m['qty']} {m['item']} {channel}" for channel, m in moving(view, "stock")],
        "orders in flight": [f"{m['order']} {channel}" for channel, m in moving(view, "order")],
    }


def workload(nodes: list[NodeInfo], rng):
    """Orders, moves and restocks at random warehouses; an order a warehouse is short of travels on."""
    items = items_of(nodes[0].params)
    while True:
        node = rng.choice(nodes)
        item, roll = rng.choice(items), rng.random()
        if roll < 0.6:
            command = {"op": "order", "item": item, "qty": rng.randint(1, 12)}
        elif roll < 0.85 and node.peers_out:
            command = {"op": "move", "item": item, "qty": rng.randint(1, 20), "to": rng.choice(sorted(node.peers_out))}
        else:
            command = {"op": "restock", "item": item, "qty": rng.randint(5, 30)}
        yield node.node_id, encode(command)


app = App(
    name="shop",
    new=Warehouse,
    invariants={"stock conserved": stock_conserved, "each order once": each_order_once},
    describe=describe,
    views={"stock": stock_rows, "orders": order_rows, "placed": placed_rows},
    sql_invariants={
        "stock conserved": "SELECT snapshot_id, item, SUM(qty) AS off_by FROM stock "
                           "GROUP BY snapshot_id, item HAVING SUM(qty) <> 0",
        "each order once": "SELECT p.snapshot_id, p.order_id, COUNT(o.place) AS places FROM placed p "
                           "LEFT JOIN orders o ON o.snapshot_id = p.snapshot_id AND o.order_id = p.order_id "
                           "GROUP BY p.snapshot_id, p.order_id HAVING COUNT(o.place) <> 1",
        "no order from nowhere": "SELECT o.snapshot_id, o.order_id, o.place FROM orders o WHERE NOT EXISTS "
                                 "(SELECT 1 FROM placed p WHERE p.snapshot_id = o.snapshot_id AND p.order_id = o.order_id)",
    },
    workload=workload,
)
