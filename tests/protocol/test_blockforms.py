"""A large state on the controller's report path stays its block list
(snapmesh/protocol/controller/blockforms.py BF1-BF4, tracker T9, lazystates L3,
answers BA5): the tracker fed reports in listed form completes the snapshot the
tracker fed the same reports whole completes, the app's invariants read the
states by block, answers leave them out by their noted sizes without reading a
block, and a block that cannot be read is named, never read as nothing."""

from __future__ import annotations

import random

import pytest

from snapmesh.app import App
from snapmesh.protocol import blocks, lazystates
from snapmesh.protocol.appstate import AppChecker, digest, view_of
from snapmesh.protocol.controller import answers, blockforms
from snapmesh.protocol.controller.tracker import COMPLETE, DuplicateReport, Now, Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

SIZE = 20 * blocks.BLOCK_BYTES + 100  # over LISTED_BYTES, its last block shorter


def sizes_alike(view) -> list[str]:
    sizes = {node: len(state) for node, state in view.states.items()}
    return [] if len(set(sizes.values())) == 1 else [f"sizes differ: {sizes}"]


APP = App(name="blob", new=lambda info: None, invariants={"sizes alike": sizes_alike})
STATES = {node: random.Random(node).randbytes(SIZE) for node in ("a", "b")}


def new_tracker() -> Tracker:
    return Tracker(topology=Topology(nodes=("a", "b"), channels=(("a", "b"), ("b", "a"))), deadline_s=5.0,
                   checker=AppChecker("blob:app", APP))


def whole(node: str, sid: str = "s1") -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id=node, state=STATES[node], app_name="blob", app_version=1,
                        channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)])


def listed(tracker: Tracker, node: str, sid: str = "s1") -> pb.FullState:
    """What the servicer hands the machine for a report as blocks: the manifest, the size and digest noted."""
    named = blocks.names(STATES[node])[0]
    report = blockforms.listed_report(whole(node, sid), named.names)
    sizes = tuple(end - start for start, end in named.bounds)
    tracker.forms.note(report, blockforms.BlockList(tuple(named.names), sizes, digest(STATES[node])))
    return report


def store() -> dict[bytes, bytes]:
    return {blocks.block_hash(b): b for state in STATES.values() for b in blocks.split(state)}


def test_a_snapshot_of_listed_reports_is_the_one_of_whole_reports_and_holds_no_state():
    at = Now(1.0, 1000.0)
    plain, lists = new_tracker(), new_tracker()
    held = store()
    lists.forms.reader = lambda: held.get
    for t in (plain, lists):
        t.start("s1", "a", at)
    plain.report(whole("a"), at)
    expected = plain.report(whole("b"), at).snapshot
    lists.report(listed(lists, "a"), at)
    got = lists.report(listed(lists, "b"), at).snapshot
    assert got.status == COMPLETE and got.app.status == pb.AppCheck.CHECKED and not got.reason
    assert all(blockforms.is_listed(n) and n.state_bytes == SIZE for n in got.nodes), "T9: no bytes in it"
    assert got.stats.state_size_bytes == expected.stats.state_size_bytes
    assert lists.get("s1") == plain.get("s1"), "BF1: the whole form is the snapshot of whole reports"
    assert lists.forms.whole(got) == expected


def test_a_repeat_is_known_by_its_digest_in_either_form_and_a_different_one_refused():
    at = Now(1.0, 1000.0)
    t = new_tracker()
    t.forms.reader = lambda: store().get
    t.start("s1", "a", at)
    t.report(listed(t, "a"), at)
    assert t.report(whole("a"), at).duplicate, "BF4: sent whole after a refusal, the same state"
    t.report(listed(t, "b"), at)
    assert t.report(listed(t, "b"), at).duplicate
    other = whole("b")
    other.state = STATES["b"][:-1] + b"\0"
    with pytest.raises(DuplicateReport):
        t.report(other, at)


def test_answers_leave_listed_states_out_by_their_sizes_or_read_them_whole():
    at = Now(1.0, 1000.0)
    t = new_tracker()
    t.forms.reader = lambda: store().get
    t.start("s1", "a", at)
    t.report(listed(t, "a"), at)
    snapshot = t.report(listed(t, "b"), at).snapshot

    def never(_):
        raise AssertionError("BA5: no block is read for an answer that leaves the states out")

    small = answers.bounded(snapshot, state_bytes=SIZE, whole=never)
    assert small.states_omitted and all(n.state_omitted and n.state_bytes == SIZE for n in small.nodes)
    assert not any(n.HasField("state_blocks") or n.HasField("state") for n in small.nodes)
    assert all(n.state_digest == digest(STATES[n.node_id]) for n in small.nodes)
    full = answers.bounded(snapshot, state_bytes=4 * SIZE, whole=t.forms.whole)
    assert [n.state for n in full.nodes] == [STATES["a"], STATES["b"]] and not full.states_omitted


