"""The broker's HTTP API (docs/http-api.md), served by uvicorn in a thread on 127.0.0.1, port 0."""
from __future__ import annotations

import asyncio
import base64
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from procs import wait_until
from sparkmq.api.broker_main import BrokerService
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.client.remoting import BrokerClient
from sparkmq.platform.common import wire
from sparkmq.platform.common.ids import decode_offset_msg_id
from sparkmq.platform.common.record_columns import RECORDS_SCHEMA, decode_records

SMALL_STORE = {"segment_size": 1 << 20, "max_message_size": 64 * 1024, "max_properties_size": 8000}


class ThreadServer:
    """A BrokerService served by uvicorn in its own thread and event loop."""

    def __init__(self, config: BrokerConfig) -> None:
        self.service = BrokerService(config)
        self.broker = self.service.broker
        self.url = self.service.url
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="broker-app-test", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            await self.service.serve(on_ready=lambda _h, _p: self._ready.set(), handle_signals=False)

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    def start(self) -> ThreadServer:
        self._thread.start()
        assert self._ready.wait(60), "the broker did not start"
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.service.request_stop)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the broker did not stop"


@pytest.fixture
def serve_broker(tmp_path: Path) -> Iterator[Callable[..., ThreadServer]]:
    """Start brokers on free loopback ports (data under tmp_path); all are stopped after the test."""
    started: list[ThreadServer] = []

    def start(data_dir: Path | None = None, **overrides: Any) -> ThreadServer:
        overrides.setdefault("store", SMALL_STORE)
        config = BrokerConfig(host="127.0.0.1", port=0, data_dir=data_dir or tmp_path / "broker", **overrides)
        server = ThreadServer(config).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    """One broker for the tests that only need distinct topic names."""
    config = BrokerConfig(host="127.0.0.1", port=0, data_dir=tmp_path_factory.mktemp("shared"), store=SMALL_STORE,
                          long_polling_max_ms=10_000, max_request_bytes=256 * 1024)
    server = ThreadServer(config).start()
    yield server
    server.stop()


@pytest.fixture
def http(shared: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared.url, timeout=30) as client:
        yield client


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def max_offsets(http: httpx.Client, topic: str) -> list[int]:
    stats = http.get(f"/topics/{topic}/stats")
    if stats.status_code == 404:
        return []
    return [q["max_offset"] for q in ok(stats)["queues"]]


# -- sending and pulling, JSON ----------------------------------------------------------------

def test_send_one_and_pull_it_back(http: httpx.Client, shared: ThreadServer) -> None:
    sent = ok(http.post("/topics/s1/messages", json={"body": "hello", "tags": "TagA", "keys": ["k1", "k2"],
                                                     "properties": {"a": "1"}, "queue_id": 2}))
    assert sent["status"] == "SEND_OK" and sent["topic"] == "s1" and sent["broker_name"] == "broker-a"
    assert sent["queue_id"] == 2 and sent["queue_offset"] == 0 and len(sent["msg_id"]) == 32
    assert sent["store_timestamp"] > 0
    assert decode_offset_msg_id(sent["offset_msg_id"]).store_host == shared.service.config.addr
    assert ok(http.get("/topics/s1"))["read_queue_nums"] == 4  # auto-created with 4 queues
    pulled = ok(http.get("/topics/s1/queues/2/messages", params={"offset": 0, "max": 10}))
    assert (pulled["status"], pulled["next_offset"], pulled["min_offset"], pulled["max_offset"]) == ("FOUND", 1, 0, 1)
    (msg,) = pulled["messages"]
    assert base64.b64decode(msg["body"]) == b"hello"
    assert (msg["tags"], msg["keys"], msg["msg_id"], msg["offset_msg_id"]) == (
        "TagA", ["k1", "k2"], sent["msg_id"], sent["offset_msg_id"])
    assert msg["properties"]["a"] == "1" and msg["born_host"].startswith("127.0.0.1:")
    assert msg["store_host"] == shared.service.config.addr and msg["sys_flag"] == 0
    received = wire.received_from_json(msg)
    assert received.body == b"hello" and received.user_properties == {"a": "1"}


def test_send_base64_msg_id_born_fields_and_compressed(http: httpx.Client) -> None:
    raw = bytes(range(256))
    sent = ok(http.post("/topics/s2/messages", json={
        "body": base64.b64encode(raw).decode(), "body_encoding": "base64", "msg_id": "MY-ID-1",
        "born_timestamp": 1_600_000_000_000, "born_host": "10.1.2.3:4567", "queue_id": 0, "producer_group": "pg"}))
    assert sent["msg_id"] == "MY-ID-1"
    packed = zlib.compress(b"z" * 10_000, 5)
    ok(http.post("/topics/s2/messages", json={"body": base64.b64encode(packed).decode(), "body_encoding": "base64",
                                              "compressed": True, "queue_id": 0}))
    first, second = ok(http.get("/topics/s2/queues/0/messages"))["messages"]
    assert base64.b64decode(first["body"]) == raw and first["msg_id"] == "MY-ID-1"
    assert first["born_timestamp"] == 1_600_000_000_000 and first["born_host"] == "10.1.2.3:4567"
    assert second["sys_flag"] & 1 and wire.received_from_json(second).body == b"z" * 10_000
    error(http.post("/topics/s2/messages", json={"body": "not zlib", "compressed": True}), 400, "MESSAGE_ILLEGAL")


