"""The admin operations the console's last gaps needed (issue 15), on one in-process broker over HTTP and remoting:

* which member holds which queue: a heartbeat's ``held_queues``, kept per broker, in ``GET /consumers/{group}``
  and in remoting's GROUP_INFO alike; malformed ones refused with INVALID_ARGUMENT, nothing changed;
* re-send: ``POST /consumers/{group}/resend`` stores a copy (reconsume count 0, its own topic in RETRY_TOPIC) in
  ``%RETRY%<group>``; a bad id, an unknown or broadcasting group get stable codes and store nothing;
* report reads: ``GET /reports/{topics,groups}/{name}`` bucket this broker's ``topic_stats`` / ``group_stats``
  rows (another broker's rows in a shared lake left out), bounded ranges, a row cap;
* alert rules: ``GET /alerts/rules`` answers the ``[[alerts.rules]]`` the broker's lake evaluates.

The browser side (the pages over these) is in ``test_console.py``.
"""
from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from test_broker_app import SMALL_STORE, ThreadServer, error, ok
from test_broker_features import fresh

from lake_rows import append_rows
from sparkmq.api.acl import ROUTE_NEEDS
from sparkmq.api.broker_main import BrokerService
from sparkmq.pipelines import tables
from sparkmq.pipelines.lake_service import LakeSettings
from sparkmq.pipelines.reports import read_report_series
from sparkmq.platform.auth import Action, Resource
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.client.broker_remoting import RemotingBrokerClient, sync_transport
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import ReportPoint, ReportSeries, held_queue_key, parse_held_queue

UTC = dt.UTC


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    config = BrokerConfig(host="127.0.0.1", port=0, data_dir=tmp_path_factory.mktemp("console-admin"),
                          store=SMALL_STORE, trace_enabled=False)
    srv = ThreadServer(config).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def heartbeat(http: httpx.Client, client_id: str, group: str, topic: str, held: list[str],
              consume_type: str = "PUSH", model: str = "CLUSTERING") -> httpx.Response:
    return http.post("/clients/heartbeat", json={"client_id": client_id, "consumers": [{
        "group": group, "consume_type": consume_type, "message_model": model,
        "subscriptions": [{"topic": topic}], "held_queues": held}]})


# -- which member holds which queue ------------------------------------------------------------------------

def test_held_queues_are_kept_per_broker_and_answered_over_http_and_remoting(server: ThreadServer,
                                                                              http: httpx.Client) -> None:
    topic, group, name = fresh("Held"), fresh("held"), server.broker.name
    ok(http.post("/topics", json={"topic": topic, "read_queue_nums": 4, "write_queue_nums": 4}))
    mine = [held_queue_key(topic, name, q) for q in (0, 1)]
    # The same heartbeat goes to every broker: another broker's queues are not this one's to show.
    ok(heartbeat(http, "c1", group, topic, [*mine, held_queue_key(topic, "broker-elsewhere", 2)]))
    ok(heartbeat(http, "c2", group, topic, [held_queue_key(topic, name, 3), held_queue_key(topic, name, 2)]))
    ok(heartbeat(http, "pop-1", group, topic, [], consume_type="POP"))
    view = ok(http.get(f"/consumers/{group}"))
    assert view["members"] == ["c1", "c2", "pop-1"]
    assert view["clients"] == [
        {"client_id": "c1", "consume_type": "PUSH", "message_model": "CLUSTERING", "held_queues": mine},
        {"client_id": "c2", "consume_type": "PUSH", "message_model": "CLUSTERING",
         "held_queues": [held_queue_key(topic, name, 2), held_queue_key(topic, name, 3)]},
        {"client_id": "pop-1", "consume_type": "POP", "message_model": "CLUSTERING", "held_queues": []}]
    version = view["version"]

    # A rebalance moved queue 1 to c2: the next heartbeat says so, and the membership version stays.
    ok(heartbeat(http, "c1", group, topic, mine[:1]))
    ok(heartbeat(http, "c2", group, topic, [held_queue_key(topic, name, q) for q in (1, 2, 3)]))
    view = ok(http.get(f"/consumers/{group}"))
    assert [len(c["held_queues"]) for c in view["clients"]] == [1, 3, 0] and view["version"] == version

    # Remoting's GROUP_INFO answers the same view (admin clients read groups over it once they know the port).
    transport = sync_transport(10.0)
    remoting = RemotingBrokerClient(server.broker.addr, server.broker.remoting_addr, 10.0, transport)
    try:
        assert remoting.consumer_group(group) == view
    finally:
        remoting.close()
        transport.close()

    # Malformed held queues refuse the whole heartbeat with a stable code; nothing changes.
    for bad in (["no-at-sign"], [f"{topic}@{name}/x"], [f"{topic}@{name}"], ["@b/1"], "a@b/1", [7]):
        error(heartbeat(http, "c1", group, topic, bad), 400, "INVALID_ARGUMENT")
    assert ok(http.get(f"/consumers/{group}")) == view


