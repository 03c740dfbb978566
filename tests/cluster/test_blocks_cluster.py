"""The controller stores app states as content-addressed blocks, on real processes: an
app whose state is a blob of 4 MiB per node (2 nodes), snapshotted through real gRPC.

- Two snapshots of states that barely changed store the unchanged blocks once: the
  second adds the one block the change touched to controller/blocks (files and
  bytes counted there), and each node's report of it sends only the blocks the
  controller lacks (the node's log and its `snapmesh_report_sent_bytes_total` say how
  many bytes it sent). Both verify; after a controller restart (its snapshots read
  from the files) a restore of the first works, and the snapshot after it has the
  first one's states and adds no block.
- Retention with `keep = 2` and states that change whole at every snapshot: the
  controller is SIGKILLed in the middle of a deletion (the retired snapshot's file
  gone, some of its blocks not yet). After the restart every kept snapshot
  verifies, the blocks no manifest names are gone, and retention goes on.
- A missing or corrupt block is named (snapshot, node, hash) by `snapshot verify`,
  and a restore of its snapshot is refused with DATA_LOSS naming it, no node changed
  (each case).
  A node's report naming the missing block is refused; the node sends its state
  whole and the snapshot completes.
- A snapshot whose reports came as blocks is journaled as they came (its journal
  grows by manifests, not states); with its files lost in a crash, the restart
  rebuilds it from the journal and the blocks, and it verifies.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import grpc
import pytest

from snapmesh.checking import snapshot_file
from snapmesh.commands import snapshot_cli
from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol import blocks
from snapmesh.protocol.controller import journal as R
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support import metrics_table
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SIZE = 4 * 1024 * 1024
PER_NODE = SIZE // blocks.BLOCK_BYTES

BLOB_APP = '''\
"""A node whose state is a blob of 4 MiB: "churn N" makes it new, "poke OFFSET N" changes 1 KiB."""
import random

from snapmesh.app import App

SIZE = 4 * 1024 * 1024


class Blob:
    def __init__(self, info):
        self.me, self.blob = info.node_id, random.Random(info.node_id).randbytes(SIZE)

    def on_command(self, command, ctx):
        word, *args = command.decode().split()
        if word == "churn":
            self.blob = random.Random(f"{self.me}-{args[0]}").randbytes(SIZE)
        elif word == "poke":
            at = int(args[0])
            self.blob = self.blob[:at] + random.Random(args[1]).randbytes(1024) + self.blob[at + 1024:]
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return self.blob

    def restore(self, state):
        self.blob = state


app = App(name="blob", new=Blob)
'''


def start(root: Path, *, keep: int = 0) -> Cluster:
    (root / "apps").mkdir()
    (root / "apps" / "blob_app.py").write_text(BLOB_APP)
    path = write_cluster(root / "cluster.toml", nodes=2, data_dir=root / "data")
    if keep:
        path.write_text(path.read_text().replace("[controller]\n", f"[controller]\nkeep = {keep}\n"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "apps"), os.environ.get("PYTHONPATH")]))}
    return Cluster(path, env=env, app="blob_app:app").start()


@pytest.fixture
def cluster(tmp_path, request):
    running = start(tmp_path, keep=getattr(request, "param", 0))
    try:
        yield running
    finally:
        running.stop()


def command(cluster: Cluster, node_id: str, text: str) -> None:
    with grpc.insecure_channel(cluster.node_address(node_id)) as channel:
        assert pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=text.encode()), timeout=30).reply == b"ok"


def controller(cluster: Cluster):
    return grpc.insecure_channel(cluster.controller_address)


def snapshot(cluster: Cluster, *, wait: bool = True) -> str:
    with controller(cluster) as channel:
        answer = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=wait), timeout=120)
    assert not wait or answer.status == pb.Snapshot.COMPLETE, answer
    return answer.snapshot_id


def data(cluster: Cluster) -> Path:
    return Path(cluster.data_dir)


def stored(cluster: Cluster, sid: str) -> Path:
    return data(cluster) / "controller" / "snapshots" / f"{sid}.pb"


def filed(cluster: Cluster, sid: str) -> Path:
    return wait_for(lambda: stored(cluster, sid), until=Path.exists, timeout=60, what=f"the file of {sid}")


def on_disk(cluster: Cluster) -> dict[str, int]:
    """Block file name -> size, under controller/blocks."""
    directory = data(cluster) / "controller" / "blocks"
    return {p.name: p.stat().st_size for p in directory.iterdir() if not p.name.startswith(".")}


def block_names(cluster: Cluster) -> set[str]:
    """The block files under controller/blocks (no stat: files may go meanwhile)."""
    return {name for name in os.listdir(data(cluster) / "controller" / "blocks") if not name.startswith(".")}


def stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped (SIGSTOP is delivered, not only sent)."""
    tasks = Path(f"/proc/{pid}/task")
    return all((task / "stat").read_text().rpartition(")")[2].split()[0] == "T" for task in tasks.iterdir())


