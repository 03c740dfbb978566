"""Segmented logs: sealed segments as JSONL, then converted to Parquet by `ingest`.

A synthetic run's logs are cut by lsn into two sealed segments and the active file
per node (as the node will write them). Every way of reading them gives the same
verdicts as the unsplit log; a segment whose JSONL changed since it was converted,
a missing or unreadable Parquet segment are bad input (exit 2) naming the path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from snapmesh.reconcile import ingest
from snapmesh.synth import writer as synth
from snapmesh.reconcile import job as reconcile
from snapmesh.reconcile.segments import read_logs
from support.spark_fixtures import spark  # noqa: F401
from support.spark_data import SIZE, split_logs

pytestmark = pytest.mark.spark





def verdicts_of(spark, data: Path) -> list[dict]:  # noqa: F811
    outcome = reconcile.reconcile(spark, str(data))
    assert not outcome.bad_input, outcome.bad_input
    return outcome.verdicts


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):  # noqa: F811
    """(whole, split): the same consistent run, unsplit and split into segments."""
    root = tmp_path_factory.mktemp("segments")
    synth.generate(str(root / "whole"), **SIZE)
    shutil.copytree(root / "whole", root / "split")
    split_logs(root / "split")
    return root / "whole", root / "split"


@pytest.fixture(scope="module")
def whole_verdicts(spark, runs):  # noqa: F811
    """The unsplit run's verdicts, what every way of reading the split run must give (reconciled once)."""
    expected = verdicts_of(spark, runs[0])
    assert expected and all(v["consistent"] is not False for v in expected)
    return expected


