"""An app's exported snapshots judged by `cut` with `cut.Payloads` (an app's reading), on a
data dir `snapmesh.synth.apps` wrote: what the Spark agreement test and the pure property
test of synth's app mode both read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from snapmesh.checking import cut
from snapmesh.checking.node_logs import read_logs
from snapmesh.protocol import wal
from snapmesh.reconcile import messages as M

# The rule each doctoring of `snapmesh.synth.apps` breaks (the first problem of its snapshot).
CAUGHT_BY = {"lost-inflight": cut.MISSING_IN_FLIGHT, "changed-payload": cut.IN_FLIGHT_CONTENT,
             "wrong-state-digest": cut.STATE, "wrong-state": cut.STATE}


def recorded_state(node: dict) -> str:
    """A node's state as `cut.Payloads` reads it: the sha256 of its bytes, when its
    state_digest says the same; a value no digest equals when the snapshot contradicts itself."""
    said = (node.get("state_digest") or "").removeprefix("sha256:")
    held = hashlib.sha256(wal.unpack(node.get("state") or "", node["node_id"])).hexdigest()
    return held if said == held else f"state_digest sha256:{said} of bytes sha256:{held}"


def listed(doc: dict) -> cut.Snapshot:
    """An exported app snapshot (protobuf JSON) for `cut` with `cut.Payloads`."""
    return cut.Snapshot(
        snapshot_id=doc["snapshot_id"],
        nodes=[(n["node_id"], recorded_state(n)) for n in doc.get("nodes") or []],
        channels=[(c["src"], c["dst"], [(m["msg_id"], m.get("payload"), int(m["seq"])) for m in c.get("in_flight") or []])
                  for c in doc.get("channels") or []],
    )


def pure_verdicts(data: Path) -> dict[str, tuple[bool, str | None]]:
    """snapshot id -> (consistent, the rule of the first problem) by `cut` with `cut.Payloads`."""
    logs = {node: [cut.record(r, node) for r in records] for node, records in read_logs(data).items()}
    index = cut.LogIndex.of(logs, reading=cut.Payloads())
    out = {}
    for path in sorted((data / "snapshots").glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("status") != "COMPLETE":
            continue
        verdict = cut.check_snapshot(index, listed(doc))
        first = min(((getattr(M, p.rule).format(*p.args), p.rule) for p in verdict.problems), default=None)
        out[doc["snapshot_id"]] = (verdict.consistent, first[1] if first else None)
    return out
