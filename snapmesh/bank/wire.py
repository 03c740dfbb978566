"""The v1 messages' fields that name the node's tally "balance" or "amount", read
and written in one place (the keys are snapmesh/bank/formats.py's).

The node layer names its one native number by role, the tally; the v1 wire
was written when the bank was the only app, and its field names are a
compatibility promise. Each function here is called once per RPC, report or
batch, never once per message: a batch's loop runs inside (protobuf's
C-level iteration), so the hot path pays no call per transfer. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from snapmesh.v1 import snapmesh_pb2 as pb


def transfer(request: pb.TransferRequest) -> tuple[str, int, str, int]:
    """A Transfer call's (dst, tally, request_id, first_sent_unix_ms)."""
    return request.to, request.amount, request.request_id, request.first_sent_unix_ms


def transfers(items: Iterable[pb.TransferRequest]) -> list[tuple[str, int, str, int]]:
    """A TransferBatch's transfers, each as `transfer` gives it, in order."""
    return [(item.to, item.amount, item.request_id, item.first_sent_unix_ms) for item in items]


def transfer_response(msg_id: str, tally: int) -> pb.TransferResponse:
    return pb.TransferResponse(msg_id=msg_id, balance=tally)


def restore_request(request: pb.RestoreStateRequest) -> int:
    """The tally a RestoreState sets."""
    return request.balance


def restore_response(epoch: int, tally: int) -> pb.RestoreStateResponse:
    return pb.RestoreStateResponse(epoch=epoch, balance=tally)


def in_flight(src: str, items: Iterable[pb.InFlightTransfer]) -> list[tuple[str, str, int, int, bytes | None]]:
    """A restore's in-flight items from `src`: (src, msg_id, seq, tally, payload or None)."""
    return [(src, t.msg_id, t.seq, t.amount, t.payload if t.HasField("payload") else None) for t in items]


def in_flight_item(msg_id: str, tally: int, seq: int, payload: bytes | None) -> pb.InFlightTransfer:
    # An app's message carries no amount: the field stays absent (v1fields.py F1).
    return pb.InFlightTransfer(msg_id=msg_id, amount=tally or None, seq=seq, payload=payload)


def run_tallies(run: Any) -> Sequence[int]:
    """A packed run's tallies (ChannelBatch's TransferRun, FullState's OutboxRun), one per seq."""
    return run.amounts


def add_run(runs: Any, tallies: Sequence[int], **fields: Any) -> Any:
    """Add a packed run of `tallies` to the repeated field `runs` (its other `fields` as given)."""
    return runs.add(amounts=tallies, **fields)


def outbox_run(src: str, dst: str, seqs: Sequence[int], tallies: Sequence[int], **fields: Any) -> pb.OutboxRun:
    return pb.OutboxRun(src=src, dst=dst, seqs=seqs, amounts=tallies, **fields)


def full_state(tally: int, **fields: Any) -> pb.FullState:
    """A node's report of its state at a cut, its tally in its v1 field."""
    return pb.FullState(balance=tally, **fields)


def batch_results(results: Any, answers: Sequence[Any], codes: Sequence[int], ok: int) -> list[Any]:
    """A TransferBatchResponse's `results`, one per answer in order: status `codes[i]`;
    an answer with code `ok` was paid (its msg_id), any other was refused (its
    error's text); each with the tally the answer carries. Returns the results."""
    add = results.add
    return [
        add(code=ok, msg_id=answer.msg_id, balance=answer.tally) if code == ok
        else add(code=code, message=str(answer.error), balance=answer.tally)
        for code, answer in zip(codes, answers, strict=True)
    ]


def message_tally(transfer: pb.TransferMessage) -> int:
    """A channel message's tally, sent one message each: only by a sender or to a
    receiver that does not use runs (the common frame is a run, `run_tallies`)."""
    return transfer.amount


def add_transfer(add: Any, seq: int, tally: int) -> None:
    """Add a channel message carrying `tally` (no msg_id: the receiver derives it), as `message_tally` reads it."""
    add(seq=seq).transfer.amount = tally


def node_state(tally: int, **fields: Any) -> pb.NodeStateResponse:
    """A GetState answer, the node's tally in its v1 field."""
    return pb.NodeStateResponse(balance=tally, **fields)


# The bank app's name and version (services/app/bank.py), what a mapped native report names.
BANK_APP = ("bank", 1)


def as_app_report(state: pb.FullState) -> pb.FullState:
    """A report the bank's native nodes sent (no state bytes: the tally in its v1
    fields), as the bank app's nodes send it: the balance as the state, each amount in
    flight, recorded or in an outbox, as its message's payload, both decimal ASCII
    (services/app/bank.py), the app named. Any other report is returned as it is. An
    old controller's journal holds such reports; its reader maps each once, so the
    tracker reads every report one way (as snapmesh/bank/oldlogs.py maps a node's log)."""
    if state.HasField("state"):
        return state
    state.state = str(state.balance).encode()
    state.ClearField("balance")
    state.app_name, state.app_version = BANK_APP
    for channel in [*state.channels, *state.outbox]:
        for item in channel.in_flight:
            if not item.HasField("payload"):
                item.payload = str(item.amount).encode()
            item.ClearField("amount")
    for run in state.outbox_runs:
        if not run.payloads:
            run.payloads.extend(str(a).encode() for a in run.amounts)
        run.ClearField("amounts")
    return state
