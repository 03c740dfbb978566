"""The chaos app mode's count of a request id's runs reads both shapes of a command in the log."""

from __future__ import annotations

from snapmesh.chaos.appmode import command_runs


def test_a_request_ids_runs_are_counted_from_command_records_and_sends_carrying_them() -> None:
    logs = {
        "p1": [{"kind": "command", "lsn": 2, "request_id": "r1", "command": "", "reply": ""},
               {"kind": "send", "lsn": 3, "request_id": "r2", "msg_id": "p1:p2:1", "payload": "", "command": ""}],
        "p2": [{"kind": "send", "lsn": 2, "request_id": "r1", "msg_id": "p2:p1:1", "payload": "", "command": "eA=="},
               {"kind": "send", "lsn": 3, "request_id": "r3", "msg_id": "p2:p1:2", "payload": ""}],  # a native transfer's
    }
    assert command_runs(logs, ["r1", "r2", "r3"]) == {"r1": 2, "r2": 1, "r3": 0}
