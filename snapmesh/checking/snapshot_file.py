"""A stored snapshot: its checksum, reading it back, and checking it is restorable.

The controller files each finished snapshot twice (services/controller/store.py):
`<id>.pb`, the Snapshot's protobuf bytes, and `<id>.json`, its proto JSON export.
Both carry `Snapshot.checksum`: "sha256:" and the SHA-256 of the Snapshot's
deterministic protobuf encoding without that field. So one checksum covers both
files: the JSON file is checked by parsing it and encoding what it holds. A file
changed on disk (a flipped bit, a truncated write, a hand edit of a node's state) no
longer matches it.

Every file this version writes is marked as such, and a marked file without
its checksum is damaged (a `.pb` cut at a field boundary parses, but loses the
checksum, which is its last field). The `.pb` file starts with `FORMAT_MARK`, an
unknown protobuf field (999, format 2) that any protobuf reader skips; the
`.json` export always has a top-level "checksum" key. A file without the mark
(written before checksums, or before the mark) may lack the checksum: it still
loads and restores as before, and `check` reports its checksum as "absent
(written before checksums)" without failing it; its other checks still run.
That is the most one can say of it.

The `.pb` file holds each app node's state as a manifest of blocks
(snapmesh/protocol/blocks.py), each block a file `controller/blocks/<hex>` beside
`controller/snapshots/`; reading the file rebuilds the whole snapshot from them,
each block checked against its hash. The checksum is the whole snapshot's, or, for
a snapshot whose files hold its states as manifests (the controller's over
EXPORT_INLINE_BYTES of states: both files hold manifests then), the stored form's:
the encoding of what the file holds. A manifest names each block by its SHA-256 and
every read of a block checks it against its name, so either covers every block; the
stored form's is hashed without reading a block, so filing a snapshot that changed
little reads only what changed. A file matches its checksum when either form's
encoding hashes to it (`checksum_problem`). A missing or corrupt block makes the file
unreadable (`BlocksDamaged`), naming the snapshot, the node and the block's hash.
A `.pb` from before blocks holds its states inline and reads as before.

`check(path)` is `snapmesh snapshot verify`: without restoring anything, is the
stored snapshot
- intact: it parses, its checksum matches, it is the snapshot its name says;
- COMPLETE;
- conserved: the app's arithmetic (`rules.conserved`), for a snapshot that
  carries the v1 fields (`total`, `conserved`) and when the caller hands the
  rules in (the bank's are snapmesh/bank/snapshot.py's);
- consistent with itself: each node and channel appears once, every channel
  joins two recorded nodes, in-flight seqs increase and msg_ids are unique, each
  app state matches its digest, and, with `rules`, the app's own arithmetic
  agrees with itself (`rules.item_problem`, `rules.whole_problems`);
- for an app: its invariants held when the controller checked them ("unchecked"
  passes, saying so).
A file that holds manifests is checked a block at a time (listedfile.py): each block
read, checked against its name and let go, each state's size and digest taken from
the same reads, the whole form's checksum (when the file's is not its manifests')
hashed as a stream; no state is joined, so its peak is about a block at any size.
The restore path (`damage`) asks only the first question, reading as `check` does: a
damaged file is refused with DATA_LOSS, a COMPLETE but odd one by the restorer's own checks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from snapmesh.checking import listedfile
from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.controller.wholedigest import WholeDigestError, whole_digest
from snapmesh.protocol.appstate import ITEM_FIGURE, NODE_FIGURE, carries_v1, clear_old_figures
from snapmesh.v1 import snapmesh_pb2 as pb

PREFIX = "sha256:"
NO_CHECKSUM = "absent (written before checksums)"
# Field 999, varint, value 2: the first bytes of every `.pb` file this version
# writes. Protobuf readers skip it as an unknown field; `read` takes it off first.
FORMAT_MARK = b"\xb8\x3e\x02"


def checksum(snapshot: pb.Snapshot) -> str:
    """The checksum of `snapshot`'s content (its own `checksum` field left out)."""
    if snapshot.checksum:
        unsealed = pb.Snapshot()
        unsealed.CopyFrom(snapshot)
        unsealed.ClearField("checksum")
        snapshot = unsealed
    data = snapshot.SerializeToString(deterministic=True)
    return PREFIX + hashlib.sha256(data).hexdigest()


