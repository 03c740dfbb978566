"""The bank's own series on a node that hosts it: its transfers, their refusals, its balance.

The dashboards (deploy/compose/grafana, deploy/helm) and the benchmark read these
names, so the bank's v1 edge (edge.py) keeps them in the node's registry: the node's
shell counts every app's messages and refused commands in its own words
(services/node/metrics.py) and knows nothing of these. A node of another app exports
none of them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from snapmesh.bank.formats import TALLY_METRIC, TALLY_METRIC_HELP


class BankMetrics:
    """The bank's series of one node, in that node's registry."""

    def __init__(self, node_id: str, registry: CollectorRegistry, codes: set[str]) -> None:
        self._node = node_id
        self.sent = Counter(
            "snapmesh_transfers_sent_total", "Transfers this node sent (the bank)", ["node"], registry=registry
        ).labels(node_id)
        self.received = Counter(
            "snapmesh_transfers_received_total", "Transfers this node received and applied (the bank)",
            ["node"], registry=registry,
        ).labels(node_id)
        self._refused = Counter(
            "snapmesh_transfers_refused_total", "Transfer requests refused (bad argument, no funds)",
            ["node", "grpc_code"], registry=registry,
        )
        self.balance = Gauge(TALLY_METRIC, TALLY_METRIC_HELP, ["node"], registry=registry).labels(node_id)
        for code in codes:  # at 0 from the start, so rates and alerts have data before the first refusal
            self.refused(code)
        self._received_seen = 0

    def refused(self, code: str) -> Counter:
        """A refused transfer, by the status its client got."""
        return self._refused.labels(self._node, code)

    def received_up_to(self, count: int) -> None:
        """The node has received `count` messages in all since it started: each is a transfer."""
        if count > self._received_seen:
            self.received.inc(count - self._received_seen)
            self._received_seen = count
