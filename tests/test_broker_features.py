"""Broker side of issue 4 over HTTP: filters, delay and timer messages, retry/DLQ, transactions, offset reset.

One broker (uvicorn in a thread on 127.0.0.1, port 0) with test-sized timings: delay
levels ``200ms 400ms 600ms``, transaction checks after 0.5 s, every 0.5 s, at most 3.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_broker_app import SMALL_STORE, ThreadServer

from procs import wait_until
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.broker.processors import OutgoingMessage
from sparkmq.platform.common.filtering import SqlFilter
from sparkmq.platform.common.wire import decode_body

_names = itertools.count()


def fresh(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}{next(_names)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    config = BrokerConfig(host="127.0.0.1", port=0, data_dir=tmp_path_factory.mktemp("features"),
                          store={**SMALL_STORE, "segment_size": 8 << 20}, long_polling_max_ms=10_000,
                          message_delay_level="200ms 400ms 600ms", timer_max_delay_s=60.0,
                          transaction_check_first_s=0.5, transaction_check_interval_s=0.5, transaction_check_max=3,
                          trace_enabled=False)  # these tests compare commit-log ends: no background trace writes
    srv = ThreadServer(config).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code, body
    return body


def max_offsets(http: httpx.Client, topic: str) -> list[int]:
    stats = http.get(f"/topics/{topic}/stats")
    return [] if stats.status_code == 404 else [q["max_offset"] for q in ok(stats)["queues"]]


def pull_all(http: httpx.Client, topic: str, queue_id: int = 0, **params: Any) -> list[dict[str, Any]]:
    """Every message of a queue the filter lets through, following next_offset to the end."""
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        got = ok(http.get(f"/topics/{topic}/queues/{queue_id}/messages",
                          params={"offset": offset, "max": 32, **params}))
        out.extend(got["messages"])
        if got["status"] in ("NO_NEW_MSG", "NO_MATCHED_QUEUE") or got["next_offset"] >= got["max_offset"] \
                and got["status"] != "FOUND":
            return out
        if got["next_offset"] >= got["max_offset"]:
            return out
        offset = got["next_offset"]


# -- filters ----------------------------------------------------------------------------------

EXPRESSIONS = [
    "a > 5", "a BETWEEN 3 AND 9", "region IN ('eu', 'us')", "region IS NULL", "a IS NOT NULL AND region = 'eu'",
    "NOT (a < 10)", "flag = TRUE", "name STARTSWITH 'ab'", "name CONTAINS 'b' OR a <= 2",
    "region <> 'asia' AND NOT a = 7", "TAGS = 'T1'",
]
_prop_values = {
    "a": st.one_of(st.integers(-3, 15).map(str), st.sampled_from(["x", "2.5"])),
    "region": st.sampled_from(["eu", "us", "asia"]),
    "flag": st.sampled_from(["true", "false", "TRUE"]),
    "name": st.sampled_from(["abc", "bcd", "ab", "zz"]),
}
_props = st.fixed_dictionaries({}, optional=_prop_values)
_messages = st.lists(st.tuples(_props, st.sampled_from([None, "T1", "T2"])), min_size=1, max_size=60)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=_messages, expression=st.sampled_from(EXPRESSIONS))
def test_sql92_pull_delivers_exactly_the_matching_messages(server: ThreadServer, messages, expression) -> None:
    topic = fresh("Sql")
    batch = [OutgoingMessage(f"m{i}".encode(), tags, properties=props) for i, (props, tags) in enumerate(messages)]
    sent = server.broker.send_processor.send_batch(topic, batch, queue_id=0)
    compiled = SqlFilter.compile(expression)
    expected = [sent.results[i].msg_id for i, (props, tags) in enumerate(messages)
                if compiled.matches({**props, **({"TAGS": tags} if tags else {})})]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        got = pull_all(http, topic, filter_type="SQL92", expression=expression)
    assert [m["msg_id"] for m in got] == expected


def test_sql_filter_scans_past_long_non_matching_runs(http: httpx.Client, server: ThreadServer) -> None:
    topic = fresh("SqlRun")
    batch = [OutgoingMessage(b"x", properties={"n": str(i)}) for i in range(3000)]
    server.broker.send_processor.send_batch(topic, batch, queue_id=0)
    got = ok(http.get(f"/topics/{topic}/queues/0/messages",
                      params={"filter_type": "SQL92", "expression": "n = '2999' OR n = '2998'"}))
    assert got["status"] == "FOUND" and [m["properties"]["n"] for m in got["messages"]] == ["2998", "2999"]
    got = ok(http.get(f"/topics/{topic}/queues/0/messages", params={"filter_type": "SQL92", "expression": "n = 'z'"}))
    assert got["status"] == "NO_MATCHED_MSG" and got["next_offset"] == 3000 and got["messages"] == []


def test_tag_pull_delivers_exactly_the_matching_tags(http: httpx.Client, server: ThreadServer) -> None:
    topic = fresh("Tags")
    tags = ["A", "B", "C", None] * 30
    sent = server.broker.send_processor.send_batch(topic, [OutgoingMessage(b"x", t) for t in tags], queue_id=0)
    got = pull_all(http, topic, tags="A || C")
    assert [m["msg_id"] for m in got] == [r.msg_id for r, t in zip(sent.results, tags, strict=True) if t in ("A", "C")]


def test_long_poll_with_sql_filter_wakes_on_a_matching_arrival(http: httpx.Client, server: ThreadServer) -> None:
    topic = fresh("SqlPoll")
    server.broker.send_processor.send(topic, OutgoingMessage(b"no", properties={"k": "0"}), queue_id=0)
    result: dict[str, Any] = {}

    def pull() -> None:
        params = {"offset": 1, "wait_ms": 8000, "filter_type": "SQL92", "expression": "k = '1'"}
        result["r"] = ok(http.get(f"/topics/{topic}/queues/0/messages", params=params))

    thread = threading.Thread(target=pull)
    started = time.monotonic()
    thread.start()
    time.sleep(0.3)
    server.broker.send_processor.send(topic, OutgoingMessage(b"yes", properties={"k": "1"}), queue_id=0)
    thread.join(10)
    assert time.monotonic() - started < 5
    assert [decode_body(m["body"]) for m in result["r"]["messages"]] == [b"yes"]


def test_bad_expressions_are_refused_with_their_position(http: httpx.Client) -> None:
    topic = fresh("Bad")
    ok(http.post(f"/topics/{topic}/messages", json={"body": "x"}))
    before = max_offsets(http, topic)
    body = error(http.get(f"/topics/{topic}/queues/0/messages",
                          params={"filter_type": "SQL92", "expression": "a > AND b"}), 400, "FILTER_EXPRESSION_ILLEGAL")
    assert "position" in body["message"] and "column" in body["message"]
    error(http.get(f"/topics/{topic}/queues/0/messages", params={"filter_type": "XPATH", "expression": "a"}),
          400, "FILTER_EXPRESSION_ILLEGAL")
    error(http.get(f"/topics/{topic}/queues/0/messages", params={"tags": "A ||"}), 400, "FILTER_EXPRESSION_ILLEGAL")
    group = fresh("badgrp")
    hb = {"client_id": "c1", "consumers": [{"group": group, "subscriptions": [
        {"topic": topic, "expression": "*", "type": "TAG"},
        {"topic": fresh("Other"), "expression": "region IN ('eu'", "type": "SQL92"}]}]}
    body = error(http.post("/clients/heartbeat", json=hb), 400, "FILTER_EXPRESSION_ILLEGAL")
    assert "position" in body["message"]
    info = ok(http.get(f"/consumers/{group}"))
    assert info["members"] == [] and info["version"] == 0
    assert http.get(f"/topics/%25RETRY%25{group}").status_code == 404
    assert max_offsets(http, topic) == before
    hb["consumers"][0]["subscriptions"][1]["expression"] = "region IN ('eu')"
    assert ok(http.post("/clients/heartbeat", json=hb))["groups"][group]["version"] == 1


# -- delay levels and timers -----------------------------------------------------------------

def test_delay_levels_deliver_no_earlier_than_due(http: httpx.Client) -> None:
    topic = fresh("Delay")
    sent = {}
    for level in (1, 2, 3):
        at = int(time.time() * 1000)
        r = ok(http.post(f"/topics/{topic}/messages", json={"body": f"L{level}", "queue_id": 0, "delay_level": level}))
        assert r["topic"] == topic and r["queue_id"] == level - 1
        sent[r["msg_id"]] = at + (200 * level)
    # The DELAY property works as well.
    at = int(time.time() * 1000)
    r = ok(http.post(f"/topics/{topic}/messages", json={"body": "P", "queue_id": 0, "properties": {"DELAY": "2"}}))
    sent[r["msg_id"]] = at + 400
    assert max_offsets(http, topic)[0] == 0
    got = wait_until(lambda: (m := pull_all(http, topic)) and len(m) == 4 and m, 15, "delayed messages")
    for m in got:
        assert m["store_timestamp"] >= sent[m["msg_id"]], m
        assert m["store_timestamp"] - sent[m["msg_id"]] < 1500
        # the delivered copy keeps its level as RocketMQ's does, not where it was parked
        assert m["properties"]["DELAY"] in ("1", "2", "3") and "REAL_TOPIC" not in m["properties"]


def test_bad_delays_are_refused_and_store_nothing(http: httpx.Client, server: ThreadServer) -> None:
    topic = fresh("BadDelay")
    ok(http.post(f"/topics/{topic}/messages", json={"body": "x"}))
    before = (max_offsets(http, topic), server.broker.store.commit_log.max_offset)
    for extra in ({"delay_level": 4}, {"delay_level": -1}, {"delay_ms": 61_000}, {"delay_ms": -5},
                  {"deliver_at_ms": int(time.time() * 1000) + 120_000}, {"properties": {"TIMER_DELAY_SEC": "999"}},
                  {"properties": {"DELAY": "x"}}, {"delay_level": 1, "delay_ms": 10}):
        error(http.post(f"/topics/{topic}/messages", json={"body": "x", **extra}), 400, "INVALID_ARGUMENT")
    assert (max_offsets(http, topic), server.broker.store.commit_log.max_offset) == before


def test_timers_p99_lateness_over_1000_timers(http: httpx.Client, server: ThreadServer) -> None:
    topic = fresh("Timers")
    broker = server.broker
    due: dict[str, int] = {}
    base = int(time.time() * 1000) + 1000
    for i in range(1000):
        at = base + (i * 7919) % 3000  # spread over 3 s, not in send order
        r = broker.send_processor.send(topic, OutgoingMessage(b"t%d" % i), queue_id=i % 4, deliver_at_ms=at)
        due[r.msg_id] = at
    got: dict[str, int] = {}

    def collect() -> bool:
        for q in range(4):
            for m in pull_all(http, topic, q):
                got[m["msg_id"]] = m["store_timestamp"]
        return len(got) == 1000

    wait_until(collect, 30, "1000 timers")
    lateness = sorted(got[i] - due[i] for i in due)
    assert lateness[0] >= 0, "a timer fired early"
    p99 = lateness[int(len(lateness) * 0.99) - 1]
    print(f"timer lateness over 1000 timers: p50={lateness[500]} ms p99={p99} ms max={lateness[-1]} ms")
    assert p99 <= 1500


def test_a_recalled_timer_never_arrives(http: httpx.Client) -> None:
    topic = fresh("Recall")
    keep = ok(http.post(f"/topics/{topic}/messages", json={"body": "keep", "queue_id": 0, "delay_ms": 600}))
    drop = ok(http.post(f"/topics/{topic}/messages", json={"body": "drop", "queue_id": 0,
                                                           "properties": {"TIMER_DELAY_SEC": "0.6"}}))
    assert keep["queue_id"] == drop["queue_id"] == 0  # the timer topic's queue
    assert ok(http.delete(f"/timers/{drop['msg_id']}")) == {"msg_id": drop["msg_id"], "recalled": True}
    assert ok(http.delete(f"/timers/{drop['msg_id']}"))["recalled"] is False
    assert ok(http.delete("/timers/UNKNOWN0000"))["recalled"] is False
    got = wait_until(lambda: pull_all(http, topic), 15, "the kept timer")
    time.sleep(1.0)
    got = pull_all(http, topic)
    assert [m["msg_id"] for m in got] == [keep["msg_id"]]
    assert ok(http.delete(f"/timers/{keep['msg_id']}"))["recalled"] is False  # fired


def test_delayed_batch_parks_each_message(http: httpx.Client) -> None:
    topic = fresh("DelayBatch")
    r = ok(http.post(f"/topics/{topic}/batch", params={"queue_id": 1, "delay_level": 1},
                     json={"messages": [{"body": "a"}, {"body": "b"}]}))
    assert len(r["results"]) == 2 and max_offsets(http, topic)[1] == 0
    got = wait_until(lambda: (m := pull_all(http, topic, 1)) and len(m) == 2 and m, 15, "the batch")
    assert [decode_body(m["body"]) for m in got] == [b"a", b"b"]


# -- retry and dead letters ------------------------------------------------------------------

def _join(http: httpx.Client, group: str, topic: str, model: str = "CLUSTERING") -> None:
    ok(http.post("/clients/heartbeat", json={"client_id": f"cli-{group}", "consumers": [
        {"group": group, "message_model": model, "subscriptions": [{"topic": topic, "expression": "*"}]}]}))


def test_send_back_1_plus_16_times_ends_in_the_dlq_and_redrive_brings_it_back(http: httpx.Client) -> None:
    topic, group = fresh("Fail"), fresh("failgrp")
    _join(http, group, topic)
    sent = ok(http.post(f"/topics/{topic}/messages", json={"body": "poison", "queue_id": 0, "tags": "TagX",
                                                           "keys": ["k1"], "properties": {"p": "1"}}))
    message = pull_all(http, topic)[0]
    retry = f"%RETRY%{group}"
    offset = 0
    deliveries = 1
    for attempt in range(16):
        back = ok(http.post(f"/consumers/{group}/send-back",
                            json={"offset_msg_id": message["offset_msg_id"], "delay_level": 1,
                                  "reason": f"boom {attempt}"}))
        assert back["status"] == "RETRY" and back["topic"] == retry and back["reconsume_times"] == attempt + 1
        got = ok(http.get(f"/topics/%25RETRY%25{group}/queues/0/messages",
                          params={"offset": offset, "wait_ms": 5000}))
        assert got["status"] == "FOUND", got
        message = got["messages"][0]
        offset = got["next_offset"]
        deliveries += 1
        assert message["msg_id"] == sent["msg_id"] and message["reconsume_times"] == attempt + 1
        assert message["properties"]["RETRY_TOPIC"] == topic and message["tags"] == "TagX"
        # The retry copy is viewable by its offsetMsgId.
        assert ok(http.get(f"/messages/{message['offset_msg_id']}"))["topic"] == retry
    assert deliveries == 17
    dead = ok(http.post(f"/consumers/{group}/send-back",
                        json={"offset_msg_id": message["offset_msg_id"], "reason": "still broken"}))
    assert dead["status"] == "DLQ" and dead["topic"] == f"%DLQ%{group}" and dead["reconsume_times"] == 17
    dlq = ok(http.get(f"/dlq/{group}"))
    assert len(dlq["messages"]) == 1 and dlq["next_offset"] == 1
    letter = dlq["messages"][0]
    assert letter["msg_id"] == sent["msg_id"] and letter["reconsume_times"] == 17
    props = letter["properties"]
    assert props["DLQ_ORIGIN_TOPIC"] == topic and props["ORIGIN_MESSAGE_ID"] == sent["msg_id"]
    assert props["DLQ_REASON"] == "still broken" and props["p"] == "1"
    config = ok(http.get(f"/topics/%25DLQ%25{group}"))
    assert (config["read_queue_nums"], config["write_queue_nums"], config["perm"]) == (1, 1, 6)
    viewed = ok(http.get(f"/messages/{letter['offset_msg_id']}"))
    assert viewed["topic"] == f"%DLQ%{group}" and viewed["properties"]["DLQ_REASON"] == "still broken"
    # Redrive: back to the original topic, count reset, DLQ properties gone; the DLQ keeps its copy.
    redriven = ok(http.post(f"/dlq/{group}/redrive", json={"msg_ids": [sent["msg_id"]]}))
    assert redriven["redriven"] == 1 and redriven["results"][0]["topic"] == topic
    back = [m for q in range(4) for m in pull_all(http, topic, q) if m["offset_msg_id"] != sent["offset_msg_id"]]
    assert len(back) == 1
    assert back[0]["msg_id"] == sent["msg_id"] and back[0]["reconsume_times"] == 0 and back[0]["tags"] == "TagX"
    assert back[0]["keys"] == ["k1"] and back[0]["properties"]["p"] == "1"
    assert not {"DLQ_ORIGIN_TOPIC", "DLQ_REASON", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID"} & set(back[0]["properties"])
    assert len(ok(http.get(f"/dlq/{group}"))["messages"]) == 1
    assert ok(http.post(f"/dlq/{group}/redrive", json={"all": True, "topic": "Nope"}))["redriven"] == 0
    assert ok(http.post(f"/dlq/{group}/redrive", json={"all": True}))["redriven"] == 1


def test_send_back_default_level_straight_to_dlq_and_refusals(http: httpx.Client, server: ThreadServer) -> None:
    topic, group = fresh("Back"), fresh("backgrp")
    _join(http, group, topic)
    sent = ok(http.post(f"/topics/{topic}/messages", json={"body": "m", "queue_id": 0}))
    back = ok(http.post(f"/consumers/{group}/send-back", json={"offset_msg_id": sent["offset_msg_id"]}))
    assert back["delay_level"] == 3  # 3 + 0, within the test-sized levels
    dead = ok(http.post(f"/consumers/{group}/send-back", json={"offset_msg_id": sent["offset_msg_id"],
                                                               "delay_level": -1, "reason": "bad"}))
    assert dead["status"] == "DLQ"
    assert ok(http.get(f"/dlq/{fresh('nobody')}"))["messages"] == []
    bgroup = fresh("bcast")
    _join(http, bgroup, topic, "BROADCASTING")
    before = server.broker.store.commit_log.max_offset
    error(http.post(f"/consumers/{bgroup}/send-back", json={"offset_msg_id": sent["offset_msg_id"]}),
          400, "INVALID_ARGUMENT")
    error(http.post(f"/consumers/{group}/send-back", json={"offset_msg_id": "zz"}), 400, "MESSAGE_ID_ILLEGAL")
    error(http.post(f"/dlq/{group}/redrive", json={}), 400, "INVALID_ARGUMENT")
    assert server.broker.store.commit_log.max_offset == before


# -- transactions ----------------------------------------------------------------------------

def test_commit_is_visible_rollback_never_unknown_ids_refused(http: httpx.Client, server: ThreadServer) -> None:
    topic = fresh("Tx")
    a = ok(http.post(f"/topics/{topic}/half", json={"body": "a", "queue_id": 0, "producer_group": "txpg"}))
    b = ok(http.post(f"/topics/{topic}/half", json={"body": "b", "queue_id": 0, "producer_group": "txpg"}))
    assert a["transaction_id"] == a["msg_id"] and pull_all(http, topic) == []
    committed = ok(http.post(f"/transactions/{a['transaction_id']}", json={"producer_group": "txpg",
                                                                          "action": "COMMIT"}))
    assert committed["action"] == "COMMIT" and committed["send_result"]["topic"] == topic
    rolled = ok(http.post(f"/transactions/{b['transaction_id']}", json={"producer_group": "txpg",
                                                                       "action": "ROLLBACK"}))
    assert rolled["send_result"] is None
    got = pull_all(http, topic)
    assert [decode_body(m["body"]) for m in got] == [b"a"] and got[0]["msg_id"] == a["msg_id"]
    before = server.broker.store.commit_log.max_offset
    for tx in (b["transaction_id"], a["transaction_id"], "F" * 32):
        error(http.post(f"/transactions/{tx}", json={"producer_group": "txpg", "action": "COMMIT"}),
              404, "TRANSACTION_NOT_FOUND")
    error(http.post(f"/topics/{topic}/half", json={"body": "c"}), 400, "INVALID_ARGUMENT")
    assert server.broker.store.commit_log.max_offset == before
    time.sleep(1.2)  # no check-back for what was settled
    assert [decode_body(m["body"]) for m in pull_all(http, topic)] == [b"a"]


def test_a_check_reaches_a_long_polling_producer_and_its_answer_applies(http: httpx.Client) -> None:
    topic, group = fresh("TxCheck"), fresh("pgcheck")
    half = ok(http.post(f"/topics/{topic}/half", json={"body": "c", "queue_id": 0, "producer_group": group,
                                                       "properties": {"order": "7"}}))
    started = time.monotonic()
    checks = ok(http.get("/transactions/checks", params={"producer_group": group, "client_id": "p1",
                                                         "wait_ms": 5000}))["checks"]
    assert time.monotonic() - started < 4
    assert [c["transaction_id"] for c in checks] == [half["transaction_id"]]
    assert checks[0]["topic"] == topic and checks[0]["properties"]["order"] == "7"
    assert decode_body(checks[0]["body"]) == b"c" and checks[0]["check_times"] >= 1
    ok(http.post(f"/transactions/{half['transaction_id']}",
                 json={"producer_group": group, "action": "COMMIT", "from_check": True}))
    assert [m["msg_id"] for m in pull_all(http, topic)] == [half["msg_id"]]
    # Nothing more for this group: the poll times out empty.
    assert ok(http.get("/transactions/checks", params={"producer_group": group, "wait_ms": 700}))["checks"] == []


def test_an_unanswered_half_is_discarded_after_max_checks(http: httpx.Client, server: ThreadServer) -> None:
    topic, group = fresh("TxLost"), fresh("pglost")
    half = ok(http.post(f"/topics/{topic}/half", json={"body": "lost", "queue_id": 0, "producer_group": group}))
    tx = server.broker.transactions
    assert tx is not None
    wait_until(lambda: half["transaction_id"] not in tx.open_transactions(), 15, "the discard")
    error(http.post(f"/transactions/{half['transaction_id']}", json={"producer_group": group, "action": "COMMIT"}),
          404, "TRANSACTION_NOT_FOUND")
    assert pull_all(http, topic) == []
    ops = pull_all(http, "RMQ_SYS_TRANS_OP_HALF_TOPIC")
    assert "DISCARD" in {m["tags"] for m in ops}


# -- offset reset ----------------------------------------------------------------------------

def test_reset_by_time_and_by_offset_moves_the_version(http: httpx.Client) -> None:
    topic, group = fresh("Reset"), fresh("resetgrp")
    for i in range(5):
        ok(http.post(f"/topics/{topic}/messages", json={"body": f"early{i}", "queue_id": 0}))
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(3):
        ok(http.post(f"/topics/{topic}/messages", json={"body": f"late{i}", "queue_id": 0}))
    _join(http, group, topic)
    ok(http.post(f"/consumers/{group}/offsets", json={"offsets": [{"topic": topic, "queue_id": 0, "offset": 8}]}))
    version = ok(http.get(f"/consumers/{group}"))["version"]
    reset = ok(http.post(f"/consumers/{group}/offsets/reset", json={"topic": topic, "timestamp": middle}))
    assert reset["offsets"]["0"] == 5 and reset["offsets"]["1"] == 0
    assert ok(http.get(f"/consumers/{group}/offsets/{topic}/0"))["offset"] == 5
    changed = ok(http.get(f"/consumers/{group}/changes", params={"version": version, "wait_ms": 100}))
    assert changed["version"] > version and changed["members"] == [f"cli-{group}"]
    reset = ok(http.post(f"/consumers/{group}/offsets/reset", json={"topic": topic, "offsets": {"0": 2}}))
    assert reset["offsets"] == {"0": 2}
    assert ok(http.get(f"/consumers/{group}/offsets/{topic}/0"))["offset"] == 2


def test_a_reset_survives_a_stale_commit_and_sends_the_groups_pulls_to_the_new_offset(http: httpx.Client) -> None:
    """The fence: a commit of the old progress after a reset is ignored; the group's pull elsewhere (a held one
    too) answers OFFSET_RESET; a pull at the reset offset takes the reset up, and commits count again."""
    topic, group = fresh("ResetFence"), fresh("fencegrp")
    for i in range(8):
        ok(http.post(f"/topics/{topic}/messages", json={"body": f"m{i}", "queue_id": 0}))
    _join(http, group, topic)

    def commit(offset: int) -> int:
        entry = {"topic": topic, "queue_id": 0, "offset": offset}
        return ok(http.post(f"/consumers/{group}/offsets", json={"offsets": [entry]}))["committed"]

    def pull(offset: int, **params: Any) -> dict[str, Any]:
        return ok(http.get(f"/topics/{topic}/queues/0/messages", params={"offset": offset, "group": group, **params}))

    assert commit(8) == 1
    held: dict[str, Any] = {}
    holder = threading.Thread(target=lambda: held.update(pull(8, wait_ms=8000, max=4)))
    holder.start()                                  # the consumer's long poll at the end of the queue
    time.sleep(0.3)
    began = time.monotonic()
    ok(http.post(f"/consumers/{group}/offsets/reset", json={"topic": topic, "offsets": {"0": 3}}))
    assert commit(8) == 0                           # its periodic commit of the old progress, in flight
    assert ok(http.get(f"/consumers/{group}/offsets/{topic}/0"))["offset"] == 3
    holder.join(10)
    assert time.monotonic() - began < 2.0           # woken by the reset, not by its 8 s deadline
    assert held["status"] == "OFFSET_RESET" and held["next_offset"] == 3 and held["messages"] == []
    again = pull(8)
    assert again["status"] == "OFFSET_RESET" and again["next_offset"] == 3
    assert [decode_body(m["body"]) for m in pull(3, max=2)["messages"]] == [b"m3", b"m4"]  # taken up: served
    assert commit(5) == 1 and ok(http.get(f"/consumers/{group}/offsets/{topic}/0"))["offset"] == 5
    assert pull(8)["status"] == "NO_NEW_MSG"       # no fence left
    assert ok(http.get(f"/topics/{topic}/queues/0/messages", params={"offset": 0}))["status"] == "FOUND"


def test_reset_refusals_change_nothing(http: httpx.Client) -> None:
    topic, group = fresh("ResetBad"), fresh("resetbad")
    ok(http.post(f"/topics/{topic}/messages", json={"body": "x", "queue_id": 0}))
    ok(http.post(f"/consumers/{group}/offsets", json={"offsets": [{"topic": topic, "queue_id": 0, "offset": 1}]}))
    error(http.post(f"/consumers/{fresh('ghost')}/offsets/reset", json={"topic": topic, "timestamp": 0}),
          404, "GROUP_NOT_EXIST")
    error(http.post(f"/consumers/{group}/offsets/reset", json={"topic": topic, "offsets": {"0": 5}}),
          400, "OFFSET_ILLEGAL")
    error(http.post(f"/consumers/{group}/offsets/reset", json={"topic": topic, "offsets": {"0": 0, "9": 0}}),
          400, "QUEUE_ID_ILLEGAL")
    error(http.post(f"/consumers/{group}/offsets/reset", json={"topic": topic}), 400, "INVALID_ARGUMENT")
    error(http.post(f"/consumers/{group}/offsets/reset", json={"topic": "NoSuchTopic", "timestamp": 0}),
          404, "TOPIC_NOT_EXIST")
    assert ok(http.get(f"/consumers/{group}/offsets/{topic}/0"))["offset"] == 1