def test_compressed_batches_keep_the_flag_on_every_record(http: httpx.Client) -> None:
    bodies = [b"batch %d " % i * 500 for i in range(3)]
    ok(http.post("/topics/s2c/batch", params={"queue_id": 0, "compressed": "true"}, json={"messages": [
        {"body": base64.b64encode(zlib.compress(b, 5)).decode(), "body_encoding": "base64"} for b in bodies]}))
    pulled = ok(http.get("/topics/s2c/queues/0/messages", params={"max": 10}))["messages"]
    assert [m["sys_flag"] & 1 for m in pulled] == [1, 1, 1]
    assert [wire.received_from_json(m).body for m in pulled] == bodies
    before = max_offsets(http, "s2c")
    error(http.post("/topics/s2c/batch", params={"queue_id": 0, "compressed": "true"},
                    json={"messages": [{"body": "plain text"}]}), 400, "MESSAGE_ILLEGAL")
    assert max_offsets(http, "s2c") == before


def test_queue_choice_explicit_sharding_and_round_robin(http: httpx.Client) -> None:
    ok(http.post("/topics", json={"topic": "s3", "read_queue_nums": 8, "write_queue_nums": 4}))
    by_key = {ok(http.post("/topics/s3/messages", json={"body": "x", "sharding_key": "order-42"}))["queue_id"]
              for _ in range(5)}
    assert len(by_key) == 1 and by_key <= {0, 1, 2, 3}
    spread = [ok(http.post("/topics/s3/messages", json={"body": "x"}))["queue_id"] for _ in range(8)]
    assert set(spread) == {0, 1, 2, 3}  # round-robin over the 4 write queues only
    before = max_offsets(http, "s3")
    error(http.post("/topics/s3/messages", json={"body": "x", "queue_id": 4}), 400, "QUEUE_ID_ILLEGAL")
    error(http.post("/topics/s3/messages", json={"body": "x", "queue_id": -1}), 400, "QUEUE_ID_ILLEGAL")
    assert max_offsets(http, "s3") == before


@pytest.mark.parametrize("body, status, code", [
    ({}, 400, "INVALID_ARGUMENT"),
    ({"body": "x", "queue_id": "1"}, 400, "INVALID_ARGUMENT"),
    ({"body": "x", "tag": "typo"}, 400, "INVALID_ARGUMENT"),
    ({"body": "x", "body_encoding": "hex"}, 400, "INVALID_ARGUMENT"),
    ({"body": "***", "body_encoding": "base64"}, 400, "MESSAGE_ILLEGAL"),
    ({"body": ""}, 400, "MESSAGE_ILLEGAL"),
    ({"body": "x", "tags": "A||B"}, 400, "MESSAGE_ILLEGAL"),
    ({"body": "x", "keys": ["has space"]}, 400, "MESSAGE_ILLEGAL"),
    ({"body": "x", "properties": {"p": "\x01"}}, 400, "MESSAGE_ILLEGAL"),
    ({"body": "x", "tags": "A", "properties": {"TAGS": "B"}}, 400, "MESSAGE_ILLEGAL"),
    ({"body": "x", "msg_id": "with space"}, 400, "MESSAGE_ILLEGAL"),
    ({"body": "x" * (64 * 1024 + 1)}, 413, "MESSAGE_TOO_LARGE"),
    ({"body": "x", "properties": {"p": "v" * 9000}}, 413, "PROPERTIES_TOO_LARGE"),
    ({"body": "x", "born_host": "not-a-host"}, 400, "INVALID_ARGUMENT"),
    ({"body": "x", "born_timestamp": -5}, 400, "INVALID_ARGUMENT"),
    ({"body": "x", "producer_group": "bad group"}, 400, "GROUP_ILLEGAL"),
    ({"body": "x", "sharding_key": ""}, 400, "INVALID_ARGUMENT"),
])
def test_bad_sends_have_stable_codes_and_create_nothing(http: httpx.Client, body: dict, status: int,
                                                         code: str) -> None:
    topic = "never-created"
    error(http.post(f"/topics/{topic}/messages", json=body), status, code)
    # The topic would have been auto-created by a good send: a rejected one leaves no trace.
    error(http.get(f"/topics/{topic}"), 404, "TOPIC_NOT_EXIST")


def test_bad_topics_and_malformed_json(http: httpx.Client) -> None:
    error(http.post("/topics/bad%20topic/messages", json={"body": "x"}), 400, "TOPIC_ILLEGAL")
    error(http.post("/topics/" + "t" * 128 + "/messages", json={"body": "x"}), 400, "TOPIC_ILLEGAL")
    error(http.post("/topics/SCHEDULE_TOPIC_XXXX2/messages", content=b"{not json",
                    headers={"content-type": "application/json"}), 400, "INVALID_ARGUMENT")
    # System topics are never auto-created by a send.
    error(http.post("/topics/%25DLQ%25nobody/messages", json={"body": "x"}), 404, "TOPIC_NOT_EXIST")
    error(http.post("/topics/rmq_sys_x/messages", json={"body": "x"}), 404, "TOPIC_NOT_EXIST")


