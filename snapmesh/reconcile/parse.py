"""Step 1, parse: text lines and snapshot documents -> typed, located rows.

Nothing here reads files or runs a job: ``main`` reads, these functions only build
plans. A log line becomes a typed record plus ``problem`` (null when well-formed);
a snapshot file becomes one typed row, or a ``problem`` naming what is wrong.

A node's log is its sealed segments ``<node>.log.<first lsn, 12 digits>.jsonl`` in
lsn order, then the active ``<node>.log.jsonl``. ``line`` is a row's line in its
file (what bad-input messages name); ``pos`` its position in the node's whole log
(what the lsn must equal).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from snapmesh.reconcile.common import RECEIPTS, SENDS, first_when, kind_in
from snapmesh.reconcile.schema import (ACTIVE_FIRST_LSN, APP_MARKS, CORRUPT_COLUMN, EVENT, LOG_FILE_PATTERN, LOG_RECORD,
                                      REQUIRED_FIELDS, TALLY_KEYS)

# ---------------------------------------------------------------------------- logs


# A record's state (init, checkpoint, restore: an app's whole state as base64, 89 MB
# of text at 64 MiB) is read by no check here, and a line carried whole through the
# plan is copied into every row that holds it: four such lines at once ran the
# default heap out while the log was cached. So the text is cut right at the scan.
STATE_KEY = '"state":"'
STATE_KEPT = 1 << 16  # a line this long or shorter is left as it is


def without_state(value: Column) -> Column:
    """A log line with its top-level state's text emptied (``"state":""``), when long.

    The key stays, so an app's record keeps its mark (schema.APP_MARKS). Only the record's
    own ``state`` is cut: a line may hold the key in a nested object too (an app's record
    of an older format, wal.Older, keeps whatever fields it had; a newer kind's), and such
    a value is the record's data, left as it is. Cut only when the text between the
    quotes has no backslash (base64 needs no escape, and wal.encode writes it compactly,
    as found here): anything else, or a line torn inside its state, is left whole and
    parsed as it is, so a bad line stays bad.
    """

    def cut(found: Column) -> Column:  # `found`: where the top-level key starts (0: nowhere)
        start = found + F.lit(len(STATE_KEY))  # the text's first character (1-based)
        end = F.call_function("locate", F.lit('"'), value, start)  # its closing quote
        escape = F.call_function("locate", F.lit("\\"), value, start)
        clean = (found > 0) & (end > 0) & ((escape == 0) | (escape > end))
        return F.when(clean, F.concat(value.substr(F.lit(1), start - 1), value.substr(end, F.length(value)))).otherwise(value)

    # Each `"state":"` in turn, the depth of objects and arrays at it counted from the last
    # one (or the line's start): the first a key at depth 1 is the record's own.
    def step(acc: Column, _: Column) -> Column:
        at, since, depth = acc["at"], acc["since"], acc["depth"]
        following = F.call_function("locate", F.lit(STATE_KEY), value, at + 1)
        key = value.substr(at - 1, F.lit(1)).isin("{", ",")  # else inside a key (`"a\"state":`)
        now = depth + _depth(value.substr(since, at - since))
        return (F.when((acc["found"] > 0) | (at == 0), acc)
                .when(key & (now == 1), F.struct(at.alias("found"), at.alias("at"), since.alias("since"), depth.alias("depth")))
                .when(key, F.struct(F.lit(0).alias("found"), following.alias("at"), at.alias("since"), now.alias("depth")))
                .otherwise(F.struct(F.lit(0).alias("found"), following.alias("at"), since.alias("since"), depth.alias("depth"))))

    first = F.struct(F.lit(0).alias("found"), F.locate(STATE_KEY, value).alias("at"), F.lit(1).alias("since"),
                     F.lit(0).alias("depth"))
    keys = F.sequence(F.lit(1), F.greatest(F.regexp_count(value, F.lit(STATE_KEY)), F.lit(1)))
    return F.when(F.length(value) > STATE_KEPT, F.aggregate(keys, first, step, lambda acc: cut(acc["found"]))
                  ).otherwise(value)


# A JSON text's escapes (a backslash and the character after it), then its strings: what is left
# is its structure, numbers and literals.
_ESCAPE = r"\\."
_STRING = r'"[^"]*"'


def _depth(text: Column) -> Column:
    """How many objects and arrays `text` opens and leaves open (negative: closes), for a
    piece of a JSON line that starts and ends outside every string."""
    bare = F.regexp_replace(F.regexp_replace(text, _ESCAPE, ""), _STRING, "")
    return ((F.length(bare) - F.length(F.regexp_replace(bare, r"[{\[]", "")))
            - (F.length(bare) - F.length(F.regexp_replace(bare, r"[}\]]", ""))))


def parse_log_lines(lines: DataFrame) -> DataFrame:
    """(file, block, mid, value) text lines -> typed records plus ``problem``.

    ``block``/``mid`` locate a line (see ``locate_lines``). ``problem`` says what is
    wrong with a line: not JSON (a truncated line), a field of the wrong type, a
    required field missing, or a record that does not belong in this node's log.
    The raw ``value`` is dropped; other columns are kept. Whether the record belongs to the file's node is
    decided in ``locate_lines``, once per file rather than once per row; until then
    ``problem`` holds the checks before it and ``_problem_after`` the ones after it.
    """
    record = F.from_json(
        "value", LOG_RECORD, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    )
    # other columns of `lines` (longlines.HELPERS, a recovered line's own) ride along
    extra = [c for c in lines.columns if c not in ("file", "block", "mid", "value")]
    parsed = lines.select("file", "block", "mid", "value", *extra, record.alias("r")).select(
        "file", "block", "mid", "value", *extra, "r.*"
    )
    # An app's record may leave its tally out (schema.APP_MARKS): its mark is a key, and a
    # key's quotes cannot appear unescaped inside a JSON string, so a substring test tells.
    tally_out = F.lit(False)
    for kind, mark in APP_MARKS.items():
        tally_out = tally_out | ((F.col("kind") == kind) & F.col(TALLY_KEYS[kind]).isNull()
                                 & F.col("value").contains(f'"{mark}":'))
    parsed = parsed.select(
        *(c for c in parsed.columns if c not in set(TALLY_KEYS.values())),
        *(F.when(tally_out, F.lit(0).cast("long")).otherwise(F.col(key)).alias(key) for key in sorted(set(TALLY_KEYS.values()))),
    )

    corrupt = F.col(CORRUPT_COLUMN).isNotNull()
    before: list[tuple[Column, Column]] = [
        (F.trim("value") == "", F.lit("empty line")),
        (corrupt & F.try_parse_json("value").isNull(), F.lit("not valid JSON (truncated line?)")),
        (corrupt, F.lit("a field has the wrong type, or the line is not a JSON object")),
    ]
    before += [(F.col(f).isNull(), F.lit(f"missing field '{f}'")) for f in ("node", "lsn", "kind")]
    before += [
        ((F.col("kind") == kind) & F.col(f).isNull(), F.lit(f"{kind} record without '{f}'"))
        for kind, fields in REQUIRED_FIELDS.items()
        for f in fields
    ]
    after: list[tuple[Column, Column]] = [
        (
            kind_in(SENDS) & (F.col("src") != F.col("node")),
            F.format_string("%s with src %s in the log of %s", "kind", "src", "node"),
        ),
        (
            kind_in(RECEIPTS) & (F.col("dst") != F.col("node")),
            F.format_string("%s with dst %s in the log of %s", "kind", "dst", "node"),
        ),
    ]
    return parsed.select(
        "*", first_when(before).alias("problem"), first_when(after).alias("_problem_after")
    ).drop("value", CORRUPT_COLUMN)


def file_node(file: Column) -> Column:
    """The node a log file is named after (``p1.log.jsonl``, ``p1.log.000000000001.jsonl``)."""
    return F.url_decode(F.regexp_extract(file, LOG_FILE_PATTERN, 1))


def file_first_lsn(file: Column) -> Column:
    """A sealed segment's first lsn from its name; the active file sorts last."""
    digits = F.regexp_extract(file, LOG_FILE_PATTERN, 2)
    return F.when(digits == "", F.lit(ACTIVE_FIRST_LSN)).otherwise(digits.cast("long"))


def locate_lines(parsed: DataFrame, base: Column | None = None) -> DataFrame:
    """Add ``line`` (in the file) and ``pos`` (in the node's log); finish ``problem``.

    ``block`` is the start offset of the file split a row was read from and ``mid``
    a monotonically increasing id taken right after the scan: the rows of one split
    have consecutive ids, so a row's line is the number of lines in the file's earlier
    splits plus its position in its split, and its position in the log adds the lines
    of the node's earlier files. ``base`` (a column of ``file_node``) adds the records
    of segments read from Parquet, which come before every file read here. One small
    aggregation, one broadcast join; the split table also carries the node the file is
    named after, so the file/node check runs once per file.
    """
    in_file = Window.partitionBy("file").orderBy("block").rowsBetween(Window.unboundedPreceding, -1)
    in_log = (
        Window.partitionBy("file_node")
        .orderBy("first_lsn", "file", "block")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    splits = (
        parsed.groupBy("file", "block")
        .agg(F.min("mid").alias("mid0"), F.count(F.lit(1)).alias("n"))
        .select("*", file_node(F.col("file")).alias("file_node"), file_first_lsn(F.col("file")).alias("first_lsn"))
        .select(
            "file",
            "block",
            "mid0",
            "file_node",
            F.coalesce(F.sum("n").over(in_file), F.lit(0)).alias("before"),
            (F.coalesce(F.sum("n").over(in_log), F.lit(0)) + (F.lit(0) if base is None else base)).alias("log_before"),
        )
    )
    offset = F.col("mid") - F.col("mid0") + 1
    located = (
        parsed.join(F.broadcast(splits), on=["file", "block"], how="inner")
        .withColumn("line", F.col("before") + offset)
        .withColumn("pos", F.col("log_before") + offset)
        .drop("block", "mid", "mid0", "before", "log_before")
    )
    return finish_problem(located)


def finish_problem(located: DataFrame) -> DataFrame:
    """``problem`` with the checks after the file's node is known (``parse_log_lines``);
    drops the parse's own columns (``block``, ``mid``, ``_problem_after``, ``file_node``)."""
    if "file_node" not in located.columns:
        located = located.withColumn("file_node", file_node(F.col("file")))
    wrong_node = F.when(
        F.col("node") != F.col("file_node"),
        F.format_string("record of node %s in the log of %s", "node", "file_node"),
    )
    return (
        located.withColumn("problem", F.coalesce("problem", wrong_node, "_problem_after"))
        .drop("block", "mid", "file_node", "_problem_after")
    )


def bad_lines(located: DataFrame) -> DataFrame:
    """Lines that are not valid input: (file, line, problem)."""
    return located.filter(F.col("problem").isNotNull()).select("file", "line", "problem")


def events(located: DataFrame) -> DataFrame:
    """The well-formed records, in the EVENT schema the checks take (line = pos)."""
    return located.filter(F.col("problem").isNull()).withColumn("line", F.col("pos")).select(*EVENT.fieldNames())


# ----------------------------------------------------------------------- snapshots


def _not_long(c: Column) -> Column:
    return c.isNotNull() & c.try_cast("long").isNull()


def _long0(c: Column) -> Column:
    # protobuf JSON omits zero values: a missing int64 is 0.
    return F.coalesce(c.try_cast("long"), F.lit(0).cast("long"))


DUPLICATE_SNAPSHOT = "snapshot_id %s is in more than one file"


def snapshot_problem() -> Column:
    """What is wrong with one snapshot file on its own (null: nothing).

    A snapshot id in more than one file needs the other rows: ``bad_snapshots``.
    """
    stem = F.url_decode(F.regexp_extract("file", r"([^/]*)\.json$", 1))
    cases: list[tuple[Column, Column]] = [
        (F.col(CORRUPT_COLUMN).isNotNull(), F.lit("not a valid snapshot JSON document")),
        (F.col("snapshot_id").isNull(), F.lit("missing snapshot_id")),
        (
            F.col("snapshot_id") != stem,
            F.format_string("snapshot_id %s does not match the file name", "snapshot_id"),
        ),
        (
            F.exists(F.coalesce("nodes", F.array()), lambda n: n.node_id.isNull() | _not_long(n.balance)),
            F.lit("a node without node_id or with a non-integer balance"),
        ),
        (
            F.exists(F.coalesce("channels", F.array()), lambda c: c.src.isNull() | c.dst.isNull()),
            F.lit("a channel without src or dst"),
        ),
        (
            F.exists(
                F.flatten(F.transform(F.coalesce("channels", F.array()), lambda c: F.coalesce(c.in_flight, F.array()))),
                lambda m: m.msg_id.isNull() | _not_long(m.amount) | _not_long(m.seq),
            ),
            F.lit("an in-flight transfer without msg_id or with a non-integer amount or seq"),
        ),
        (_not_long(F.col("total")) | _not_long(F.col("expected_total")), F.lit("a non-integer total")),
    ]
    return first_when(cases)


def bad_snapshots(raw: DataFrame) -> DataFrame:
    """Snapshot files that are not valid input: (file, line=null, problem)."""
    same_id = Window.partitionBy("snapshot_id")
    duplicate = F.when(
        F.col("snapshot_id").isNotNull() & (F.count(F.lit(1)).over(same_id) > 1),
        F.format_string(DUPLICATE_SNAPSHOT, "snapshot_id"),
    )
    return (
        raw.select("*", F.coalesce(snapshot_problem(), duplicate).alias("problem"))
        .filter(F.col("problem").isNotNull())
        .select("file", F.lit(None).cast("long").alias("line"), "problem")
    )


def typed_snapshots(raw: DataFrame) -> DataFrame:
    """Snapshot files -> one typed row per snapshot (int64 strings become longs)."""
    return raw.select(*typed_snapshot_columns())


def is_app_snapshot() -> Column:
    """A raw snapshot row (schema.SNAPSHOT) that is an app's: its export names the app."""
    return F.coalesce(F.col("app.spec"), F.lit("")) != ""


def typed_snapshot_columns() -> list[Column]:
    """The columns of ``typed_snapshots``, to select beside others.

    An app's snapshot has no tallies: its logs carry none (an app's send, recv and cut
    records hold 0, or nothing), and the figures its export may carry beside its bytes
    (a node's `balance`, an item's `amount`, `total`, `expected_total`: the v1 fields
    an app's adapter fills) are the app's reading of those bytes, which ``figures``
    checks through the app's own code. So they read 0 (the claimed totals null) here.
    """
    app = is_app_snapshot()

    def tally(c: Column) -> Column:
        return F.when(app, F.lit(0).cast("long")).otherwise(_long0(c))

    nodes = F.transform(
        F.coalesce("nodes", F.array()),
        lambda n: F.struct(n.node_id.alias("node"), tally(n.balance).alias("balance")),
    )
    channels = F.transform(
        F.coalesce("channels", F.array()),
        lambda c: F.struct(
            c.src.alias("src"),
            c.dst.alias("dst"),
            F.transform(
                F.coalesce(c.in_flight, F.array()),
                lambda m: F.struct(
                    m.msg_id.alias("msg_id"), tally(m.amount).alias("amount"), _long0(m.seq).alias("seq")
                ),
            ).alias("in_flight"),
        ),
    )
    return [
        F.col("snapshot_id"),
        F.coalesce("status", F.lit("STATUS_UNSPECIFIED")).alias("status"),
        F.coalesce("reason", F.lit("")).alias("reason"),
        F.col("started_at"),
        F.greatest(_long0(F.col("epoch")), F.lit(1).cast("long")).alias("epoch"),
        nodes.alias("nodes"),
        channels.alias("channels"),
        F.when(~app, F.col("total").try_cast("long")).alias("claimed_total"),
        F.when(~app, F.col("expected_total").try_cast("long")).alias("claimed_expected_total"),
    ]