def sealed_bytes(snapshot: pb.Snapshot, stored: pb.Snapshot | None = None) -> tuple[bytes, str]:
    """The `.pb` file's content, the encoding of `stored` (the stored form of
    `snapshot`, its states as block manifests; default `snapshot` itself) with the
    checksum of `snapshot` set, and that checksum. Neither is changed (the
    controller's copy is shared): field 41 is the last one encoded, so it is appended."""
    assert not snapshot.checksum, "seal an unsealed snapshot"
    data = snapshot.SerializeToString(deterministic=True)
    digest = PREFIX + hashlib.sha256(data).hexdigest()
    if stored is not None:
        data = stored.SerializeToString(deterministic=True)
    return FORMAT_MARK + data + pb.Snapshot(checksum=digest).SerializeToString(), digest


def sealed_with(stored: pb.Snapshot, digest: str) -> bytes:
    """`sealed_bytes`' file for a checksum found otherwise (the controller's store hashes
    a listed snapshot's whole form a block at a time: wholedigest.py)."""
    assert not stored.checksum, "seal an unsealed snapshot"
    return FORMAT_MARK + stored.SerializeToString(deterministic=True) + pb.Snapshot(checksum=digest).SerializeToString()


def sealed_json(rendered: str, digest: str) -> str:
    """The `.json` export `rendered` (every field printed, so with an empty
    top-level checksum) with the checksum `digest` filled in."""
    empty = '\n  "checksum": ""'
    if empty not in rendered:  # pragma: no cover  (the export prints every field)
        snapshot = json_format.Parse(rendered, pb.Snapshot())
        snapshot.checksum = digest
        return json_format.MessageToJson(snapshot, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
    return rendered.replace(empty, f'\n  "checksum": "{digest}"', 1)


class Unreadable(ValueError):
    """The file cannot be read as a snapshot; the message names it and says why."""


class BlocksDamaged(Unreadable):
    """A stored snapshot whose blocks are not all there as named: `problems` names each."""

    def __init__(self, path: Path, problems: list[blocks.BlockProblem]) -> None:
        self.problems = problems
        shown = "; ".join(str(p) for p in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{path}: {len(problems)} block(s) not as named: {shown}{more}")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Verdict:
    path: Path
    snapshot_id: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict:
        return {
            "file": str(self.path), "snapshot_id": self.snapshot_id, "ok": self.ok,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def read(path: Path) -> pb.Snapshot:
    """The snapshot in a `.pb` or `.json` file (Unreadable when it is not one)."""
    return read_marked(path)[0]


def read_marked(path: Path) -> tuple[pb.Snapshot, bool]:
    """The whole snapshot in a `.pb` or `.json` file, and whether the file is marked
    as written by this version (so it must carry its checksum); Unreadable when it
    is not a snapshot file, BlocksDamaged when a block it names is missing or corrupt."""
    stored, marked = read_stored(path)
    return whole(stored, path), marked


def blocks_dir(path: Path) -> Path:
    """Where the blocks of the stored file `path` are: `controller/blocks` beside
    `controller/snapshots` for a `.pb`; for a `.json` export (`<data>/snapshots/`),
    `<data>/controller/blocks` (an export of large states names its blocks)."""
    path = Path(path)
    if path.suffix == ".json":
        return path.parent.parent / "controller" / "blocks"
    return path.parent.parent / "blocks"


def whole(stored: pb.Snapshot, path: Path) -> pb.Snapshot:
    """The whole form of a snapshot read from `path` in its stored form, its blocks
    read from `blocks_dir(path)`; BlocksDamaged naming each block missing or corrupt."""
    if not blocks.is_stored_form(stored):
        return stored
    directory = blocks_dir(path)

    def read(name: bytes) -> bytes | None:
        try:
            return (directory / name.hex()).read_bytes()
        except FileNotFoundError:
            return None

    snapshot, problems = blocks.whole_form(stored, read)
    if snapshot is None:
        raise BlocksDamaged(Path(path), problems)
    return snapshot


def read_stored(path: Path) -> tuple[pb.Snapshot, bool]:
    """`read_marked`'s snapshot as the file holds it: in a `.pb`, the app states as
    block manifests (snapmesh/protocol/blocks.py), no block read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise Unreadable(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".json":
            fields = json.loads(data.decode("utf-8"))
            if not isinstance(fields, dict):
                raise json_format.ParseError("not a JSON object")
            return json_format.ParseDict(fields, pb.Snapshot()), "checksum" in fields
        marked = data.startswith(FORMAT_MARK)
        return pb.Snapshot.FromString(data[len(FORMAT_MARK):] if marked else data), marked
    except (DecodeError, UnicodeDecodeError, ValueError, json_format.ParseError) as exc:
        raise Unreadable(f"{path}: not a snapshot file: {exc}") from None


def checksum_problem(snapshot: pb.Snapshot, marked: bool, stored: pb.Snapshot | None = None) -> str:
    """Why the checksum of a snapshot read from a file fails it ("" when it does
    not): it does not match the content, or the file is marked as written by this
    version and has none. `stored`: the file's content as it holds it (`read_stored`),
    when that is a stored form (manifests), whose own encoding may be what the checksum
    is of; `snapshot` is then its whole form, every block read and checked against its
    name (`whole`), which is what makes a checksum of the manifests cover the blocks."""
    if not snapshot.checksum:
        return "has no checksum, yet its format always carries one (cut short?)" if marked else ""
    if stored is not None and blocks.is_stored_form(stored) and stored.checksum == snapshot.checksum \
            and snapshot.checksum == checksum(stored):
        return ""
    if snapshot.checksum != (computed := checksum(snapshot)) and snapshot.checksum != checksum(_as_before(snapshot)):
        return f"content does not match its checksum {snapshot.checksum} (computed {computed})"
    return ""


def _as_before(snapshot: pb.Snapshot) -> pb.Snapshot:
    """`snapshot` as a JSON export written before the v1 figures were optional encoded
    it: those it prints at their default (0, false) were not on the wire then."""
    old = pb.Snapshot()
    old.CopyFrom(snapshot)
    for name in ("total", "expected_total", "conserved"):
        if not getattr(old, name):
            old.ClearField(name)
    for part, name in [*((n, NODE_FIGURE) for n in old.nodes),
                       *((t, ITEM_FIGURE) for c in old.channels for t in c.in_flight)]:
        if not getattr(part, name):
            part.ClearField(name)
    return old


def damage(path: Path) -> str:
    """Why the stored file `path` is damaged ("" when intact): it cannot be read,
    its checksum does not match or is missing from a file that must carry one, or
    it holds another snapshot than its name."""
    try:
        stored, marked = read_stored(path)
        snapshot, _, problem = _checked_form(Path(path), stored, marked)
    except Unreadable as exc:
        return str(exc)
    if snapshot.snapshot_id != Path(path).stem:
        return f"{path}: holds snapshot_id {snapshot.snapshot_id!r}, not {Path(path).stem!r}"
    if problem:
        return f"{path}: {problem}"
    return ""


def check(path: Path, rules: Any = None) -> Verdict:
    """Every check of the module doc on the stored file `path` (read only). `rules`: the
    app's arithmetic on the snapshot's figures (`conserved`, `item_problem`, `whole_problems`;
    None: none, only what every app's snapshot has is checked)."""
    path = Path(path)
    try:
        stored, marked = read_stored(path)
    except Unreadable as exc:
        return Verdict(path, path.stem, [Check("intact", False, str(exc).removeprefix(f"{path}: "))])
    try:
        snapshot, digests, problem = _checked_form(path, stored, marked)
    except BlocksDamaged as exc:
        return Verdict(path, stored.snapshot_id, [Check("blocks", False, str(exc).removeprefix(f"{path}: "))])
    verdict = Verdict(path, snapshot.snapshot_id)
    add = verdict.checks.append
    if names := [name for node in stored.nodes for name in node.state_blocks.hashes]:
        add(Check("blocks", True, f"{len(names)} blocks ({len(set(names))} distinct) under {blocks_dir(path)}, "
                                  "each matching its hash"))
    if problem:
        add(Check("checksum", False, problem))
    else:
        add(Check("checksum", True, snapshot.checksum or NO_CHECKSUM))
        clear_old_figures(snapshot)  # read as it is judged now
    named = path.stem == snapshot.snapshot_id
    add(Check("name", named, f"holds {snapshot.snapshot_id!r}" + ("" if named else f", not {path.stem!r}")))
    status = pb.Snapshot.Status.Name(snapshot.status) if snapshot.status in pb.Snapshot.Status.values() else str(
        snapshot.status)
    add(Check("complete", snapshot.status == pb.Snapshot.COMPLETE,
              status + (f": {snapshot.reason}" if snapshot.reason else "")))
    if rules is not None and carries_v1(snapshot):  # the rules' check, where the snapshot carries the v1 fields
        add(Check("conserved", *rules.conserved(snapshot)))
    if snapshot.HasField("app"):  # an app's verdict is its invariants
        app = snapshot.app
        broken = [f"{i.name}: {'; '.join(i.problems)}" for i in app.invariants if not i.ok]
        add(Check("invariants", not broken, "; ".join(broken) if broken else
                  f"{len(app.invariants)} of app {app.spec} held" if app.status == pb.AppCheck.CHECKED else "unchecked"))
    problems = inconsistencies(snapshot, rules, digests)
    add(Check("consistent", not problems, "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else "")
              if problems else f"{len(snapshot.nodes)} nodes, {len(snapshot.channels)} channels, "
              f"{sum(len(c.in_flight) for c in snapshot.channels)} in flight"))
    return verdict


def _checked_form(path: Path, stored: pb.Snapshot, marked: bool) -> tuple[pb.Snapshot, dict[int, str], str]:
    """The snapshot read from `path` as `check` and `damage` judge it: a stored form
    listed, a block at a time, no state joined (listedfile.py); its listed states'
    digests by entry index; and `checksum_problem`'s answer. BlocksDamaged naming
    every block missing or corrupt."""
    if not blocks.is_stored_form(stored):
        return stored, {}, checksum_problem(stored, marked)
    read = listedfile.directory_reader(blocks_dir(path))
    found = listedfile.scan(stored, read)
    if found.problems:
        raise BlocksDamaged(Path(path), found.problems)
    snapshot = listedfile.listed(stored, found.sizes)
    return snapshot, found.digests, _listed_checksum_problem(snapshot, marked, stored, read)


def _listed_checksum_problem(snapshot: pb.Snapshot, marked: bool, stored: pb.Snapshot,
                             read: listedfile.Read) -> str:
    """`checksum_problem` of the listed form `snapshot` of `stored`, every block already
    checked against its name (listedfile.scan): the whole form's checksum, when the
    file's is not its manifests', hashed a block at a time (wholedigest.py)."""
    if not snapshot.checksum:
        return checksum_problem(snapshot, marked)
    if stored.checksum == checksum(stored):  # its manifests': each block was checked against its name
        return ""
    unsealed = pb.Snapshot()
    unsealed.CopyFrom(snapshot)
    unsealed.ClearField("checksum")
    blocks_of = listedfile.checked_blocks(snapshot.snapshot_id, read)
    try:
        computed = whole_digest(unsealed, blocks_of).checksum
        if computed == snapshot.checksum or whole_digest(_as_before(unsealed), blocks_of).checksum == snapshot.checksum:
            return ""
    except (listedfile.NotAsNamed, WholeDigestError) as exc:  # a block changed while it was read
        return f"its whole form cannot be hashed: {exc}"
    return f"content does not match its checksum {snapshot.checksum} (computed {computed})"


def inconsistencies(snapshot: pb.Snapshot, rules: Any = None, digests: dict[int, str] | None = None) -> list[str]:
    """What in `snapshot` contradicts the rest of it (empty: nothing); `rules` as for `check`;
    `digests`: entry index -> its listed state's digest, in its entry's form (listedfile.scan)."""
    problems: list[str] = []
    nodes = [n.node_id for n in snapshot.nodes]
    if snapshot.status == pb.Snapshot.COMPLETE and not nodes:
        problems.append("COMPLETE with no node recorded")
    if dupes := sorted({n for n in nodes if nodes.count(n) > 1}):
        problems.append(f"node(s) recorded twice: {', '.join(dupes)}")
    seen_channels: set[tuple[str, str]] = set()
    msg_ids: set[str] = set()
    for channel in snapshot.channels:
        key = (channel.src, channel.dst)
        name = f"{channel.src}->{channel.dst}"
        if key in seen_channels:
            problems.append(f"channel {name} recorded twice")
        seen_channels.add(key)
        if channel.src not in nodes or channel.dst not in nodes:
            problems.append(f"channel {name} joins a node the snapshot does not record")
        last = 0
        for transfer in channel.in_flight:
            if rules is not None and (problem := rules.item_problem(name, transfer)):
                problems.append(problem)
            if transfer.seq and transfer.seq <= last:
                problems.append(f"{name}: seq {transfer.seq} after {last}")
            last = transfer.seq or last
            if transfer.msg_id in msg_ids:
                problems.append(f"{name}: msg_id {transfer.msg_id} recorded twice")
            msg_ids.add(transfer.msg_id)
    for index, node in enumerate(snapshot.nodes):
        if index in (digests or {}):
            wrong = digests[index] != node.state_digest  # type: ignore[index]
        else:
            wrong = node.HasField("state") and not statedigest.matches(node.state_digest, node.state)  # either form (SD2)
        if wrong:
            problems.append(f"node {node.node_id}: its state does not match its digest {node.state_digest}")
    if rules is not None:
        problems += rules.whole_problems(snapshot)
    return problems
