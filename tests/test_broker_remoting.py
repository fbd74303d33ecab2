"""The broker's remoting (RocketMQ's protocol, on its one port) against real processes: the same messages as over
HTTP, pipelining, pushed rebalance notices and offset resets, fuzzed frames that never hurt the broker, and the
routes naming the one port (``docs/remoting.md``)."""
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
from sparkmq.platform.client.broker_remoting import decode_pulled, heartbeat_data, properties_text, pull_ext, send_ext
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import PULL_OUTCOME_CODES, RequestCode
from sparkmq.platform.remoting import AsyncRemotingClient, Frame, SyncRemotingClient, encode_frame

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def broker(module_procs: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One name server and one broker; the broker's HTTP base URL and remoting address (its one port)."""
    # No trace: its background writes would move the log while the tests check that nothing was stored.
    _ns, service = module_procs.start_platform(tmp_path_factory.mktemp("broker") / "data", "--no-trace")
    info = httpx.get(f"{service.url}/broker", timeout=5).json()
    assert info["remoting_addr"] == info["addr"] == service.url.removeprefix("http://"), info
    return {"url": service.url, "remoting": info["remoting_addr"]}


def _max_offset(url: str) -> int:
    return int(httpx.get(f"{url}/broker", timeout=5).json()["commitlog"]["max_offset"])


def _consumer(group: str, topic: str) -> dict[str, Any]:
    return {"group": group, "subscriptions": [{"topic": topic, "expression": "*", "type": "TAG"}]}


def test_a_message_sent_over_http_and_one_sent_over_remoting_look_the_same(broker: dict[str, str]) -> None:
    url, remoting = broker["url"], broker["remoting"]
    props = {"color": "blue", "n": "7"}
    sent_http = httpx.post(f"{url}/topics/Equal/messages", timeout=5, json={
        "body": base64.b64encode(b"over http").decode(), "body_encoding": "base64", "tags": "TagA",
        "keys": ["k1", "k2"], "properties": props, "queue_id": 0, "msg_id": "MSGIDHTTP0001"}).json()
    with SyncRemotingClient(on_push=None) as client:
        text = properties_text(props, tags="TagA", keys=("k1", "k2"), msg_id="MSGIDREMOTING01")
        sent_remoting = client.request(remoting, RequestCode.SEND_MESSAGE_V2,
                                       send_ext("pg", "Equal", 0, text, born_timestamp=1_700_000_000_000),
                                       b"over remoting")
        pulled = decode_pulled(client.request(remoting, RequestCode.SPARKMQ_PULL_PACKED,
                                              pull_ext(None, "Equal", 0, 0, 32), ok=PULL_OUTCOME_CODES), "broker-a")
    over_http = httpx.get(f"{url}/topics/Equal/queues/0/messages", params={"offset": 0, "max": 32},
                          timeout=5).json()["messages"]
    assert [m.msg_id for m in pulled.messages] == [m["msg_id"] for m in over_http] == [
        sent_http["msg_id"], sent_remoting.ext["transactionId"]] == ["MSGIDHTTP0001", "MSGIDREMOTING01"]
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
    assert pulled.messages[1].offset_msg_id == sent_remoting.ext["msgId"]


def test_ten_thousand_requests_in_flight_on_one_connection(broker: dict[str, str]) -> None:
    remoting = broker["remoting"]

    async def run() -> list[tuple[str, str]]:
        client = AsyncRemotingClient(request_timeout_s=60)  # 10,000 queued at once: the last wait their turn
        try:
            async def send(msg_id: str, ext: dict[str, str]) -> Frame:
                # A request that waited in the broker longer than wait_time_ms_in_send_queue (the tail of a read
                # of a thousand requests, on a loaded machine) is answered SYSTEM_BUSY, before it is stored: as
                # every client does, send it again after a pause.
                for _ in range(50):
                    try:
                        return await client.request(remoting, RequestCode.SEND_MESSAGE_V2, ext, b"x")
                    except SparkMQError as exc:
                        if exc.code is not ErrorCode.SYSTEM_BUSY:
                            raise
                        await asyncio.sleep(0.1)
                raise AssertionError(f"{msg_id} was answered SYSTEM_BUSY 50 times")

            async def task(worker: int) -> list[tuple[str, str]]:
                pending = []
                for i in range(1250):
                    msg_id = f"PIPE{worker:02d}{i:06d}"
                    ext = send_ext("pg", "Pipelined", worker % 4, properties_text({}, msg_id=msg_id),
                                   born_timestamp=1)
                    pending.append((msg_id, send(msg_id, ext)))
                answers = await asyncio.gather(*(req for _, req in pending))
                return [(msg_id, a.ext["transactionId"]) for (msg_id, _), a in zip(pending, answers, strict=True)]
            results = await asyncio.gather(*(task(w) for w in range(8)))
            return [pair for chunk in results for pair in chunk]
        finally:
            await client.close()

    pairs = asyncio.run(run())
    assert len(pairs) == 10_000
    assert all(asked == answered for asked, answered in pairs)  # every answer matched its own request


def test_a_rebalance_notice_reaches_the_members_the_joining_one_included(broker: dict[str, str]) -> None:
    remoting = broker["remoting"]
    group = "cg-notice"

    async def run() -> float:
        notices: asyncio.Queue[tuple[float, Frame]] = asyncio.Queue()

        def on_push(addr: str, frame: Frame) -> None:
            if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                notices.put_nowait((time.monotonic(), frame))

        first, second = AsyncRemotingClient(on_push=on_push), AsyncRemotingClient()
        try:
            await first.request(remoting, RequestCode.HEART_BEAT, None, heartbeat_data(
                {"client_id": "member-1", "consumers": [_consumer(group, "Noticed")]}))
            # Its own join, on the connection of its first heartbeat (RocketMQ's clients rebalance on it at once,
            # else only after their 20 s rebalance interval); it may arrive just after the heartbeat's answer.
            _, own = await asyncio.wait_for(notices.get(), 5)
            assert own.ext == {"consumerGroup": group}
            while not notices.empty():
                notices.get_nowait()
            joined = time.monotonic()
            await second.request(remoting, RequestCode.HEART_BEAT, None, heartbeat_data(
                {"client_id": "member-2", "consumers": [_consumer(group, "Noticed")]}))
            at, notice = await asyncio.wait_for(notices.get(), 5)
            assert notice.ext == {"consumerGroup": group} and notice.is_oneway
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


def _frame(code: int, ext: dict[str, str] | None, body: bytes, *, flags: int = 0, opaque: int = 1) -> bytes:
    data = encode_frame(code, flags, opaque, ext, body)
    return data if isinstance(data, bytes) else b"".join(bytes(b) for b in data)


def _json_header_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


_TEXT = st.text(max_size=12)
#: Codes that may store something when their header happens to be valid: the junk-header frames leave them out.
_WRITES = {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
           RequestCode.SPARKMQ_SEND_PACKED, RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION}
_FUZZ_FRAMES = st.one_of(
    st.binary(min_size=1, max_size=512),                                                    # random bytes
    st.builds(lambda code, ext, body: _frame(code, ext, body),                               # any code, junk ext
              st.integers(0, 32767).filter(lambda c: c not in _WRITES), st.dictionaries(_TEXT, _TEXT, max_size=4),
              st.binary(max_size=256)),
    st.builds(lambda header: _json_header_frame(header),                                     # bad JSON headers
              st.sampled_from([b"{", b"[]", b'{"code":"x"}', b'{"code":10,"extFields":{"a":[1]}}', b"\xff\xfe",
                               b'{"code":310,"flag":0,"opaque":1,"extFields":{"b":"F\\udcff"}}'])),
    st.builds(lambda body: _frame(RequestCode.SPARKMQ_SEND_PACKED, p.ext_fields(p.SendPackedRequestHeader("Fuzz", 2)),
                                  body), st.binary(max_size=300)),                           # garbage packed batches
    st.builds(lambda body: _frame(RequestCode.SEND_BATCH_MESSAGE, {"a": "pg", "b": "Fuzz"}, body),
              st.binary(max_size=300)),                                                      # garbage RocketMQ batches
    st.builds(lambda cut: _frame(RequestCode.SPARKMQ_PING, None, b"abc")[:cut], st.integers(1, 20)),  # truncated
    st.builds(lambda length, kind: struct.pack(">iI", length, kind << 24),                   # oversized, bad type
              st.integers(1 << 26, (1 << 31) - 1), st.integers(0, 255)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_FUZZ_FRAMES)
def test_fuzzed_frames_never_crash_or_change_the_broker(broker: dict[str, str], data: bytes) -> None:
    url, remoting = broker["url"], broker["remoting"]

    def queue_max() -> int:
        with SyncRemotingClient(on_push=None) as good:  # another connection keeps working throughout
            return good.request(remoting, RequestCode.SPARKMQ_QUEUE_OFFSETS, p.QueueRequestHeader("Equal", 0)
                                ).header_as(p.QueueOffsetsResponseHeader).maxOffset

    before, queue_before = _max_offset(url), queue_max()
    with _raw(remoting) as sock:
        try:
            sock.sendall(data)
            sock.recv(65536)  # an error answer, or the broker closing the connection, or nothing
        except OSError:
            pass
    assert queue_max() == queue_before and _max_offset(url) == before  # nothing stored


def test_bad_requests_get_stable_codes_and_store_nothing(broker: dict[str, str]) -> None:
    url, remoting = broker["url"], broker["remoting"]
    before = _max_offset(url)
    with SyncRemotingClient(on_push=None) as client:
        cases = [
            (RequestCode.SPARKMQ_SEND_PACKED, p.SendPackedRequestHeader("Bad", 2), b"\x01\x02\x03",
             ErrorCode.MESSAGE_ILLEGAL),
            (RequestCode.SEND_MESSAGE_V2, {"b": "Bad"}, b"x", ErrorCode.INVALID_ARGUMENT),  # no producer group
            (RequestCode.SEND_MESSAGE_V2, {**send_ext("pg", "Bad", 0, "", born_timestamp=1), "e": "x"}, b"x",
             ErrorCode.INVALID_ARGUMENT),
            (RequestCode.SEND_MESSAGE_V2, send_ext("pg", "bad topic!", 0, "", born_timestamp=1), b"x",
             ErrorCode.TOPIC_ILLEGAL),
            (RequestCode.SEND_MESSAGE_V2, send_ext("pg", "Bad", 0, "", born_timestamp=1), b"",
             ErrorCode.MESSAGE_ILLEGAL),
            (RequestCode.SEND_MESSAGE_V2, send_ext("pg", "Bad", 0, "\x01v\x02", born_timestamp=1), b"x",
             ErrorCode.MESSAGE_ILLEGAL),  # a property without a name
            (RequestCode.HEART_BEAT, None, b"[1, 2]", ErrorCode.INVALID_ARGUMENT),
            (4242, None, b"", ErrorCode.REQUEST_CODE_NOT_SUPPORTED),
        ]
        for code, ext, body, expected in cases:
            with pytest.raises(SparkMQError) as err:
                client.request(remoting, code, ext, body)
            assert err.value.code is expected, (code, err.value)
    assert _max_offset(url) == before


def test_the_name_server_routes_name_the_brokers_one_port(broker: dict[str, str], module_procs: Any,
                                                          tmp_path: Path) -> None:
    namesrv = module_procs.started[0]
    # its own topic: under xdist the tests of this module may run on another worker's broker
    httpx.post(f"{broker['url']}/topics/Routed/messages", json={"body": "a"}, timeout=5).raise_for_status()
    wait_until(lambda: httpx.get(f"{namesrv.url}/routes/Routed", timeout=5).status_code == 200, 10, "a route")
    route = httpx.get(f"{namesrv.url}/routes/Routed", timeout=5).json()
    assert route["broker_datas"][0]["remoting_addrs"] == {"0": broker["remoting"]}
    assert route["broker_datas"][0]["broker_addrs"] == {"0": broker["remoting"]}


def test_an_offset_reset_is_pushed_to_the_group_members(broker: dict[str, str]) -> None:
    url, remoting = broker["url"], broker["remoting"]
    group = "cg-reset-push"
    httpx.post(f"{url}/topics/ResetPushed/messages", json={"body": "a", "queue_id": 0}, timeout=5).raise_for_status()

    async def run() -> Frame:
        notices: asyncio.Queue[Frame] = asyncio.Queue()

        def on_push(addr: str, frame: Frame) -> None:
            if frame.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
                notices.put_nowait(frame)

        member = AsyncRemotingClient(on_push=on_push)
        try:
            await member.request(remoting, RequestCode.HEART_BEAT, None, heartbeat_data(
                {"client_id": "member-r", "consumers": [_consumer(group, "ResetPushed")]}))
            answer = await asyncio.to_thread(httpx.post, f"{url}/consumers/{group}/offsets/reset",
                                             json={"topic": "ResetPushed", "offsets": {"0": 1}}, timeout=5)
            answer.raise_for_status()
            return await asyncio.wait_for(notices.get(), 2)
        finally:
            await member.close()

    notice = asyncio.run(run())
    assert (notice.ext["group"], notice.ext["topic"]) == (group, "ResetPushed")
    assert p.parse_mq_offsets(notice.body) == {p.MessageQueueData("ResetPushed", "broker-a", 0): 1}


def test_heartbeat_answers_carry_the_group_versions(broker: dict[str, str]) -> None:
    with SyncRemotingClient(on_push=None) as client:
        answer = client.request(broker["remoting"], RequestCode.HEART_BEAT, None, heartbeat_data(
            {"client_id": "versions-1", "consumers": [_consumer("cg-versions", "Versions")]}))
    assert answer.ext == {"isSupportHeartBeatV2": "false", "isSubChange": "true"}
    assert msgspec.json.decode(answer.body) == {"groupVersions": {"cg-versions": 1}}