def test_perm_4_refuses_sends_and_perm_2_refuses_pulls(http: httpx.Client) -> None:
    ok(http.post("/topics", json={"topic": "ro", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 4}))
    error(http.post("/topics/ro/messages", json={"body": "x"}), 403, "NO_PERMISSION")
    error(http.post("/topics/ro/batch", json={"messages": [{"body": "x"}]}), 403, "NO_PERMISSION")
    assert max_offsets(http, "ro") == [0]
    assert ok(http.get("/topics/ro/queues/0/messages"))["status"] == "NO_MATCHED_QUEUE"
    ok(http.post("/topics", json={"topic": "wo", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 2}))
    assert ok(http.post("/topics/wo/messages", json={"body": "x"}))["status"] == "SEND_OK"
    error(http.get("/topics/wo/queues/0/messages"), 403, "NO_PERMISSION")
    ok(http.post("/topics", json={"topic": "wo", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}))
    assert len(ok(http.get("/topics/wo/queues/0/messages"))["messages"]) == 1


def test_pull_statuses_and_filters(http: httpx.Client) -> None:
    ok(http.post("/topics", json={"topic": "p1", "read_queue_nums": 2, "write_queue_nums": 2}))
    for i, tag in enumerate(["A", "B", "B", "C", "A"]):
        ok(http.post("/topics/p1/messages", json={"body": f"m{i}", "tags": tag, "queue_id": 0}))
    get = lambda **params: ok(http.get("/topics/p1/queues/0/messages", params=params))  # noqa: E731
    found = get(offset=0, tags="A || C")
    assert found["status"] == "FOUND" and [m["tags"] for m in found["messages"]] == ["A", "C", "A"]
    assert found["next_offset"] == 5
    assert [m["tags"] for m in get(offset=0, max=2)["messages"]] == ["A", "B"]
    assert get(offset=0, max=2)["next_offset"] == 2
    assert (r := get(offset=1, tags="Z"))["status"] == "NO_MATCHED_MSG" and r["next_offset"] == 5
    assert (r := get(offset=5))["status"] == "NO_NEW_MSG" and r["next_offset"] == 5
    assert (r := get(offset=9))["status"] == "OFFSET_OVERFLOW" and r["next_offset"] == 5
    assert (r := get(offset=0, tags="*"))["status"] == "FOUND" and len(r["messages"]) == 5
    r = ok(http.get("/topics/p1/queues/1/messages"))
    assert (r["status"], r["next_offset"]) == ("NO_MATCHED_QUEUE", 0)
    error(http.get("/topics/p1/queues/2/messages"), 400, "QUEUE_ID_ILLEGAL")
    error(http.get("/topics/p1/queues/0/messages", params={"offset": -1}), 400, "OFFSET_ILLEGAL")
    error(http.get("/topics/p1/queues/0/messages", params={"max": 0}), 400, "INVALID_ARGUMENT")
    error(http.get("/topics/p1/queues/0/messages", params={"max": 5000}), 400, "INVALID_ARGUMENT")
    error(http.get("/topics/p1/queues/0/messages", params={"wait_ms": -1}), 400, "INVALID_ARGUMENT")
    error(http.get("/topics/p1/queues/x/messages"), 400, "INVALID_ARGUMENT")
    error(http.get("/topics/nope/queues/0/messages"), 404, "TOPIC_NOT_EXIST")
    offsets = ok(http.get("/topics/p1/queues/0/offsets"))
    assert offsets == {"min_offset": 0, "max_offset": 5}
    assert ok(http.get("/topics/p1/queues/0/offsets", params={"timestamp": 0}))["offset"] == 0
    future = int(time.time() * 1000) + 3_600_000
    assert ok(http.get("/topics/p1/queues/0/offsets", params={"timestamp": future}))["offset"] == 5