def names(path: Path) -> set[str]:
    """The blocks the stored file `path` names."""
    return {name.hex() for name in blocks.hashes(snapshot_file.read_stored(path)[0])}


def verify(cluster: Cluster, sid: str, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = snapshot_cli.main(["verify", sid, "--data-dir", str(data(cluster))])
    return code, capsys.readouterr().out


def digests(cluster: Cluster, sid: str) -> dict[str, str]:
    with controller(cluster) as channel:
        found = pb_grpc.ControllerStub(channel).GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=30)
    return {node.node_id: node.state_digest for node in found.nodes}


def reported(cluster: Cluster, node_id: str, sid: str) -> int:
    """The bytes the node's log says its report of `sid` sent."""
    pattern = re.compile(rf"snapshot {sid}: reported state to the controller \((\d+) bytes\)")
    found = wait_for(lambda: pattern.search(cluster.node(node_id).output()), timeout=30, what=f"{node_id}'s report")
    return int(found.group(1))


def test_two_snapshots_of_mostly_unchanged_states_store_the_unchanged_blocks_once(cluster, capsys):
    first = snapshot(cluster)
    filed(cluster, first)
    assert len(on_disk(cluster)) == 2 * PER_NODE and sum(on_disk(cluster).values()) == 2 * SIZE
    command(cluster, "p1", "poke 100 7")  # 1 KiB inside p1's first block
    second = snapshot(cluster)
    filed(cluster, second)
    blocks_now = on_disk(cluster)
    assert len(blocks_now) == 2 * PER_NODE + 1 and sum(blocks_now.values()) == 2 * SIZE + blocks.BLOCK_BYTES
    assert stored(cluster, second).stat().st_size < 64 * 1024  # manifests, not 8 MiB of states
    assert len(names(stored(cluster, first)) & names(stored(cluster, second))) == 2 * PER_NODE - 1
    assert all(reported(cluster, node, first) > SIZE for node in ("p1", "p2"))  # whole: nothing held yet
    assert reported(cluster, "p2", second) < PER_NODE * 40  # its manifest alone
    assert reported(cluster, "p1", second) < PER_NODE * 40 + blocks.BLOCK_BYTES  # and the one changed block
    for node in cluster.config.nodes:  # the node's counter of bytes sent: what its log says, both reports
        sent = metrics_table.value(metrics_table.scrape(node.metrics_address), "snapmesh_report_sent_bytes_total",
                                   node=node.id)
        assert sent == reported(cluster, node.id, first) + reported(cluster, node.id, second)
    for sid in (first, second):
        code, out = verify(cluster, sid, capsys)
        assert code == 0 and "each matching its hash" in out, out
    before = digests(cluster, first)
    assert before != digests(cluster, second)

    cluster.restart_controller()  # the snapshots are read back from their files and blocks
    with controller(cluster) as channel:
        wait_for(lambda: pb_grpc.ControllerStub(channel).RestoreSnapshot(
            pb.RestoreSnapshotRequest(snapshot_id=first, request_id="blocks-restore"), timeout=60),
            timeout=60, retry_on=grpc.RpcError, what="the restore of the first snapshot")
    third = snapshot(cluster)
    filed(cluster, third)
    assert digests(cluster, third) == before
    assert on_disk(cluster) == blocks_now  # every block of the restored states was there


