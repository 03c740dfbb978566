"""Raw gRPC figures on loopback, two processes: the ceiling the cluster works under.

A server process implements just enough of the Node service: `Channel` acks each
frame, `GetState` answers at once. The client measures, in one run:
  - unary round trips (GetState): p50, p99, calls/s;
  - unary calls from UNARY_CALLERS concurrent callers (`Submit`, echoing the
    command as the reply): calls/s, `raw_unary_calls_per_s`, the yardstick of
    the nodes' unary Submit (bench/submit_batch.py);
  - one Channel stream, one message per frame, one ack per frame;
  - one Channel stream, 100 messages per frame (the batching the nodes use).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import grpc

from bench import smoke
from bench.report import percentile
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

UNARY_CALLS = 2_000
STREAM_MESSAGES = 20_000
BATCHED_MESSAGES = 1_000_000
BATCH = 100
UNARY_CALLERS = 64  # concurrent unary callers, as the unary Submit phase of bench/submit_batch.py has
UNARY_WINDOW_S = 3.0


class _EchoNode(pb_grpc.NodeServicer):
    async def GetState(self, request, context):
        return pb.NodeStateResponse(node_id="bench", balance=0)

    async def Submit(self, request, context):
        return pb.SubmitResponse(reply=request.command, epoch=1)

    async def Channel(self, request_iterator, context):
        last = 0
        async for frame in request_iterator:
            if frame.HasField("batch") and frame.batch.messages:
                last = frame.batch.messages[-1].seq
            yield pb.ChannelAck(acked_seq=last)


async def _serve() -> None:
    server = grpc.aio.server()
    pb_grpc.add_NodeServicer_to_server(_EchoNode(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await server.stop(0)


def _frames(total: int, batch: int):
    template = pb.TransferMessage(msg_id="p1:p2:0", amount=7)
    seq = 0
    while seq < total:
        n = min(batch, total - seq)
        messages = [pb.ChannelMessage(seq=seq + i + 1, transfer=template) for i in range(n)]
        seq += n
        yield pb.ChannelFrame(batch=pb.ChannelBatch(messages=messages))


async def _stream_rate(stub, total: int, batch: int) -> float:
    """Messages per second through one stream, acked frame by frame (lock-step)."""
    frames = list(_frames(total, batch))  # built before the clock starts
    queue: asyncio.Queue = asyncio.Queue()

    async def requests():
        yield pb.ChannelFrame(open=pb.ChannelOpen(src="p1", dst="bench"))
        for frame in frames:
            yield frame
            await queue.get()  # one frame in flight: the node's ack discipline

    call = stub.Channel(requests())
    start = time.perf_counter()
    acks = 0
    async for _ in call:
        acks += 1
        if acks > 1:
            queue.put_nowait(None)
        else:
            start = time.perf_counter()  # the open's ack: the stream is up
            queue.put_nowait(None)
        if acks == len(frames) + 1:
            break
    elapsed = time.perf_counter() - start
    call.cancel()
    return total / elapsed


async def concurrent_unary_rate(stub, callers: int, seconds: float) -> float:
    """Calls per second from `callers` closed-loop unary Submit callers over `seconds` (after a short warm-up)."""
    request = pb.SubmitRequest(command=b"x")
    counting = False
    calls = 0
    stop_at = time.monotonic() + 0.5 + seconds

    async def caller() -> None:
        nonlocal calls
        while time.monotonic() < stop_at:
            await stub.Submit(request, timeout=30)
            if counting:
                calls += 1

    tasks = [asyncio.create_task(caller()) for _ in range(callers)]
    await asyncio.sleep(0.5)
    counting, started = True, time.perf_counter()
    await asyncio.sleep(seconds)
    counting, elapsed = False, time.perf_counter() - started
    await asyncio.gather(*tasks)
    return calls / elapsed


def _cpu_s(pid: int) -> float:
    """utime + stime of process `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(port: int, server_pid: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_OPTIONS) as channel:
        stub = pb_grpc.NodeStub(channel)
        unary_calls, stream_messages = smoke.size(UNARY_CALLS, 50), smoke.size(STREAM_MESSAGES, 200)
        for _ in range(smoke.size(200, 5)):  # warm up
            await stub.GetState(pb.GetStateRequest())
        latencies = []
        start = time.perf_counter()
        for _ in range(unary_calls):
            t0 = time.perf_counter()
            await stub.GetState(pb.GetStateRequest())
            latencies.append(time.perf_counter() - t0)
        unary_elapsed = time.perf_counter() - start
        cpu_before = _cpu_s(os.getpid()) + _cpu_s(server_pid)
        single = await _stream_rate(stub, stream_messages, 1)
        frame_cpu_s = (_cpu_s(os.getpid()) + _cpu_s(server_pid) - cpu_before) / stream_messages
        batched = await _stream_rate(stub, smoke.size(BATCHED_MESSAGES, 5_000), BATCH)
        concurrent = await concurrent_unary_rate(stub, UNARY_CALLERS, smoke.size(UNARY_WINDOW_S, 0.3))
    return {
        "unary_p50_ms": percentile(latencies, 50) * 1e3,
        "unary_p99_ms": percentile(latencies, 99) * 1e3,
        "unary_per_s": unary_calls / unary_elapsed,
        "stream_single_per_s": single,
        "cpu_us_per_frame_acked": frame_cpu_s * 1e6,
        "stream_batched_per_s": batched,
        "raw_unary_calls_per_s": concurrent,
    }


def measure() -> dict[str, float]:
    return _with_server(_measure)


def raw_unary_calls_per_s(seconds: float = UNARY_WINDOW_S) -> float:
    """`raw_unary_calls_per_s` alone: UNARY_CALLERS concurrent unary callers of an echo server."""

    async def rate(port: int, _pid: int) -> float:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_OPTIONS) as channel:
            return await concurrent_unary_rate(pb_grpc.NodeStub(channel), UNARY_CALLERS, seconds)

    return _with_server(rate)


def raw_batched_stream_msgs_per_s() -> float:
    """`stream_batched_per_s` alone: one Channel stream, BATCH messages a frame, each frame acked."""

    async def rate(port: int, _pid: int) -> float:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_OPTIONS) as channel:
            return await _stream_rate(pb_grpc.NodeStub(channel), smoke.size(BATCHED_MESSAGES, 5_000), BATCH)

    return _with_server(rate)


def _with_server(measure_with):
    """`measure_with(port, server_pid)` run against a fresh echo server process, stopped after."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.grpc_raw", "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())
        return asyncio.run(measure_with(port, server.pid))
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> int:
    figures = measure()
    print(f"{'raw gRPC on loopback (two processes)':<52} {'figure':>14}")
    print(f"{'unary round trip p50 (ms)':<52} {figures['unary_p50_ms']:>14.3f}")
    print(f"{'unary round trip p99 (ms)':<52} {figures['unary_p99_ms']:>14.3f}")
    print(f"{'unary sequential calls/s':<52} {figures['unary_per_s']:>14,.0f}")
    print(f"{f'unary calls/s, {UNARY_CALLERS} concurrent callers':<52} {figures['raw_unary_calls_per_s']:>14,.0f}")
    print(f"{'one stream, 1 msg/frame, acked: msgs/s':<52} {figures['stream_single_per_s']:>14,.0f}")
    print(f"{'CPU per frame and its ack, both processes (µs)':<52} {figures['cpu_us_per_frame_acked']:>14.1f}")
    print(f"{f'one stream, {BATCH} msgs/frame, acked: msgs/s':<52} {figures['stream_batched_per_s']:>14,.0f}")
    ratio = figures["stream_batched_per_s"] / figures["stream_single_per_s"]
    print(f"{'batched / single (ratio, same run)':<52} {ratio:>14.1f}x")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        asyncio.run(_serve())
    else:
        sys.exit(main())
