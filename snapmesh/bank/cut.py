"""The bank's reading of its logs for `snapmesh.checking.cut`: money, and its rules.

The bank ran natively on the packed path: a message is an amount, a node's state
its balance, and its log says both (the native records of snapmesh/bank/v1records.py,
`Init.tally`, `Send.tally`, `Recv.tally`, `Cut.tally`: the log's keys "balance" and
"amount"; `older` decodes a log line read as a dict into one). `cut.check_snapshot` compares a recorded in-flight
amount with its send record's and a recorded balance with the balance its log
gives before its cut (`cut.STATE`); the arithmetic behind that balance, and the
rules that are only money's, are here (docs/reconcile.md "The rules", 3 and 7):

  CUT_BALANCE       the balance the `cut` record holds != init + received - sent
                    before the cut;
  CONSERVATION      recorded balances + in flight != the total (the logs' `init`
                    balances, unless one is given);
  CLAIMED_TOTAL     the snapshot's own `total` is not its parts' sum;
  CLAIMED_EXPECTED  its `expected_total` is not the total.

A `Reading` holds the balances it replayed, so it is one per `cut.LogIndex`. Pure
(the protocol layer's rule): it sees records and the snapshot as listed, and its
problems are (rule, args) pairs that `cut` reports as its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import snapmesh.bank.v1records as v1records
from snapmesh.protocol import wal

CUT_BALANCE = "CUT_BALANCE"
CONSERVATION = "CONSERVATION"
CLAIMED_TOTAL = "CLAIMED_TOTAL"
CLAIMED_EXPECTED = "CLAIMED_EXPECTED"
RULES = (CUT_BALANCE, CONSERVATION, CLAIMED_TOTAL, CLAIMED_EXPECTED)


class Totals(NamedTuple):
    """What a snapshot holds in all (a verdict's `whole`): its balances, its amounts in flight, and the total."""

    balances: int
    in_flight: int
    total: int

    @property
    def observed(self) -> int:
        return self.balances + self.in_flight


class Reading:
    """The bank's `cut.Reading`. `total`: the money there is (None: the sum of the
    `init` balances it was fed)."""

    node_rules = (CUT_BALANCE,)

    def __init__(self, total: int | None = None) -> None:
        self.given_total = total
        self.initial_total = 0
        self.held: dict[str, int] = {}  # node -> its balance after the records fed so far
        self.at_cut: dict[tuple[str, int], int] = {}  # (node, lsn of a cut record) -> the balance before it

    @property
    def total(self) -> int:
        return self.initial_total if self.given_total is None else self.given_total

    # An app's record (a `wal` record, not a native one) holds no money: it reads as 0.

    def content(self, send: wal.Send) -> int:
        return getattr(send, "tally", 0)

    def said(self, cut: wal.Cut) -> int:
        return getattr(cut, "tally", 0)

    def state(self, node: str, cut: Any) -> int:
        return self.at_cut[(node, cut.lsn)]

    def feed(self, node: str, records: Sequence[wal.Record]) -> None:
        """The balance replayed: init + received - sent, kept at every cut."""
        held, at_cut, initial = self.held.get(node, 0), self.at_cut, 0
        send, recv, init, cut = "send", "recv", "init", "cut"
        for r in records:
            kind = r.KIND
            if kind == send:
                held -= getattr(r, "tally", 0)
            elif kind == recv:
                held += getattr(r, "tally", 0)
            elif kind == init:
                held += getattr(r, "tally", 0)
                initial += getattr(r, "tally", 0)
            elif kind == cut:
                at_cut[(node, r.lsn)] = held
        self.held[node] = held
        self.initial_total += initial

    def add(self, node: str, record: wal.Record) -> None:
        """One record, for a reader that streams (beside `cut.LogIndex.add`)."""
        self.feed(node, (record,))

    def check_node(self, node: str, cut: Any) -> Iterable[tuple[str, tuple]]:
        said, before = self.said(cut.record), self.state(node, cut)
        return ((CUT_BALANCE, (node, said, before)),) if said != before else ()

    def check_whole(self, snap: Any, verdict: Any) -> tuple[Totals, list[tuple[str, tuple]]]:
        totals = Totals(
            balances=sum(b for _, b in snap.nodes),
            in_flight=sum(amount for _, _, items in snap.channels for _, amount, _ in items),
            total=self.total,
        )
        found = []
        if totals.observed != totals.total:
            found.append((CONSERVATION, (totals.observed, totals.balances, totals.in_flight, totals.total)))
        claimed, expected = snap.claims.get("total"), snap.claims.get("expected_total")
        if claimed is not None and claimed != totals.observed:
            found.append((CLAIMED_TOTAL, (claimed, totals.observed)))
        if expected is not None and expected != totals.total:
            found.append((CLAIMED_EXPECTED, (expected, totals.total)))
        return totals, found

    def opening(self, restore: wal.Restore) -> wal.Record:
        return v1records.Init(lsn=restore.lsn, tally=getattr(restore, "tally", 0))

    def replayed(self, opening: wal.Record, replay: wal.Replay) -> wal.Record:
        return v1records.Init(lsn=opening.lsn, tally=getattr(opening, "tally", 0) + getattr(replay, "tally", 0))

    @staticmethod
    def older(record: wal.Record, where: str) -> wal.Record:
        """A native record (`wal.Older`, as `snapmesh.checking.cut.record` gives it) decoded; a
        value out of range is kept, for the checkers' rules to report."""
        return v1records.decode(record, where, values_checked=False)
