"""The record schema (the one place it is written down) and the job's Spark schemas.

Nothing is inferred. Log file names are here too: a node's log is its sealed
segments ``<node>.log.<first lsn, 12 digits>.jsonl`` and the active ``<node>.log.jsonl``.

The schemas:

* ``LOG_RECORD``: one line of ``<node_id>.log.jsonl`` as ``from_json`` parses it.
  ``_corrupt`` receives the raw line when it is not JSON or a field has the wrong
  type (an int64 field given a string, a float or an out-of-range number).
* ``EVENT``: a parsed, located log record, the input of every check.
* ``INGESTED``: a sealed segment converted to Parquet (``snapmesh reconcile ingest``).
* ``SNAPSHOT``: one exported snapshot file (protobuf JSON: int64 values are strings).
* ``VERDICT``: the output, one row per snapshot plus one row for the whole-log checks.
"""

from __future__ import annotations

from pyspark.sql import types as T

import snapmesh.bank.v1records as v1records
from snapmesh.protocol import wal

CORRUPT_COLUMN = "_corrupt"

# <node>.log.jsonl (active) and <node>.log.<first lsn, 12 digits>.jsonl (sealed).
LOG_FILE_PATTERN = r"([^/]*)\.log(?:\.([0-9]{12}))?\.jsonl$"
SEGMENT_DIGITS = 12
ACTIVE_FIRST_LSN = (1 << 63) - 1  # the active file sorts after every sealed segment


def segment_file_name(node_file_stem: str, first_lsn: int) -> str:
    """``p1.log.000000000001.jsonl``: the name of a sealed segment (`snapmesh.protocol.wal`'s)."""
    return wal.sealed_name(node_file_stem, first_lsn)



def _fields(*pairs: tuple[str, T.DataType], nullable: bool = True) -> list[T.StructField]:
    return [T.StructField(name, type_, nullable) for name, type_ in pairs]


# The kinds the checks read; their required fields, in the order `snapmesh.protocol.wal.SPEC`
# (the one definition of the log record) gives them, or for the kinds the bank's native
# nodes wrote with a tally, its v1 records' (snapmesh/bank/v1records.py), make the columns.
CHECKED_KINDS = ("init", "send", "recv", "cut", "marker_sent", "marker_recv", "restore", "replay")
_SPARK_TYPES = {int: T.LongType(), str: T.StringType()}


def _spec(kind: str) -> tuple[tuple[str, type, bool], ...]:
    """A checked kind's fields: the bank's native record's (its tally's key, no mark;
    snapmesh/bank/v1records.py) where it has one, else the framework's."""
    if kind in v1records.SPEC:
        return tuple((key, type_, required) for key, _, type_, required in v1records.SPEC[kind])
    return wal.SPEC[kind]


def _payload() -> tuple[tuple[str, T.DataType], ...]:
    columns: dict[str, T.DataType] = {name: _SPARK_TYPES[type_] for name, type_, _ in wal.COMMON}
    for kind in CHECKED_KINDS:
        for name, type_, required in _spec(kind):
            if required:
                columns.setdefault(name, _SPARK_TYPES[type_])
    return tuple(columns.items())


# node, lsn, kind, balance, msg_id, src, dst, seq, amount, snapshot_id, epoch, deliveries
_EVENT_PAYLOAD = _payload()
INT_COLUMNS = tuple(name for name, type_ in _EVENT_PAYLOAD if isinstance(type_, T.LongType))
STR_COLUMNS = tuple(name for name, type_ in _EVENT_PAYLOAD if isinstance(type_, T.StringType))

# One log line, as parsed by from_json (PERMISSIVE, corrupt record column).
LOG_RECORD = T.StructType(_fields(*_EVENT_PAYLOAD, (CORRUPT_COLUMN, T.StringType())))

# Required fields per kind (besides node, lsn and kind, which every record needs).
# Kinds not listed here are ignored by the checks ("abort", "restart", "checkpoint",
# ...), and so are fields not in LOG_RECORD (e.g. "request_id" on "send").
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    kind: tuple(name for name, _, required in _spec(kind) if required) for kind in CHECKED_KINDS
}

# An app's record has no tally (only the bank run natively keeps one), so it may leave
# its tally's key out (written with 0 before): kind -> the key whose presence marks the
# record an app's (wal.APP_MARKS, of the kinds checked). A missing tally is then 0; on a
# record without the mark it is bad input.
APP_MARKS: dict[str, str] = {kind: mark for kind, mark in wal.APP_MARKS.items() if kind in CHECKED_KINDS}
# kind -> its tally's key ("balance", "amount": the v1 format's, snapmesh/bank/formats.py)
TALLY_KEYS: dict[str, str] = {kind: key for kind, key in v1records.TALLY_KEYS.items() if kind in APP_MARKS}

