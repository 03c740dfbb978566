"""`snapmesh.embed` in this process, on real sockets: its five refusals, a clean
close, and the cluster's security rules on an embedded TLS node.

Each refusal is one line of a named type before anything is read, written or
started (embedded.py M2). `close()` leaves no task of the node on the loop and,
once the program stops its server, the node's port free: the same node embeds
again on the same address; nor the thread that writes its held blocks, whose
pending writes it finishes (each block's file whole, no temporary one left). On a TLS cluster the access table still applies to
the embedded node's calls (the checks are in its handlers, not an interceptor),
the program's own plaintext port does not open snapmesh's services, and the
program's own service on that port is left alone.
"""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

import snapmesh
from snapmesh.app import App, Context, NodeInfo, Refused
from snapmesh.protocol import blocks
from snapmesh.protocol.appstate import digest
from snapmesh.serving.credentials import open_channel
from snapmesh.services.node.embedded import EmbedError, NodeClosed
from snapmesh.settings import config, security
from snapmesh.settings.config import write_cluster
from snapmesh.settings.ports import free_ports, port_is_free
from snapmesh.settings.security import write_certs
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(120)


class Counter:
    def __init__(self, info: NodeInfo) -> None:
        self.count = 0

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        self.count += 1
        return str(self.count).encode()

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        pass

    def snapshot(self) -> bytes:
        return str(self.count).encode()

    def restore(self, state: bytes) -> None:
        self.count = int(state)

    def on_query(self, query: bytes) -> bytes:
        return str(self.count).encode()


APP = App(name="counter", new=Counter)


def cluster(tmp_path: Path) -> Path:
    return write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path / "data")


def others() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_a_started_server_is_refused(tmp_path):
    async def go():
        server = grpc.aio.server()
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            with pytest.raises(EmbedError, match="already started: embed before server.start()"):
                await snapmesh.embed(APP, cluster=cluster(tmp_path), node_id="p1", server=server)
        finally:
            await server.stop(0)

    asyncio.run(go())
    assert not (tmp_path / "data").exists()  # nothing read or written


def test_a_node_id_not_in_the_cluster_file_is_refused(tmp_path):
    async def go():
        with pytest.raises(EmbedError, match=r"no node 'p9' \(nodes: p1, p2\)"):
            await snapmesh.embed(APP, cluster=cluster(tmp_path), node_id="p9", server=grpc.aio.server())

    asyncio.run(go())


def test_a_server_that_registers_health_is_refused(tmp_path):
    async def go():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        with pytest.raises(EmbedError, match="already registers grpc.health.v1.Health"):
            await snapmesh.embed(APP, cluster=cluster(tmp_path), node_id="p1", server=server)

    asyncio.run(go())


def test_embed_twice_for_one_node_is_refused_and_submit_after_close_too(tmp_path):
    # The node's calls: submit, query (a read: the count does not move), submit_many; none after close.
    path = cluster(tmp_path)

    async def go():
        first, second = grpc.aio.server(), grpc.aio.server()
        node = await snapmesh.embed(APP, cluster=path, node_id="p1", server=first)
        try:
            with pytest.raises(EmbedError, match="node p1 is already embedded in this process"):
                await snapmesh.embed(APP, cluster=path, node_id="p1", server=second)
            assert (await node.submit(b"x")).reply == b"1"
            assert await node.query(b"count") == b"1"  # a read, not logged: the count stays
            assert (await node.submit(b"x")).reply == b"2"
        finally:
            assert await node.close() == 0
        with pytest.raises(NodeClosed, match="node p1 is closed"):
            await node.submit(b"x")
        with pytest.raises(NodeClosed):
            await node.query(b"count")
        with pytest.raises(NodeClosed):
            await node.submit_many([("a", b"x")])

    asyncio.run(go())


def test_close_leaves_no_task_and_the_port_serves_the_node_again(tmp_path):
    path = cluster(tmp_path)
    address = config.load(path).node("p1").address

    async def one_life(expected: bytes) -> None:
        before = others()
        server = grpc.aio.server()
        node = await snapmesh.embed(APP, cluster=path, node_id="p1", server=server)
        await server.start()
        async with grpc.aio.insecure_channel(address) as channel:
            reply = await pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b"x"), timeout=10)
        assert reply.reply == expected  # the second life recovered the first's command from the log
        assert await node.close() == 0
        await server.stop(0)
        await asyncio.sleep(0)
        assert others() == before

    asyncio.run(one_life(b"1"))
    assert port_is_free("127.0.0.1", int(address.rsplit(":", 1)[1]))
    asyncio.run(one_life(b"2"))