def killed_while_retiring(cluster: Cluster, n: int) -> tuple[str, set[str], set[str]]:
    """Churn every state, snapshot, and SIGKILL the controller once the oldest kept
    snapshot's file is gone and its first block went: that snapshot, its blocks, and
    those of them still on disk when it stopped."""
    retired = min(p.stem for p in stored(cluster, "x").parent.glob("*.pb"))
    its_blocks = names(stored(cluster, retired))
    for node in ("p1", "p2"):
        command(cluster, node, f"churn {n}")
    snapshot(cluster, wait=False)
    wait_for(lambda: stored(cluster, retired).exists(), until=lambda there: not there, timeout=60, interval=0.0002,
             what=f"the retirement of {retired}")
    wait_for(lambda: its_blocks & block_names(cluster), until=lambda there: len(there) < len(its_blocks),
             timeout=30, interval=0.0002, what=f"the first block of {retired} to go")
    cluster.pause_controller()  # SIGSTOP: as it is, then SIGKILL
    wait_for(lambda: stopped(cluster.controller_pid), timeout=10, interval=0.001, what="the controller to stop")
    left = its_blocks & block_names(cluster)
    assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    return retired, its_blocks, left


@pytest.mark.parametrize("cluster", [2], indirect=True)
def test_a_controller_killed_in_the_middle_of_a_deletion_leaves_every_kept_snapshot_verifying(cluster, capsys):
    for n in (1, 2):
        for node in ("p1", "p2"):
            command(cluster, node, f"churn {n}")
        filed(cluster, snapshot(cluster))
    caught = None
    for n in range(3, 9):  # each snapshot retires the oldest kept one and its 2 * PER_NODE blocks
        retired, its_blocks, left = killed_while_retiring(cluster, n)
        if left and len(left) < len(its_blocks):
            caught = (retired, len(left))
            break
        cluster.start_controller()
    assert caught, "never stopped the controller in the middle of a deletion"
    garbage = block_names(cluster) - {name for p in stored(cluster, "x").parent.glob("*.pb") for name in names(p)}
    assert garbage >= left

    cluster.start_controller()
    kept = sorted(p.stem for p in stored(cluster, "x").parent.glob("*.pb"))
    assert len(kept) == 2, kept
    for sid in kept:
        code, out = verify(cluster, sid, capsys)
        assert code == 0, out
    wait_for(lambda: block_names(cluster), until=lambda found: not found & left, timeout=30,
             what="the blocks the deletion left to go")
    assert block_names(cluster) == {name for sid in kept for name in names(stored(cluster, sid))}
    for node in ("p1", "p2"):
        command(cluster, node, "churn 100")
    newest = snapshot(cluster)
    filed(cluster, newest)
    wait_for(lambda: sorted(p.stem for p in stored(cluster, "x").parent.glob("*.pb")),
             until=lambda found: found == [kept[-1], newest], timeout=30, what="retention after the restart")
    wait_for(lambda: block_names(cluster), timeout=30, what="the retired blocks to go",
             until=lambda found: found == names(stored(cluster, kept[-1])) | names(stored(cluster, newest)))


def test_a_missing_or_corrupt_block_is_named_by_verify_and_refused_by_restore(cluster, capsys):
    sid = snapshot(cluster)
    path = filed(cluster, sid)
    manifest = snapshot_file.read_stored(path)[0]
    owner = manifest.nodes[0].node_id
    gone = manifest.nodes[0].state_blocks.hashes[5]
    (data(cluster) / "controller" / "blocks" / gone.hex()).unlink()
    code, out = verify(cluster, sid, capsys)
    assert code == 1 and f"snapshot {sid}, node {owner}, block sha256:{gone.hex()}: missing" in out
    with controller(cluster) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.ControllerStub(channel).RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=sid), timeout=60)
    assert refused.value.code() == grpc.StatusCode.DATA_LOSS
    assert "not restored (nothing changed)" in refused.value.details() and gone.hex() in refused.value.details()
    after = snapshot(cluster)  # the owner's report names the missing block: refused, then sent whole
    assert digests(cluster, after) == digests(cluster, sid)  # no node changed
    assert "missing blocks" in cluster.node(owner).output() and reported(cluster, owner, after) > SIZE
    filed(cluster, after)
    code, out = verify(cluster, after, capsys)
    assert code == 0, out

    bad = manifest.nodes[1].state_blocks.hashes[0]
    (data(cluster) / "controller" / "blocks" / bad.hex()).write_bytes(b"\x00" * blocks.BLOCK_BYTES)
    code, out = verify(cluster, sid, capsys)
    assert code == 1 and f"node {manifest.nodes[1].node_id}, block sha256:{bad.hex()}: corrupt" in out, out
    with controller(cluster) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.ControllerStub(channel).RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=sid), timeout=60)
    assert refused.value.code() == grpc.StatusCode.DATA_LOSS
    assert "not restored (nothing changed)" in refused.value.details() and bad.hex() in refused.value.details()
    assert digests(cluster, snapshot(cluster)) == digests(cluster, after)  # no node changed


