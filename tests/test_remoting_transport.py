"""The remoting transport (``platform/remoting``): frames, server, clients, on real sockets.

Everything runs on 127.0.0.1 with free ports, in this process; every server, loop thread and
client a test starts is stopped by that test.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import random
import socket
import struct
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    RESPONSE_SUCCESS,
    RequestCode,
    ResponseCode,
)
from sparkmq.platform.common.validation import split_addr
from sparkmq.platform.remoting import (
    AsyncRemotingClient,
    Deferred,
    Frame,
    FrameDecoder,
    LoopThread,
    ProtocolError,
    RemotingConnection,
    RemotingError,
    RemotingServer,
    Reply,
    ServerConnection,
    SyncRemotingClient,
    blocking,
    encode_frame,
    encode_rocketmq_header,
    error_from_frame,
    error_reply,
    new_event_loop,
    unsupported_reply,
)

ECHO = 10      # echo extFields and body (synchronous handler: the hot path)
ECHO_LATER = 11  # the same from a task
SLOW = 12      # answers after ext "s" seconds
FAIL = 13      # raises SparkMQError(code named by ext "name")
CRASH = 14     # raises a plain exception
HANG = 15      # never answers
ODD_CODE = 16  # answers a response code nobody knows
DEFERRED = 17  # answers from a future's done callback (Deferred): its body, or the error ext "name" names


def h(text: str) -> dict[str, str]:
    """A request's extFields carrying ``text`` (what ECHO answers back)."""
    return {"h": text}


def named(code_name: str) -> dict[str, str]:
    return {"name": code_name}


def slow(seconds: float) -> dict[str, str]:
    return {"s": str(seconds)}


def frame_bytes(data: object) -> bytes:
    """What encode_frame returned, as one bytes."""
    return data if isinstance(data, bytes) else b"".join(bytes(p) for p in data)  # type: ignore[union-attr]


def raw_prefix(length: int, kind: int = 0, hlen: int = 0) -> bytes:
    """A frame prefix with any field values, legal or not: length, serialize type, header length."""
    return struct.pack(">iI", length, ((kind & 0xFF) << 24) | (hlen & 0xFFFFFF)) if length < 2**31 else \
        struct.pack(">II", length, ((kind & 0xFF) << 24) | (hlen & 0xFFFFFF))


def handler(conn: ServerConnection, frame: Frame):
    """The test server's handler."""
    code = frame.code
    if code == ECHO:
        return Reply(RESPONSE_SUCCESS, frame.ext_text(), frame.body)
    if code == ECHO_LATER:
        async def later() -> Reply:
            await asyncio.sleep(0)
            return Reply(RESPONSE_SUCCESS, frame.ext_text(), frame.body)
        return later()
    if code == SLOW:
        async def slow_answer() -> Reply:
            await asyncio.sleep(float(frame.ext_text()["s"]))
            return Reply(RESPONSE_SUCCESS, frame.ext_text())
        return slow_answer()
    if code == FAIL:
        raise SparkMQError(ErrorCode[frame.ext_text()["name"]], "as asked")
    if code == CRASH:
        raise ZeroDivisionError("crash as asked")
    if code == HANG:
        return asyncio.get_running_loop().create_future()
    if code == ODD_CODE:
        return Reply(999, None, b"", "from the future")
    if code == DEFERRED:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_result, bytes(frame.body))

        def finish(done: asyncio.Future) -> Reply:
            if "name" in (frame.ext or {}):
                raise SparkMQError(ErrorCode[frame.ext_text()["name"]], "deferred as asked")
            return Reply(RESPONSE_SUCCESS, None, done.result())
        return Deferred(future, finish)
    return unsupported_reply(frame)


