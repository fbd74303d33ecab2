"""The broker's remoting port against real processes: the same messages as over HTTP, pipelining, pushed
rebalance notices, and fuzzed frames that never hurt the broker (``docs/remoting.md``)."""
from __future__ import annotations

import asyncio
import base64
import socket
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procs import wait_until
from sparkmq.platform.client.broker_remoting import decode_pulled
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import FRAME_MAGIC, PROTOCOL_VERSION, RequestCode
from sparkmq.platform.remoting import AsyncRemotingClient, Frame, SyncRemotingClient, encode_frame

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

_encode = msgspec.msgpack.encode


def _decode(data: bytes | memoryview, kind: type) -> Any:
    return msgspec.msgpack.decode(data, type=kind)


@pytest.fixture(scope="module")
def broker(module_procs: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One name server and one broker; the broker's HTTP base URL and remoting address."""
    # No trace: its background writes would move the log while the tests check that nothing was stored.
    _ns, service = module_procs.start_platform(tmp_path_factory.mktemp("broker") / "data", "--no-trace")
    info = httpx.get(f"{service.url}/broker", timeout=5).json()
    assert info["remoting_addr"], info
    return {"url": service.url, "remoting": info["remoting_addr"]}


def _max_offset(url: str) -> int:
    return int(httpx.get(f"{url}/broker", timeout=5).json()["commitlog"]["max_offset"])


def test_a_message_sent_over_http_and_one_sent_over_remoting_look_the_same(broker: dict[str, str]) -> None:
    url, remoting = broker["url"], broker["remoting"]
    props = {"color": "blue", "n": "7"}
    sent_http = httpx.post(f"{url}/topics/Equal/messages", timeout=5, json={
        "body": base64.b64encode(b"over http").decode(), "body_encoding": "base64", "tags": "TagA",
        "keys": ["k1", "k2"], "properties": props, "queue_id": 0, "msg_id": "MSGIDHTTP0001"}).json()
    with SyncRemotingClient(on_push=None) as client:
        header = _encode(p.SendRequest("Equal", 0, tags="TagA", keys=["k1", "k2"], properties=props,
                                       msg_id="MSGIDREMOTING01", born_timestamp=1_700_000_000_000))
        sent_remoting = _decode(client.request(remoting, RequestCode.SEND_MESSAGE, header, b"over remoting").header,
                                p.SendResponse)
        pulled = decode_pulled(client.request(remoting, RequestCode.PULL_MESSAGE,
                                              _encode(p.PullRequest("Equal", 0, 0, 32))), "broker-a")
    over_http = httpx.get(f"{url}/topics/Equal/queues/0/messages", params={"offset": 0, "max": 32},
                          timeout=5).json()["messages"]
    assert [m.msg_id for m in pulled.messages] == [m["msg_id"] for m in over_http] == [
        sent_http["msg_id"], sent_remoting.msg_id] == ["MSGIDHTTP0001", "MSGIDREMOTING01"]
    for received, as_json in zip(pulled.messages, over_http, strict=True):
        assert received.body == base64.b64decode(as_json["body"])
        assert received.tags == as_json["tags"] == "TagA"
        assert list(received.keys) == as_json["keys"] == ["k1", "k2"]
        assert received.properties == as_json["properties"]
        assert {k: received.properties[k] for k in props} == props
        for field in ("offset_msg_id", "queue_offset", "born_timestamp", "store_timestamp", "born_host",
                      "store_host", "commitlog_offset", "store_size", "sys_flag", "reconsume_times"):
            assert getattr(received, field) == as_json[field], field
    assert pulled.messages[1].born_timestamp == 1_700_000_000_000
    assert pulled.messages[1].offset_msg_id == sent_remoting.offset_msg_id


def test_ten_thousand_requests_in_flight_on_one_connection(broker: dict[str, str]) -> None:
    remoting = broker["remoting"]

    async def run() -> list[tuple[str, str]]:
        client = AsyncRemotingClient()
        try:
            async def task(worker: int) -> list[tuple[str, str]]:
                pending = []
                for i in range(1250):
                    msg_id = f"PIPE{worker:02d}{i:06d}"
                    header = _encode(p.SendRequest("Pipelined", worker % 4, msg_id=msg_id))
                    pending.append((msg_id, client.request(remoting, RequestCode.SEND_MESSAGE, header, b"x")))
                answers = await asyncio.gather(*(req for _, req in pending))
                return [(msg_id, _decode(a.header, p.SendResponse).msg_id)
                        for (msg_id, _), a in zip(pending, answers, strict=True)]
            results = await asyncio.gather(*(task(w) for w in range(8)))
            return [pair for chunk in results for pair in chunk]
        finally:
            await client.close()

    pairs = asyncio.run(run())
    assert len(pairs) == 10_000
    assert all(asked == answered for asked, answered in pairs)  # every answer matched its own request


def test_a_rebalance_notice_reaches_the_members_within_a_second(broker: dict[str, str]) -> None:
    remoting = broker["remoting"]
    group = "cg-notice"
    consumer = p.ConsumerGroupData(group, subscriptions=[p.SubscriptionData("Noticed")])

    async def run() -> float:
        notices: asyncio.Queue[tuple[float, p.GroupChangedNotice]] = asyncio.Queue()

        def on_push(addr: str, frame: Frame) -> None:
            if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                notices.put_nowait((time.monotonic(), _decode(frame.header, p.GroupChangedNotice)))

        first, second = AsyncRemotingClient(on_push=on_push), AsyncRemotingClient()
        try:
            await first.request(remoting, RequestCode.HEARTBEAT,
                                _encode(p.HeartbeatRequest("member-1", consumers=[consumer])))
            while not notices.empty():  # its own join
                notices.get_nowait()
            joined = time.monotonic()
            await second.request(remoting, RequestCode.HEARTBEAT,
                                 _encode(p.HeartbeatRequest("member-2", consumers=[consumer])))
            at, notice = await asyncio.wait_for(notices.get(), 5)
            assert notice.group == group
            return at - joined
        finally:
            await first.close()
            await second.close()

    assert asyncio.run(run()) < 1.0


def _raw(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.settimeout(0.3)  # a partial frame gets no answer: the broker waits for the rest
    return sock


def _frame(code: int, header: bytes, body: bytes, *, flags: int = 0, opaque: int = 1) -> bytes:
    data = encode_frame(flags, code, opaque, header, body)
    return data if isinstance(data, bytes) else b"".join(bytes(b) for b in data)


_FUZZ_FRAMES = st.one_of(
    st.binary(min_size=1, max_size=512),                                                   # random bytes
    st.builds(lambda code, header, body: _frame(code, header, body),                        # any code, junk header
              st.integers(0, 0xFFFF), st.binary(max_size=64), st.binary(max_size=256)),
    st.builds(lambda header: _frame(RequestCode.SEND_BATCH, header, b"\x00" * 40),           # bad UTF-8 / msgpack
              st.sampled_from([b"\xff\xfe", _encode({"topic": "F\udcff".encode("utf-8", "surrogatepass")}),
                               _encode({"topic": "Fuzz", "count": 3}), _encode({"topic": 5, "count": "x"})])),
    st.builds(lambda body: _frame(RequestCode.SEND_BATCH, _encode(p.SendBatchRequest("Fuzz", 2)), body),
              st.binary(max_size=300)),                                                      # garbage batches
    st.builds(lambda cut: _frame(RequestCode.PING, b"", b"abc")[:cut], st.integers(1, 20)),  # truncated
    st.builds(lambda length: struct.pack("<I", length) + FRAME_MAGIC + bytes([PROTOCOL_VERSION, 0]),
              st.integers(1 << 27, (1 << 32) - 1)),                                          # oversized
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_FUZZ_FRAMES)
def test_fuzzed_frames_never_crash_or_change_the_broker(broker: dict[str, str], data: bytes) -> None:
    url, remoting = broker["url"], broker["remoting"]
    before = _max_offset(url)
    with _raw(remoting) as sock:
        try:
            sock.sendall(data)
            sock.recv(65536)  # an error answer, or the broker closing the connection, or nothing
        except OSError:
            pass
    with SyncRemotingClient(on_push=None) as good:  # another connection keeps working throughout
        offsets = _decode(good.request(remoting, RequestCode.QUEUE_OFFSETS,
                                       _encode(p.QueueOffsetsRequest("Equal", 0))).header, p.QueueOffsetsResponse)
    assert offsets.max_offset >= 0
    assert _max_offset(url) == before  # nothing stored


def test_bad_requests_get_stable_codes_and_store_nothing(broker: dict[str, str]) -> None:
    url, remoting = broker["url"], broker["remoting"]
    before = _max_offset(url)
    with SyncRemotingClient(on_push=None) as client:
        cases = [
            (RequestCode.SEND_BATCH, _encode(p.SendBatchRequest("Bad", 2)), b"\x01\x02\x03", ErrorCode.MESSAGE_ILLEGAL),
            (RequestCode.SEND_MESSAGE, b"\xc1", b"x", ErrorCode.INVALID_ARGUMENT),
            (RequestCode.SEND_MESSAGE, _encode({"topic": "Bad", "surprise": 1}), b"x", ErrorCode.INVALID_ARGUMENT),
            (RequestCode.SEND_MESSAGE, _encode(p.SendRequest("bad topic!")), b"x", ErrorCode.TOPIC_ILLEGAL),
            (RequestCode.SEND_MESSAGE, _encode(p.SendRequest("Bad")), b"", ErrorCode.MESSAGE_ILLEGAL),
            (4242, b"", b"", ErrorCode.REQUEST_CODE_NOT_SUPPORTED),
        ]
        for code, header, body, expected in cases:
            with pytest.raises(SparkMQError) as err:
                client.request(remoting, code, header, body)
            assert err.value.code is expected, (code, err.value)
    assert _max_offset(url) == before


def test_the_name_server_routes_name_the_remoting_endpoint(broker: dict[str, str], module_procs: Any,
                                                           tmp_path: Path) -> None:
    namesrv = module_procs.started[0]
    # its own topic: under xdist the tests of this module may run on another worker's broker
    httpx.post(f"{broker['url']}/topics/Routed/messages", json={"body": "a"}, timeout=5).raise_for_status()
    wait_until(lambda: httpx.get(f"{namesrv.url}/routes/Routed", timeout=5).status_code == 200, 10, "a route")
    route = httpx.get(f"{namesrv.url}/routes/Routed", timeout=5).json()
    assert route["broker_datas"][0]["remoting_addrs"] == {"0": broker["remoting"]}


def test_an_offset_reset_is_pushed_to_the_group_members(broker: dict[str, str]) -> None:
    url, remoting = broker["url"], broker["remoting"]
    group = "cg-reset-push"
    httpx.post(f"{url}/topics/ResetPushed/messages", json={"body": "a", "queue_id": 0}, timeout=5).raise_for_status()
    consumer = p.ConsumerGroupData(group, subscriptions=[p.SubscriptionData("ResetPushed")])

    async def run() -> p.OffsetResetNotice:
        notices: asyncio.Queue[p.OffsetResetNotice] = asyncio.Queue()

        def on_push(addr: str, frame: Frame) -> None:
            if frame.code == RequestCode.NOTIFY_OFFSET_RESET:
                notices.put_nowait(_decode(frame.header, p.OffsetResetNotice))

        member = AsyncRemotingClient(on_push=on_push)
        try:
            await member.request(remoting, RequestCode.HEARTBEAT,
                                 _encode(p.HeartbeatRequest("member-r", consumers=[consumer])))
            answer = await asyncio.to_thread(httpx.post, f"{url}/consumers/{group}/offsets/reset",
                                             json={"topic": "ResetPushed", "offsets": {"0": 1}}, timeout=5)
            answer.raise_for_status()
            return await asyncio.wait_for(notices.get(), 2)
        finally:
            await member.close()

    notice = asyncio.run(run())
    assert (notice.group, notice.topic, notice.broker_name, notice.offsets) == (group, "ResetPushed", "broker-a",
                                                                                 {0: 1})
