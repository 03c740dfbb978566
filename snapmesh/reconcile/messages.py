"""Every discrepancy the reconciliation can report: a priority and a printf template.

Each snapshot message is named as its rule in `snapmesh.checking.cut`, or in the bank's
reading `snapmesh.bank.cut` (docs/reconcile.md "The rules"):
`getattr(messages, problem.rule)` words a `cut.Problem`.

Shared by the Spark job (``format_string``) and the plain-Python baseline (``%``),
so both say the same thing in the same words. A verdict's "first discrepancy" is the
smallest (priority, text): completeness before balances, balances before channels,
channels before conservation, and the snapshot's own claims last. Only ``%s`` is
used: Java's String.format and Python's ``%`` agree on it.
"""

from __future__ import annotations

from typing import NamedTuple


class Message(NamedTuple):
    priority: int
    template: str

    def format(self, *args: object) -> tuple[int, str]:
        return self.priority, self.template % args


# Whole-log checks (the "logs" verdict row).
NO_INIT = Message(1, "node %s: no init record")
MANY_INITS = Message(1, "node %s: %s init records")
INIT_NOT_FIRST = Message(1, "node %s: init at lsn %s, not 1")
LSN_NOT_LINE = Message(2, "node %s: line %s has lsn %s (lsn must count lines 1, 2, 3, ...)")
RECV_NEVER_SENT = Message(3, "msg_id %s: received by %s but never sent")
SENT_TWICE = Message(3, "msg_id %s: sent %s times")
RECEIVED_TWICE = Message(3, "msg_id %s: received %s times")
RECV_MISMATCH = Message(3, "msg_id %s: received as %s, sent as %s")
TRANSFER = "%s->%s seq %s amount %s"  # how RECV_MISMATCH describes each side
SEQ_DUPLICATE = Message(4, "channel %s->%s: seq %s logged %s times by %s %s")
SEQ_MISSING = Message(4, "channel %s->%s: seq %s missing from %s %s's log")
SEQ_NOT_1_TO_N = Message(4, "channel %s->%s: %s %s's seqs are not 1..n")
RECV_BEYOND_SENT = Message(4, "channel %s->%s: %s received up to seq %s, %s sent only up to %s")

# Per-snapshot checks.
MISSING_NODE = Message(10, "snapshot missing node %s")
UNKNOWN_NODE = Message(10, "node %s is in the snapshot but not in the logs")
NODE_LISTED_TWICE = Message(10, "node %s listed %s times")
NO_CUT = Message(11, "node %s: no cut record for this snapshot")
MANY_CUTS = Message(11, "node %s: %s cut records for this snapshot")
MISSING_CHANNEL = Message(12, "snapshot missing channel %s->%s")
CHANNEL_LISTED_TWICE = Message(12, "channel %s->%s listed %s times")
STATE = Message(20, "node %s: recorded %s, logs say %s before cut")
CUT_BALANCE = Message(21, "node %s: cut record says %s, logs say %s before cut")
SENDER_NOT_PREFIX = Message(30, "channel %s->%s: %s logged %s sends/markers before its cut, highest seq %s")
RECEIVER_NOT_PREFIX = Message(30, "channel %s->%s: %s logged %s receipts before its cut, highest seq %s")
ORPHAN_RECEIPT = Message(31, "channel %s->%s: %s received seq %s before its cut, %s sent only up to seq %s before its cut")
MISSING_IN_FLIGHT = Message(32, "channel %s->%s: missing in-flight %s")
IN_FLIGHT_NEVER_SENT = Message(33, "channel %s->%s: in-flight %s was never sent")
IN_FLIGHT_OTHER_CHANNEL = Message(33, "channel %s->%s: in-flight %s was sent on %s->%s")
IN_FLIGHT_AFTER_CUT = Message(33, "channel %s->%s: in-flight %s was sent after %s's cut")
IN_FLIGHT_RECEIVED = Message(33, "channel %s->%s: in-flight %s was received by %s before its cut")
UNEXPECTED_IN_FLIGHT = Message(33, "channel %s->%s: unexpected in-flight %s")
IN_FLIGHT_LISTED_TWICE = Message(34, "channel %s->%s: in-flight %s listed %s times")
IN_FLIGHT_CONTENT = Message(34, "channel %s->%s: in-flight %s amount %s, logs say %s")
IN_FLIGHT_SEQ = Message(34, "channel %s->%s: in-flight %s seq %s, logs say %s")
IN_FLIGHT_ORDER = Message(35, "channel %s->%s: in-flight not in seq order")
CONSERVATION = Message(40, "conservation: recorded %s (balances %s + in-flight %s), initial total %s")
CLAIMED_TOTAL = Message(50, "snapshot says total %s, its parts sum to %s")
CLAIMED_EXPECTED = Message(50, "snapshot says expected_total %s, logs say %s")

# An app's snapshot (snapmesh.app), beyond the checks above: after all of them.
NO_CUT_DIGEST = Message(60, "node %s: its cut record has no state digest")
NO_STATE = Message(61, "node %s: no state recorded")
STATE_BLOCK = Message(61, "%s")  # blockstates' words: "snapshot S, node N, block sha256:H: missing from DIR"
STATE_DIGEST = Message(61, "node %s: state digest %s, its cut record says sha256:%s")
STATE_BYTES = Message(62, "node %s: recorded state hashes to sha256:%s, its cut record says sha256:%s")
NO_PAYLOAD = Message(63, "channel %s->%s: in-flight seq %s has no payload")
IN_FLIGHT_PAYLOAD = Message(63, "channel %s->%s: in-flight seq %s payload sha256:%s, %s logged sha256:%s")

SKIPPED = "skipped: status %s%s"

# An app's figures (``figures``: its describe's totals), after the checks above.
FIGURES_TOTAL = Message(64, "%s's describe: total %s, expected_total %s")
FIGURES_CLAIMED = Message(65, "snapshot says %s %s, %s's describe says %s")
FIGURES_RAISED = Message(64, "%s's describe raised %s")