def async_test(fn: Callable) -> Callable:
    """Run an async test on a fresh event loop (uvloop), with a 30 s guard."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        loop = new_event_loop()
        try:
            return loop.run_until_complete(asyncio.wait_for(fn(*args, **kwargs), 30))
        finally:
            loop.close()

    return wrapper


@contextlib.asynccontextmanager
async def serving(handle=handler, **kwargs) -> AsyncIterator[RemotingServer]:
    """A started server on the running loop, stopped on exit."""
    server = await RemotingServer(handle, **kwargs).start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop(1.0)


class ServerThread:
    """A server on its own loop thread (for the threaded facade and raw sockets)."""

    def __init__(self, handle=handler, **kwargs) -> None:
        self.loop_thread = LoopThread(name="test-remoting-server").start()
        self.server: RemotingServer = self.loop_thread.run(RemotingServer(handle, **kwargs).start("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.server.port}"

    def stop(self, grace_s: float = 1.0) -> None:
        if self.loop_thread.running:
            self.loop_thread.run(self.server.stop(grace_s))
            self.loop_thread.stop()


@contextlib.contextmanager
def server_thread(handle=handler, **kwargs) -> Iterator[ServerThread]:
    st_ = ServerThread(handle, **kwargs)
    try:
        yield st_
    finally:
        st_.stop()


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def raw_connect(addr: str) -> socket.socket:
    host, port = split_addr(addr)
    sock = socket.create_connection((host, port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the peer closed (EOF or reset); False if it still talks or stays open."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


# ---- frame codec --------------------------------------------------------------------------


@pytest.mark.parametrize("flag,code,opaque,ext,body,remark", [
    (0, 1, 0, None, b"", None),
    (FLAG_RESPONSE, 0, 0x7FFFFFFF, {"a": "1"}, b"", None),
    (FLAG_ONEWAY, 32767, 7, None, b"body", None),
    (0, 11, 123456, {"k" * 100: "v" * 300, "\u00e9t\u00e9": "\u2603"}, b"b" * 20_000, None),
    (FLAG_RESPONSE, 19, 5, {}, bytes(range(256)) * 1024, "no new message"),  # large: not joined, not copied
])
def test_frame_round_trip(flag, code, opaque, ext, body, remark) -> None:
    data = encode_frame(code, flag, opaque, ext, body, remark)
    if len(body) > 64 * 1024:
        assert isinstance(data, list) and data[-1] is body  # the body goes to writelines untouched
    wire = frame_bytes(data)
    length, word = struct.unpack_from(">iI", wire)
    assert length == len(wire) - 4 and word >> 24 == 0  # JSON header
    header = msgspec.json.decode(wire[8:8 + (word & 0xFFFFFF)])
    assert header["code"] == code and header["language"] == "PYTHON" and header["flag"] == flag
    assert ("remark" in header) == (remark is not None)  # RocketMQ's JSON leaves a null remark out
    for chunk in (len(wire), 1, 7, 8, 4096):  # whole, byte by byte, odd splits
        decoder = FrameDecoder()
        frames: list[Frame] = []
        for i in range(0, len(wire), chunk):
            frames += decoder.feed(wire[i:i + chunk])
        assert len(frames) == 1 and decoder.buffered == 0
        f = frames[0]
        assert (f.flag, f.code, f.opaque, f.remark) == (flag, code, opaque, remark)
        assert (f.ext or {}) == (ext or {}) and bytes(f.body) == body
        assert f.is_response == bool(flag & FLAG_RESPONSE) and f.is_oneway == bool(flag & FLAG_ONEWAY)


def test_rocketmq_binary_headers_are_read() -> None:
    """RocketMQ's binary header (serialize type 1), as its benchmark tools send it: every field, a repeated
    key (the last wins) and a remark."""
    header = encode_rocketmq_header(310, 0, 42, {"a": "group", "b": "topic"}, "why", version=401, language=0)
    header += b""  # the encoder's own output, then a repeated key appended by hand below
    extra = struct.pack(">H", 1) + b"b" + struct.pack(">i", 5) + b"later"
    ext_len_pos = 13 + 4 + 3
    (ext_len,) = struct.unpack_from(">i", header, ext_len_pos)
    header = header[:ext_len_pos] + struct.pack(">i", ext_len + len(extra)) + header[ext_len_pos + 4:] + extra
    wire = struct.pack(">iI", 4 + len(header) + 4, (1 << 24) | len(header)) + header + b"body"
    (f,) = FrameDecoder().feed(wire)
    assert (f.code, f.flag, f.opaque, f.version, f.language, f.remark, f.serialize) == (310, 0, 42, 401, 0, "why", 1)
    assert f.ext == {"a": "group", "b": "later"} and f.body == b"body"
    for broken in (header[:10], header[:-3]):  # cut inside the fixed part, and inside an ext value
        bad = struct.pack(">iI", 4 + len(broken), (1 << 24) | len(broken)) + broken
        with pytest.raises(ProtocolError):
            FrameDecoder().feed(bad)


def test_json_headers_from_other_clients() -> None:
    """A JSON header with numbers and booleans in extFields (ali-ons writes them raw) and a language given
    by name converts like the strings Java sends; a header that is not JSON is a protocol error."""
    text = (b'{"code":34,"language":"NODE_JS","version":121,"opaque":-5,"flag":0,'
            b'"extFields":{"queueId":3,"setZeroIfNotFound":true,"topic":"t"}}')
    (f,) = FrameDecoder().feed(struct.pack(">iI", 4 + len(text), len(text)) + text)
    assert (f.code, f.language, f.version, f.opaque) == (34, 13, 121, -5)
    assert f.ext_text() == {"queueId": "3", "setZeroIfNotFound": "true", "topic": "t"}
    from sparkmq.platform.common.protocol import QueryConsumerOffsetRequestHeader as Q
    with pytest.raises(SparkMQError, match="consumerGroup") as info:
        f.header_as(Q)
    assert info.value.code is ErrorCode.INVALID_ARGUMENT
    f.ext["consumerGroup"] = "g"
    assert f.header_as(Q) == Q("g", "t", 3, True)
    for garbage in (b"{not json", b'{"code":"x"}', b"[]"):
        with pytest.raises(ProtocolError, match="JSON header"):
            FrameDecoder().feed(struct.pack(">iI", 4 + len(garbage), len(garbage)) + garbage)


def test_many_frames_in_one_chunk_and_split_across_chunks() -> None:
    frames_in = [(i, i % 3, i * 7, {"i": f"h{i}"}, b"x" * (i * 13 % 500)) for i in range(300)]
    wire = b"".join(frame_bytes(encode_frame(*f)) for f in frames_in)
    rng = random.Random(5)
    decoder = FrameDecoder()
    out: list[Frame] = []
    pos = 0
    while pos < len(wire):
        step = rng.randint(1, 3000)
        out += decoder.feed(wire[pos:pos + step])
        pos += step
    assert [(f.code, f.flag, f.opaque, f.ext, bytes(f.body)) for f in out] == frames_in


def test_large_frame_is_assembled_with_one_copy() -> None:
    body = bytes(range(256)) * (64 * 1024)  # 16 MiB
    wire = frame_bytes(encode_frame(0, FLAG_RESPONSE, 9, None, body))
    decoder = FrameDecoder()
    frames: list[Frame] = []
    for i in range(0, len(wire), 65536):
        frames += decoder.feed(wire[i:i + 65536])
    (f,) = frames
    # The body is a read-only view of the one buffer the reads were joined into.
    assert isinstance(f.body, memoryview) and f.body.readonly
    assert isinstance(f.body.obj, bytes) and len(f.body.obj) == len(wire)
    assert f.body == body
    # A large frame inside one chunk is a view of that chunk (no copy at all).
    (g,) = FrameDecoder().feed(wire)
    assert isinstance(g.body, memoryview) and g.body.obj is wire


@pytest.mark.parametrize("prefix,reason", [
    (raw_prefix(20, kind=2), "serialize type"),
    (raw_prefix(20, kind=0x7F), "serialize type"),
    (raw_prefix(3), "minimum"),
    (raw_prefix(-1), "minimum"),
    (raw_prefix(1024 + 1), "max_frame_bytes"),
    (raw_prefix(0x7FFFFFFF), "max_frame_bytes"),
    (raw_prefix(20, hlen=17), "header length"),
    (raw_prefix(4, hlen=0xFFFFFF), "header length"),
])
def test_protocol_errors(prefix: bytes, reason: str) -> None:
    # Whole, and split inside the prefix (the decoder's other path).
    for parts in ([prefix + b"\0" * 6], [prefix[:5], prefix[5:] + b"\0" * 6]):
        decoder = FrameDecoder(max_frame_bytes=1024)
        with pytest.raises(ProtocolError, match=reason):
            for part in parts:
                decoder.feed(part)
    # After a good frame in the same chunk too.
    with pytest.raises(ProtocolError, match=reason):
        FrameDecoder(max_frame_bytes=1024).feed(frame_bytes(encode_frame(1, 0, 1)) + prefix)


def test_limits_are_inclusive() -> None:
    wire = frame_bytes(encode_frame(1, 0, 1, {"h": "x"}))
    hlen = len(wire) - 8
    decoder = FrameDecoder(max_frame_bytes=4 + hlen + 80)
    (f,) = decoder.feed(frame_bytes(encode_frame(1, 0, 1, {"h": "x"}, b"b" * 80)))  # length == the maximum
    assert f.ext == {"h": "x"} and len(f.body) == 80
    with pytest.raises(ProtocolError, match="max_frame_bytes"):
        decoder.feed(frame_bytes(encode_frame(1, 0, 1, {"h": "x"}, b"b" * 81)))


def test_error_frames_map_to_codes() -> None:
    err = error_from_frame(Frame(17, FLAG_RESPONSE, 1, None, b"", "no topic t"))
    assert err.code is ErrorCode.TOPIC_NOT_EXIST and err.message == "no topic t"
    # Several stable codes share RocketMQ's 29 (INVALID_PARAMETER): the errorCode field tells which.
    err = error_from_frame(Frame(29, FLAG_RESPONSE, 1, {"errorCode": "TOPIC_ILLEGAL"}, b"", "bad name"))
    assert err.code is ErrorCode.TOPIC_ILLEGAL and err.message == "bad name"
    assert error_from_frame(Frame(29, FLAG_RESPONSE, 1, None, b"", "")).code is ErrorCode.INVALID_ARGUMENT
    assert error_from_frame(Frame(29, FLAG_RESPONSE, 1, {"errorCode": "NOPE"}, b"")).code is ErrorCode.INVALID_ARGUMENT
    err = error_from_frame(Frame(4242, FLAG_RESPONSE, 1, None, b"", "new"))
    assert err.code is ErrorCode.INTERNAL_ERROR and "4242" in err.message and "new" in err.message
    err = error_from_frame(Frame(int(ResponseCode.SUBSCRIPTION_NOT_LATEST), FLAG_RESPONSE, 1, None, b"", "old"))
    assert err.code is ErrorCode.INTERNAL_ERROR and "SUBSCRIPTION_NOT_LATEST" in err.message
    reply = error_reply(ErrorCode.DISK_FULL, "full")
    assert (reply.code, reply.ext, reply.remark) == (ResponseCode.SERVICE_NOT_AVAILABLE, {"errorCode": "DISK_FULL"},
                                                     "full")
    assert RemotingError("h:1", "x", timed_out=True).code is ErrorCode.SERVICE_NOT_AVAILABLE
    with pytest.raises(SparkMQError):
        split_addr("nohost")
    assert split_addr("[::1]:80") == ("::1", 80)


# ---- server and async client --------------------------------------------------------------


@async_test
async def test_echo_errors_and_ping() -> None:
    async with serving() as server:
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}")
        try:
            r = await conn.request(ECHO, {"k": "1"}, b"payload")
            assert (r.code, r.ext, r.body) == (0, {"k": "1"}, b"payload")
            r = await conn.request(ECHO_LATER, h("h"), b"b")
            assert (r.ext, r.body) == (h("h"), b"b")
            big = bytes(range(256)) * (64 * 1024)  # 16 MiB each way
            r = await conn.request(ECHO, None, big, timeout=20)
            assert isinstance(r.body, memoryview) and r.body == big
            assert (await conn.request(RequestCode.SPARKMQ_PING)).code == RESPONSE_SUCCESS
            for name in ("TOPIC_NOT_EXIST", "NO_PERMISSION", "FLUSH_DISK_TIMEOUT"):
                with pytest.raises(SparkMQError) as info:
                    await conn.request(FAIL, named(name))
                assert info.value.code is ErrorCode[name] and info.value.message == "as asked"
                assert not isinstance(info.value, RemotingError)
            with pytest.raises(SparkMQError) as info:
                await conn.request(CRASH)
            assert info.value.code is ErrorCode.INTERNAL_ERROR and "ZeroDivisionError" in info.value.message
            with pytest.raises(SparkMQError) as info:
                await conn.request(777)
            assert info.value.code is ErrorCode.REQUEST_CODE_NOT_SUPPORTED and "777" in info.value.message
            with pytest.raises(SparkMQError) as info:
                await conn.request(ODD_CODE)
            assert info.value.code is ErrorCode.INTERNAL_ERROR and "999" in info.value.message
            conn.oneway(ECHO, h("nothing comes back"))
            conn.oneway(CRASH)  # a ONEWAY failure answers nothing either
            assert (await conn.request(ECHO, h("still"))).ext == h("still")  # the connection stayed open
            assert conn.in_flight == 0 and server.connection_count == 1
            stats = server.stats()
            assert stats["handler_errors"] == 2 and stats["protocol_errors"] == 0
        finally:
            await conn.close()
        assert conn.closed
        with pytest.raises(RemotingError):
            await conn.request(ECHO)


@async_test
async def test_deferred_answers_come_from_the_future_callback() -> None:
    async with serving() as server:
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}")
        try:
            answers = await asyncio.gather(*(conn.request(DEFERRED, h(""), b"%d" % i) for i in range(50)))
            assert [bytes(r.body) for r in answers] == [b"%d" % i for i in range(50)]
            with pytest.raises(SparkMQError) as info:
                await conn.request(DEFERRED, named("FLUSH_DISK_TIMEOUT"))
            assert info.value.code is ErrorCode.FLUSH_DISK_TIMEOUT and info.value.message == "deferred as asked"
            conn.oneway(DEFERRED, h(""), b"nothing comes back")
            assert bytes((await conn.request(DEFERRED, h(""), b"still")).body) == b"still"
            await wait_until(lambda: server.stats()["in_flight"] == 0)
            assert all(c._inflight == 0 for c in server._conns)
        finally:
            await conn.close()


@async_test
async def test_ten_thousand_in_flight_answered_out_of_order() -> None:
    total = 10_000
    arrived = 0
    all_in = asyncio.Event()
    completion: list[int] = []
    rng = random.Random(11)

    def slow_echo(conn, frame):
        nonlocal arrived
        arrived += 1
        if arrived == total:
            all_in.set()

        async def answer() -> Reply:
            await all_in.wait()  # every request is in flight before the first answer
            await asyncio.sleep(rng.random() * 0.02)
            completion.append(int(frame.ext["i"]))
            return Reply(0, frame.ext_text(), frame.body)

        return answer()

    async with serving(slow_echo) as server:
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}")
        try:
            async def worker(w: int) -> None:
                ids = range(w, total, 8)
                responses = await asyncio.gather(
                    *(conn.request(ECHO, {"i": str(i)}, str(i).encode(), timeout=20) for i in ids))
                for i, r in zip(ids, responses, strict=True):
                    assert r.ext == {"i": str(i)} and r.body == str(i).encode()

            await asyncio.gather(*(worker(w) for w in range(8)))
            assert len(completion) == total and completion != sorted(completion)
            assert conn.in_flight == 0 and server.connection_count == 1
        finally:
            await conn.close()


@async_test
async def test_opaque_wraps_and_skips_in_flight() -> None:
    seen: list[int] = []

    def record(conn, frame):
        seen.append(frame.opaque)
        return Reply(0, frame.ext_text())

    async with serving(record) as server:
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}")
        try:
            conn._ids = itertools.count(0x7FFFFFFE)
            conn._pending[0] = object()  # pretend opaque 0 is in flight
            for _ in range(3):
                await conn.request(ECHO)
            assert seen == [0x7FFFFFFE, 0x7FFFFFFF, 1]  # Java ints: opaques stay positive
            del conn._pending[0]
        finally:
            await conn.close()


@async_test
async def test_request_timeout_leaves_connection_usable() -> None:
    async with serving() as server:
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}")
        try:
            with pytest.raises(RemotingError) as info:
                await conn.request(SLOW, slow(0.3), timeout=0.05)
            assert info.value.timed_out and info.value.code is ErrorCode.SERVICE_NOT_AVAILABLE
            assert (await conn.request(ECHO, h("after"))).ext == h("after")
            await asyncio.sleep(0.4)  # the late answer arrives and is dropped
            assert conn.in_flight == 0 and not conn.closed
            assert (await conn.request(ECHO, h("again"))).ext == h("again")
            # A request larger than the client's max_frame_bytes fails before it is sent.
            conn.max_frame_bytes = 1024
            with pytest.raises(SparkMQError) as info:
                await conn.request(ECHO, h(""), b"x" * 2000)
            assert info.value.code is ErrorCode.INVALID_ARGUMENT and conn.in_flight == 0
            assert (await conn.request(ECHO, h("ok"))).ext == h("ok")
        finally:
            await conn.close()


@async_test
async def test_server_push_reaches_the_client() -> None:
    server_conns: list[ServerConnection] = []
    closed: list[ServerConnection] = []

    def on_connect(conn: ServerConnection) -> None:
        conn.attributes["client_id"] = "c1"
        conn.on_close(closed.append)
        server_conns.append(conn)

    pushes: asyncio.Queue[Frame] = asyncio.Queue()
    async with serving(on_connect=on_connect) as server:
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}", on_push=pushes.put_nowait)
        try:
            await wait_until(lambda: len(server_conns) == 1)
            sconn = server_conns[0]
            assert sconn.peer.startswith("127.0.0.1:") and sconn.attributes == {"client_id": "c1"}
            code = RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
            assert sconn.push(code, {"consumerGroup": "g"})
            pusher = threading.Thread(target=sconn.push, args=(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, None, b"body"))
            pusher.start()
            pusher.join()
            first = await asyncio.wait_for(pushes.get(), 5)
            second = await asyncio.wait_for(pushes.get(), 5)
            assert first.code == code and first.is_oneway and not first.is_response
            assert first.ext == {"consumerGroup": "g"}
            assert (second.code, second.ext, second.body) == (RequestCode.RESET_CONSUMER_CLIENT_OFFSET, None, b"body")
            assert (await conn.request(ECHO, h("x"))).ext == h("x")
        finally:
            await conn.close()
        await wait_until(lambda: closed == [sconn])
        assert not sconn.push(RequestCode.RESET_CONSUMER_CLIENT_OFFSET)


@async_test
async def test_idle_connections_are_reaped_heartbeats_keep_them() -> None:
    # Heartbeats at a tenth of the idle timeout: a loaded machine that delays one by 0.2 s must not reap the
    # pinging connection (with a 0.3 s timeout it did, once, in a suite run at load 30).
    async with serving(idle_timeout_s=1.0) as server:
        addr = f"127.0.0.1:{server.port}"
        silent = await RemotingConnection.connect(addr, heartbeat_interval_s=None)
        pinging = await RemotingConnection.connect(addr, heartbeat_interval_s=0.1)
        try:
            await wait_until(lambda: silent.closed, timeout=10)
            assert server.stats()["idle_closed"] == 1
            with pytest.raises(RemotingError):
                await silent.request(ECHO)
            await asyncio.sleep(1.5)  # longer than the idle timeout
            assert not pinging.closed
            assert (await pinging.request(ECHO, h("alive"))).ext == h("alive")
        finally:
            await silent.close()
            await pinging.close()


@async_test
async def test_graceful_stop_answers_in_flight() -> None:
    server = await RemotingServer(handler).start("127.0.0.1", 0)
    addr = f"127.0.0.1:{server.port}"
    conn = await RemotingConnection.connect(addr)
    try:
        pending = [asyncio.ensure_future(conn.request(SLOW, slow(0.3))) for _ in range(20)]
        await wait_until(lambda: server.stats()["in_flight"] == 20)
        stopping = asyncio.ensure_future(server.stop(5.0))
        await asyncio.sleep(0.05)
        with pytest.raises(SparkMQError) as info:  # nothing new is accepted meanwhile
            await conn.request(ECHO)
        assert info.value.code is ErrorCode.SERVICE_NOT_AVAILABLE and not isinstance(info.value, RemotingError)
        for r in await asyncio.gather(*pending):
            assert r.code == RESPONSE_SUCCESS
        await stopping
        await wait_until(lambda: conn.closed)
        assert server.connection_count == 0
        with pytest.raises(RemotingError):
            await RemotingConnection.connect(addr, timeout=1)
    finally:
        await conn.close()
        await server.stop(0)


@async_test
async def test_async_pool_shares_one_connection_per_address_and_reconnects() -> None:
    async with serving() as server:
        addr = f"127.0.0.1:{server.port}"
        client = AsyncRemotingClient()
        try:
            conns = await asyncio.gather(*(client.connection(addr) for _ in range(5)))
            assert all(c is conns[0] for c in conns)
            answers = await asyncio.gather(*(client.request(addr, ECHO, h(str(i))) for i in range(100)))
            assert [a.ext for a in answers] == [h(str(i)) for i in range(100)]
            assert server.connection_count == 1
            await conns[0].close()
            assert (await client.request(addr, ECHO, h("again"))).ext == h("again")
            assert (await client.connection(addr)) is not conns[0]
        finally:
            await client.close()
        with pytest.raises(RemotingError):
            await client.request(addr, ECHO)


@async_test
async def test_client_gets_remoting_error_when_server_dies() -> None:
    server = await RemotingServer(handler).start("127.0.0.1", 0)
    client = AsyncRemotingClient()
    addr = f"127.0.0.1:{server.port}"
    try:
        assert (await client.request(addr, ECHO, h("up"))).ext == h("up")
        hanging = asyncio.ensure_future(client.request(addr, HANG, timeout=30))
        await wait_until(lambda: server.stats()["in_flight"] == 1)
        started = time.monotonic()
        await server.stop(0)  # no grace: the handler is cancelled, the connection closed
        with pytest.raises(RemotingError) as info:
            await hanging
        assert not info.value.timed_out and time.monotonic() - started < 3
        with pytest.raises(RemotingError):  # reconnecting is refused
            await client.request(addr, ECHO)
    finally:
        await client.close()
        await server.stop(0)


@async_test
async def test_backpressure_stops_reading_a_client_that_does_not_read() -> None:
    reply_body = b"r" * (512 * 1024)

    def big(conn, frame):
        return Reply(0, None, reply_body)

    async with serving(big, write_high_water=512 * 1024) as server:
        sock = await asyncio.to_thread(raw_connect, f"127.0.0.1:{server.port}")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            requests = 100
            request = frame_bytes(encode_frame(ECHO, 0, 1))
            for _ in range(requests):
                await loop.sock_sendall(sock, request)
                await asyncio.sleep(0.003)
            await asyncio.sleep(0.2)
            served_unread = server.requests
            assert served_unread < requests // 2  # the server stopped taking requests it cannot answer
            received = 0
            while received < requests * len(reply_body):
                chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 5)
                assert chunk
                received += len(chunk)
            assert server.requests == requests  # reading resumed once the replies drained
        finally:
            sock.close()


# ---- isolation: one connection's garbage never affects others ------------------------------


@async_test
async def test_oversized_and_garbage_close_only_that_connection() -> None:
    async with serving(max_frame_bytes=1 << 20) as server:
        addr = f"127.0.0.1:{server.port}"
        good = await RemotingConnection.connect(addr)
        greedy = await RemotingConnection.connect(addr, max_frame_bytes=4 << 20)
        try:
            assert (await good.request(ECHO, h("before"))).ext == h("before")
            bad_inputs = [raw_prefix(2 << 20) + b"x" * 100, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 20,
                          raw_prefix(20, kind=3) + b"\0" * 16, raw_prefix(20, hlen=10) + b"{not json!" + b"\0" * 6]
            for bad in bad_inputs:
                sock = await asyncio.to_thread(raw_connect, addr)
                try:
                    sock.sendall(bad)
                    assert await asyncio.to_thread(closed_by_peer, sock)
                finally:
                    sock.close()
                assert (await good.request(ECHO, h("during"))).ext == h("during")
            # A client allowed to send more than the server accepts loses only its own connection.
            with pytest.raises(RemotingError):
                await greedy.request(ECHO, h(""), b"x" * (2 << 20))
            assert greedy.closed and not good.closed
            assert (await good.request(ECHO, h("after"))).ext == h("after")
            assert server.stats()["protocol_errors"] == len(bad_inputs) + 1
            await wait_until(lambda: server.connection_count == 1)
        finally:
            await good.close()
            await greedy.close()


# ---- threaded facade ----------------------------------------------------------------------


def test_threaded_facade_from_several_threads() -> None:
    pushes: list[tuple[str, Frame]] = []
    with server_thread() as srv, SyncRemotingClient(on_push=lambda addr, f: pushes.append((addr, f))) as client:
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                for i in range(400):
                    text = f"{t}:{i}"
                    r = client.request(srv.addr, ECHO if i % 2 else ECHO_LATER, h(text), text.encode() * 3)
                    assert r.ext == h(text) and r.body == text.encode() * 3
                futures = [client.request_future(srv.addr, ECHO, h(f"f{t}:{i}")) for i in range(300)]
                assert [f.result(10).ext for f in futures] == [h(f"f{t}:{i}") for i in range(300)]
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[0]
        assert srv.server.connection_count == 1  # one shared connection for every thread

        with pytest.raises(SparkMQError) as info:
            client.request(srv.addr, FAIL, named("GROUP_NOT_EXIST"))
        assert info.value.code is ErrorCode.GROUP_NOT_EXIST
        future = client.request_future(srv.addr, FAIL, named("DISK_FULL"))
        assert future.exception(5).code is ErrorCode.DISK_FULL
        with pytest.raises(RemotingError) as info:
            client.request(srv.addr, SLOW, slow(0.3), timeout=0.05)
        assert info.value.timed_out
        future = client.request_future(srv.addr, SLOW, slow(0.3), timeout=0.05)
        assert isinstance(future.exception(5), RemotingError) and future.exception().timed_out
        assert client.request(srv.addr, ECHO, h("usable")).ext == h("usable")

        (sconn,) = srv.server.connections
        sconn.push(RequestCode.CHECK_TRANSACTION_STATE, None, b"tx")
        deadline = time.monotonic() + 5
        while not pushes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pushes and pushes[0][0] == srv.addr and pushes[0][1].body == b"tx"

        # The connection dropped by the server: the next request reconnects.
        first = client.connection(srv.addr)
        sconn.close()
        deadline = time.monotonic() + 5
        while not first.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.request(srv.addr, ECHO, h("reconnected")).ext == h("reconnected")


def test_threaded_facade_when_the_server_dies() -> None:
    srv = ServerThread()
    client = SyncRemotingClient(connect_timeout_s=1.0)
    try:
        assert client.request(srv.addr, ECHO, h("up")).ext == h("up")
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                client.request(srv.addr, HANG, timeout=30)
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        deadline = time.monotonic() + 5
        while srv.server.stats()["in_flight"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        srv.stop(0)
        caller.join(10)
        assert outcome and isinstance(outcome[0], RemotingError) and not outcome[0].timed_out
        assert time.monotonic() - started < 5
        with pytest.raises(RemotingError):
            client.request(srv.addr, ECHO)
        assert isinstance(client.request_future(srv.addr, ECHO).exception(5), RemotingError)
    finally:
        client.close()
        srv.stop(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.cluster
def test_threaded_facade_in_a_forked_child() -> None:
    with server_thread() as srv, SyncRemotingClient() as client:
        assert client.request(srv.addr, ECHO, h("parent")).ext == h("parent")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() with threads running
            pid = os.fork()
        if pid == 0:  # the child: the parent's loop thread is gone, the client starts afresh
            status = 1
            try:
                status = 0 if client.request(srv.addr, ECHO, h("child"), timeout=5).ext == h("child") else 2
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.request(srv.addr, ECHO, h("parent again")).ext == h("parent again")


def test_direct_requests_run_on_the_calling_thread() -> None:
    """request_direct: one blocking connection per thread, same answers and errors as request(),
    at most max_per_addr connections per address, reopened after the server dropped one."""
    with server_thread() as srv, SyncRemotingClient(connect_timeout_s=1.0) as client:
        client._direct.max_per_addr = 2
        for i in range(50):
            r = client.request_direct(srv.addr, ECHO if i % 2 else ECHO_LATER, h(f"h{i}"), b"b" * i)
            assert r.ext == h(f"h{i}") and r.body == b"b" * i
        assert client.request_direct(srv.addr, ECHO, h(""), b"x" * 300_000).body == b"x" * 300_000  # a large frame
        assert srv.server.connection_count == 1  # this thread's own connection; the shared one never opened
        with pytest.raises(SparkMQError) as info:
            client.request_direct(srv.addr, FAIL, named("DISK_FULL"))
        assert info.value.code is ErrorCode.DISK_FULL
        assert client.request_direct(srv.addr, ECHO, h("after an error")).ext == h("after an error")

        # A timeout closes the connection: the late answer can never be taken for the next request's.
        with pytest.raises(RemotingError) as timed_out:
            client.request_direct(srv.addr, SLOW, slow(0.3), timeout=0.05)
        assert timed_out.value.timed_out
        assert client.request_direct(srv.addr, ECHO, h("fresh")).ext == h("fresh")

        # Threads beyond max_per_addr share the multiplexed connection.
        barrier = threading.Barrier(4)
        answers: list[bytes] = []
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                barrier.wait(5)
                answers.append(client.request_direct(srv.addr, SLOW, slow(0.2)).ext)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not errors, errors[0]
        assert len(answers) == 4
        assert srv.server.connection_count <= 3  # at most 2 direct (this thread's is one) + the shared one

        # The server drops this thread's connection: the next call notices and reconnects.
        before = client._direct.connection(srv.addr)
        for sconn in list(srv.server.connections):
            sconn.close()
        deadline = time.monotonic() + 5
        while srv.server.connection_count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.request_direct(srv.addr, ECHO, h("again")).ext == h("again")
        assert client._direct.connection(srv.addr) is not before
    with pytest.raises(RemotingError):
        client.request_direct(srv.addr, ECHO)  # closed client


def test_threads_opening_direct_connections_together_stay_within_max_per_addr(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads that open their first direct connection at the same moment cannot all pass the cap (each connect
    is slowed so they overlap), and a connect that fails gives its reserved slot back."""
    slowed = blocking.BlockingConnection

    class SlowConnect(slowed):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            time.sleep(0.2)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(blocking, "BlockingConnection", SlowConnect)
    with server_thread() as srv:
        direct = blocking.DirectConnections(connect_timeout_s=1.0, max_per_addr=2)
        barrier = threading.Barrier(5)
        got: list[object] = []

        def first_use() -> None:
            barrier.wait(5)
            got.append(direct.connection(srv.addr))

        threads = [threading.Thread(target=first_use) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(got) == 5
        assert sum(c is not None for c in got) == 2  # the others fall back to the shared connection
        direct.close()

        with socket.socket() as probe:  # a port nobody listens on: every connect fails
            probe.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{probe.getsockname()[1]}"
        direct = blocking.DirectConnections(connect_timeout_s=1.0, max_per_addr=1)
        for _ in range(2):  # the second try still connects (fails again) instead of finding the slot taken
            with pytest.raises(RemotingError):
                direct.connection(dead)
        direct.close()


def test_blocking_request_on_the_loop_thread_is_refused() -> None:
    with server_thread() as srv, SyncRemotingClient() as client:
        conn = client.connection(srv.addr)

        async def misuse() -> str:
            try:
                conn.request_blocking(ECHO)
            except RuntimeError as exc:
                return str(exc)
            return "no error"

        assert "deadlock" in client.loop_thread.run(misuse())


# ---- fuzzing: nothing a client sends kills the server --------------------------------------


class EchoHeader(msgspec.Struct):
    name: str
    count: int = 0


def strict_handler(conn: ServerConnection, frame: Frame):
    """Reads the extFields as a typed header; anything else is INVALID_ARGUMENT."""
    if frame.code != ECHO:
        return unsupported_reply(frame)
    header = frame.header_as(EchoHeader)  # type: ignore[type-var]  # any struct converts
    return Reply(0, {"name": header.name, "count": str(header.count)}, frame.body)


def reads_as_echo_header(ext: object) -> bool:
    try:
        msgspec.convert(ext or {}, EchoHeader, strict=False)
    except msgspec.ValidationError:
        return False
    return True


FUZZ_MAX = 64 * 1024


@st.composite
def attacks(draw) -> tuple[str, bytes]:
    """(kind, bytes to send): a well-formed request (answer expected) or something broken."""
    kind = draw(st.sampled_from(["random", "frame", "binary_frame", "truncated", "oversized", "bad_length",
                                 "bad_type", "bad_header"]))
    ext = draw(st.one_of(
        st.builds(lambda s: {"name": s}, st.text(max_size=20)),
        st.builds(lambda s, c: {"name": s, "count": c}, st.text(max_size=5), st.text(max_size=5)),
        st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
        st.just(None),
    ))
    code = draw(st.one_of(st.just(ECHO), st.integers(-32768, 32767)))
    body = draw(st.binary(max_size=300))
    opaque = draw(st.integers(-(2**31), 2**31 - 1))
    flag = draw(st.sampled_from([0, 0, FLAG_ONEWAY, FLAG_RESPONSE]))
    wire = frame_bytes(encode_frame(code, flag, opaque, ext, body))
    if kind == "random":
        return kind, draw(st.binary(min_size=1, max_size=300))
    if kind == "frame":
        return kind, wire
    if kind == "binary_frame":
        header = encode_rocketmq_header(code, flag, opaque, dict(ext or {}))
        return kind, struct.pack(">iI", 4 + len(header) + len(body), (1 << 24) | len(header)) + header + body
    if kind == "truncated":
        return kind, wire[:draw(st.integers(1, len(wire) - 1))]
    if kind == "oversized":
        return kind, raw_prefix(draw(st.integers(FUZZ_MAX + 1, 2**31 - 1))) + body[:50]
    if kind == "bad_length":
        length = draw(st.integers(0, 3) | st.integers(FUZZ_MAX + 1, 2**31 - 1))
        return kind, struct.pack(">i", length) + wire[4:]
    if kind == "bad_type":
        return kind, wire[:4] + bytes([draw(st.integers(2, 255))]) + wire[5:]
    junk = draw(st.binary(min_size=1, max_size=40).filter(lambda b: not b.lstrip().startswith(b"{")))
    return kind, struct.pack(">iI", 4 + len(junk), len(junk)) + junk


@pytest.fixture(scope="module")
def fuzz_target() -> Iterator[tuple[ServerThread, SyncRemotingClient]]:
    srv = ServerThread(strict_handler, max_frame_bytes=FUZZ_MAX)
    client = SyncRemotingClient()
    try:
        yield srv, client
    finally:
        client.close()
        srv.stop()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(attack=attacks())
def test_fuzzed_input_never_kills_the_server(fuzz_target, attack: tuple[str, bytes]) -> None:
    srv, client = fuzz_target
    kind, data = attack
    event(kind)
    sock = raw_connect(srv.addr)
    try:
        sock.sendall(data)
        (sent,) = FrameDecoder().feed(data) if kind in ("frame", "binary_frame") else (None,)
        if sent is not None and sent.flag == 0 and sent.code != RequestCode.SPARKMQ_PING:
            decoder = FrameDecoder()
            frames: list[Frame] = []
            sock.settimeout(5)
            while not frames:
                chunk = sock.recv(65536)
                assert chunk, "the server closed a connection that sent a well-formed request"
                frames = decoder.feed(chunk)
            reply = frames[0]
            assert reply.is_response and reply.opaque == sent.opaque
            if sent.code != ECHO:
                assert error_from_frame(reply).code is ErrorCode.REQUEST_CODE_NOT_SUPPORTED
            elif reads_as_echo_header(sent.ext):
                assert reply.code == RESPONSE_SUCCESS and reply.body == sent.body
            else:
                err = error_from_frame(reply)
                assert err.code is ErrorCode.INVALID_ARGUMENT and err.message.startswith("bad EchoHeader header")
        elif kind in ("oversized", "bad_length", "bad_type", "bad_header"):
            assert closed_by_peer(sock), "a protocol violation must close the connection"
    finally:
        sock.close()
    assert client.request(srv.addr, ECHO, {"name": "good"}, b"b").ext == {"name": "good", "count": "0"}


def test_fuzz_left_only_the_good_connection(fuzz_target) -> None:
    srv, client = fuzz_target
    assert client.request(srv.addr, ECHO, {"name": "x"}).code == RESPONSE_SUCCESS
    deadline = time.monotonic() + 5
    while srv.server.connection_count > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    # Raw sockets the test closed mid-frame are gone too: one connection left, the good client's.
    assert srv.server.connection_count == 1


def test_default_limits_come_from_the_protocol_module() -> None:
    assert FrameDecoder().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES
    assert RemotingServer(handler).max_frame_bytes == DEFAULT_MAX_FRAME_BYTES


@async_test
async def test_server_requests_are_answered_by_the_client() -> None:
    """A request the server sends (GET_CONSUMER_RUNNING_INFO relayed to a client) is answered by the client's
    on_push; a client that does not know the code answers REQUEST_CODE_NOT_SUPPORTED; a closed connection
    fails the wait."""
    server_conns: list[ServerConnection] = []

    def on_push(frame: Frame) -> Reply | None:
        if frame.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            return Reply(0, {"clientId": frame.ext_text()["clientId"]}, b"{}")
        return None

    async with serving(on_connect=server_conns.append) as server:
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}", on_push=on_push)
        try:
            await wait_until(lambda: len(server_conns) == 1)
            sconn = server_conns[0]
            answer = await sconn.request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"clientId": "c-1"})
            assert (answer.code, answer.ext, answer.body) == (0, {"clientId": "c-1"}, b"{}")
            answer = await sconn.request(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT)
            assert error_from_frame(answer).code is ErrorCode.REQUEST_CODE_NOT_SUPPORTED
            waiting = asyncio.ensure_future(sconn.request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"clientId": "x"},
                                                          timeout_s=10))
            await conn.close()
            with pytest.raises(RemotingError):
                await waiting
        finally:
            await conn.close()


@async_test
async def test_one_port_serves_http_and_remoting() -> None:
    """An HTTP port given a RemotingServer tells the protocols apart by the first byte: curl and a remoting
    client are both served on it, and stopping the remoting side leaves HTTP serving."""
    import httpx
    from fastapi import FastAPI

    from sparkmq.api.serving import bind_socket, serve_app

    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "UP"}

    remoting = RemotingServer(handler).start_shared()
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    ready = asyncio.Event()
    servers: list[object] = []
    serving_task = asyncio.ensure_future(serve_app(
        app, sock, lambda host, p: ready.set(), handle_signals=False, server_ready=servers.append, remoting=remoting))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        conn = await RemotingConnection.connect(f"127.0.0.1:{port}")
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{port}/health")).json() == {"status": "UP"}
            for i in range(20):
                assert (await conn.request(ECHO, h(str(i)))).ext == h(str(i))
            assert (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200
            assert remoting.connection_count == 1
            await remoting.stop(1.0)
            await wait_until(lambda: conn.closed)
            assert (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200
    finally:
        servers[0].should_exit = True  # type: ignore[attr-defined]
        await asyncio.wait_for(serving_task, 15)
        await remoting.stop(0)
