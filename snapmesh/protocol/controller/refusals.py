"""What the controller machine refuses, each naming the gRPC status it becomes (`code`).

The machine (snapmesh/protocol/controller/machine.py) raises these and changes
nothing; a shell turns `code` into the status and the words into its details.
"""

from __future__ import annotations

from snapmesh.protocol.controller.tracker import TrackerError


class TooManySnapshots(Exception):
    """A trigger at the admission limit (A1): nothing started or journaled."""

    code = "RESOURCE_EXHAUSTED"


class UnknownInitiator(Exception):
    """A trigger naming a node outside the topology (A2): nothing started or journaled."""

    code = "INVALID_ARGUMENT"


class StaleReport(TrackerError):
    """A report from an epoch before the cluster's (a node not restored yet, or a
    message from before a restore): refused, changing nothing."""

    code = "FAILED_PRECONDITION"


def stale_report(report_epoch: int, epoch: int) -> str:
    """Why a report of `report_epoch` is refused in cluster epoch `epoch` ("" when it is not)."""
    if report_epoch and report_epoch < epoch:
        return f"a report from epoch {report_epoch}; the cluster is in epoch {epoch}"
    return ""


class MissingBlocks(Exception):
    """A report sent as blocks naming blocks neither it nor the controller holds
    (snapmesh/protocol/blocks.py B4): refused, changing nothing; the node sends it whole."""

    code = "FAILED_PRECONDITION"