class Blob(Counter):
    """Its state is any bytes: a restore of it may be several blocks."""

    def __init__(self, info: NodeInfo) -> None:
        super().__init__(info)
        self.state = b""

    def snapshot(self) -> bytes:
        return self.state

    def restore(self, state: bytes) -> None:
        self.state = state


def as_blocks(state: bytes) -> pb.RestoreStateRequest:
    """A restore of `state` as blocks, each block's content with it (restoreblocks.py RB2)."""
    named = blocks.names(state)[0]
    request = pb.RestoreStateRequest(snapshot_id="s1", epoch=3, state_digest=digest(state))
    request.state_blocks.hashes.extend(named.names)
    request.blocks.extend(state[start:end] for start, end in named.bounds)
    return request


def test_close_ends_the_block_shelfs_thread_once_its_writes_are_whole(tmp_path):
    # The restored state's blocks are written to the shelf in its own thread after the
    # answer; close at once, and the writes are done and the thread gone (heldblocks.py).
    path = cluster(tmp_path)
    address = config.load(path).node("p1").address
    state = random.Random(3).randbytes(6 * blocks.BLOCK_BYTES)

    def shelf_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("block-shelf")}

    async def go() -> set[threading.Thread]:
        before = shelf_threads()  # another test's, if any: not this node's
        server = grpc.aio.server()
        node = await snapmesh.embed(App(name="blob", new=Blob), cluster=path, node_id="p1", server=server)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                assert (await pb_grpc.NodeStub(channel).RestoreState(as_blocks(state), timeout=10)).epoch == 3
        finally:
            assert await node.close() == 0
            await server.stop(0)
        return shelf_threads() - before

    assert asyncio.run(go()) == set()
    shelf = tmp_path / "data" / "p1.blocks"
    assert sorted(p.name for p in shelf.iterdir()) == sorted(n.hex() for n in blocks.names(state)[0].names)
    assert all(blocks.block_hash(p.read_bytes()).hex() == p.name for p in shelf.iterdir())


