"""The node's Prometheus metrics, in a registry of its own, every series labelled `node`
(names and labels: docs/metrics.md).

Every node counts its messages and the commands it refused in the same words,
whichever app it runs (snapmesh_messages_*, snapmesh_commands_refused_total).
An app's extra edge (extra_edge.py) may add series of its own to the registry
(a v1 adapter's, say), and be told each call the node's fence
refused before any app ran (`fence_refused`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from snapmesh.protocol.hops import HOP_SECONDS, NODE_HOPS


STALE_KINDS = ("channel", "start_snapshot", "restore")  # what a node fences by epoch (services/node/servicer.py)


class NodeMetrics:
    def __init__(self, node_id: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._node = node_id
        # Every app's messages and refused commands.
        self.messages_sent = Counter(
            "snapmesh_messages_sent_total", "Messages this node sent on its channels (any app's)",
            ["node"], registry=r,
        ).labels(node_id)
        self.messages_received = Counter(
            "snapmesh_messages_received_total", "Messages this node received and applied (any app's)",
            ["node"], registry=r,
        ).labels(node_id)
        self.commands_refused = Counter(
            "snapmesh_commands_refused_total",
            "Commands and queries to this node's app refused, by the gRPC status the client got", ["node", "grpc_code"],
            registry=r,
        )
        # Told the status of each call the node's fence refused (an app's edge counts them its way).
        self.on_fence_refusal: list[Callable[[str], None]] = []
        self.markers_sent = Counter(
            "snapmesh_markers_sent_total", "Snapshot markers this node sent", ["node"], registry=r
        ).labels(node_id)
        self.markers_received = Counter(
            "snapmesh_markers_received_total", "Snapshot markers this node received", ["node"], registry=r
        ).labels(node_id)
        self.recorded_messages = Counter(
            "snapmesh_channel_recorded_messages_total",
            "Messages recorded as in flight in a snapshot's channel state",
            ["node"],
            registry=r,
        ).labels(node_id)
        self.snapshots_completed = Counter(
            "snapmesh_node_snapshots_completed_total", "Snapshots this node finished its part of", ["node"], registry=r
        ).labels(node_id)
        self._unacked = Gauge(
            "snapmesh_channel_unacked_messages",
            "Messages sent on the channel to `peer` and not yet acknowledged",
            ["node", "peer"],
            registry=r,
        )
        self._reconnects = Counter(
            "snapmesh_channel_reconnects_total", "Channel streams to `peer` (re)opened", ["node", "peer"], registry=r
        )
        self._resent = Counter(
            "snapmesh_channel_resent_messages_total", "Messages sent again after a reconnect", ["node", "peer"],
            registry=r,
        )
        self._frames_sent = Counter(
            "snapmesh_channel_frames_sent_total",
            "Frames written on the channel stream to `peer` (each carries one or more messages and is acked once)",
            ["node", "peer"], registry=r,
        )
        self._payload_run_messages = Counter(
            "snapmesh_channel_payload_run_messages_total",
            "An app's messages received from `peer` packed in payload runs (the others came one ChannelMessage each)",
            ["node", "peer"], registry=r,
        )
        self._stream_errors = Counter(
            "snapmesh_channel_stream_errors_total", "Channel streams that ended in an error", ["node", "peer", "side"],
            registry=r,
        )
        self.fsync_seconds = Histogram(
            "snapmesh_log_fsync_seconds",
            "One group commit of the transfer log: write + fdatasync",
            ["node"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        ).labels(node_id)
        self.fsync_bytes = Counter(
            "snapmesh_log_written_bytes_total", "Bytes appended to the transfer log", ["node"], registry=r
        ).labels(node_id)
        self.log_records = Counter(
            "snapmesh_log_committed_records_total",
            "Records the transfer log's group commits made durable (over snapmesh_log_fsync_seconds_count: records per commit)",
            ["node"], registry=r,
        ).labels(node_id)
        self.segments_sealed = Counter(
            "snapmesh_log_segments_sealed_total",
            "Transfer-log segments sealed (at segment_records records or segment_bytes bytes)", ["node"], registry=r,
        ).labels(node_id)
        self.segment_bytes = Gauge(
            "snapmesh_log_active_segment_bytes",
            "Bytes in the transfer log's active segment, buffered records included (sealed past segment_bytes)",
            ["node"], registry=r,
        ).labels(node_id)
        self.receive_limit = Gauge(
            "snapmesh_node_receive_limit_bytes",
            "The largest message this node's gRPC server takes (the largest of what its RPCs may carry)",
            ["node"], registry=r,
        ).labels(node_id)
        self._hop = Histogram(
            "snapmesh_snapshot_hop_seconds",
            "Per snapshot, one hop of its path after this node's cut (snapmesh/protocol/hops.py)",
            ["node", "hop"], buckets=HOP_SECONDS, registry=r,
        )
        for hop in NODE_HOPS:
            self.hop(hop)
        self.report_failures = Counter(
            "snapmesh_report_state_failures_total", "ReportState calls to the controller that failed", ["node"],
            registry=r,
        ).labels(node_id)
        self.report_bytes = Counter(
            "snapmesh_report_sent_bytes_total",
            "Bytes of the reports the controller accepted, as sent (a state as blocks: its manifest and new blocks)",
            ["node"], registry=r,
        ).labels(node_id)

        self.restore_bytes = Counter(
            "snapmesh_restore_received_bytes_total",
            "Bytes of the restores this node took, as received (a state as blocks: its manifest and new blocks)",
            ["node"], registry=r,
        ).labels(node_id)

        self._stale_epoch = Counter(
            "snapmesh_stale_epoch_refused_total",
            "Channel opens, snapshot starts and restores from an older epoch, refused",
            ["node", "kind"],
            registry=r,
        )
        for kind in STALE_KINDS:
            self.stale_epoch(kind)
        self.epoch = Gauge("snapmesh_epoch", "This node's epoch (one more per restore)", ["node"], registry=r).labels(
            node_id
        )

        self.request_window_bytes = Gauge(
            "snapmesh_request_window_bytes",
            "Bytes the request-id window holds: retry keys, their answers and digests (limit: reply_window_bytes)",
            ["node"], registry=r,
        ).labels(node_id)

    def initialise(
        self, *, incoming: Iterable[str], outgoing: Iterable[str], command_codes: Iterable[str] = ()
    ) -> None:
        """Create the labelled series known up front at 0, so that rates and alerts
        have data before the first event (Prometheus' advice for known labels):
        `command_codes` a refused command's statuses."""
        for peer in incoming:
            self.stream_errors(peer, "receiver")
            self.payload_run_messages(peer)
        for peer in outgoing:
            self.unacked(peer)
            self.reconnects(peer)
            self.resent(peer)
            self.frames_sent(peer)
            self.stream_errors(peer, "sender")
        for code in command_codes:
            self.command_refused(code)

    def stale_epoch(self, kind: str) -> Counter:
        return self._stale_epoch.labels(self._node, kind)

    def unacked(self, peer: str) -> Gauge:
        return self._unacked.labels(self._node, peer)

    def reconnects(self, peer: str) -> Counter:
        return self._reconnects.labels(self._node, peer)

    def resent(self, peer: str) -> Counter:
        return self._resent.labels(self._node, peer)

    def frames_sent(self, peer: str) -> Counter:
        return self._frames_sent.labels(self._node, peer)

    def payload_run_messages(self, peer: str) -> Counter:
        return self._payload_run_messages.labels(self._node, peer)

    def stream_errors(self, peer: str, side: str) -> Counter:
        return self._stream_errors.labels(self._node, peer, side)

    def hop(self, hop: str) -> Histogram:
        return self._hop.labels(self._node, hop)

    def fence_refused(self, code: str) -> None:
        """A call the node's fence refused with `code` (fence.py F1, F4), told to whoever counts it."""
        for count in self.on_fence_refusal:
            count(code)

    def command_refused(self, code: str) -> Counter:
        """A refused command or query to the app (the node's Edge: Submit, SubmitBatch, Query)."""
        return self.commands_refused.labels(self._node, code)

    def observe_round(self, records: int) -> None:
        self.log_records.inc(records)

    def observe_fsync(self, seconds: float, nbytes: int) -> None:
        self.fsync_seconds.observe(seconds)
        self.fsync_bytes.inc(nbytes)