def test_long_polling_over_http_wakes_on_arrival(http: httpx.Client, shared: ThreadServer) -> None:
    ok(http.post("/topics", json={"topic": "lp", "read_queue_nums": 1, "write_queue_nums": 1}))
    result: dict[str, Any] = {}

    def pull() -> None:
        started = time.monotonic()
        with httpx.Client(base_url=shared.url, timeout=30) as other:
            result["body"] = ok(other.get("/topics/lp/queues/0/messages", params={"wait_ms": 9000}))
        result["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=pull)
    thread.start()
    wait_until(lambda: shared.broker.holds.held("lp", 0), 10, "the pull to be held", interval=0.005)
    ok(http.post("/topics/lp/messages", json={"body": "arrived"}))
    thread.join(20)
    assert result["body"]["status"] == "FOUND" and result["elapsed"] < 8
    # Nothing new: held until wait_ms, then NO_NEW_MSG.
    started = time.monotonic()
    assert ok(http.get("/topics/lp/queues/0/messages", params={"offset": 1, "wait_ms": 200}))["status"] == "NO_NEW_MSG"
    assert time.monotonic() - started >= 0.2


# -- batches and Arrow ------------------------------------------------------------------------

def test_json_batch_lands_in_one_queue_with_consecutive_offsets(http: httpx.Client) -> None:
    body = {"messages": [{"body": f"b{i}", "tags": "T", "keys": [f"k{i}"], "msg_id": f"ID{i}"} for i in range(10)]}
    result = ok(http.post("/topics/b1/batch", params={"queue_id": 3}, json=body))
    assert result["status"] == "SEND_OK" and result["queue_id"] == 3 and result["topic"] == "b1"
    assert [r["queue_offset"] for r in result["results"]] == list(range(10))
    assert [r["msg_id"] for r in result["results"]] == [f"ID{i}" for i in range(10)]
    pulled = ok(http.get("/topics/b1/queues/3/messages"))["messages"]
    assert [base64.b64decode(m["body"]) for m in pulled] == [f"b{i}".encode() for i in range(10)]
    same = {ok(http.post("/topics/b1/batch", params={"sharding_key": "k"}, json=body))["queue_id"] for _ in range(3)}
    assert len(same) == 1


def test_rejected_batch_writes_nothing(http: httpx.Client) -> None:
    ok(http.post("/topics/b2/batch", json={"messages": [{"body": "seed"}]}))
    before = max_offsets(http, "b2")
    bad = {"messages": [{"body": "fine"}, {"body": ""}, {"body": "fine"}]}
    assert "message 1" in error(http.post("/topics/b2/batch", json=bad), 400, "MESSAGE_ILLEGAL")["message"]
    error(http.post("/topics/b2/batch", json={"messages": []}), 400, "MESSAGE_ILLEGAL")
    error(http.post("/topics/b2/batch", json={"messages": [{"body": 5}]}), 400, "INVALID_ARGUMENT")
    error(http.post("/topics/b2/batch", content=b"[", headers={"content-type": "application/json"}),
          400, "INVALID_ARGUMENT")
    error(http.post("/topics/b2/batch", params={"queue_id": 9}, json={"messages": [{"body": "x"}]}),
          400, "QUEUE_ID_ILLEGAL")
    error(http.post("/topics/b2/batch", content=b"garbage", headers={"content-type": wire.ARROW_STREAM}),
          400, "MESSAGE_ILLEGAL")
    too_big = {"messages": [{"body": "x" * 60_000} for _ in range(5)]}
    error(http.post("/topics/b2/batch", json=too_big), 413, "MESSAGE_TOO_LARGE")
    assert max_offsets(http, "b2") == before
    error(http.post("/topics/b3/batch", json=bad), 400, "MESSAGE_ILLEGAL")
    error(http.get("/topics/b3"), 404, "TOPIC_NOT_EXIST")


def test_arrow_batch_send_and_arrow_pull_round_trip(http: httpx.Client) -> None:
    rows = [wire.SendRow(f"arrow-{i}".encode() * 3, "AT" if i % 2 else None, (f"k{i}",) if i % 3 else (),
                         {"i": str(i)}) for i in range(20)]
    payload = wire.to_ipc(wire.send_rows_to_arrow(rows))
    result = ok(http.post("/topics/a1/batch", params={"queue_id": 1}, content=payload,
                          headers={"content-type": wire.ARROW_STREAM}))
    assert [r["queue_offset"] for r in result["results"]] == list(range(20))
    response = http.get("/topics/a1/queues/1/messages", params={"max": 100},
                        headers={"accept": wire.ARROW_STREAM})
    assert response.status_code == 200 and response.headers["content-type"] == wire.ARROW_STREAM
    headers = {k: response.headers[v] for k, v in wire.PULL_HEADERS.items()}
    assert headers == {"status": "FOUND", "next_offset": "20", "min_offset": "0", "max_offset": "20", "form": "rows"}
    table = wire.from_ipc(response.content)
    assert table.schema.equals(wire.PULL_SCHEMA)
    got = wire.received_from_arrow(table)
    assert [m.body for m in got] == [r.body for r in rows]
    assert [m.tags for m in got] == [r.tags for r in rows] and [m.keys for m in got] == [r.keys for r in rows]
    assert [m.user_properties for m in got] == [r.properties for r in rows]
    assert [m.msg_id for m in got] == [r["msg_id"] for r in result["results"]]
    # The same pull in JSON says the same.
    as_json = [wire.received_from_json(m) for m in ok(http.get("/topics/a1/queues/1/messages",
                                                              params={"max": 100}))["messages"]]
    assert as_json == got
    # An empty Arrow pull still carries its status.
    empty = http.get("/topics/a1/queues/1/messages", params={"offset": 20}, headers={"accept": wire.ARROW_STREAM})
    assert empty.headers["X-Pull-Status"] == "NO_NEW_MSG" and wire.from_ipc(empty.content).num_rows == 0


def test_bulk_pull_in_records_form_decodes_to_the_same_rows(http: httpx.Client) -> None:
    """form=records carries the stored records; decoded by the reader they are the rows form's rows.
    Bulk pulls take up to 16384 messages; a filtered or grouped pull stays at 1024 and refuses records."""
    payload = wire.to_ipc(wire.send_rows_to_arrow([wire.SendRow(b"r%d" % i, "T" if i % 2 else None, (f"k{i}",),
                                                                {"i": str(i)}) for i in range(1500)]))
    ok(http.post("/topics/rec1/batch", params={"queue_id": 0}, content=payload,
                 headers={"content-type": wire.ARROW_STREAM}))
    arrow = {"accept": wire.ARROW_STREAM}
    rows = http.get("/topics/rec1/queues/0/messages", params={"max": 1500}, headers=arrow)
    records = http.get("/topics/rec1/queues/0/messages", params={"max": 1500, "form": "records"}, headers=arrow)
    assert rows.headers["X-Pull-Form"] == "rows" and records.headers["X-Pull-Form"] == "records"
    assert records.headers["X-Pull-Next-Offset"] == rows.headers["X-Pull-Next-Offset"] == "1500"
    raw, decoded = wire.from_ipc(records.content), wire.from_ipc(rows.content)
    name = decoded.column("broker_name")[0].as_py()
    assert raw.schema.equals(RECORDS_SCHEMA) and raw.num_rows == 1500
    assert pa.Table.from_batches([decode_records(raw.column("record"), name)]).equals(decoded)
    # The client asks for records when it knows the broker name, and hands back the same table.
    client = BrokerClient(http.base_url.netloc.decode(), 10.0)
    try:
        via_client = client.pull_arrow_table("rec1", 0, 0, 1500, broker_name=name).table
        assert via_client.equals(decoded)
    finally:
        client.close()
    error(http.get("/topics/rec1/queues/0/messages", params={"max": 16385}, headers=arrow), 400, "INVALID_ARGUMENT")
    error(http.get("/topics/rec1/queues/0/messages", params={"max": 1025, "tags": "T"}, headers=arrow),
          400, "INVALID_ARGUMENT")
    error(http.get("/topics/rec1/queues/0/messages", params={"form": "pages"}, headers=arrow), 400, "INVALID_ARGUMENT")
    error(http.get("/topics/rec1/queues/0/messages", params={"form": "records", "group": "g"}, headers=arrow),
          400, "INVALID_ARGUMENT")


# -- topics admin -----------------------------------------------------------------------------

def test_topic_admin(http: httpx.Client) -> None:
    names = {t["topic"] for t in ok(http.get("/topics"))["topics"]}
    assert {"RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "TBW102"} <= names
    created = ok(http.post("/topics", json={"topic": "adm", "read_queue_nums": 3, "write_queue_nums": 2,
                                           "perm": 6, "order": True}))
    assert created == {"topic": "adm", "read_queue_nums": 3, "write_queue_nums": 2, "perm": 6,
                       "topic_sys_flag": 0, "order": True}
    assert ok(http.get("/topics/adm")) == created
    assert ok(http.post("/topics", json={"topic": "adm"}))["read_queue_nums"] == 16  # update with defaults
    ok(http.post("/topics/adm/messages", json={"body": "x", "queue_id": 1}))
    stats = ok(http.get("/topics/adm/stats"))
    assert len(stats["queues"]) == 16 and stats["queues"][1]["max_offset"] == 1
    assert stats["queues"][1]["last_store_timestamp"] > 0 and stats["queues"][0]["last_store_timestamp"] == 0
    for system in ("SCHEDULE_TOPIC_XXXX", "%25RETRY%25g", "TBW102"):
        error(http.post("/topics", json={"topic": system.replace("%25", "%")}), 403, "NO_PERMISSION")
        error(http.delete(f"/topics/{system}"), 403, "NO_PERMISSION")
    error(http.post("/topics", json={"topic": "adm2", "perm": 9}), 400, "INVALID_ARGUMENT")
    error(http.post("/topics", json={"topic": "adm2", "read_queue_nums": 0}), 400, "INVALID_ARGUMENT")
    error(http.post("/topics", json={"topic": "bad name"}), 400, "TOPIC_ILLEGAL")
    error(http.post("/topics", json={"read_queue_nums": 1}), 400, "INVALID_ARGUMENT")
    error(http.get("/topics/adm2"), 404, "TOPIC_NOT_EXIST")
    ok(http.post("/consumers/cg-adm/offsets", json={"offsets": [{"topic": "adm", "queue_id": 1, "offset": 1}]}))
    assert ok(http.delete("/topics/adm")) == {"topic": "adm", "deleted": True}
    assert ok(http.delete("/topics/adm")) == {"topic": "adm", "deleted": False}
    error(http.get("/topics/adm"), 404, "TOPIC_NOT_EXIST")
    assert ok(http.get("/consumers/cg-adm/offsets"))["offsets"] == {}  # its offsets went with it


# -- clients, groups, rebalance notices -------------------------------------------------------

def heartbeat(client_id: str, group: str = "cg1", *topics: str) -> dict[str, Any]:
    return {"client_id": client_id, "producer_groups": ["pg1"],
            "consumers": [{"group": group, "consume_type": "PUSH", "message_model": "CLUSTERING",
                           "consume_from_where": "CONSUME_FROM_LAST_OFFSET",
                           "subscriptions": [{"topic": t, "expression": "*", "type": "TAG"} for t in topics]}]}


def test_heartbeats_groups_and_change_polls(http: httpx.Client, shared: ThreadServer) -> None:
    assert ok(http.post("/clients/heartbeat", json=heartbeat("host@1@a", "cg1", "t1"))) == {
        "groups": {"cg1": {"version": 1}}}
    assert ok(http.post("/clients/heartbeat", json=heartbeat("host@1@a", "cg1", "t1")))["groups"]["cg1"] == {
        "version": 1}
    assert "cg1" in ok(http.get("/consumers"))["groups"]
    info = ok(http.get("/consumers/cg1"))
    assert info == {"group": "cg1", "version": 1, "members": ["host@1@a"], "message_model": "CLUSTERING",
                    "consume_type": "PUSH", "consume_from_where": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptions": [{"topic": "t1", "expression": "*", "type": "TAG"}],
                    "clients": [{"client_id": "host@1@a", "consume_type": "PUSH", "message_model": "CLUSTERING",
                                 "held_queues": []}]}
    assert ok(http.get("/topics/%25RETRY%25cg1"))["read_queue_nums"] == 1  # the retry topic came with it
    assert ok(http.get("/consumers/nobody")) == {"group": "nobody", "version": 0, "members": [],
                                                  "message_model": None, "consume_type": None,
                                                  "consume_from_where": None, "subscriptions": [], "clients": []}
    # A different version answers at once; the same one is held until a member joins.
    assert ok(http.get("/consumers/cg1/changes", params={"version": 0, "wait_ms": 10_000})) == {
        "version": 1, "members": ["host@1@a"]}
    result: dict[str, Any] = {}

    def poll() -> None:
        with httpx.Client(base_url=shared.url, timeout=30) as other:
            result["body"] = ok(other.get("/consumers/cg1/changes", params={"version": 1, "wait_ms": 20_000}))

    thread = threading.Thread(target=poll)
    thread.start()
    wait_until(lambda: shared.broker.clients._waiters.waiting("cg1"), 10, "the change poll to be held", interval=0.005)
    ok(http.post("/clients/heartbeat", json=heartbeat("host@2@b", "cg1", "t1")))
    thread.join(20)
    assert result["body"] == {"version": 2, "members": ["host@1@a", "host@2@b"]}
    assert ok(http.get("/consumers/cg1/changes", params={"version": 2, "wait_ms": 100}))["version"] == 2
    leaving = {"client_id": "host@2@b", "producer_groups": ["pg1"], "consumer_groups": ["cg1"]}
    assert ok(http.post("/clients/unregister", json=leaving)) == {"groups": {"cg1": {"version": 3}}}
    assert ok(http.get("/consumers/cg1"))["members"] == ["host@1@a"]
    error(http.post("/clients/heartbeat", json={"client_id": ""}), 400, "INVALID_ARGUMENT")
    error(http.post("/clients/heartbeat", json=heartbeat("c", "bad group")), 400, "GROUP_ILLEGAL")
    bad_model = heartbeat("c", "cg9")
    bad_model["consumers"][0]["message_model"] = "BOTH"
    error(http.post("/clients/heartbeat", json=bad_model), 400, "INVALID_ARGUMENT")
    error(http.get("/consumers/cg1/changes", params={"wait_ms": -1}), 400, "INVALID_ARGUMENT")
    assert "cg9" not in ok(http.get("/consumers"))["groups"]


# -- consumer offsets -------------------------------------------------------------------------

def test_offsets_commit_query_lag_and_pull_ride_along(http: httpx.Client) -> None:
    ok(http.post("/topics", json={"topic": "o1", "read_queue_nums": 2, "write_queue_nums": 2}))
    for q in (0, 0, 0, 1):
        ok(http.post("/topics/o1/messages", json={"body": "x", "queue_id": q}))
    body = {"offsets": [{"topic": "o1", "queue_id": 0, "offset": 2}, {"topic": "o1", "queue_id": 1, "offset": 1}]}
    assert ok(http.post("/consumers/og/offsets", json=body)) == {"committed": 2}
    assert ok(http.get("/consumers/og/offsets")) == {"group": "og", "offsets": {"o1": {"0": 2, "1": 1}}}
    assert ok(http.get("/consumers/og/offsets", params={"topic": "o1"}))["offsets"] == {"o1": {"0": 2, "1": 1}}
    assert ok(http.get("/consumers/og/offsets/o1/0")) == {"offset": 2}
    assert ok(http.get("/consumers/other/offsets/o1/0")) == {"offset": -1}
    lag = ok(http.get("/consumers/og/lag"))
    assert lag["group"] == "og" and lag["total_lag"] == 1
    assert lag["queues"] == [
        {"topic": "o1", "queue_id": 0, "broker_offset": 3, "consumer_offset": 2, "lag": 1},
        {"topic": "o1", "queue_id": 1, "broker_offset": 1, "consumer_offset": 1, "lag": 0}]
    assert ok(http.get("/consumers/og/lag", params={"topic": "o1"}))["total_lag"] == 1
    # The pull's commit ride-along.
    pulled = ok(http.get("/topics/o1/queues/0/messages", params={"offset": 2, "group": "og", "commit_offset": 3}))
    assert len(pulled["messages"]) == 1 and ok(http.get("/consumers/og/offsets/o1/0")) == {"offset": 3}
    # One bad entry: nothing is committed.
    for bad, status, code in [
        ({"topic": "o1", "queue_id": 0, "offset": -1}, 400, "OFFSET_ILLEGAL"),
        ({"topic": "o1", "queue_id": 5, "offset": 1}, 400, "QUEUE_ID_ILLEGAL"),
        ({"topic": "nope", "queue_id": 0, "offset": 1}, 404, "TOPIC_NOT_EXIST"),
        ({"topic": "o1", "queue_id": 0}, 400, "INVALID_ARGUMENT"),
    ]:
        entries = {"offsets": [{"topic": "o1", "queue_id": 1, "offset": 0}, bad]}
        error(http.post("/consumers/og/offsets", json=entries), status, code)
    error(http.post("/consumers/bad%20group/offsets", json=body), 400, "GROUP_ILLEGAL")
    error(http.get("/topics/o1/queues/0/messages", params={"group": "og", "commit_offset": -2}), 400, "OFFSET_ILLEGAL")
    assert ok(http.get("/consumers/og/offsets"))["offsets"] == {"o1": {"0": 3, "1": 1}}
    error(http.get("/consumers/og/lag", params={"topic": "nope"}), 404, "TOPIC_NOT_EXIST")


def test_offsets_persist_to_delta_and_reload_after_restart(serve_broker, tmp_path: Path) -> None:
    data_dir = tmp_path / "restart"
    first = serve_broker(data_dir, offset_persist_interval_s=60)
    with httpx.Client(base_url=first.url, timeout=30) as http:
        ok(http.post("/topics", json={"topic": "r1", "read_queue_nums": 2, "write_queue_nums": 2}))
        ok(http.post("/topics/r1/messages", json={"body": "x", "queue_id": 1}))
        ok(http.post("/consumers/rg/offsets", json={"offsets": [{"topic": "r1", "queue_id": 1, "offset": 1}]}))
    first.stop()  # shutdown persists even though the interval (60 s) never came
    rows = DeltaTable(str(data_dir / "lake" / "consumer_offsets")).to_pyarrow_table().to_pylist()
    assert [(r["broker"], r["group"], r["topic"], r["queue_id"], r["offset"]) for r in rows] == [
        ("broker-a", "rg", "r1", 1, 1)]
    second = serve_broker(data_dir)
    with httpx.Client(base_url=second.url, timeout=30) as http:
        assert ok(http.get("/consumers/rg/offsets/r1/1")) == {"offset": 1}
        assert ok(http.get("/topics/r1"))["read_queue_nums"] == 2  # the topic table came back too
        assert len(ok(http.get("/topics/r1/queues/1/messages"))["messages"]) == 1


# -- locks, messages, broker, health, metrics -------------------------------------------------

def test_queue_locks_over_http(http: httpx.Client) -> None:
    queues = [{"topic": "lk", "queue_id": 0}, {"topic": "lk", "queue_id": 1}]
    assert ok(http.post("/locks/lock", json={"group": "lg", "client_id": "c1", "queues": queues})) == {
        "locked": queues}
    assert ok(http.post("/locks/lock", json={"group": "lg", "client_id": "c2", "queues": queues})) == {"locked": []}
    assert ok(http.post("/locks/unlock", json={"group": "lg", "client_id": "c2", "queues": queues})) == {
        "unlocked": []}
    assert ok(http.post("/locks/unlock", json={"group": "lg", "client_id": "c1", "queues": queues[:1]})) == {
        "unlocked": queues[:1]}
    assert ok(http.post("/locks/lock", json={"group": "lg", "client_id": "c2", "queues": queues})) == {
        "locked": queues[:1]}
    error(http.post("/locks/lock", json={"group": "lg", "client_id": "c1", "queues": [{"topic": "lk",
                                                                                       "queue_id": -1}]}),
          400, "QUEUE_ID_ILLEGAL")
    error(http.post("/locks/lock", json={"group": "lg", "queues": []}), 400, "INVALID_ARGUMENT")


def test_message_by_offset_msg_id(http: httpx.Client, shared: ThreadServer) -> None:
    sent = ok(http.post("/topics/m1/messages", json={"body": "find me", "keys": ["k"]}))
    found = ok(http.get(f"/messages/{sent['offset_msg_id']}"))
    assert base64.b64decode(found["body"]) == b"find me" and found["msg_id"] == sent["msg_id"]
    assert found["queue_offset"] == sent["queue_offset"] and found["topic"] == "m1"
    error(http.get("/messages/xyz"), 400, "MESSAGE_ID_ILLEGAL")
    prefix = sent["offset_msg_id"][:16]
    error(http.get(f"/messages/{prefix}{(1 << 40):016X}"), 404, "MESSAGE_NOT_FOUND")
    error(http.get(f"/messages/0A0000010000270F{0:016X}"), 404, "MESSAGE_NOT_FOUND")  # another store host


def test_broker_info_health_and_metrics(http: httpx.Client, shared: ThreadServer) -> None:
    ok(http.post("/topics/mt/messages", json={"body": "12345"}))
    ok(http.post("/consumers/mg/offsets", json={"offsets": [{"topic": "mt", "queue_id": 0, "offset": 0}]}))
    ok(http.get("/topics/mt/queues/0/messages", params={"group": "mg"}))
    info = ok(http.get("/broker"))
    assert info["cluster"] == "DefaultCluster" and info["broker_name"] == "broker-a" and info["broker_id"] == 0
    assert info["addr"] == shared.service.config.addr and info["role"] == "ASYNC_MASTER"
    assert info["namesrv_addrs"] == [] and info["topics"] >= 5 and info["clients"] >= 0
    assert info["commitlog"]["max_offset"] > 0 and info["commitlog"]["min_offset"] == 0
    # The console's cluster page: the version and the store's file system.
    from sparkmq import __version__

    assert info["version"] == __version__
    disk = info["disk"]
    assert disk["total_bytes"] > 0 and 0 <= disk["free_bytes"] <= disk["total_bytes"]
    assert 0 < disk["used_bytes"] <= disk["total_bytes"] and disk["path"].endswith("store")
    health = ok(http.get("/health"))
    assert health["status"] == "ok" and health["store"]["ok"] and health["offsets"]["ok"]
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'sparkmq_messages_sent_total{topic="mt"} 1.0' in text
    assert 'sparkmq_bytes_sent_total{topic="mt"} 5.0' in text
    assert "sparkmq_messages_pulled_total{" in text and "sparkmq_bytes_pulled_total{" in text
    assert "sparkmq_send_latency_seconds_count" in text and "sparkmq_pull_latency_seconds_count" in text
    clog = next(line for line in text.splitlines() if line.startswith("sparkmq_commitlog_max_offset "))
    assert float(clog.split()[1]) > 0
    assert 'sparkmq_queue_max_offset{queue_id="0",topic="mt"}' in text
    lag = [line for line in text.splitlines() if line.startswith('sparkmq_group_lag{group="mg",topic="mt"}')]
    assert lag and float(lag[0].split()[1]) >= 1
    assert ok(http.get("/openapi.json"))["info"]["title"] == "sparkmq broker"


def test_auto_create_off_and_slave_and_sync_master(serve_broker, tmp_path: Path) -> None:
    off = serve_broker(tmp_path / "off", auto_create_topic=False)
    with httpx.Client(base_url=off.url, timeout=30) as http:
        error(http.post("/topics/fresh/messages", json={"body": "x"}), 404, "TOPIC_NOT_EXIST")
        ok(http.post("/topics", json={"topic": "fresh", "read_queue_nums": 1, "write_queue_nums": 1}))
        assert ok(http.post("/topics/fresh/messages", json={"body": "x"}))["status"] == "SEND_OK"
        assert "TBW102" not in {t["topic"] for t in ok(http.get("/topics"))["topics"]}
    sync = serve_broker(tmp_path / "sync", role="SYNC_MASTER", store={**SMALL_STORE, "flush_mode": "SYNC_FLUSH"})
    with httpx.Client(base_url=sync.url, timeout=30) as http:
        # Stored and flushed, but no slave exists to acknowledge it.
        assert ok(http.post("/topics/t/messages", json={"body": "x"}))["status"] == "SLAVE_NOT_AVAILABLE"
        assert ok(http.post("/topics/t/batch", json={"messages": [{"body": "x"}]}))["status"] == "SLAVE_NOT_AVAILABLE"
    slave = serve_broker(tmp_path / "slave", role="SLAVE", broker_id=1)
    with httpx.Client(base_url=slave.url, timeout=30) as http:
        error(http.post("/topics/t/messages", json={"body": "x"}), 503, "SERVICE_NOT_AVAILABLE")


def test_shutdown_releases_held_pulls_and_refuses_work(serve_broker, tmp_path: Path) -> None:
    server = serve_broker(tmp_path / "stopping")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        ok(http.post("/topics", json={"topic": "h", "read_queue_nums": 1, "write_queue_nums": 1}))
        result: dict[str, Any] = {}

        def pull() -> None:
            with httpx.Client(base_url=server.url, timeout=30) as other:
                result["body"] = ok(other.get("/topics/h/queues/0/messages", params={"wait_ms": 15_000}))

        thread = threading.Thread(target=pull)
        thread.start()
        wait_until(lambda: server.broker.holds.held(), 10, "the pull to be held", interval=0.005)
        started = time.monotonic()
        server.stop()
        thread.join(20)
        assert result["body"]["status"] == "NO_MATCHED_QUEUE"
        assert time.monotonic() - started < 10  # released at once, not after the 15 s hold
        assert not server.broker.running


def test_a_query_by_key_without_the_lake_says_where_the_index_lives(http: httpx.Client) -> None:
    # The key index is the lake's message_keys table: without it the answer is a stable error, never an empty
    # success for a key that may well exist.
    ok(http.post("/topics/NoLake/messages", json={"body": "hello", "keys": ["k-1"]}))
    answer = error(http.get("/query/messages", params={"topic": "NoLake", "key": "k-1"}), 503, "LAKE_NOT_AVAILABLE")
    assert "message_keys" in answer["message"]
    error(http.get("/query/messages", params={"msg_id": "00AA"}), 503, "LAKE_NOT_AVAILABLE")
