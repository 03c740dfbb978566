"""An app's snapshot in `snapmesh snapshot list` and `verify` (issue 46, "What a user
reads"): its verdict is its invariants, in its own words, with none of the bank's
(balance, total, money, conserved); a bank snapshot's output is as it was. Over
snapshots built here and files written with the store's own sealing."""

from __future__ import annotations

import hashlib
import re

import pytest

from snapmesh.checking import snapshot_file
from snapmesh.commands import snapshot_cli
from snapmesh.services.controller.export import snapshot_json
from snapmesh.v1 import snapmesh_pb2 as pb

SID = "20261127T100000Z-ab12cd34"
BANK_WORDS = re.compile(r"\b(balances?|total|money|conserved)\b", re.IGNORECASE)


def timed(s: pb.Snapshot) -> pb.Snapshot:
    s.started_at.FromNanoseconds(10**18)
    s.finished_at.FromNanoseconds(10**18 + 5 * 10**6)
    return s


def bank() -> pb.Snapshot:
    s = timed(pb.Snapshot(snapshot_id=SID, initiator="p1", status=pb.Snapshot.COMPLETE, epoch=1, total=30,
                          expected_total=30, conserved=True))
    s.nodes.add(node_id="p1", balance=10)
    s.nodes.add(node_id="p2", balance=10)
    s.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", amount=10, seq=1)
    s.channels.add(src="p2", dst="p1")
    return s


def app(verdict: str) -> pb.Snapshot:
    """A COMPLETE app snapshot as the controller judges one (appstate.py V3: no v1
    figures, no total, no `conserved`), its invariants "ok", "broken" or "unchecked"."""
    s = timed(pb.Snapshot(snapshot_id=SID, initiator="p1", status=pb.Snapshot.COMPLETE, epoch=1))
    for node in ("p1", "p2"):
        s.nodes.add(node_id=node, state=b"{}", state_digest=snapshot_file.PREFIX + hashlib.sha256(b"{}").hexdigest())
    s.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", seq=1, payload=b"put a")
    s.channels.add(src="p2", dst="p1")
    s.app.spec, s.app.name = "inventory:app", "inventory"
    if verdict == "unchecked":
        s.app.status, s.reason = pb.AppCheck.UNCHECKED, "unchecked: the app does not load"
    else:
        s.app.status = pb.AppCheck.CHECKED
        s.app.invariants.add(name="stock never negative", ok=verdict == "ok",
                             problems=[] if verdict == "ok" else ["widget: -2 on p2"])
    return s


def verify(tmp_path, snapshot: pb.Snapshot, capsys, *flags: str, suffix: str = ".pb") -> tuple[int, str]:
    """`snapshot verify` of the snapshot's file as the store writes it (`.pb` or the `.json` export)."""
    path = tmp_path / f"{snapshot.snapshot_id}{suffix}"
    data, digest = snapshot_file.sealed_bytes(snapshot)
    if suffix == ".json":
        path.write_text(snapshot_json(snapshot, digest))
    else:
        path.write_bytes(data)
    capsys.readouterr()
    code = snapshot_cli.main(["verify", str(path), *flags])
    return code, capsys.readouterr().out.replace(str(path), "FILE")


@pytest.mark.parametrize("verdict", ["ok", "broken", "unchecked"])
def test_an_apps_list_and_verify_name_its_invariants_and_no_bank_word(tmp_path, capsys, verdict):
    snapshot = app(verdict)
    listed = snapshot_cli.render_summary([snapshot])
    header, row = listed.split("\n")
    assert header.split()[-2:] == ["invariants", "reason"] and verdict in row.split()
    code, out = verify(tmp_path, snapshot, capsys)
    assert code == (1 if verdict == "broken" else 0)  # the exit code follows the invariants
    checks = [line.split()[0] for line in out.splitlines()[2:]]
    assert checks == ["checksum", "name", "complete", "invariants", "consistent"]
    assert ("FAILED" in out) == (verdict == "broken")
    exported = verify(tmp_path, snapshot, capsys, suffix=".json")  # the export, which still has the fields
    assert exported == (code, out)
    code_json, as_json = verify(tmp_path, snapshot, capsys, "--json")
    assert code_json == code
    for text in (listed, out, as_json, snapshot_cli.render_detail(snapshot)):
        assert not BANK_WORDS.search(text), text


def test_a_bank_snapshots_list_and_verify_are_unchanged(tmp_path, capsys):
    assert snapshot_cli.render_summary([bank()]) == (
        "snapshot                   status    initiator  epoch  started (UTC)        duration  total  conserved  reason\n"
        "20261127T100000Z-ab12cd34  COMPLETE  p1             1  2001-09-09 01:46:40    0.005s     30  yes")
    code, out = verify(tmp_path, bank(), capsys)
    digest = snapshot_file.checksum(bank())
    assert code == 0 and out == (
        "FILE: OK\n"
        "check       result  detail\n"
        f"checksum    ok      {digest}\n"
        "name        ok      holds '20261127T100000Z-ab12cd34'\n"
        "complete    ok      COMPLETE\n"
        "conserved   ok      total 30, expected 30\n"
        "consistent  ok      2 nodes, 2 channels, 1 in flight\n")


def test_a_list_of_bank_and_app_snapshots_keeps_the_banks_columns_and_no_sums_for_the_app():
    other = app("ok")
    other.snapshot_id = "20261127T100001Z-ab12cd35"
    header, first, second = snapshot_cli.render_summary([bank(), other]).split("\n")
    assert "total" in header.split() and first.split()[-2:] == ["30", "yes"]
    assert second.split()[-2:] == ["-", "-"]