def test_a_snapshot_journaled_as_blocks_and_never_filed_is_rebuilt_whole_after_a_crash(cluster, capsys):
    """journalblocks.py JB1-JB3: the second snapshot's reports came as blocks and are
    journaled so (manifests and the changed block, not the states). A crash before its
    files were written (here: SIGKILL, then its files removed) leaves only the
    journal: the restart makes it whole from the blocks on disk and the journal's,
    files it again, and it verifies with the states it had."""
    first = snapshot(cluster)
    filed(cluster, first)
    journal = data(cluster) / "controller" / "journal"
    size_before = journal.stat().st_size
    command(cluster, "p1", "poke 100 7")
    second = snapshot(cluster)
    filed(cluster, second)
    assert journal.stat().st_size - size_before < 2 * PER_NODE * 40 + 2 * blocks.BLOCK_BYTES  # not 2 x 4 MiB
    before = digests(cluster, second)
    assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    for path in (stored(cluster, second), data(cluster) / "snapshots" / f"{second}.json"):
        path.unlink()
    cluster.start_controller()
    filed(cluster, second)
    assert digests(cluster, second) == before
    code, out = verify(cluster, second, capsys)
    assert code == 0 and "each matching its hash" in out, out


def two_filed_with_one_block_changed_on_p1_and_p2(cluster) -> tuple[str, str]:
    """A snapshot filed, one block of p1's and p2's states changed, a second filed: their ids."""
    first = snapshot(cluster)
    filed(cluster, first)
    command(cluster, "p1", "poke 100 7")
    command(cluster, "p2", "poke 9000 8")
    second = snapshot(cluster)
    filed(cluster, second)
    return first, second


def test_blocks_a_journaled_report_carried_lost_in_an_os_crash_are_written_back_at_the_restart(cluster, capsys):
    """blockdir.py D8, journalblocks.py JB1, JB3: the blocks a report as blocks carries are
    renamed into controller/blocks unsynced, its record's fdatasync making them durable. An
    OS crash after the record and before the filing (here: SIGKILL, the snapshot's files
    removed, and the changed blocks' files left as an OS crash may: p1's empty, p2's gone)
    loses them; the restart writes them back from the journal, files the snapshot, which
    verifies with the states it had, and the nodes' next reports, naming them as held, are
    taken as they come (none refused and sent whole)."""
    first, second = two_filed_with_one_block_changed_on_p1_and_p2(cluster)
    kept_first = names(stored(cluster, first))
    lost = {node.node_id: [name for name in node.state_blocks.hashes if name.hex() not in kept_first]
            for node in snapshot_file.read_stored(stored(cluster, second))[0].nodes}
    assert [len(lost["p1"]), len(lost["p2"])] == [1, 1], lost
    before = digests(cluster, second)
    assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    for path in (stored(cluster, second), data(cluster) / "snapshots" / f"{second}.json"):
        path.unlink()
    directory = data(cluster) / "controller" / "blocks"
    (directory / lost["p1"][0].hex()).write_bytes(b"")  # renamed, its content never on disk
    (directory / lost["p2"][0].hex()).unlink()  # its name never on disk
    cluster.start_controller()
    filed(cluster, second)
    assert digests(cluster, second) == before
    code, out = verify(cluster, second, capsys)
    assert code == 0 and "each matching its hash" in out, out
    for name in (lost["p1"][0], lost["p2"][0]):
        assert blocks.block_hash((directory / name.hex()).read_bytes()) == name
    third = snapshot(cluster)
    for node in ("p1", "p2"):
        assert "missing blocks" not in cluster.node(node).output()
        assert reported(cluster, node, third) < PER_NODE * 40  # its manifest: every block held
    filed(cluster, third)
    assert digests(cluster, third) == before


