"""The bank's names in the formats that must never change, in one place.

The framework carries one native number per node and per message, its tally
(the bank keeps its money there: the packed int64 fast path). The node logs,
the trace events, the snapshot files and the v1 messages were written when the
bank was the only app, so their keys say "balance" and "amount". Those keys are
a compatibility promise (old logs must still load, old clients still parse), so
the generic code names the tally by role and reads and writes these keys only
through the constants below. Pure: no I/O, importable from the pure layer.
"""

NODE_TALLY_KEY = "balance"  # a log record's, trace event's or FullState's tally of a node (v1)
MESSAGE_TALLY_KEY = "amount"  # a send/recv/replay record's or an in-flight item's tally (v1)
RUN_TALLIES_KEY = "amounts"  # a packed outbox run's tallies, one per seq (OutboxRun.amounts)
RECORDED_TALLIES_KEY = "amounts"  # a trace's channel_recorded event's tallies, one per msg (in arrival order)
RESTORED_TALLY_KEY = "restored_balance"  # a checkpoint record's tally right after the last restore (v1)
TALLY_METRIC = "snapmesh_balance"  # the node's gauge of its tally (the dashboards' queries name it)
TALLY_METRIC_HELP = "This node's current balance"  # its HELP text, as scrapers have always read it
