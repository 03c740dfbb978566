"""The bank's checks of a stored snapshot file (snapmesh/checking/snapshot_file.py).

A Snapshot (v1) carries the bank's arithmetic: each node's balance, each transfer's
amount in flight, the `total`, the `expected_total` and whether it is `conserved`.
The file checker (`snapshot_file.check`, `snapmesh snapshot verify`) checks what any
app's snapshot has (checksum, name, status, channels, seqs, msg ids, digests) and
asks this module about the money:

- `conserved(snapshot)`: the "conserved" check, its total is the expected total;
- `item_problem(name, transfer)`: an in-flight amount is positive (an app's
  message: a payload, amount 0);
- `whole_problems(snapshot)`: the total is the recorded balances plus the in-flight
  amounts, and `conserved` agrees with the totals.

Pure: a message in, problems out.
"""

from __future__ import annotations

from snapmesh.v1 import snapmesh_pb2 as pb


def conserved(snapshot: pb.Snapshot) -> tuple[bool, str]:
    """The "conserved" check: (passed, detail)."""
    return (snapshot.conserved and snapshot.total == snapshot.expected_total,
            f"total {snapshot.total}, expected {snapshot.expected_total}")


def item_problem(name: str, transfer: pb.InFlightTransfer) -> str | None:
    """An in-flight transfer of channel `name` whose amount is not positive (an app's message may have 0)."""
    if transfer.amount <= 0 and not transfer.HasField("payload"):
        return f"{name}: in-flight {transfer.msg_id} has amount {transfer.amount}"
    return None


def whole_problems(snapshot: pb.Snapshot) -> list[str]:
    """The snapshot's money against its own `total` and `conserved` (none to check in an
    app's snapshot without them: its invariants are its check)."""
    if snapshot.HasField("app") and not snapshot.HasField("conserved"):
        return []
    problems = []
    in_flight = sum(t.amount for c in snapshot.channels for t in c.in_flight)
    balances = sum(n.balance for n in snapshot.nodes)
    if snapshot.status == pb.Snapshot.COMPLETE and balances + in_flight != snapshot.total:
        problems.append(f"total {snapshot.total} is not balances {balances} + in flight {in_flight}")
    if snapshot.conserved != (snapshot.total == snapshot.expected_total):
        problems.append(f"conserved is {str(snapshot.conserved).lower()} but total {snapshot.total}, "
                        f"expected {snapshot.expected_total}")
    return problems