@pytest.mark.parametrize("damage", ["unreadable", "corrupt"])
def test_a_restart_that_cannot_read_a_journaled_report_s_block_drops_only_the_snapshot_naming_it(
        cluster, capsys, damage):
    """journalblocks.py JB3, process.py `_stored_block`: the second snapshot's report of p2, as
    blocks, journaled only (its files lost), carries its changed block damaged, and that block's file
    cannot be read (a name whose open fails, as EIO would) or is corrupt. The restart starts, drops that
    snapshot with one warning naming snapshot, node and block, and rebuilds the third (p2 changed
    that block again, so it names it not), which verifies as the first does."""
    first, second = two_filed_with_one_block_changed_on_p1_and_p2(cluster)
    kept_first = names(stored(cluster, first))
    lost = next(name for node in snapshot_file.read_stored(stored(cluster, second))[0].nodes if node.node_id == "p2"
                for name in node.state_blocks.hashes if name.hex() not in kept_first)
    command(cluster, "p2", "poke 9000 9")  # the same block changed again: the third names it not
    third = snapshot(cluster)
    filed(cluster, third)
    assert lost.hex() not in names(stored(cluster, third))
    before = digests(cluster, third)
    assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    for sid in (second, third):
        for path in (stored(cluster, sid), data(cluster) / "snapshots" / f"{sid}.json"):
            path.unlink(missing_ok=True)  # the export may not be written yet
    journal = data(cluster) / "controller" / "journal"
    records, _, problem = R.decode_all(journal.read_bytes())
    assert problem is None
    damaged = 0
    for record in records:
        if isinstance(record, R.Reported) and record.sent is not None and record.snapshot_id == second \
                and record.sent.node_id == "p2":
            carried = [b"\0" * len(block) if blocks.block_hash(block) == lost else block for block in record.sent.blocks]
            damaged += carried != list(record.sent.blocks)
            record.sent.ClearField("blocks")
            record.sent.blocks.extend(carried)
    assert damaged == 1, "the report of p2 in the second snapshot did not carry its changed block"
    journal.write_bytes(b"".join(map(R.encode, records)))
    path = data(cluster) / "controller" / "blocks" / lost.hex()
    path.unlink()
    if damage == "unreadable":
        path.symlink_to(path.name)  # open fails (ELOOP), not FileNotFoundError: as a file the disk cannot read
    else:
        path.write_bytes(b"\0" * blocks.BLOCK_BYTES)
    cluster.start_controller()
    filed(cluster, third)
    lines = [line for line in cluster.controller.output().splitlines() if " WARNING " in line and lost.hex() in line]
    warned = [line for line in lines if "cannot be read" not in line]  # blockdir.py D11 names the file apart
    assert len(warned) == 1 and second in warned[0] and "p2" in warned[0], lines
    assert damage == "unreadable" or len(lines) == 1, lines
    assert digests(cluster, third) == before
    for sid in (first, third):
        code, out = verify(cluster, sid, capsys)
        assert code == 0 and "each matching its hash" in out, out
    assert not stored(cluster, second).exists()


HOLD_WRITES = '''# sitecustomize of this cluster's processes: with the marker file next to it, the controller
# started now never writes the block files of answered reports (blockdir.py D12): they stay pending
from pathlib import Path
if (Path(__file__).parent / "hold-block-writes").exists():
    import threading
    from snapmesh.services.controller import blockwriter
    blockwriter.BlockWriter._run = lambda self: threading.Event().wait()
'''


def test_a_controller_killed_with_block_writes_pending_loses_none_of_them(cluster, capsys):
    """blockdir.py D12, blockwrites.py BW2, BW5, journalblocks.py JB3: the files of the blocks
    a report's record carries are written after it is answered. With those writes held (the
    controller's writer never runs them), the second snapshot still completes, GetSnapshot
    gives its states from memory, and no block file of it is there; SIGKILLed so, the restart
    writes them back from the journal, files the snapshot, and it verifies."""
    first = snapshot(cluster)
    filed(cluster, first)
    apps = data(cluster).parent / "apps"
    (apps / "sitecustomize.py").write_text(HOLD_WRITES)
    (apps / "hold-block-writes").touch()
    assert cluster.stop_controller() == 0
    cluster.start_controller()
    before_files = block_names(cluster)
    command(cluster, "p1", "poke 100 7")
    command(cluster, "p2", "poke 9000 8")
    second = snapshot(cluster)
    before = digests(cluster, second)  # its changed blocks read from memory (BW2)
    assert set(before) == {"p1", "p2"} and all(before.values())
    assert block_names(cluster) == before_files  # answered, the changed blocks' files not written
    assert not stored(cluster, second).exists()  # its filing waits for them (BW5)
    assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    (apps / "hold-block-writes").unlink()
    cluster.start_controller()
    filed(cluster, second)
    assert digests(cluster, second) == before
    code, out = verify(cluster, second, capsys)
    assert code == 0 and "each matching its hash" in out, out
    assert len(block_names(cluster) - before_files) == 2  # the two changed blocks, written back (JB3)