def test_a_block_that_cannot_be_read_is_named_and_without_a_reader_a_listed_state_is_no_bytes():
    at = Now(1.0, 1000.0)
    t = new_tracker()
    held = store()
    t.forms.reader = lambda: held.get
    t.start("s1", "a", at)
    t.report(listed(t, "a"), at)
    snapshot = t.report(listed(t, "b"), at).snapshot
    lost = snapshot.nodes[1].state_blocks.hashes[3]
    del held[lost]
    with pytest.raises(blockforms.BlockMissing, match=f"snapshot s1, node b, block sha256:{lost.hex()}: missing"):
        t.get("s1")
    with pytest.raises(LookupError, match="node 'a' of snapshot s1: its state is a block list"):
        view_of(snapshot).states["a"]
    got = lazystates.with_reader(t.forms.state, lambda: view_of(snapshot).states["a"])
    assert got == STATES["a"]


def test_streamed_reads_each_block_once_for_the_size_and_digest_and_names_those_it_lacks():
    """BF6: the block list of a state without its bytes joined; a block not read is named."""
    state = random.Random(6).randbytes(3 * blocks.BLOCK_BYTES + 7)
    named = blocks.names(state)[0]
    content = {name: state[start:end] for name, (start, end) in zip(named.names, named.bounds, strict=True)}
    asked: list[bytes] = []

    def read(name: bytes) -> bytes | None:
        asked.append(name)
        return content.get(name)

    block_list, missing = blockforms.streamed(named.names, read)
    assert missing == [] and asked == named.names
    assert block_list == blockforms.BlockList(tuple(named.names), tuple(len(b) for b in blocks.split(state)), digest(state))
    del content[named.names[1]]
    assert blockforms.streamed(named.names, read) == (None, [named.names[1]])


def test_streamed_takes_the_digest_the_node_said():
    """BF6: a digest the report carries is taken, not hashed again (the filing checks it)."""
    state = random.Random(7).randbytes(2 * blocks.BLOCK_BYTES + 1)
    named = blocks.names(state)[0]
    content = dict(zip(named.names, blocks.split(state), strict=True))
    block_list, _ = blockforms.streamed(named.names, content.get, "sha256:said")
    assert block_list is not None and block_list.digest == "sha256:said" and block_list.size == len(state)


def test_streamed_counts_the_blocks_it_knows_the_size_of_unread_only_with_the_nodes_digest():
    """BF6: with the node's digest, a block `sized` knows is counted without being read;
    without it, every block is read (the digest is hashed from them)."""
    state = random.Random(8).randbytes(4 * blocks.BLOCK_BYTES + 9)
    named = blocks.names(state)[0]
    content = dict(zip(named.names, blocks.split(state), strict=True))
    known = {name: len(content[name]) for name in named.names[1:]}  # all but the first
    asked: list[bytes] = []

    def read(name: bytes) -> bytes | None:
        asked.append(name)
        return content.get(name)

    block_list, _ = blockforms.streamed(named.names, read, "sha256:said", known.get)
    assert asked == [named.names[0]]
    assert block_list is not None and block_list.size == len(state)
    assert block_list.sizes == tuple(len(b) for b in blocks.split(state))
    asked.clear()
    block_list, _ = blockforms.streamed(named.names, read, "", known.get)
    assert asked == named.names and block_list is not None and block_list.digest == digest(state)


def test_a_report_s_block_list_is_found_only_for_the_manifest_noted():
    """BF8: the noted list is found by snapshot and node when the manifest is the one noted; a
    report changed since, or another manifest of the same node, is not given it."""
    forms = blockforms.BlockForms()
    hashes = tuple(bytes([i]) * 32 for i in range(5))
    listed = blockforms.listed_report(pb.FullState(snapshot_id="s1", node_id="p1"), hashes)
    block_list = blockforms.BlockList(hashes, (blocks.BLOCK_BYTES,) * 4 + (7,), "sha256:" + "0" * 64)
    forms.note(listed, block_list)
    assert forms.of(listed) is block_list
    same = pb.FullState.FromString(listed.SerializeToString())  # equal, another message
    assert forms.of(same) is block_list
    by_names = dict(forms._notes)
    forms._notes.clear()  # found by snapshot and node and compared, not by a tuple of its names
    assert forms.of(same) is block_list
    forms._notes.update(by_names)
    listed.state_blocks.hashes[2] = b"\xff" * 32  # changed after it was noted
    with pytest.raises(LookupError):
        forms.of(listed)
    other = blockforms.listed_report(pb.FullState(snapshot_id="s1", node_id="p1"), hashes[:4])
    with pytest.raises(LookupError):
        forms.of(other)
    other_list = blockforms.BlockList(hashes[:4], (blocks.BLOCK_BYTES,) * 4, "sha256:" + "1" * 64)
    forms.note(other, other_list)  # the node's manifest noted again, another one
    assert forms.of(other) is other_list and forms.of(same) is block_list  # the earlier by its names