def test_held_queue_keys_round_trip_and_bad_ones_are_invalid_argument() -> None:
    assert parse_held_queue(held_queue_key("%RETRY%cg", "broker-a", 12)) == ("%RETRY%cg", "broker-a", 12)
    assert parse_held_queue("t@name/with/slashes/3") == ("t", "name/with/slashes", 3)
    for bad in ("t@b/", "t@/1", "t-b/1", None, "t@b/123456", "x" * 600 + "@b/1"):
        with pytest.raises(SparkMQError) as info:
            parse_held_queue(bad)
        assert info.value.code is ErrorCode.INVALID_ARGUMENT


# -- re-send a message to a group --------------------------------------------------------------------------

def _log_end(server: ThreadServer) -> int:
    return server.broker.store.log_offsets().max_offset


def test_resend_copies_a_message_into_the_groups_retry_topic_only(server: ThreadServer,
                                                                   http: httpx.Client) -> None:
    topic, group, other = fresh("Resend"), fresh("resend"), fresh("resendother")
    for g in (group, other):
        ok(heartbeat(http, f"cli-{g}", g, topic, []))
    sent = ok(http.post(f"/topics/{topic}/messages", json={"body": "again", "queue_id": 0, "tags": "T1",
                                                           "keys": ["k1"], "properties": {"p": "1"}}))
    answer = ok(http.post(f"/consumers/{group}/resend", json={"msg_id": sent["offset_msg_id"]}))
    assert (answer["group"], answer["msg_id"], answer["origin_topic"]) == (group, sent["msg_id"], topic)
    assert answer["result"]["topic"] == f"%RETRY%{group}" and answer["result"]["queue_id"] == 0
    got = ok(http.get(f"/topics/%25RETRY%25{group}/queues/0/messages", params={"offset": 0}))
    assert got["status"] == "FOUND" and len(got["messages"]) == 1
    copy = got["messages"][0]
    assert copy["msg_id"] == sent["msg_id"] and copy["reconsume_times"] == 0 and copy["tags"] == "T1"
    assert copy["keys"] == ["k1"] and copy["properties"]["p"] == "1" and copy["properties"]["RETRY_TOPIC"] == topic
    # The other group's retry topic got nothing.
    assert ok(http.get(f"/topics/%25RETRY%25{other}/queues/0/messages", params={"offset": 0}))["status"] \
        in ("NO_MATCHED_QUEUE", "NO_NEW_MSG")

    # A copy of the copy (by its offsetMsgId) is still shown under the message's own topic.
    again = ok(http.post(f"/consumers/{other}/resend", json={"msg_id": copy["offset_msg_id"]}))
    assert again["origin_topic"] == topic and again["result"]["topic"] == f"%RETRY%{other}"

    # Bad input: a stable code each, nothing stored.
    end = _log_end(server)
    error(http.post(f"/consumers/{group}/resend", json={"msg_id": "not an id"}), 400, "MESSAGE_ID_ILLEGAL")
    error(http.post(f"/consumers/{group}/resend", json={"msg_id": "0" * 32}), 404, "MESSAGE_NOT_FOUND")
    error(http.post(f"/consumers/{fresh('nobody')}/resend", json={"msg_id": sent["offset_msg_id"]}), 404,
          "GROUP_NOT_EXIST")
    error(http.post("/consumers/bad%20group/resend", json={"msg_id": sent["offset_msg_id"]}), 400, "GROUP_ILLEGAL")
    error(http.post(f"/consumers/{group}/resend", json={}), 400, "INVALID_ARGUMENT")
    broadcast = fresh("resendbc")
    ok(heartbeat(http, "bc-1", broadcast, topic, [], model="BROADCASTING"))
    error(http.post(f"/consumers/{broadcast}/resend", json={"msg_id": sent["offset_msg_id"]}), 400, "INVALID_ARGUMENT")
    assert _log_end(server) == end
    # Without a lake a msgId cannot be looked up: not found, not a crash.
    error(http.post(f"/consumers/{group}/resend", json={"msg_id": sent["msg_id"]}), 404, "MESSAGE_NOT_FOUND")