def test_the_access_rules_hold_on_an_embedded_tls_node(tmp_path, monkeypatch):
    path = cluster(tmp_path)
    write_certs(config.load(path), tmp_path / "tls")
    monkeypatch.setenv("SNAPMESH_TLS_DIR", str(tmp_path / "tls"))
    cfg = config.load(path)
    tls = cfg.tls
    client = security.load_tls_dir(tmp_path / "tls")
    p2 = security.load_files("p2", ca=tls.ca, cert=tls.cert_path("p2"), key=tls.key_path("p2"), token_file=None)
    address = cfg.node("p1").address
    own_port = free_ports(1)[0]

    async def echo(request: bytes, context) -> bytes:
        return request

    async def code_of(call) -> grpc.StatusCode:
        try:
            await call
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK

    async def go():
        server = grpc.aio.server()
        node = await snapmesh.embed(APP, cluster=path, node_id="p1", server=server)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "shop.Shop", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))
        server.add_insecure_port(f"127.0.0.1:{own_port}")  # the program's own plaintext port
        await server.start()
        try:
            async with open_channel(address, client, aio=True) as channel:
                stub = pb_grpc.NodeStub(channel)
                assert (await stub.Submit(pb.SubmitRequest(command=b"x"), timeout=10)).reply == b"1"  # AUTH4
                assert await code_of(stub.StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s"), timeout=10)) \
                    == grpc.StatusCode.PERMISSION_DENIED  # AUTH2: the controller's only
            async with open_channel(address, p2, aio=True) as channel:
                assert await code_of(pb_grpc.NodeStub(channel).StartSnapshot(
                    pb.StartSnapshotRequest(snapshot_id="s"), timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
            async with grpc.aio.insecure_channel(address) as channel:  # plaintext on the node's TLS port
                assert await code_of(pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b"x"), timeout=5)) \
                    == grpc.StatusCode.UNAVAILABLE
            async with grpc.aio.insecure_channel(f"127.0.0.1:{own_port}") as channel:
                stub = pb_grpc.NodeStub(channel)  # snapmesh's services through the program's plaintext port
                for call in (stub.Submit(pb.SubmitRequest(command=b"x"), timeout=5),
                             stub.StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s"), timeout=5),
                             stub.GetState(pb.GetStateRequest(), timeout=5)):
                    assert await code_of(call) == grpc.StatusCode.UNAUTHENTICATED
                assert await channel.unary_unary("/shop.Shop/Echo")(b"hi", timeout=5) == b"hi"  # the program's own
            assert (await node.submit(b"x")).reply == b"2"  # the refused Submits changed nothing
        finally:
            await node.close()
            await server.stop(0)

    asyncio.run(go())


def test_a_certificate_from_the_programs_own_ca_is_not_the_clusters(tmp_path, monkeypatch):
    # The program's own mutual-TLS port trusts its own CA; a certificate of that CA that
    # names the controller must not pass for the cluster's controller (AUTH2).
    from cryptography.hazmat.primitives import serialization

    from snapmesh.settings import devcerts

    path = cluster(tmp_path)
    write_certs(config.load(path), tmp_path / "tls")
    monkeypatch.setenv("SNAPMESH_TLS_DIR", str(tmp_path / "tls"))
    ca_key, ca_cert = devcerts.make_ca("the program's own CA")
    ca = ca_cert.public_bytes(serialization.Encoding.PEM)
    server_cert, server_key = devcerts.issue(ca_key, ca_cert, "localhost", "127.0.0.1")
    fake_cert, fake_key = devcerts.issue(ca_key, ca_cert, "controller")
    own_port = free_ports(1)[0]

    async def go():
        server = grpc.aio.server()
        node = await snapmesh.embed(APP, cluster=path, node_id="p1", server=server)
        server.add_secure_port(f"127.0.0.1:{own_port}", grpc.ssl_server_credentials(
            [(server_key, server_cert)], root_certificates=ca, require_client_auth=True))
        await server.start()
        try:
            credentials = grpc.ssl_channel_credentials(ca, fake_key, fake_cert)
            async with grpc.aio.secure_channel(f"127.0.0.1:{own_port}", credentials) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.NodeStub(channel).StartSnapshot(pb.StartSnapshotRequest(snapshot_id="s"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "not from the cluster's CA" in refused.value.details()
        finally:
            await node.close()
            await server.stop(0)

    asyncio.run(go())


class Fragile(Counter):
    """Sends each command's count to the other node, which cannot take it."""

    def __init__(self, info: NodeInfo) -> None:
        super().__init__(info)
        self.peer = sorted(info.peers_out)[0]

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        ctx.send(self.peer, command)
        return super().on_command(command, ctx)

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        raise RuntimeError(f"cannot take {payload!r} from {src}")


def test_two_nodes_in_one_process_and_a_failure_is_told(tmp_path, caplog):
    # M4: p2's app raises on p1's message; p2 logs the line snapmesh node would exit
    # with, answers commands UNAVAILABLE, and node.failed() returns the line.
    path = cluster(tmp_path)
    app = App(name="fragile", new=Fragile)

    async def go():
        servers = {n: grpc.aio.server() for n in ("p1", "p2")}
        nodes = {n: await snapmesh.embed(app, cluster=path, node_id=n, server=s) for n, s in servers.items()}
        for server in servers.values():
            await server.start()
        try:
            assert (await nodes["p1"].submit(b"x")).reply == b"1"
            line = await asyncio.wait_for(nodes["p2"].failed(), 30)
            assert "node p2: the app failed on a message" in line and "cannot take b'x' from p1" in line
            with pytest.raises(Refused) as refused:
                await nodes["p2"].submit(b"y")
            assert refused.value.code == "UNAVAILABLE"
        finally:
            for node in nodes.values():
                await node.close()
            for server in servers.values():
                await server.stop(0)
        with pytest.raises(NodeClosed):
            await nodes["p1"].failed()

    with caplog.at_level("ERROR", logger="snapmesh.services.node"):
        asyncio.run(go())
    assert any("node p2: the app failed on a message" in r.getMessage() for r in caplog.records)
