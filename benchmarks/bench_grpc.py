"""RocketMQ 5 gRPC benchmarks: one broker (``sparkmq dev``, no lake) in a child process, this process the client.

    python benchmarks/bench_grpc.py [--quick]

The official Python client spends about 0.85 ms of CPU per send, so it cannot load a server: the server is
driven with the generated stubs directly (requests serialized once, several calls in flight), 1 KiB bodies:

* ``grpc.send_batch`` -- SendMessage with 64 messages per request, 8 in flight: msgs/s;
* ``grpc.receive_ack`` -- ReceiveMessage batches of 32 + one AckMessage per batch, 4 in flight, draining a
  backlog: msgs/s;
* ``grpc.send_p99_ms`` -- one message at a time, one caller: p99 (and p50) ms.

And, for scale, ``grpc.receive_ack_ceiling``: the same receive/ack client against a bare ``grpc.aio`` server
in a child process that answers from bytes serialized once (no broker, no work): what grpcio itself moves on
this machine, one stream message per delivered message as the protocol has it.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import tempfile
import time
import uuid

import grpc
from bench_messaging import (  # the benchmarks' one line format (run as scripts: this folder is on the path)
    Platform,
    line,
    pct,
)
from rocketmq.grpc_protocol import definition_pb2, service_pb2

BODY = os.urandom(1024)
BATCH = 64
SEND_IN_FLIGHT = 8
RECEIVE_IN_FLIGHT = 4
_SERVICE = "/apache.rocketmq.v2.MessagingService/"
_META = (("x-mq-client-id", f"bench-{uuid.uuid4().hex[:8]}"), ("x-mq-protocol", "GRPC_V2"))


def grpc_addr_of(platform: Platform) -> str:
    """The gRPC endpoint ``sparkmq dev`` printed in its banner."""
    match = re.search(r"gRPC on (\S+)", platform.banner)
    if match is None:
        platform.stop()
        raise SystemExit(f"the platform serves no gRPC endpoint: {platform.banner!r}")
    return match.group(1).rstrip(",")


def send_request(topic: str, count: int) -> bytes:
    """A serialized SendMessageRequest of ``count`` NORMAL messages with fresh ids."""
    request = service_pb2.SendMessageRequest()
    for _ in range(count):
        msg = request.messages.add(body=BODY)
        msg.topic.name = topic
        sp = msg.system_properties
        sp.message_id = uuid.uuid4().hex.upper()
        sp.message_type = definition_pb2.MessageType.NORMAL
        sp.body_encoding = definition_pb2.Encoding.IDENTITY
        sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
    return request.SerializeToString()


def _send_stub(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    # Requests go as pre-serialized bytes: the client's CPU is the server's on this machine.
    return channel.unary_unary(_SERVICE + "SendMessage",
                               response_deserializer=service_pb2.SendMessageResponse.FromString)


def _check(status: definition_pb2.Status) -> None:
    if status.code != definition_pb2.Code.OK:
        raise SystemExit(f"the server answered {status.code}: {status.message}")


async def bench_send_batch(channel: grpc.aio.Channel, topic: str, seconds: float) -> int:
    send = _send_stub(channel)
    requests = [send_request(topic, BATCH) for _ in range(32)]
    _check((await send(requests[0], metadata=_META)).status)  # the topic exists from here on
    deadline = time.perf_counter() + seconds
    sent = 0

    async def sender(i: int) -> None:
        nonlocal sent
        while time.perf_counter() < deadline:
            answer = await send(requests[i % len(requests)], metadata=_META)
            _check(answer.status)
            sent += len(answer.entries)
            i += SEND_IN_FLIGHT

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(sender(i) for i in range(SEND_IN_FLIGHT)))
    elapsed = time.perf_counter() - started
    # client_cpu: this process's share of one core (near 1.0 would make the client the bottleneck).
    line("grpc.send_batch", msgs_per_s=sent / elapsed, batch=BATCH, in_flight=SEND_IN_FLIGHT, seconds=elapsed,
         client_cpu=(time.process_time() - cpu) / elapsed)
    return sent + BATCH


async def bench_receive_ack(channel: grpc.aio.Channel, topic: str, backlog: int,
                            name: str = "grpc.receive_ack") -> None:
    receive = channel.unary_stream(_SERVICE + "ReceiveMessage",
                                   response_deserializer=service_pb2.ReceiveMessageResponse.FromString)
    ack = channel.unary_unary(_SERVICE + "AckMessage",
                              request_serializer=service_pb2.AckMessageRequest.SerializeToString,
                              response_deserializer=service_pb2.AckMessageResponse.FromString)
    group = f"bench-pop-{uuid.uuid4().hex[:6]}"
    request = service_pb2.ReceiveMessageRequest(batch_size=32)
    request.group.name = group
    request.message_queue.topic.name = topic
    request.invisible_duration.seconds = 60
    request.long_polling_timeout.seconds = 1
    raw = request.SerializeToString()
    done = 0
    empty_polls = 0

    async def worker() -> None:
        nonlocal done, empty_polls
        while done < backlog and empty_polls < 3 * RECEIVE_IN_FLIGHT:
            ack_request = service_pb2.AckMessageRequest()
            ack_request.group.name = group
            ack_request.topic.name = topic
            async for response in receive(raw, metadata=_META):
                if response.HasField("message"):
                    sp = response.message.system_properties
                    ack_request.entries.add(message_id=sp.message_id, receipt_handle=sp.receipt_handle)
            if not ack_request.entries:
                empty_polls += 1
                continue
            _check((await ack(ack_request, metadata=_META)).status)
            done += len(ack_request.entries)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(RECEIVE_IN_FLIGHT)))
    elapsed = time.perf_counter() - started
    line(name, msgs_per_s=done / elapsed, batch=32, in_flight=RECEIVE_IN_FLIGHT, messages=done,
         backlog=backlog)


async def bench_send_p99(channel: grpc.aio.Channel, topic: str, count: int) -> None:
    send = _send_stub(channel)
    requests = [send_request(topic, 1) for _ in range(256)]
    for raw in requests[:50]:  # warm up the connection and the broker's paths
        await send(raw, metadata=_META)
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        answer = await send(requests[i % len(requests)], metadata=_META)
        latencies.append((time.perf_counter() - started) * 1000)
        _check(answer.status)
    line("grpc.send_p99_ms", p99_ms=pct(latencies, 0.99), p50_ms=pct(latencies, 0.5), sends=count)


def _bare_server(ready: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """A grpc.aio server answering ReceiveMessage and AckMessage from bytes serialized once (a child process)."""
    stream = [service_pb2.ReceiveMessageResponse(status=definition_pb2.Status(code=definition_pb2.Code.OK))]
    for i in range(32):
        response = service_pb2.ReceiveMessageResponse()
        response.message.topic.name = "Ceiling"
        response.message.body = BODY
        sp = response.message.system_properties
        sp.message_id, sp.receipt_handle = f"{i:032X}", f"handle-{i:074d}"
        sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
        stream.append(response)
    answers = [r.SerializeToString() for r in stream]
    ack = service_pb2.AckMessageResponse(status=definition_pb2.Status(code=definition_pb2.Code.OK)).SerializeToString()

    async def receive(request: bytes, context: grpc.aio.ServicerContext) -> object:
        for answer in answers:
            yield answer

    async def acknowledge(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return ack

    async def serve() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("apache.rocketmq.v2.MessagingService", {
            "ReceiveMessage": grpc.unary_stream_rpc_method_handler(receive),
            "AckMessage": grpc.unary_unary_rpc_method_handler(acknowledge)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.put(port)
        await server.wait_for_termination()

    asyncio.run(serve())


async def bench_receive_ceiling(messages: int) -> None:
    ready: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()  # type: ignore[type-arg]
    child = multiprocessing.get_context("spawn").Process(target=_bare_server, args=(ready,), daemon=True)
    child.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ready.get(timeout=60)}") as channel:
            await bench_receive_ack(channel, "Ceiling", messages, name="grpc.receive_ack_ceiling")
    finally:
        child.kill()
        child.join()


#: What ``--only`` may name (default: all, in this order).
BENCHES = ("send_batch", "receive_ack", "send_p99", "receive_ack_ceiling")


async def run(addr: str, quick: bool, only: str | None = None) -> None:
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    if only == "receive_ack_ceiling":
        await bench_receive_ceiling(30_000 if quick else 200_000)
        return
    async with grpc.aio.insecure_channel(addr, options=options) as channel:
        topic = f"BenchGrpc{uuid.uuid4().hex[:6]}"
        if only in (None, "send_batch", "receive_ack"):
            sent = await bench_send_batch(channel, topic, 3.0 if quick else 10.0)
        if only in (None, "receive_ack"):
            await bench_receive_ack(channel, topic, min(sent, 30_000 if quick else 200_000))
        if only in (None, "send_p99"):
            await bench_send_p99(channel, f"{topic}Single", 500 if quick else 5000)
    if only is None:  # after the broker's figures, so they run alone
        await bench_receive_ceiling(30_000 if quick else 200_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test of the figures)")
    parser.add_argument("--only", choices=BENCHES, help="one benchmark (receive_ack sends its backlog first)")
    args = parser.parse_args()
    if args.only == "receive_ack_ceiling":  # no broker
        asyncio.run(run("", args.quick, args.only))
        return
    with tempfile.TemporaryDirectory(prefix="sparkmq-bench-grpc-") as data_dir:
        platform = Platform(data_dir)
        # The broker's pid, for a profiler (py-spy record -p PID) attached while it runs.
        print(f"# broker pid {platform.proc.pid}", flush=True)
        try:
            asyncio.run(run(grpc_addr_of(platform), args.quick, args.only))
        finally:
            platform.stop()


if __name__ == "__main__":
    main()