def test_resend_and_the_new_reads_have_acl_rules() -> None:
    # Re-send is an operator's act on the group, as a re-drive: Update on the group.
    assert ROUTE_NEEDS[("POST", "/consumers/{group}/resend")]({"group": "g"}, {}, {}) == [
        (Action.UPDATE, Resource.group("g"))]
    assert ROUTE_NEEDS[("GET", "/reports/groups/{group}")]({"group": "g"}, {}, {}) == [
        (Action.GET, Resource.group("g"))]
    assert ROUTE_NEEDS[("GET", "/reports/topics/{topic}")]({"topic": "t"}, {}, {}) == [
        (Action.GET, Resource.topic("t"))]
    assert ("GET", "/alerts/rules") in ROUTE_NEEDS


# -- report reads ------------------------------------------------------------------------------------------

def _minute(ago: int) -> dt.datetime:
    return dt.datetime.now(UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=ago)


_batch = itertools.count(1)


def write_topic_stats(spark: Any, lake: Path, rows: list[tuple[dt.datetime, str, str, int, int]]) -> None:
    """``(window, topic, broker, messages_in, messages_out)`` rows, as the report job writes them (delta-spark)."""
    data = pa.Table.from_pylist([{"window_start": w, "topic": t, "broker": b, "messages_in": i, "bytes_in": 100 * i,
                                  "messages_out": o, "bytes_out": 100 * o, "tps_in": i / 60, "tps_out": o / 60}
                                 for w, t, b, i, o in rows], schema=tables.get_spec(tables.TOPIC_STATS).schema)
    append_rows(spark, lake, tables.TOPIC_STATS, data, next(_batch), app_id="console-admin-test")


def write_group_stats(spark: Any, lake: Path, rows: list[tuple[dt.datetime, str, str, int, int, int]]) -> None:
    """``(window, group, broker, queue_id, messages_out, lag)`` rows of topic "T" (delta-spark)."""
    data = pa.Table.from_pylist([{"window_start": w, "group": g, "topic": "T", "broker": b, "queue_id": q,
                                  "messages_in": 1, "messages_out": o, "bytes_out": o, "tps_out": o / 60,
                                  "committed_offset": 0, "max_offset": lag, "lag": lag}
                                 for w, g, b, q, o, lag in rows], schema=tables.get_spec(tables.GROUP_STATS).schema)
    append_rows(spark, lake, tables.GROUP_STATS, data, next(_batch), app_id="console-admin-test")


@pytest.mark.spark
def test_report_reads_bucket_this_brokers_rows_of_one_topic_or_group(server: ThreadServer, http: httpx.Client,
                                                                       spark: Any) -> None:
    lake = server.broker.config.data_dir / "lake"
    name, topic, group = server.broker.name, fresh("Report"), fresh("report")
    # Nothing written yet for them: no points, not an error.
    assert ok(http.get(f"/reports/topics/{topic}", params={"range": "1h"}))["points"] == []
    w = {ago: _minute(ago) for ago in (3, 4, 9, 30, 200, 2000)}
    write_topic_stats(spark, lake, [(w[3], topic, name, 60, 30), (w[4], topic, name, 120, 0), (w[9], topic, name, 6, 6),
                             (w[200], topic, name, 600, 0), (w[3], topic, "broker-other", 999, 999),
                             (w[3], fresh("Else"), name, 5, 5), (w[2000], topic, name, 1, 1)])
    hour = ok(http.get(f"/reports/topics/{topic}", params={"range": "1h"}))
    assert (hour["kind"], hour["name"], hour["range"], hour["step_s"], hour["truncated"]) == \
        ("topic", topic, "1h", 60, False)
    by_t = {p["t"]: p for p in hour["points"]}
    assert sorted(by_t) == [int(w[a].timestamp()) for a in (9, 4, 3)]   # another broker's row is not ours
    newest = by_t[int(w[3].timestamp())]
    assert (newest["messages_in"], newest["messages_out"], newest["lag"]) == (60, 30, None)
    assert newest["tps_in"] == pytest.approx(1.0) and newest["tps_out"] == pytest.approx(0.5)
    # 24 h in 5-minute buckets: windows -3 and -4 share one unless a bucket edge falls between them.
    day = ok(http.get(f"/reports/topics/{topic}", params={"range": "24h"}))
    assert day["step_s"] == 300 and sum(p["messages_in"] for p in day["points"]) == 60 + 120 + 6 + 600
    assert all(p["t"] % 300 == 0 for p in day["points"])
    week = ok(http.get(f"/reports/topics/{topic}", params={"range": "7d"}))
    assert sum(p["messages_in"] for p in week["points"]) == 60 + 120 + 6 + 600 + 1

    # A group: consumed summed over queues, lag of the bucket's last window.
    write_group_stats(spark, lake, [(w[30], group, name, 0, 60, 10), (w[30], group, name, 1, 60, 5),
                             (w[4], group, name, 0, 6, 1), (w[4], group, name, 1, 6, 2),
                             (w[4], group, "broker-other", 0, 600, 700)])
    points = ok(http.get(f"/reports/groups/{group}", params={"range": "6h"}))["points"]
    assert [(p["t"], p["messages_out"], p["lag"]) for p in points] == [
        (int(w[30].timestamp()), 120, 15), (int(w[4].timestamp()), 12, 3)]
    assert points[0]["tps_out"] == pytest.approx(2.0)

    # Bounded: only the listed ranges, names checked.
    error(http.get(f"/reports/topics/{topic}", params={"range": "2h"}), 400, "INVALID_ARGUMENT")
    error(http.get("/reports/groups/bad%20name", params={"range": "1h"}), 400, "GROUP_ILLEGAL")


