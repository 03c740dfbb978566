"""What a generic app command's log records cost to make and encode: today's code against an older commit's.

`python -m bench logrecords [--rev REV]` (REV defaults to BEFORE, the commit before the log's fast
writers). One bank command step's records as the node makes them (snapmesh/protocol/node/steps.py:
`submit_many`'s common item and `received_payloads`): the `send` carrying the command and its reply
in base64 (`wal.pack`; at REV and before it, a `command` record and the `send`), and at the receiver the `recv`, each
made by `fastrecords`, wrapped in its Append effect and appended to a TransferLog (encoded and
buffered; nothing is written). The older side runs REV's wal.py and fastrecords.py, loaded beside
today's, its records appended to REV's TransferLog. Both sides
alternate within each round on the same machine, so the ratio holds on a loaded one; the
absolute figures do not (CPU time of this process: time it was preempted is left out). Pure, one
process, a few seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from bench import smoke
from bench.base_tree import REPO, has_commit
from snapmesh.protocol import fastrecords, wal
from snapmesh.protocol.node.effects import Append, fast_new
from snapmesh.services.node.translog import TransferLog

BEFORE = "cd9820e"  # main before the log's fast writers (wal.Encoder.lines, pack's decode)
STEPS = 5_000
ROUNDS = 21
COMMAND, REPLY, PAYLOAD = b"1 p2", b"999999", b"1"  # the bank's common command, its tally, the amount sent


def _older(rev: str) -> tuple[types.ModuleType, ...]:
    """REV's wal, fastrecords and translog as modules of their own, each importing REV's wal
    (their dataclasses need a module in sys.modules)."""
    mods = []
    for name, path in (("wal", "snapmesh/protocol/wal.py"), ("fastrecords", "snapmesh/protocol/fastrecords.py"),
                       ("translog", "services/node/translog.py")):
        text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout
        text = text.replace("from snapmesh.protocol.wal import", "from bench_older_wal import")
        text = text.replace("from snapmesh.protocol import wal\n", "import bench_older_wal as wal\n")
        module = types.ModuleType(f"bench_older_{name}")
        sys.modules[module.__name__] = module
        exec(compile(text, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102  (our own history)
        mods.append(module)
    return tuple(mods)


def _steps(wal_: types.ModuleType, records: types.ModuleType, sender: TransferLog, receiver: TransferLog,
           n: int, keep: bool = False) -> float:
    """Seconds for `n` command steps' records at the sender and their recv at the receiver: a
    `command` and a `send`, or (a `records` with `step_record`) one `send` carrying the command."""
    pack, command_record, send_record, recv_record = wal_.pack, records.command_record, records.send_record, \
        records.recv_record
    step_record = getattr(records, "step_record", None)
    append, take = sender.append_record, receiver.append_record
    me, dst = "p1", "p2"
    lsn, at = sender.last_lsn, receiver.last_lsn
    seq = at
    started = time.process_time()
    for _ in range(n):
        lsn += 1
        seq += 1
        if step_record is not None:
            effect = fast_new(Append, (step_record(lsn, f"{me}:{dst}:{seq}", me, dst, seq, "", pack(PAYLOAD),
                                                   pack(COMMAND), pack(REPLY)),))
            append(effect.record)
        else:
            effect = fast_new(Append, (command_record(lsn, "", pack(COMMAND), pack(REPLY)),))
            append(effect.record)
            lsn += 1
            effect = fast_new(Append, (send_record(lsn, f"{me}:{dst}:{seq}", me, dst, seq, "", pack(PAYLOAD)),))
            append(effect.record)
        at += 1
        effect = fast_new(Append, (recv_record(at, f"{me}:{dst}:{seq}", me, dst, seq, pack(PAYLOAD)),))
        take(effect.record)
    elapsed = time.process_time() - started
    if not keep:  # nothing is written: the buffer only
        sender._buffer.clear()
        receiver._buffer.clear()
    return elapsed


def _read(logs: tuple[str, str]) -> list[tuple]:
    """What the lines say, either shape: per step its command, reply, send and recv (lsns aside)."""
    sender, receiver = ([wal.parse(line, "bench") for line in text.splitlines()] for text in logs)
    commands = [(c.command, c.reply) for r in sender if (c := wal.step_command(r)) is not None]
    sends = [(r.msg_id, r.payload) for r in sender if type(r) is wal.Send]
    return list(zip(commands, sends, [(r.msg_id, r.payload) for r in receiver], strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench logrecords")
    parser.add_argument("--rev", default=BEFORE, help=f"the older commit to compare with (default: {BEFORE})")
    args = parser.parse_args(sys.argv[2:] if sys.argv[1:2] == ["logrecords"] else sys.argv[1:])
    if not has_commit(args.rev):
        print(f"logrecords: this clone lacks {args.rev}; nothing to compare with")
        return 0
    old_wal, old_records, old_log = _older(args.rev)
    steps, rounds = smoke.size(STEPS, 200), smoke.size(ROUNDS, 1)
    with tempfile.TemporaryDirectory() as tmp:
        logs = {side: [kind(Path(tmp) / f"{side}-{node}.log.jsonl", node, last_lsn=0) for node in ("p1", "p2")]
                for side, kind in (("new", TransferLog), ("old", old_log.TransferLog))}
        best = {"new": float("inf"), "old": float("inf")}
        buffered = {}
        for side, (w, r) in (("old", (old_wal, old_records)), ("new", (wal, fastrecords))):
            sender, receiver = logs[side]
            _steps(w, r, sender, receiver, 100, keep=True)
            buffered[side] = ("".join(sender._buffer), "".join(receiver._buffer))  # type: ignore[arg-type]
            sender._buffer.clear()
            receiver._buffer.clear()
        assert _read(buffered["new"]) == _read(buffered["old"]), "today's lines say other than REV's"
        for _ in range(rounds):
            for side, (w, r) in (("old", (old_wal, old_records)), ("new", (wal, fastrecords))):
                best[side] = min(best[side], _steps(w, r, *logs[side], steps))
        for pair in logs.values():
            for log_ in pair:
                os.close(log_._fd)  # nothing was written; no flusher ran
    per = {side: seconds / steps * 1e6 for side, seconds in best.items()}
    print(f"{'one command step and its message at the receiver':<52} {'µs':>7}")
    print(f"{'  ' + args.rev + ' (command + send + recv records)':<52} {per['old']:7.2f}")
    today = 'send carrying the command' if hasattr(fastrecords, 'step_record') else 'command + send'
    print(f"{'  today (' + today + ' + recv)':<52} {per['new']:7.2f}")
    print(f"{'  ratio today/' + args.rev:<52} {per['new'] / per['old']:7.2f}  (best of {rounds} x {steps:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