def test_segments_read_as_jsonl_then_parquet_give_the_same_verdicts(spark, runs, whole_verdicts, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    assert len(list(data.glob("p1.log.*.jsonl"))) == 2 and (data / "p1.log.jsonl").exists()  # sealed, active
    expected = whole_verdicts
    assert verdicts_of(spark, data) == expected

    converted = ingest.ingest(spark, str(data))
    assert sorted(converted) == sorted(p.name for p in data.glob("*.log.0*.jsonl"))
    manifest = json.loads((data / "columnar" / "manifest.json").read_text())
    assert {e["name"]: e["records"] for e in manifest["segments"]}["p1.log.000000000001.jsonl"] == 69
    assert verdicts_of(spark, data) == expected
    assert ingest.ingest(spark, str(data)) == []  # nothing new

    # The node seals more of its active file: only that segment is converted.
    split_logs(data, cuts=(180,))
    newest = sorted(p.name for p in data.glob("p1.log.0*.jsonl"))[-1]
    assert newest == "p1.log.000000000140.jsonl"  # sealed up to 180 now
    assert newest in ingest.ingest(spark, str(data))
    assert verdicts_of(spark, data) == expected


def test_a_corruption_in_a_converted_segment_is_named(spark, tmp_path):  # noqa: F811
    made = synth.generate(str(tmp_path / "data"), corrupt="duplicate-recv", **SIZE)
    split_logs(tmp_path / "data")
    ingest.ingest(spark, str(tmp_path / "data"))
    outcome = reconcile.reconcile(spark, str(tmp_path / "data"))
    assert outcome.exit_status == 1
    assert outcome.verdicts[0]["first_discrepancy"] == f"msg_id {made.detail['msg_id']}: received 2 times"


def bad_input(data: Path, capsys) -> str:
    assert reconcile.main(["--data-dir", str(data), "--out", str(data / "out")]) == 2
    return capsys.readouterr().err


def test_a_segment_that_disagrees_with_its_jsonl_origin_exits_2(spark, runs, tmp_path, capsys):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    ingest.ingest(spark, str(data))
    origin = data / "p2.log.000000000070.jsonl"
    origin.write_text(origin.read_text().replace('"amount":', '"amount": ', 1))  # one byte more
    err = bad_input(data, capsys)
    assert "columnar/segments/file=p2.log.000000000070.jsonl disagrees with its JSONL origin" in err, err
    assert str(origin) in err


def test_a_missing_or_unreadable_parquet_segment_exits_2(spark, runs, tmp_path, capsys):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    ingest.ingest(spark, str(data))
    segment = data / "columnar" / "segments" / "file=p3.log.000000000001.jsonl"
    [part] = segment.glob("*.parquet")
    part.write_bytes(part.read_bytes()[:-10])  # torn
    assert f"unreadable Parquet segment file:{part}" in bad_input(data, capsys)
    shutil.rmtree(segment)
    assert f"missing Parquet segment {segment}" in bad_input(data, capsys)


# ---------------------------------------------------------------- the marker index


def markers_in(segment: Path) -> int:
    """Marker records of a JSONL segment, counted from the text itself."""
    return sum(json.loads(line)["kind"] in ("cut", "restore", "replay") for line in segment.read_text().splitlines())


def test_ingest_indexes_each_segment_and_the_job_reads_the_index(spark, runs, whole_verdicts, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    ingest.ingest(spark, str(data))
    entries = {e["name"]: e for e in json.loads((data / "columnar" / "manifest.json").read_text())["segments"]}
    assert entries and all(e["bad"] == 0 for e in entries.values())
    assert {n: e["markers"] for n, e in entries.items()} == {n: markers_in(data / n) for n in entries}
    assert sum(e["markers"] for e in entries.values()) > 0
    logs = read_logs(spark, str(data))
    assert logs.expected_markers == {n: e["markers"] for n, e in entries.items()}
    # Only the active files are scanned; the segments' markers come from the index.
    assert {Path(r["file"]).name for r in logs.scanned.select("file").distinct().collect()} <= {
        p.name for p in data.glob("*.log.jsonl")
    }
    assert verdicts_of(spark, data) == whole_verdicts


def rewrite_manifest(data: Path, *drop: str) -> None:
    """The manifest as an older ingest wrote it: without the entries' ``drop`` keys."""
    manifest = data / "columnar" / "manifest.json"
    old = json.loads(manifest.read_text())
    for e in old["segments"]:
        for key in drop:
            del e[key]
    manifest.write_text(json.dumps(old))
    manifest.with_name(".manifest.json.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old text


def test_a_manifest_without_the_index_is_scanned_as_before(spark, runs, whole_verdicts, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    ingest.ingest(spark, str(data))
    rewrite_manifest(data, "sums")  # indexed, not summed
    shutil.rmtree(data / "columnar" / "sums")
    logs = read_logs(spark, str(data))
    assert logs.expected_markers and logs.sums is None and not logs.expected_sums
    assert verdicts_of(spark, data) == whole_verdicts
    rewrite_manifest(data, "bad", "markers")
    shutil.rmtree(data / "columnar" / "markers")
    assert read_logs(spark, str(data)).expected_markers == {}
    assert verdicts_of(spark, data) == whole_verdicts


@pytest.mark.parametrize(
    "index, named", [("markers", "marker index"), ("sums", "interval sums")]
)
def test_an_index_that_disagrees_with_the_manifest_exits_2(spark, runs, tmp_path, capsys, index, named):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    ingest.ingest(spark, str(data))
    gone = data / "columnar" / index / "file=p2.log.000000000070.jsonl"
    [part] = gone.glob("*.parquet")
    part.write_bytes(part.read_bytes()[:-10])  # torn
    assert f"unreadable {named} file:{part}: not a Parquet file" in bad_input(data, capsys)
    shutil.rmtree(gone)
    err = bad_input(data, capsys)
    assert f"{named} {gone} holds 0 records, the manifest says" in err, err


def test_a_bad_line_in_a_converted_segment_is_named_with_its_file_and_line(spark, runs, tmp_path, capsys):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    segment = data / "p3.log.000000000070.jsonl"
    lines = segment.read_text().splitlines(keepends=True)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"  # torn: not JSON any more
    segment.write_text("".join(lines))
    ingest.ingest(spark, str(data))
    entry = next(e for e in json.loads((data / "columnar" / "manifest.json").read_text())["segments"]
                 if e["name"] == segment.name)
    assert entry["bad"] == 1
    assert f"{segment} line 5: not valid JSON" in bad_input(data, capsys)


def test_a_manifest_changed_behind_its_checksum_exits_2(spark, runs, tmp_path, capsys):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    ingest.ingest(spark, str(data))
    manifest = data / "columnar" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"records": ', '"records":  ', 1))  # Hadoop's .crc now stale
    err = bad_input(data, capsys)
    assert "manifest.json does not match its checksum file" in err and ".manifest.json.crc" in err, err


# ---------------------------------------------------------------- the interval sums


@pytest.fixture
def certified(monkeypatch):
    """What ``checksums.certify`` settled, call by call (the exact path would hide a wrong sum)."""
    from snapmesh.reconcile import checksums

    calls = []
    real = checksums.certify

    def spy(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(checksums, "certify", spy)
    return calls


def settled_by_checksums(spark, data: Path, certified, **kwargs) -> tuple:  # noqa: F811
    certified.clear()
    outcome = reconcile.reconcile(spark, str(data), **kwargs)
    [done] = certified
    return outcome.verdicts, done


def test_ingest_sums_each_segment_and_the_job_aggregates_only_the_rest(spark, runs, whole_verdicts, tmp_path, certified):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    ingest.ingest(spark, str(data))
    entries = {e["name"]: e for e in json.loads((data / "columnar" / "manifest.json").read_text())["segments"]}
    stored = spark.read.parquet(str(data / "columnar" / "sums")).groupBy("file").count().collect()
    assert {r["file"]: r["count"] for r in stored} == {n: e["sums"] for n, e in entries.items()}
    assert all(e["sums"] > 0 for e in entries.values())
    logs = read_logs(spark, str(data))
    assert logs.expected_sums == {n: e["sums"] for n, e in entries.items()}
    # What the sums cover is not aggregated again: only the active files are.
    assert {Path(r["file"]).name for r in logs.unsummed.select("file").distinct().collect()} == {
        p.name for p in data.glob("*.log.jsonl")
    }
    verdicts, done = settled_by_checksums(spark, data, certified)
    assert verdicts == whole_verdicts
    assert done.logs_settled and not done.unsettled and done.rows == verdicts  # no exact join needed
    assert settled_by_checksums(spark, data, certified, summed=False) == (verdicts, done)


@pytest.mark.parametrize("corruption", ["duplicate-recv", "seq-gap", "balance", "missing-inflight", "extra-inflight"])
def test_ingested_sums_give_the_verdicts_of_the_rows(spark, tmp_path, corruption, certified):  # noqa: F811
    """Each corruption the synthesizer injects: the checksums settle the same from sums, rows and JSONL."""
    data = tmp_path / "data"
    synth.generate(str(data), corrupt=corruption, **SIZE)
    split_logs(data)
    from_jsonl = settled_by_checksums(spark, data, certified)
    assert any(v["consistent"] is False for v in from_jsonl[0])
    ingest.ingest(spark, str(data))
    assert read_logs(spark, str(data)).expected_sums
    assert settled_by_checksums(spark, data, certified) == from_jsonl
    assert settled_by_checksums(spark, data, certified, summed=False) == from_jsonl


def test_a_segment_not_where_its_name_says_is_aggregated_from_its_rows(spark, runs, tmp_path, certified):  # noqa: F811
    """Ingest's sums assume a segment's first lsn is the one in its name; a lost record before it breaks that."""
    data = tmp_path / "data"
    shutil.copytree(runs[1], data)
    first = data / "p2.log.000000000001.jsonl"
    first.write_text("".join(first.read_text().splitlines(keepends=True)[:-1]))  # lsn 69 lost
    from_jsonl = settled_by_checksums(spark, data, certified)
    assert from_jsonl[0][0]["consistent"] is False and not from_jsonl[1].logs_settled
    ingest.ingest(spark, str(data))
    logs = read_logs(spark, str(data))
    assert "p2.log.000000000070.jsonl" not in logs.expected_sums and "p2.log.000000000001.jsonl" in logs.expected_sums
    assert settled_by_checksums(spark, data, certified) == from_jsonl


def write_run(data: Path, logs: dict[str, list[dict]], snapshots: list[tuple]) -> None:
    """Hand-written logs (records without node and lsn) and snapshot rows (SNAPSHOT tuples) as files."""
    from snapmesh.reconcile.schema import SNAPSHOT

    (data / "snapshots").mkdir(parents=True)
    for node, records in logs.items():
        lines = [json.dumps({"node": node, "lsn": lsn, **r}) + "\n" for lsn, r in enumerate(records, 1)]
        (data / f"{node}.log.jsonl").write_text("".join(lines))
    for row in snapshots:
        doc = {k: v for k, v in zip(SNAPSHOT.fieldNames(), row, strict=False) if v is not None}
        doc["nodes"] = [{"node_id": n, "balance": b} for n, b in doc["nodes"]]
        doc["channels"] = [
            {"src": s, "dst": d, "in_flight": [{"msg_id": m, "amount": a, "seq": q} for m, a, q in f]}
            for s, d, f in doc["channels"]
        ]
        (data / "snapshots" / f"{doc['snapshot_id']}.json").write_text(json.dumps(doc, indent=2))


def test_a_log_with_a_restore_is_checked_by_epoch_from_its_rows_with_sums_ingested(spark, tmp_path, certified):  # noqa: F811
    from support.spark_data import snapshot_doc, two_epochs

    data = tmp_path / "data"
    logs = two_epochs(p3_restored_to=101)  # a wrong restore balance: the restore row names it
    snaps = [snapshot_doc("ok", 0), snapshot_doc("e2", 1, balances={"p1": 90, "p2": 110, "p3": 100}, p1_p2=[], epoch="2")]
    write_run(data, logs, snaps)
    split_logs(data, cuts=(8,))  # epoch 1 sealed; the restore and epoch 2 active (p3's log is shorter)
    from_jsonl = settled_by_checksums_per_epoch(spark, data, certified)
    rows = {(v["scope"], v["snapshot_id"]): v for v in from_jsonl[0]}
    assert list(rows) == [("logs", None), ("snapshot", "ok"), ("restore", "ok"), ("snapshot", "e2")]
    assert rows[("restore", "ok")]["first_discrepancy"] == "epoch 2: p3 restored ok to 101, expected ok at 100"
    assert rows[("snapshot", "e2")]["first_discrepancy"] == "node p3: recorded 100, logs say 101 before cut"
    assert rows[("snapshot", "ok")]["consistent"] is True and len(certified) == 2  # once per epoch
    ingest.ingest(spark, str(data))
    assert read_logs(spark, str(data)).expected_sums  # there are sums; the epochs do not use them
    assert settled_by_checksums_per_epoch(spark, data, certified) == from_jsonl


def settled_by_checksums_per_epoch(spark, data: Path, certified) -> tuple:  # noqa: F811
    certified.clear()
    outcome = reconcile.reconcile(spark, str(data))
    assert not outcome.bad_input, outcome.bad_input
    return outcome.verdicts, list(certified)