@pytest.mark.spark
def test_read_report_series_caps_the_rows_it_scans(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    write_topic_stats(spark, lake, [(_minute(m), "Capped", "b", 1, 0) for m in range(1, 11)])
    full = read_report_series(lake, "topic", "Capped", "1h", broker="b")
    assert len(full.points) == 10 and not full.truncated
    capped = read_report_series(lake, "topic", "Capped", "1h", broker="b", max_rows=4)
    assert capped.truncated and sum(p.messages_in for p in capped.points) == 4
    for kind, range_name, max_rows in (("broker", "1h", 10), ("topic", "1y", 10), ("topic", "1h", 0)):
        with pytest.raises(SparkMQError) as info:
            read_report_series(lake, kind, "Capped", range_name, max_rows=max_rows)
        assert info.value.code is ErrorCode.INVALID_ARGUMENT
    # No table at all (a broker whose lake never reported): no points.
    assert read_report_series(tmp_path / "none", "group", "g", "7d").points == []


def test_series_of_several_brokers_are_summed_per_bucket() -> None:
    a = ReportSeries("group", "g", "6h", 60, [ReportPoint(60, 1, 2, 0.5, 1.0, 3), ReportPoint(120, 1, 1, 1.0, 1.0, 1)])
    b = ReportSeries("group", "g", "6h", 60, [ReportPoint(120, 2, 2, 2.0, 2.0, 4)], truncated=True)
    merged = ReportSeries.merged([a, b])
    assert merged.points == [ReportPoint(60, 1, 2, 0.5, 1.0, 3), ReportPoint(120, 3, 3, 3.0, 3.0, 5)]
    assert merged.truncated and ReportSeries.from_dict(merged.to_dict()) == merged


# -- alert rules -------------------------------------------------------------------------------------------

ALERTS = {"rules": [
    {"name": "orders-lag", "kind": "lag", "threshold": 1000, "for_minutes": 5, "severity": "critical",
     "group": "order-*"},
    {"name": "dead-letters", "kind": "dlq_growth", "threshold": 10}]}


def test_alert_rules_are_answered_as_configured(tmp_path: Path) -> None:
    config = BrokerConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "b", store=SMALL_STORE)
    service = BrokerService(config, LakeSettings(enabled=True, alerts=ALERTS))  # built, not served: no Spark
    try:
        answer = service.broker.admin_processor.alert_rules()
        assert answer == {"error": None, "rules": [
            {"name": "orders-lag", "kind": "lag", "threshold": 1000, "for_minutes": 5, "severity": "critical",
             "group": "order-*", "topic": None},
            {"name": "dead-letters", "kind": "dlq_growth", "threshold": 10, "for_minutes": 1, "severity": "warning",
             "group": None, "topic": None}]}
    finally:
        service.sock.close()
    bad = BrokerService(config, LakeSettings(enabled=True, alerts={"rules": [{"name": "x", "kind": "nope"}]}))
    try:
        answer = bad.broker.admin_processor.alert_rules()
        assert answer["rules"] == [] and "kind must be one of" in answer["error"]
    finally:
        bad.sock.close()
    off = BrokerService(config, LakeSettings(enabled=False, alerts=ALERTS))  # no lake: nothing evaluates them
    try:
        assert off.broker.admin_processor.alert_rules() == {"rules": [], "error": None}
    finally:
        off.sock.close()


def test_alert_rules_over_http(server: ThreadServer, http: httpx.Client) -> None:
    processor = server.broker.admin_processor
    try:
        processor.set_alert_rules([{"name": "r1", "kind": "lag", "threshold": 5}])
        assert ok(http.get("/alerts/rules")) == {"rules": [{"name": "r1", "kind": "lag", "threshold": 5}],
                                                 "error": None}
    finally:
        processor.set_alert_rules([])