# A located, well-formed log record: the input of the checks.
EVENT = T.StructType(
    _fields(("file", T.StringType()), ("line", T.LongType())) + _fields(*_EVENT_PAYLOAD)
)

# A sealed segment as Parquet: the parsed lines, in file order, with their line in
# the file and what is wrong with them (``file`` is the segment's base name).
INGESTED = T.StructType(
    _fields(("file", T.StringType()), ("line", T.LongType()))
    + _fields(*_EVENT_PAYLOAD)
    + _fields(("problem", T.StringType()))
)

def _strings(*names: str) -> T.StructType:
    return T.StructType(_fields(*((name, T.StringType()) for name in names)))


def _channels(in_flight: T.StructType) -> T.ArrayType:
    """A snapshot's channels, each with its in-flight entries of `in_flight`."""
    return T.ArrayType(T.StructType(_fields(("src", T.StringType()), ("dst", T.StringType()),
                                            ("in_flight", T.ArrayType(in_flight)))))


_IN_FLIGHT = _strings("msg_id", "amount", "seq")

# One snapshot file (snapshot_pb2.Snapshot in protobuf JSON form).
SNAPSHOT = T.StructType(
    _fields(
        ("snapshot_id", T.StringType()),
        ("initiator", T.StringType()),
        ("status", T.StringType()),
        ("reason", T.StringType()),
        ("nodes", T.ArrayType(_strings("node_id", "balance"))),
        ("channels", _channels(_IN_FLIGHT)),
        ("total", T.StringType()),
        ("conserved", T.BooleanType()),
        ("expected_total", T.StringType()),
        ("started_at", T.StringType()),
        ("finished_at", T.StringType()),
        ("epoch", T.StringType()),  # the epoch it was taken in; absent (0) or "1": epoch 1
        ("app", _strings("spec")),  # an app's snapshot: app.spec its module:attr; absent: the bank
        (CORRUPT_COLUMN, T.StringType()),
    )
)

# What the app checks read of a snapshot file (`apps`, `invariants`): an app's bytes, as
# protobuf JSON has them: a node's state (its snapshot() bytes, base64), or its manifest
# (`state_blocks.hashes`, base64: large states, read by `blockstates`), and state_digest
# ("sha256:<hex>"), each in-flight message's payload (base64). The bank has none of them.
_APP_NODE = T.StructType(
    _strings("node_id", "state", "state_digest").fields
    + _fields(("state_blocks", T.StructType(_fields(("hashes", T.ArrayType(T.StringType()))))))
)
APP_SNAPSHOT = T.StructType(
    _fields(
        ("snapshot_id", T.StringType()),
        ("status", T.StringType()),
        ("app", _strings("spec", "name")),
        ("started_at", T.StringType()),
        ("total", T.StringType()),  # the figures an app's adapter filled (`figures` checks them)
        ("expected_total", T.StringType()),
        ("nodes", T.ArrayType(_APP_NODE)),
        ("channels", _channels(_strings("seq", "payload"))),
        (CORRUPT_COLUMN, T.StringType()),
    )
)

# A snapshot as the checks see it: SNAPSHOT plus the file it came from.
SNAPSHOT_WITH_FILE = T.StructType([T.StructField("file", T.StringType())] + SNAPSHOT.fields)

SCOPE_LOGS = "logs"
SCOPE_SNAPSHOT = "snapshot"
SCOPE_RESTORE = "restore"
SCOPE_LEFT_OUT = "left_out"  # a notice: the torn last line of an active file, left out
SCOPE_INVARIANT = "invariant"  # an app's SQL invariant (`reconcile --app`): violated in a snapshot, or held

VERDICT = T.StructType(
    _fields(
        ("scope", T.StringType()),  # "logs" (whole-log checks), "snapshot", "restore", "invariant" or "left_out"
        ("snapshot_id", T.StringType()),  # null on the "logs" row
        ("status", T.StringType()),  # snapshot status; "-" on the "logs" row
        ("consistent", T.BooleanType()),  # null: skipped (snapshot not COMPLETE)
        ("nodes_checked", T.LongType()),
        ("channels_checked", T.LongType()),
        ("expected_total", T.LongType()),
        ("observed_total", T.LongType()),
        ("discrepancies", T.LongType()),
        ("first_discrepancy", T.StringType()),
    )
)

# A line or file that is not valid input (exit status 2).
BAD_INPUT = T.StructType(
    _fields(("file", T.StringType()), ("line", T.LongType()), ("problem", T.StringType()))
)
