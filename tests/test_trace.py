"""Message trace end to end: clients and the broker record events, the trace job writes ``message_trace``,
``GET /trace/{msg_id}``, ``AdminClient.trace`` and ``sparkmq admin trace`` show a message's path.

Real name server + broker processes (delay levels of 100 ms so retries are quick), real clients,
the shared SparkSession for the trace job (``availableNow``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable as RustDeltaTable

from procs import ProcessHarness, ServiceProcess, child_env, wait_until
from sparkmq.pipelines import tables
from sparkmq.pipelines.cluster_io import pull_queue_range
from sparkmq.pipelines.sql import run_sql
from sparkmq.pipelines.trace_job import start_trace_job, trace_app_id, trace_batch, trace_stats
from sparkmq.platform.broker.trace import TraceRecorder, trace_path
from sparkmq.platform.client import AdminClient, ClientConfig, ConsumeStatus, Message, Producer, PushConsumer
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.system_topics import TRACE_TOPIC, retry_topic
from sparkmq.platform.common.trace import TraceEvent, decode_events, decode_trace
from sparkmq.platform.store import PutResult, PutStatus

pytestmark = [pytest.mark.timeout(240)]

FAST_LEVELS = " ".join(["100ms"] * 18)



def start_cluster(procs: ProcessHarness, tmp_path: Path, *extra: str) -> tuple[ServiceProcess, ServiceProcess, Path]:
    data_dir = tmp_path / "broker"
    ns, broker = procs.start_platform(data_dir, "--broker-name", "broker-a", "--message-delay-level", FAST_LEVELS,
                                      "--segment-size", str(8 << 20), *extra)
    return ns, broker, data_dir


def client_config(ns: ServiceProcess, **overrides: Any) -> ClientConfig:
    return ClientConfig(namesrv_addrs=ns.addr, heartbeat_interval_s=0.5, rebalance_interval_s=0.5,
                        route_refresh_interval_s=0.5, offset_commit_interval_s=0.5, long_poll_wait_ms=1000,
                        **overrides)


def consumer(ns: ServiceProcess, group: str, topic: str, listener: Callable[[list], ConsumeStatus],
             **kwargs: Any) -> PushConsumer:
    c = PushConsumer(group, client_config(ns), consume_from_where="CONSUME_FROM_FIRST_OFFSET", **kwargs)
    c.subscribe(topic)
    c.register_listener(listener)
    return c.start()


def run_trace_job(spark: Any, broker: ServiceProcess, data_dir: Path, checkpoint: Path) -> None:
    query = start_trace_job(spark, {"broker-a": broker.addr}, data_dir / "lake", checkpoint,
                            trigger={"availableNow": True})
    query.awaitTermination(120)
    stats = trace_stats(query)
    assert stats is not None and stats.last_error is None


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["event_type"] for e in events]


@pytest.mark.spark
@pytest.mark.cluster
def test_trace_shows_send_store_deliver_consume_and_the_retry_and_dlq_hops(
        procs: ProcessHarness, tmp_path: Path, spark: Any) -> None:
    ns, broker, data_dir = start_cluster(procs, tmp_path)
    http = httpx.Client(base_url=broker.url, timeout=10)
    with Producer("trace-pg", client_config(ns)) as producer:
        producer.send(Message("TraceOk", b"warm-up"))  # creates the topics before the consumers look for routes
        producer.send(Message("TraceBad", b"warm-up"))
        consumed: list[str] = []
        ok = consumer(ns, "ok-group", "TraceOk",
                      lambda ms: consumed.extend(m.msg_id for m in ms) or ConsumeStatus.CONSUME_SUCCESS)
        bad = consumer(ns, "bad-group", "TraceBad", lambda ms: ConsumeStatus.RECONSUME_LATER, max_reconsume_times=2)
        try:
            good_id = producer.send(Message("TraceOk", b"fine", tags="TagA", keys=("order-1",))).msg_id
            bad_id = producer.send(Message("TraceBad", b"poison", tags="TagB")).msg_id
            wait_until(lambda: good_id in consumed, 30, "the good message to be consumed")
            wait_until(lambda: bad.stats["dlq"] >= 2, 60, "both bad messages to reach the DLQ")
        finally:
            ok.shutdown()
            bad.shutdown()
    # A producer with tracing off: the broker still traces the store, the producer sends no 'send' event.
    with Producer("quiet-pg", client_config(ns, trace_enabled=False)) as quiet:
        quiet_id = quiet.send(Message("TraceOk", b"quiet")).msg_id
    wait_until(lambda: http.get("/health").json()["trace"]["buffered"] == 0, 10, "the broker to flush its events")

    run_trace_job(spark, broker, data_dir, tmp_path / "ckpt")

    good = http.get(f"/trace/{good_id}").json()["events"]
    assert types(good) == ["send", "store", "deliver", "consume"], good
    send, store, deliver, consume_ = good
    assert send["status"] == "SEND_OK" and send["group"] == "trace-pg" and send["cost_ms"] >= 0
    assert store["status"] == "STORED" and store["queue_offset"] == send["queue_offset"]
    assert store["tags"] == "TagA" and store["keys"] == "order-1" and store["broker"] == "broker-a"
    assert deliver["group"] == "ok-group" and consume_["group"] == "ok-group"
    assert consume_["status"] == "CONSUME_SUCCESS" and consume_["reconsume_times"] == 0
    assert all(e["elapsed_ms"] >= 0 for e in good) and good[-1]["since_first_ms"] == sum(e["elapsed_ms"] for e in good)

    path = http.get(f"/trace/{bad_id}").json()["events"]
    assert types(path) == ["send", "store", "deliver", "consume",
                           "retry", "store", "deliver", "consume",
                           "retry", "store", "deliver", "consume", "dlq"], types(path)
    consumes = [e for e in path if e["event_type"] == "consume"]
    assert [(e["status"], e["reconsume_times"]) for e in consumes] == [("RECONSUME_LATER", 0),
                                                                      ("RECONSUME_LATER", 1),
                                                                      ("RECONSUME_LATER", 2)]
    retries = [e for e in path if e["event_type"] == "retry"]
    assert [e["reconsume_times"] for e in retries] == [1, 2]
    assert all(e["group"] == "bad-group" and "%RETRY%bad-group" in e["detail"] for e in retries)
    assert [e["topic"] for e in path if e["event_type"] == "store"][1:] == [retry_topic("bad-group")] * 2
    assert path[-1]["status"] == "DLQ" and path[-1]["detail"].startswith("to %DLQ%bad-group")

    # (a pull of the stopped ok-group consumer still held on the broker may hand it out: 'deliver' is fine)
    quiet_path = types(http.get(f"/trace/{quiet_id}").json()["events"])
    assert quiet_path[0] == "store" and "send" not in quiet_path, quiet_path
    assert all(e["topic"] != TRACE_TOPIC for e in good + path)

    # SQL over the table.
    counts = run_sql(spark, data_dir / "lake",
                     f"SELECT event_type, count(*) AS n FROM message_trace WHERE msg_id = '{bad_id}' "
                     "GROUP BY event_type ORDER BY event_type")
    expected = spark.createDataFrame([("consume", 3), ("deliver", 3), ("dlq", 1), ("retry", 2), ("send", 1),
                                      ("store", 3)], counts.schema)
    assert_df_equality(counts, expected)

    # The admin client merges every master; the CLI prints the path (JSON for scripts, a table for people).
    with AdminClient(client_config(ns)) as admin:
        assert admin.trace(bad_id) == path
    out = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", ns.addr, "trace", good_id,
                          "--json"], capture_output=True, text=True, timeout=60, env=child_env())
    assert out.returncode == 0, out.stderr
    assert types(json.loads(out.stdout)) == ["send", "store", "deliver", "consume"]
    table = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", ns.addr, "trace",
                            bad_id], capture_output=True, text=True, timeout=60, env=child_env(COLUMNS="300"))
    assert table.returncode == 0 and "dlq" in table.stdout and "RECONSUME_LATER" in table.stdout, table.stderr

    # A replayed batch adds nothing (Delta's txnAppId/txnVersion): each event exactly once.
    body = pa.table({"body": [b"\n".join(json.dumps(e).encode() for e in (send, store))],
                     "store_timestamp": pa.array([0], pa.timestamp("ms", tz="UTC"))})
    table_path = tables.table_path(data_dir / "lake", tables.MESSAGE_TRACE)
    before = RustDeltaTable(table_path)
    trace_batch(spark, body, 0, data_dir / "lake", "broker-a")
    after = RustDeltaTable(table_path)
    assert after.transaction_version(trace_app_id("other-job")) is None
    trace_batch(spark, body, 10_000, data_dir / "lake", "other-job")
    assert RustDeltaTable(table_path).transaction_version(trace_app_id("other-job")) == 10_000
    assert RustDeltaTable(table_path).to_pyarrow_table().num_rows == after.to_pyarrow_table().num_rows + 2
    assert before.to_pyarrow_table().num_rows == after.to_pyarrow_table().num_rows   # batch 0 was skipped


@pytest.mark.spark
@pytest.mark.cluster
def test_batches_over_remoting_are_traced_by_one_record_each_and_expanded_to_every_message(
        procs: ProcessHarness, tmp_path: Path, spark: Any) -> None:
    ns, broker, data_dir = start_cluster(procs, tmp_path)
    http = httpx.Client(base_url=broker.url, timeout=10)
    all_ids: list[str] = []
    a_ids: list[str] = []
    with Producer("batch-pg", client_config(ns)) as producer:
        producer.send(Message("TraceBatch", b"warm-up", tags="TagB"))  # creates the topic before the consumers
        http_sent = producer.send(Message("TraceHttp", b"pulled over HTTP"))
        everything = consumer(ns, "all-group", "TraceBatch",
                              lambda ms: all_ids.extend(m.msg_id for m in ms) or ConsumeStatus.CONSUME_SUCCESS)
        only_a = PushConsumer("a-group", client_config(ns), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        only_a.subscribe("TraceBatch", "TagA")
        only_a.register_listener(lambda ms: a_ids.extend(m.msg_id for m in ms) or ConsumeStatus.CONSUME_SUCCESS)
        only_a.start()
        try:
            batches = [[Message("TraceBatch", f"{b}-{i}".encode(), tags="TagA" if i % 3 == 0 else "TagB",
                                keys=(f"order-{b}-{i}", f"user-{i % 2}")) for i in range(n)]
                       for b, n in enumerate((10, 7, 12))]
            sent = [(m, r) for batch in batches for m, r in zip(batch, producer.send_batch(batch), strict=True)]
            wanted_a = {r.msg_id for m, r in sent if m.tags == "TagA"}
            wait_until(lambda: {r.msg_id for _m, r in sent} <= set(all_ids) and wanted_a <= set(a_ids), 30,
                       "both groups to consume the batches")
            clients = {"all-group": everything.client_id, "a-group": only_a.client_id}
        finally:
            everything.shutdown()
            only_a.shutdown()
    # The bug: a pull over HTTP names its consumer like one over remoting.
    pulled = http.get(f"/topics/TraceHttp/queues/{http_sent.queue_id}/messages",
                      params={"offset": http_sent.queue_offset, "max": 1, "group": "http-group",
                              "client_id": "http-client-1"}).json()
    assert [m["msg_id"] for m in pulled["messages"]] == [http_sent.msg_id]
    wait_until(lambda: http.get("/health").json()["trace"]["buffered"] == 0, 10, "the broker to flush its events")

    # The broker wrote one record per batch sent (and per pull answered), nothing per message.
    end = http.get(f"/topics/{TRACE_TOPIC}/stats").json()["queues"][0]["max_offset"]
    trace_messages, _ = pull_queue_range(broker.addr, TRACE_TOPIC, 0, 0, end, broker_name="broker-a")
    records = [r for body in trace_messages.column("body").to_pylist() for r in decode_trace(body)
               if r.topic == "TraceBatch"]
    store_batches = [r for r in records if r.event_type == "store_batch"]
    assert [(r.first_offset, r.count) for r in store_batches] == [
        (r.queue_offset, len(batch)) for batch, r in zip(batches, (sent[0][1], sent[10][1], sent[17][1]),
                                                         strict=True)]
    per_message = {r.msg_id for r in records if isinstance(r, TraceEvent) and r.event_type in ("store", "deliver")}
    assert per_message.isdisjoint(r.msg_id for _m, r in sent)  # (only the warm-up's, a single send)
    delivers = [r for r in records if r.event_type == "deliver_batch"]
    assert {(r.group, r.client_id) for r in delivers} == set(clients.items())
    assert {tuple(r.filter_tags or ()) for r in delivers if r.group == "a-group"} == {("TagA",)}
    assert sum(r.count for r in delivers if r.group == "all-group") >= len(sent) + 1

    run_trace_job(spark, broker, data_dir, tmp_path / "ckpt")

    rows = run_sql(spark, data_dir / "lake", "SELECT msg_id, event_type, status, `group`, client_id, queue_id, "
                   "queue_offset, tags, keys, born_ts, broker FROM message_trace "
                   "WHERE topic IN ('TraceBatch', 'TraceHttp')").collect()
    by_id: dict[str, list[Any]] = {}
    for row in rows:
        by_id.setdefault(row.msg_id, []).append(row)
    for message, result in sent:
        steps = by_id[result.msg_id]
        kinds = sorted(r.event_type for r in steps)
        groups = ["all-group", "a-group"] if message.tags == "TagA" else ["all-group"]
        assert kinds == sorted(["send", "store"] + ["deliver", "consume"] * len(groups)), (result.msg_id, kinds)
        store = next(r for r in steps if r.event_type == "store")
        assert (store.status, store.queue_id, store.queue_offset) == ("STORED", result.queue_id, result.queue_offset)
        assert (store.tags, store.keys, store.broker) == (message.tags, " ".join(message.keys), "broker-a")
        for deliver in (r for r in steps if r.event_type == "deliver"):
            assert deliver.client_id == clients[deliver.group] and deliver.queue_offset == result.queue_offset
            assert (deliver.tags, deliver.keys, deliver.born_ts) == (message.tags, store.keys, store.born_ts)
        assert sorted(r.group for r in steps if r.event_type == "deliver") == sorted(groups)
    http_deliver = [r for r in by_id[http_sent.msg_id] if r.event_type == "deliver"]
    assert [(r.group, r.client_id) for r in http_deliver] == [("http-group", "http-client-1")]

    # GET /trace shows a batch-sent message's path like an HTTP-sent one's.
    message, result = next((m, r) for m, r in sent if m.tags == "TagB")
    path = http.get(f"/trace/{result.msg_id}").json()["events"]
    assert types(path) == ["send", "store", "deliver", "consume"], path
    assert path[1]["queue_offset"] == path[0]["queue_offset"] == result.queue_offset
    assert path[2]["client_id"] == clients["all-group"] and path[3]["client_id"] == clients["all-group"]


@pytest.mark.cluster
def test_no_trace_broker_writes_nothing_and_bad_events_are_refused(procs: ProcessHarness, tmp_path: Path) -> None:
    ns, broker, _ = start_cluster(procs, tmp_path, "--no-trace")
    http = httpx.Client(base_url=broker.url, timeout=10)
    with Producer("pg", client_config(ns)) as producer:
        msg_id = producer.send(Message("Quiet", b"x")).msg_id
        got: list[str] = []
        c = consumer(ns, "cg", "Quiet", lambda ms: got.extend(m.msg_id for m in ms) or ConsumeStatus.CONSUME_SUCCESS)
        try:
            wait_until(lambda: msg_id in got, 30, "the message to be consumed")
        finally:
            c.shutdown()
    time.sleep(0.5)  # longer than a flush interval
    stats = http.get(f"/topics/{TRACE_TOPIC}/stats").json()
    assert [q["max_offset"] for q in stats["queues"]] == [0]
    assert http.get("/health").json()["trace"] == {"enabled": False, "recorded": 0, "dropped": 0, "written": 0,
                                                    "failed": 0, "messages": 0, "buffered": 0, "last_error": None,
                                                    "ok": True}

    good = TraceEvent(msg_id, "Quiet", "consume", "CONSUME_SUCCESS", 1).to_dict()
    assert http.post("/trace", json={"events": [good]}).json() == {"accepted": 0, "dropped": 0, "enabled": False}
    for bad in ({**good, "event_type": "teleport"}, {**good, "event_ts": "soon"}, {"msg_id": msg_id},
                {**good, "queue_id": True}, {**good, "topic": ""}):
        answer = http.post("/trace", json={"events": [good, bad]})
        assert answer.status_code == 400 and answer.json()["code"] == "INVALID_ARGUMENT", answer.text
        assert answer.json()["message"].startswith("event 1:")
    assert http.get(f"/trace/{msg_id}").json() == {"msg_id": msg_id, "broker": "broker-a", "events": []}


def test_recorder_batches_bounds_and_never_traces_itself() -> None:
    stored: list[Message] = []

    def put(message: Any) -> PutResult:
        stored.append(message)
        return PutResult(PutStatus.PUT_OK, "id", "off", message.topic, 0, len(stored) - 1, 0, 0, 0)

    recorder = TraceRecorder(put, "broker-a", max_buffered=300)
    events = [TraceEvent(f"m{i}", "T", "send", "SEND_OK", i) for i in range(300)]
    assert recorder.add_events(events)
    assert not recorder.add_events(events[:1])  # full: dropped and counted, never blocks
    assert not recorder.add_events([TraceEvent("t", TRACE_TOPIC, "send", "SEND_OK", 1)])  # trace messages: never
    assert recorder.flush() == 300
    assert [m.topic for m in stored] == [TRACE_TOPIC, TRACE_TOPIC]  # 256 + 44 events per message
    assert [e.msg_id for m in stored for e in decode_events(m.body)] == [e.msg_id for e in events]
    assert recorder.status() | {} == {"enabled": True, "recorded": 300, "dropped": 1, "written": 300, "failed": 0,
                                      "messages": 2, "buffered": 0, "last_error": None}
    off = TraceRecorder(put, "broker-a", enabled=False)
    assert not off.add_events(events) and off.flush() == 0


def test_recorder_splits_a_trace_message_larger_than_the_store_takes() -> None:
    """A store with a small max_message_size refuses 256 events in one message: they go in smaller ones."""
    stored: list[Message] = []

    def put(message: Any) -> PutResult:
        if len(message.body) > 5000:
            raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE, f"the body is {len(message.body)} bytes")
        stored.append(message)
        return PutResult(PutStatus.PUT_OK, "id", "off", message.topic, 0, len(stored) - 1, 0, 0, 0)

    recorder = TraceRecorder(put, "broker-a")
    events = [TraceEvent(f"m{i}", "T", "send", "SEND_OK", i, detail="d" * 100) for i in range(300)]
    assert recorder.add_events(events) and recorder.flush() == 300
    assert len(stored) > 2 and all(len(m.body) <= 5000 for m in stored)
    assert [e.msg_id for m in stored for e in decode_events(m.body)] == [e.msg_id for e in events]  # in order
    assert recorder.status()["failed"] == 0


def test_trace_path_orders_merges_and_times_the_steps() -> None:
    store = {"msg_id": "m", "topic": "T", "event_type": "store", "status": "STORED", "event_ts": 100}
    send = {**store, "event_type": "send", "status": "SEND_OK"}
    consume = {**store, "event_type": "consume", "status": "CONSUME_SUCCESS", "event_ts": 130}
    deliver = {**store, "event_type": "deliver", "status": "DELIVERED", "event_ts": 110}
    path = trace_path([consume, store, deliver, send, dict(store)])  # the same event from two lakes counts once
    assert types(path) == ["send", "store", "deliver", "consume"]
    assert [(e["elapsed_ms"], e["since_first_ms"]) for e in path] == [(0, 0), (0, 0), (10, 10), (20, 30)]


def test_broker_traces_transactions_delays_and_trace_messages_stay_untraced(tmp_path: Path) -> None:
    from sparkmq.platform.broker.broker import Broker
    from sparkmq.platform.broker.config import BrokerConfig
    from sparkmq.platform.broker.processors import OutgoingMessage

    broker = Broker(BrokerConfig(port=10911, data_dir=tmp_path, message_delay_level=FAST_LEVELS,
                                 store={"segment_size": 8 << 20})).start(register=False)
    try:
        transactions = broker.transaction_processor
        committed = transactions.send_half("Tx", OutgoingMessage(b"c", tags="T"), "txg")["transaction_id"]
        rolled = broker.transaction_processor.send_half("Tx", OutgoingMessage(b"r"), "txg")["transaction_id"]
        broker.transaction_processor.end_transaction(committed, "txg", "COMMIT")
        broker.transaction_processor.end_transaction(rolled, "txg", "ROLLBACK")
        delayed = broker.send_processor.send("Later", OutgoingMessage(b"d"), delay_level=1).msg_id
        wait_until(lambda: broker.store.max_offset("Later", 0) + broker.store.max_offset("Later", 1)
                   + broker.store.max_offset("Later", 2) + broker.store.max_offset("Later", 3) > 0, 10,
                   "the delayed message to be delivered")
        # The delivered copy's trace event is recorded just after its put: wait for all seven
        # (committed: half, stored, commit; rolled back: half, rollback; delayed: delayed, stored).
        wait_until(lambda: broker.tracer.status()["recorded"] >= 7, 10, "the seven trace events")
        broker.tracer.flush()
        events: list[TraceEvent] = []
        offset = 0
        while (got := broker.pull_processor.pull_once(TRACE_TOPIC, 0, offset, 100, group="trace-reader")).messages:
            events += [e for m in got.messages for e in decode_events(m.body)]
            offset = got.next_offset
        broker.tracer.flush()
        assert broker.tracer.status()["recorded"] == len(events)  # reading the trace topic traced nothing

        def steps(msg_id: str) -> list[tuple[str, str]]:
            return [(e["event_type"], e["status"]) for e in trace_path(e.to_dict() for e in events)
                    if e["msg_id"] == msg_id]

        # The commit's put and its settle happen in the same millisecond or one after the other.
        assert steps(committed)[0] == ("store", "HALF")
        assert sorted(steps(committed)[1:]) == [("store", "STORED"), ("transaction", "COMMIT")]
        assert steps(rolled) == [("store", "HALF"), ("transaction", "ROLLBACK")]
        assert steps(delayed) == [("store", "DELAYED"), ("store", "STORED")]
        assert all(e.topic in ("Tx", "Later") for e in events)
    finally:
        broker.shutdown()
