"""Client logic without servers: fault tolerance, process queues, routes, offset stores, errors,
name server failover, producer routing/retries/compression and rebalance over ``httpx.MockTransport``."""
from __future__ import annotations

import asyncio
import base64
import doctest
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from procs import wait_until
from sparkmq.platform.client import (
    ClientConfig,
    LocalOffsetStore,
    Message,
    MessageQueue,
    ProcessQueue,
    Producer,
    ReadOffsetType,
    RemoteOffsetStore,
    SendStatus,
    Subscription,
    TopicRouteInfo,
)
from sparkmq.platform.client import admin as admin_module
from sparkmq.platform.client import config as config_module
from sparkmq.platform.client import fault as fault_module
from sparkmq.platform.client import offset_store as offset_store_module
from sparkmq.platform.client import process_queue as process_queue_module
from sparkmq.platform.client import producer as producer_module
from sparkmq.platform.client import rebalance as rebalance_module
from sparkmq.platform.client import remoting as remoting_module
from sparkmq.platform.client import routes as routes_module
from sparkmq.platform.client import scheduler as scheduler_module
from sparkmq.platform.client import send_retry as send_retry_module
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.client.allocation import AllocateAveragely
from sparkmq.platform.client.fault import (
    LatencyFaultTolerance,
    QueueSelector,
    not_available_duration_ms,
)
from sparkmq.platform.client.rebalance import (
    ConsumeFromWhere,
    MessageModel,
    RebalanceImpl,
    parse_consume_from_where,
    resolve_strategy,
)
from sparkmq.platform.client.remoting import BrokerClientPool, NameServerClient, RemotingError, error_from_response
from sparkmq.platform.client.routes import TopicRouteCache
from sparkmq.platform.client.scheduler import Scheduler
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.ids import encode_offset_msg_id
from sparkmq.platform.common.sysflag import COMPRESSED
from sparkmq.platform.common.wire import ReceivedMessage, from_ipc, inflate, send_rows_from_arrow

NS1, NS2 = "10.0.0.1:9876", "10.0.0.2:9876"
BA, BB = "10.0.1.1:10911", "10.0.1.2:10911"


# -- doctests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", [config_module, fault_module, process_queue_module, offset_store_module,
                                    routes_module, remoting_module, producer_module, rebalance_module,
                                    scheduler_module, admin_module, send_retry_module],
                         ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.failed == 0


# -- fake servers ------------------------------------------------------------------------------------

def _json(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, json=body)


def _error(code: ErrorCode, message: str) -> httpx.Response:
    return _json(code.http_status, {"code": code.name, "message": message})


class FakeBroker:
    """Enough of the broker API for client tests: sends, offsets, groups, heartbeats."""

    def __init__(self, name: str, addr: str, queues: int = 2) -> None:
        self.name, self.addr = name, addr
        self.sent: list[tuple[str, dict[str, Any]]] = []       # (topic, payload)
        self.batches: list[tuple[str, dict[str, str], Any]] = []
        self.next_offsets: dict[tuple[str, int], int] = {}
        self.fail_with: ErrorCode | None = None
        self.members: list[str] = []
        self.committed: dict[tuple[str, str, int], int] = {}
        self.bounds: dict[tuple[str, int], tuple[int, int]] = {}  # (topic, qid) -> (min, max)
        self.ts_offset = 7
        self.heartbeats: list[dict[str, Any]] = []
        self.topic_configs: dict[str, dict[str, Any]] = {}
        self.queues = queues

    def _stored(self, topic: str, queue_id: int) -> int:
        offset = self.next_offsets.get((topic, queue_id), 0)
        self.next_offsets[(topic, queue_id)] = offset + 1
        return offset

    def handle(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        parts = path.strip("/").split("/")
        if self.fail_with is not None and parts[0] == "topics" and method == "POST":
            return _error(self.fail_with, "injected failure")
        if method == "POST" and len(parts) == 3 and parts[2] == "messages":
            payload = json.loads(request.content)
            self.sent.append((parts[1], payload))
            qid = payload["queue_id"]
            offset = self._stored(parts[1], qid)
            return _json(200, {"status": "SEND_OK", "msg_id": payload["msg_id"] or "GEN",
                               "offset_msg_id": encode_offset_msg_id(self.addr, 1000 + offset), "topic": parts[1],
                               "broker_name": self.name, "queue_id": qid, "queue_offset": offset,
                               "store_timestamp": 1})
        if method == "POST" and len(parts) == 3 and parts[2] == "batch":
            params = dict(request.url.params)
            if request.headers.get("content-type") == "application/vnd.apache.arrow.stream":
                content: Any = send_rows_from_arrow(from_ipc(request.content))
            else:
                content = json.loads(request.content)["messages"]
            self.batches.append((parts[1], params, content))
            qid = int(params["queue_id"])
            results = [{"msg_id": f"M{i}", "offset_msg_id": "X", "queue_offset": self._stored(parts[1], qid)}
                       for i in range(len(content))]
            return _json(200, {"status": "SEND_OK", "topic": parts[1], "broker_name": self.name, "queue_id": qid,
                               "results": results})
        if method == "POST" and path == "/topics":
            body = json.loads(request.content)
            self.topic_configs[body["topic"]] = body
            return _json(200, body)
        if method == "GET" and len(parts) == 5 and parts[4] == "offsets":
            lo, hi = self.bounds.get((parts[1], int(parts[3])), (0, 0))
            out = {"min_offset": lo, "max_offset": hi}
            if "timestamp" in request.url.params:
                out["offset"] = self.ts_offset
            return _json(200, out)
        if method == "POST" and path == "/clients/heartbeat":
            self.heartbeats.append(json.loads(request.content))
            return _json(200, {"groups": {}})
        if method == "POST" and path == "/clients/unregister":
            return _json(200, {})
        if method == "GET" and len(parts) == 2 and parts[0] == "consumers":
            return _json(200, {"group": parts[1], "version": 1, "members": sorted(self.members)})
        if method == "GET" and len(parts) == 5 and parts[2] == "offsets":
            return _json(200, {"offset": self.committed.get((parts[1], parts[3], int(parts[4])), -1)})
        if method == "POST" and len(parts) == 3 and parts[2] == "offsets":
            entries = json.loads(request.content)["offsets"]
            for e in entries:
                self.committed[(parts[1], e["topic"], e["queue_id"])] = e["offset"]
            return _json(200, {"committed": len(entries)})
        if method == "GET" and len(parts) == 3 and parts[2] == "offsets":
            by_topic: dict[str, dict[str, int]] = {}
            for (g, t, q), o in self.committed.items():
                if g == parts[1]:
                    by_topic.setdefault(t, {})[str(q)] = o
            return _json(200, {"group": parts[1], "offsets": by_topic})
        if method == "GET" and parts[0] == "messages":
            return _json(200, {"topic": "t", "broker_name": self.name, "queue_id": 0, "queue_offset": 3,
                               "msg_id": "U", "offset_msg_id": parts[1], "body": base64.b64encode(b"hi").decode()})
        if method == "GET" and path == "/health":
            return _json(200, {"status": "ok"})
        return _error(ErrorCode.INVALID_ARGUMENT, f"fake broker has no {method} {path}")


class FakeCluster:
    """Two name servers and two brokers behind one ``httpx.MockTransport``."""

    def __init__(self) -> None:
        self.brokers = {BA: FakeBroker("broker-a", BA), BB: FakeBroker("broker-b", BB)}
        self.down: set[str] = set()
        self.ns_errors: dict[str, int] = {}   # name server -> HTTP status it answers with
        self.requests: list[tuple[str, str, str]] = []
        self.topics: dict[str, dict[str, int]] = {}  # topic -> broker name -> perm
        self.lock = threading.Lock()

    def route(self, topic: str) -> dict[str, Any]:
        perms = self.topics[topic]
        by_name = {b.name: b for b in self.brokers.values()}
        return {"queue_datas": [{"broker_name": n, "read_queue_nums": by_name[n].queues,
                                 "write_queue_nums": by_name[n].queues, "perm": p, "topic_sys_flag": 0}
                                for n, p in sorted(perms.items())],
                "broker_datas": [{"cluster": "c", "broker_name": n, "broker_addrs": {"0": by_name[n].addr}}
                                 for n in sorted(perms)]}

    def handle(self, request: httpx.Request) -> httpx.Response:
        addr = f"{request.url.host}:{request.url.port}"
        with self.lock:
            self.requests.append((addr, request.method, request.url.path))
        if addr in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if addr in (NS1, NS2):
            if addr in self.ns_errors:
                return _json(self.ns_errors[addr], {"detail": "boom"})
            parts = request.url.path.strip("/").split("/")
            if parts[0] == "routes":
                if parts[1] not in self.topics:
                    return _error(ErrorCode.TOPIC_NOT_EXIST, f"no route for {parts[1]}")
                return _json(200, self.route(parts[1]))
            if parts[0] == "cluster":
                return _json(200, {"clusters": {"c": ["broker-a", "broker-b"]},
                                   "brokers": {b.name: {"cluster": "c", "broker_name": b.name,
                                                        "broker_addrs": {"0": b.addr}}
                                               for b in self.brokers.values()},
                                   "live_brokers": {}})
            if parts[0] == "topics":
                return _json(200, {"topics": sorted(self.topics)})
        return self.brokers[addr].handle(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def hits(self, addr: str, method: str | None = None) -> int:
        """Requests to ``addr`` (only those of ``method`` when given)."""
        with self.lock:
            return sum(1 for a, m, _ in self.requests if a == addr and method in (None, m))


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.topics["t"] = {"broker-a": 6, "broker-b": 6}
    return c


def _config(**kw: Any) -> ClientConfig:
    return ClientConfig(namesrv_addrs=[NS1, NS2], **kw)


@pytest.fixture
def producer(cluster: FakeCluster) -> Any:
    p = Producer("pg", _config(), transport=cluster.transport()).start()
    yield p
    p.shutdown()


def _msg(body: bytes = b"hello", topic: str = "t", **kw: Any) -> Message:
    return Message(topic, body, **kw)


# -- config ----------------------------------------------------------------------------------

def test_config_defaults_follow_rocketmq() -> None:
    cfg = ClientConfig(namesrv_addrs="127.0.0.1:9876")
    assert (cfg.send_timeout_s, cfg.retry_times, cfg.compress_threshold, cfg.compress_level) == (3.0, 2, 4096, 5)
    assert (cfg.route_refresh_interval_s, cfg.heartbeat_interval_s, cfg.rebalance_interval_s,
            cfg.offset_commit_interval_s) == (30.0, 30.0, 20.0, 5.0)
    assert (cfg.consume_threads, cfg.pull_batch_size, cfg.flow_control_max_messages, cfg.flow_control_max_bytes,
            cfg.max_offset_span) == (20, 32, 1000, 100 * 1024 * 1024, 2000)
    assert cfg.pull_timeout_s > cfg.long_poll_wait_ms / 1000
    a, b = cfg.new_client_id(), cfg.new_client_id()
    assert a != b and a.count("@") == 2 and a.split("@")[1] == str(os.getpid())


@pytest.mark.parametrize("kw", [{"namesrv_addrs": ""}, {"namesrv_addrs": "nohost"}, {"send_timeout_s": 0},
                                {"retry_times": -1}, {"pull_format": "xml"}, {"compress_level": 10},
                                {"heartbeat_interval_s": float("inf")}, {"consume_threads": True}])
def test_config_rejects_bad_values(kw: dict[str, Any]) -> None:
    kw = {"namesrv_addrs": "127.0.0.1:9876", **kw}
    with pytest.raises(ValueError):
        ClientConfig(**kw)


# -- fault tolerance --------------------------------------------------------------------------

def test_not_available_durations_follow_the_latency_table() -> None:
    cases = {0: 0, 49: 0, 50: 0, 100: 0, 549: 0, 550: 30000, 999: 30000, 1000: 60000, 2000: 120000,
             3000: 180000, 14999: 180000, 15000: 600000, 30000: 600000}
    assert {k: not_available_duration_ms(k) for k in cases} == cases


def test_fault_windows_expire_with_the_clock() -> None:
    now = [100.0]
    ft = LatencyFaultTolerance(clock=lambda: now[0])
    ft.update("a", 1200)                       # 60 s
    ft.update("b", 0, isolation=True, reachable=False)   # 600 s, unreachable
    ft.update("c", 80)                         # available at once
    assert [ft.is_available(n) for n in "abcd"] == [False, False, True, True]
    assert ft.unreachable_brokers() == ["b"]
    now[0] = 160.0
    assert ft.is_available("a") and not ft.is_available("b")
    now[0] = 700.0
    assert ft.is_available("b") and ft.unreachable_brokers() == []
    ft.update("a", 600)
    ft.remove("a")
    assert ft.is_available("a")


def test_selector_round_robins_and_skips_unavailable_and_last_failed() -> None:
    qs = [MessageQueue("t", b, i) for b in ("a", "b", "c") for i in range(2)]
    ft = LatencyFaultTolerance()
    sel = QueueSelector(ft)
    assert [sel.select(qs) for _ in range(6)] == qs                     # plain round-robin
    ft.update("b", 0, isolation=True)
    picked = [sel.select(qs).broker_name for _ in range(12)]
    assert "b" not in picked and set(picked) == {"a", "c"}
    assert all(sel.select(qs, last_broker="a").broker_name == "c" for _ in range(6))
    ft.update("a", 0, isolation=True)
    ft.update("c", 0, isolation=True)
    # Everyone is marked: still send somewhere (other than the broker that just failed when possible).
    assert {sel.select(qs, last_broker="a").broker_name for _ in range(6)} == {"b", "c"}
    assert sel.select([MessageQueue("t", "a", 0)], last_broker="a").broker_name == "a"
    with pytest.raises(ValueError):
        sel.select([])


def test_selector_without_fault_tolerance_only_avoids_the_last_broker() -> None:
    qs = [MessageQueue("t", b, 0) for b in ("a", "b")]
    sel = QueueSelector(None)
    assert {sel.select(qs, last_broker="a").broker_name for _ in range(4)} == {"b"}


# -- process queue ----------------------------------------------------------------------------

def _received(offset: int, size: int = 1, topic: str = "t", tags: str | None = None) -> ReceivedMessage:
    return ReceivedMessage(topic, "broker-a", 0, offset, f"id{offset}", "", b"x" * size, tags=tags)


def test_smallest_unfinished_offset_under_out_of_order_completion() -> None:
    pq = ProcessQueue(MessageQueue("t", "broker-a", 0), next_offset=100)
    assert pq.commit_offset() == 100                      # nothing pulled: where pulling starts
    msgs = [_received(o) for o in range(100, 110)]
    pq.on_pulled(msgs, next_offset=112)                   # 110, 111 were filtered out
    assert pq.commit_offset() == 100
    order = [105, 101, 109, 100, 103, 102, 104, 108, 106, 107]
    expected = [100, 100, 100, 102, 102, 104, 106, 106, 107, 112]
    got = [pq.remove([msgs[o - 100]]) for o in order]
    assert got == expected
    assert pq.msg_count == 0 and pq.msg_bytes == 0 and pq.in_flight_offsets() == []
    pq.remove([msgs[0]])                                  # finishing twice changes nothing
    assert pq.commit_offset() == 112


def test_commit_offset_never_passes_a_message_being_consumed_concurrently() -> None:
    pq = ProcessQueue(MessageQueue("t", "broker-a", 0), next_offset=0)
    msgs = [_received(o) for o in range(2000)]
    pq.on_pulled(msgs, next_offset=2000)
    stuck = msgs[777]
    others = [m for m in msgs if m is not stuck]
    threads = [threading.Thread(target=lambda part=others[i::8]: [pq.remove([m]) for m in part]) for i in range(8)]
    for t in threads:
        t.start()
    seen = []
    while any(t.is_alive() for t in threads):
        seen.append(pq.commit_offset())
    for t in threads:
        t.join()
    assert max(seen + [pq.commit_offset()]) <= 777
    assert pq.commit_offset() == 777
    assert pq.remove([stuck]) == 2000


def test_flow_control_thresholds() -> None:
    mq = MessageQueue("t", "broker-a", 0)
    pq = ProcessQueue(mq, 0, max_messages=3, max_bytes=100, max_span=10)
    pq.on_pulled([_received(o) for o in range(3)], 3)
    assert pq.flow_control_reason() is None               # at the limit is still fine
    pq.on_pulled([_received(3)], 4)
    assert pq.flow_control_reason() == "count"
    pq = ProcessQueue(mq, 0, max_messages=1000, max_bytes=100, max_span=2000)
    pq.on_pulled([_received(0, 60), _received(1, 41)], 2)
    assert pq.flow_control_reason() == "size" and pq.msg_bytes == 101
    pq = ProcessQueue(mq, 0, max_messages=1000, max_bytes=1 << 20, max_span=10)
    first = _received(0)
    pq.on_pulled([first, _received(10)], 11)
    assert pq.offset_span() == 10 and pq.flow_control_reason() is None
    pq.on_pulled([_received(11)], 12)
    assert pq.flow_control_reason() == "span"
    pq.remove([first])                                    # the stuck one finished: span is 1
    assert pq.flow_control_reason() is None and pq.offset_span() == 1


def test_a_flow_controlled_pull_loop_is_woken_by_consumption_from_another_thread() -> None:
    """The pull loop waits for room, not a fixed back-off: a poll that empties the queue wakes it at once.

    (With ``pull_batch_size`` above ``flow_control_max_messages`` every pull leaves the queue over the limit: a
    fixed 50 ms back-off per pull made ``pull_batch_size=1024`` drain three times slower than 256.)
    """
    pq = ProcessQueue(MessageQueue("t", "broker-a", 0), 0, max_messages=2)
    msgs = [_received(o) for o in range(3)]
    pq.on_pulled(msgs, 3)
    assert pq.flow_control_reason() == "count"

    async def wait() -> bool:
        waiting = asyncio.get_running_loop().create_task(pq.wait_for_room(3600))  # a back-off never reached
        await asyncio.sleep(0)
        assert pq._room is not None                                   # registered before the consumer polls
        await asyncio.to_thread(pq.remove, msgs[:1])                  # 2 left: at the limit, room again
        return await asyncio.wait_for(waiting, 30)

    assert asyncio.run(wait()) is True and pq.flow_control_reason() is None and pq._room is None
    # Room already there: no wait at all; a drop wakes a waiter too (its loop must see the drop).
    assert asyncio.run(pq.wait_for_room(3600)) is True
    pq.on_pulled([_received(o) for o in range(3, 6)], 6)

    async def dropped() -> bool:
        waiting = asyncio.get_running_loop().create_task(pq.wait_for_room(3600))
        await asyncio.sleep(0)
        pq.drop()
        return await asyncio.wait_for(waiting, 30)

    assert asyncio.run(dropped()) is False and pq.dropped


def test_dropped_flag_and_reset() -> None:
    pq = ProcessQueue(MessageQueue("t", "broker-a", 0), 5)
    pq.on_pulled([_received(5), _received(6)], 7)
    assert not pq.dropped
    pq.drop()
    assert pq.dropped
    pq.reset(3)
    assert pq.msg_count == 0 and pq.commit_offset() == 3 and pq.next_offset == 3


# -- routes ------------------------------------------------------------------------------------

def _route(queue_datas: list[tuple[str, int, int, int]], addrs: dict[str, dict[str, str]]) -> TopicRouteInfo:
    return TopicRouteInfo.from_dict("t", {
        "queue_datas": [{"broker_name": n, "read_queue_nums": r, "write_queue_nums": w, "perm": p}
                        for n, r, w, p in queue_datas],
        "broker_datas": [{"cluster": "c", "broker_name": n, "broker_addrs": a} for n, a in addrs.items()]})


def test_route_queue_lists_follow_perm_and_masters_and_are_sorted() -> None:
    route = _route([("broker-c", 2, 2, 6), ("broker-a", 3, 2, 6), ("broker-b", 2, 2, 4), ("broker-d", 2, 2, 2),
                    ("broker-e", 1, 1, 6)],
                   {"broker-a": {"0": "a:1", "1": "a:2"}, "broker-b": {"0": "b:1"}, "broker-c": {"0": "c:1"},
                    "broker-d": {"0": "d:1"}, "broker-e": {"1": "e:2"}})
    assert [q.key for q in route.write_queues] == ["broker-a/0", "broker-a/1", "broker-c/0", "broker-c/1",
                                                   "broker-d/0", "broker-d/1"]
    # broker-d is write-only; broker-e has only a slave (readable, not writable).
    assert [q.key for q in route.read_queues] == ["broker-a/0", "broker-a/1", "broker-a/2", "broker-b/0",
                                                  "broker-b/1", "broker-c/0", "broker-c/1", "broker-e/0"]
    assert route.master_addr("broker-a") == "a:1" and route.master_addr("broker-e") is None
    assert route.read_addr("broker-e") == "e:2" and route.read_addr("nope") is None
    assert route.all_addrs() == ["a:1", "a:2", "b:1", "c:1", "d:1", "e:2"]
    assert route.master_addrs() == ["a:1", "b:1", "c:1", "d:1"]
    assert all(q.topic == "t" for q in route.read_queues)


def test_a_master_that_refused_is_read_from_its_slave_briefly_and_pulls_there_are_held_briefly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While a master is down its queues are read from the slave, but neither the pass-over nor a pull held on the
    slave may keep a consumer there for long once the master answers again (the soak's killed master: its new
    messages waited for pulls parked on the slave)."""
    monkeypatch.setattr(routes_module, "_unreachable", {})
    route = _route([("broker-a", 2, 2, 6)], {"broker-a": {"0": "a:1", "1": "a:2"}})
    assert route.read_addr("broker-a") == "a:1"
    assert route.read_wait_ms("broker-a", "a:1", 15_000) == 15_000  # the master: the consumer's long poll
    routes_module.mark_unreachable("a:1", routes_module.UNREACHABLE_PASS_OVER_S)
    assert route.read_addr("broker-a") == "a:2"
    assert route.read_wait_ms("broker-a", "a:2", 15_000) == 1_000  # the slave: held at most the pass-over
    assert route.read_wait_ms("broker-a", "a:2", 300) == 300
    # The pass-over ends on the clock, so a loaded machine only delays this poll: the bound is not stretched by
    # the day's slowness (wait_until's would be, past the old 5 s pass-over on a slow day).
    marked = time.monotonic()
    while route.read_addr("broker-a") != "a:1":
        assert time.monotonic() - marked < 3.0, "the master was not tried again within 3 s of the pass-over's start"
        time.sleep(0.05)
    only_slave = _route([("broker-a", 2, 2, 6)], {"broker-a": {"1": "a:2"}})  # the name servers dropped the master
    assert only_slave.read_wait_ms("broker-a", "a:2", 15_000) == 1_000


def test_default_route_covers_every_master_with_four_queues() -> None:
    route = TopicRouteInfo.default_from_cluster("new", {"brokers": {
        "broker-b": {"broker_addrs": {"0": "b:1"}}, "broker-a": {"broker_addrs": {"0": "a:1", "1": "a:2"}},
        "broker-s": {"broker_addrs": {"1": "s:2"}}}})
    assert route.is_default
    assert [q.key for q in route.write_queues] == [f"broker-{b}/{i}" for b in "ab" for i in range(4)]


def test_malformed_route_is_an_internal_error() -> None:
    with pytest.raises(SparkMQError) as err:
        TopicRouteInfo.from_dict("t", {"queue_datas": [{"broker_name": "a"}], "broker_datas": []})
    assert err.value.code is ErrorCode.INTERNAL_ERROR


def test_route_cache_keeps_the_last_good_route_when_name_servers_fail(cluster: FakeCluster) -> None:
    ns = NameServerClient([NS1, NS2], 1.0, transport=cluster.transport())
    cache = TopicRouteCache(ns)
    first = cache.get("t")
    cluster.down |= {NS1, NS2}
    cache.refresh_all()
    assert cache.get("t") is first
    with pytest.raises(RemotingError):
        cache.get("other")
    ns.close()


# -- local offset store -------------------------------------------------------------------------

def test_local_offset_store_persists_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q0, q1 = MessageQueue("t", "broker-a", 0), MessageQueue("t", "broker-b", 1)
    store = LocalOffsetStore("g", tmp_path)
    store.update(q0, 10)
    store.update(q1, 20)
    assert store.persist_all() == 2
    assert store.persist_all() == 0                        # nothing changed: nothing written
    path = tmp_path / "g" / "offsets.json"
    assert json.loads(path.read_text()) == {"group": "g", "offsets": {"t": {"broker-a/0": 10, "broker-b/1": 20}}}
    before = path.read_bytes()

    def crash(*_: object) -> None:
        raise OSError("disk went away mid-rename")

    store.update(q0, 11)
    monkeypatch.setattr(os, "replace", crash)
    assert store.persist_all() == 0                        # logged, not raised
    with pytest.raises(SparkMQError):
        store.persist_all(raise_errors=True)
    monkeypatch.undo()
    assert path.read_bytes() == before                     # the old file is whole
    assert [p.name for p in path.parent.iterdir()] == ["offsets.json"]   # no temp file left behind
    assert store.persist_all() == 1                        # still changed, so retried
    fresh = LocalOffsetStore("g", tmp_path)
    fresh.load()
    assert fresh.table() == {q0: 11, q1: 20}
    assert fresh.read(MessageQueue("t", "broker-a", 9)) == -1
    assert fresh.read(q1, ReadOffsetType.MEMORY) == 20


def test_local_offset_store_keeps_queues_it_no_longer_holds(tmp_path: Path) -> None:
    q0, q1 = MessageQueue("t", "broker-a", 0), MessageQueue("t", "broker-a", 1)
    store = LocalOffsetStore("g", tmp_path)
    store.update(q0, 1)
    store.update(q1, 2)
    store.persist_all()
    store.remove(q1)
    store.update(q0, 5)
    store.persist_all([q0])
    assert LocalOffsetStore("g", tmp_path).read(q1, ReadOffsetType.STORE) == 2
    assert LocalOffsetStore("g", tmp_path).read(q0, ReadOffsetType.STORE) == 5


def test_corrupt_local_offsets_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "offsets.json").write_text("{not json")
    with pytest.raises(SparkMQError) as err:
        LocalOffsetStore("g", tmp_path).load()
    assert err.value.code is ErrorCode.INTERNAL_ERROR and "offsets.json" in err.value.message


def test_remote_offset_store_commits_per_broker_and_only_changes(cluster: FakeCluster) -> None:
    pool = BrokerClientPool(1.0, transport=cluster.transport())
    addrs = {"broker-a": BA, "broker-b": BB}
    store = RemoteOffsetStore("g", pool, lambda mq: addrs.get(mq.broker_name))
    qa, qb = MessageQueue("t", "broker-a", 0), MessageQueue("t", "broker-b", 1)
    assert store.read(qa) == -1
    store.update(qa, 5)
    store.update(qb, 9)
    assert store.persist_all() == 2
    assert cluster.brokers[BA].committed == {("g", "t", 0): 5}
    assert cluster.brokers[BB].committed == {("g", "t", 1): 9}
    assert store.persist_all() == 0
    store.update(qa, 4, increase_only=True)
    assert store.read(qa, ReadOffsetType.MEMORY) == 5
    cluster.down.add(BB)
    store.update(qa, 6)
    store.update(qb, 10)
    with pytest.raises(RemotingError):
        store.persist_all(raise_errors=True)
    assert cluster.brokers[BA].committed[("g", "t", 0)] == 6   # the reachable broker still got its commit
    cluster.down.clear()
    assert store.persist_all() == 1 and cluster.brokers[BB].committed[("g", "t", 1)] == 10
    cluster.brokers[BA].committed[("g", "t", 0)] = 42
    assert store.read(qa, ReadOffsetType.STORE) == 42 and store.read(qa, ReadOffsetType.MEMORY) == 42
    pool.close()


def test_remote_offset_store_logs_a_down_broker_once_not_per_commit(
        cluster: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    """A master that is down fails every periodic commit until it is back: the first failure is logged, the rest
    are counted for a summary line once the interval (60 s) has passed (issue 30's quiet failure logging)."""
    pool = BrokerClientPool(1.0, transport=cluster.transport())
    store = RemoteOffsetStore("g", pool, lambda mq: BB)
    qb = MessageQueue("t", "broker-b", 1)
    cluster.down.add(BB)
    with caplog.at_level(logging.INFO, logger="sparkmq.client"):
        for offset in range(1, 21):
            store.update(qb, offset)
            store.persist_all()
        failed = [r for r in caplog.records if "committing offsets of g to broker-b" in r.getMessage()]
        assert len(failed) == 1 and "failed" in failed[0].getMessage(), [r.getMessage() for r in failed]
        cluster.down.clear()
        assert store.persist_all() == 1 and cluster.brokers[BB].committed[("g", "t", 1)] == 20
    lines = [r.getMessage() for r in caplog.records if "committing offsets of g to broker-b" in r.getMessage()]
    assert len(lines) == 1, lines  # 20 failed commits, one line
    pool.close()


# -- error mapping ----------------------------------------------------------------------------------

@pytest.mark.parametrize("response, code, text", [
    (_error(ErrorCode.TOPIC_NOT_EXIST, "no t"), ErrorCode.TOPIC_NOT_EXIST, "no t"),
    (_error(ErrorCode.MESSAGE_TOO_LARGE, "big"), ErrorCode.MESSAGE_TOO_LARGE, "big"),
    (_json(503, {"code": "FLUSH_SLAVE_TIMEOUT_NEW", "message": "m"}), ErrorCode.SERVICE_NOT_AVAILABLE,
     "FLUSH_SLAVE_TIMEOUT_NEW: m"),
    (_json(409, {"code": "SOMETHING_NEW", "message": "m"}), ErrorCode.INVALID_ARGUMENT, "SOMETHING_NEW"),
    (httpx.Response(502, text="<html>bad gateway</html>"), ErrorCode.INTERNAL_ERROR, "HTTP 502"),
    (httpx.Response(503), ErrorCode.SERVICE_NOT_AVAILABLE, "HTTP 503"),
    (_json(404, {"detail": "Not Found"}), ErrorCode.INVALID_ARGUMENT, "Not Found"),
])
def test_error_responses_map_back_to_stable_codes(response: httpx.Response, code: ErrorCode, text: str) -> None:
    err = error_from_response(response)
    assert type(err) is SparkMQError and err.code is code and text in err.message


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_round_trips(code: ErrorCode) -> None:
    err = error_from_response(_json(code.http_status, SparkMQError(code, "why").to_dict()))
    assert (err.code, err.message) == (code, "why")


def test_connection_failures_and_timeouts_are_service_not_available() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    for handler, timed_out in ((refuse, False), (slow, True)):
        pool = BrokerClientPool(1.0, transport=httpx.MockTransport(handler))
        with pytest.raises(RemotingError) as err:
            pool.get(BA).topics()
        assert err.value.code is ErrorCode.SERVICE_NOT_AVAILABLE and err.value.timed_out is timed_out
        assert isinstance(err.value, SparkMQError) and BA in err.value.message
        pool.close()


# -- name server failover ----------------------------------------------------------------------------

def test_name_server_client_fails_over_and_sticks(cluster: FakeCluster) -> None:
    ns = NameServerClient([NS1, NS2], 1.0, transport=cluster.transport())
    assert ns.topic_list() == ["t"] and cluster.hits(NS1) == 1 and cluster.hits(NS2) == 0
    cluster.down.add(NS1)
    assert ns.topic_route("t")["queue_datas"]
    assert ns.current == NS2 and cluster.hits(NS1) == 2 and cluster.hits(NS2) == 1
    for _ in range(3):                                       # sticky: the dead one is not tried again
        ns.cluster_info()
    assert cluster.hits(NS1) == 2 and cluster.hits(NS2) == 4
    cluster.down = {NS2}
    cluster.ns_errors[NS1] = 500                              # a 5xx fails over as well ...
    with pytest.raises(SparkMQError) as err:
        ns.topic_list()
    assert err.value.code is ErrorCode.INTERNAL_ERROR
    cluster.ns_errors.clear()
    assert ns.topic_list() == ["t"] and ns.current == NS1
    with pytest.raises(SparkMQError) as err:                 # ... but a 4xx is an answer
        ns.topic_route("missing")
    assert err.value.code is ErrorCode.TOPIC_NOT_EXIST and ns.current == NS1
    cluster.down = {NS1, NS2}
    with pytest.raises(RemotingError):
        ns.topic_list()
    ns.close()


def test_name_server_each_reports_per_address(cluster: FakeCluster) -> None:
    ns = NameServerClient([NS1, NS2], 1.0, transport=cluster.transport())
    cluster.down.add(NS2)
    out = ns.each("GET", "/topics")
    assert out[NS1] == {"topics": ["t"]} and isinstance(out[NS2], RemotingError)
    ns.close()


# -- producer ----------------------------------------------------------------------------------------

def test_send_round_robins_over_every_write_queue(producer: Producer, cluster: FakeCluster) -> None:
    results = [producer.send(_msg(f"m{i}".encode(), tags="A", keys=("k1", "k2"), properties={"p": "1"}))
               for i in range(8)]
    queues = [r.message_queue.key for r in results]
    assert sorted(queues) == sorted([f"broker-{b}/{q}" for b in "ab" for q in range(2)] * 2)
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 8 and all(len(r.msg_id) == 32 for r in results)
    topic, payload = cluster.brokers[BA].sent[0]
    assert topic == "t" and payload["tags"] == "A" and payload["keys"] == ["k1", "k2"]
    assert payload["properties"] == {"p": "1"} and payload["producer_group"] == "pg"
    assert payload["body_encoding"] == "base64" and payload["compressed"] is False


def test_failed_send_retries_on_another_broker_and_isolates_the_broker(producer: Producer, cluster: FakeCluster,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a failure isolates here: on a loaded machine a successful send to broker-b could take 550 ms, which
    # marks broker-b slow for 30 s too, and then the selector rightly tries broker-a again (a second POST).
    monkeypatch.setattr(fault_module, "not_available_duration_ms",
                        lambda latency_ms: 600_000 if latency_ms >= fault_module.ISOLATION_LATENCY_MS else 0)
    cluster.down.add(BA)
    results = [producer.send(_msg()) for _ in range(6)]
    assert {r.broker_name for r in results} == {"broker-b"}
    # The first send tried broker-a once (if round-robin started there); afterwards it is avoided.  (Only sends
    # count: the fault detector's health probe of the isolated broker, a GET every 2 s, may come in between.)
    # Sends only: a producer heartbeat (POST /clients/heartbeat) to broker-a may come in between as well.
    assert sum(1 for a, m, path in cluster.requests if a == BA and m == "POST" and path.endswith("/messages")) <= 1
    assert not producer.fault.is_available("broker-a")
    assert producer.fault.unreachable_brokers() == ["broker-a"]
    assert len({p["msg_id"] for _, p in cluster.brokers[BB].sent}) == 6


def test_retry_keeps_the_message_id(producer: Producer, cluster: FakeCluster) -> None:
    cluster.brokers[BA].fail_with = ErrorCode.SERVICE_NOT_AVAILABLE
    cluster.brokers[BB].fail_with = ErrorCode.SERVICE_NOT_AVAILABLE
    with pytest.raises(SparkMQError) as err:
        producer.send(_msg())
    assert err.value.code is ErrorCode.SERVICE_NOT_AVAILABLE
    # Sends only: the producer's heartbeat (a POST too) may fall in the same moment on a busy machine.
    attempts = [(a, p) for a in (BA, BB) for a2, m, p in cluster.requests
                if a2 == a and m == "POST" and p.endswith("/messages")]
    assert len(attempts) == 3                                 # 1 + 2 retries
    cluster.brokers[BA].fail_with = cluster.brokers[BB].fail_with = None
    cluster.brokers[BA].fail_with = ErrorCode.DISK_FULL
    producer.fault.remove("broker-a")
    producer.fault.remove("broker-b")
    ids = set()
    for _ in range(4):
        producer.send(_msg())
    for _, payload in cluster.brokers[BB].sent:
        ids.add(payload["msg_id"])
    assert len(ids) == 4


def test_send_failure_of_a_bad_message_is_not_retried(producer: Producer, cluster: FakeCluster) -> None:
    cluster.brokers[BA].fail_with = ErrorCode.MESSAGE_ILLEGAL
    cluster.brokers[BB].fail_with = ErrorCode.MESSAGE_ILLEGAL
    with pytest.raises(SparkMQError) as err:
        producer.send(_msg())
    assert err.value.code is ErrorCode.MESSAGE_ILLEGAL
    assert sum(1 for _, m, p in cluster.requests if m == "POST" and p.endswith("/messages")) == 1
    assert producer.fault.is_available("broker-a") and producer.fault.is_available("broker-b")


@pytest.mark.parametrize("msg, code", [
    (Message("t", b""), ErrorCode.MESSAGE_ILLEGAL),
    (Message("t", "text"), ErrorCode.MESSAGE_ILLEGAL),  # type: ignore[arg-type]
    (Message("bad topic", b"x"), ErrorCode.TOPIC_ILLEGAL),
    (Message("t", b"x" * (4 * 1024 * 1024 + 1)), ErrorCode.MESSAGE_TOO_LARGE),
])
def test_bad_messages_are_refused_before_any_request(producer: Producer, cluster: FakeCluster, msg: Message,
                                                     code: ErrorCode) -> None:
    before = len(cluster.requests)
    with pytest.raises(SparkMQError) as err:
        producer.send(msg)
    assert err.value.code is code and len(cluster.requests) == before


def test_ordered_send_sticks_to_one_queue_and_never_moves(producer: Producer, cluster: FakeCluster) -> None:
    results = [producer.send(_msg(f"{i}".encode()), sharding_key="order-42") for i in range(5)]
    assert len({r.message_queue for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(5))
    owner = results[0].broker_name
    addr = BA if owner == "broker-a" else BB
    cluster.down.add(addr)
    before = len(cluster.requests)
    with pytest.raises(RemotingError):
        producer.send(_msg(), sharding_key="order-42")
    # one attempt, same queue (then the route is asked for again: the failed master may have a successor).
    # Sends only: the heartbeat the first send triggered runs on the scheduler's thread and may come this late.
    assert [a for a, m, path in cluster.requests[before:]
            if a not in (NS1, NS2) and m == "POST" and path.endswith("/messages")] == [addr]
    cluster.down.clear()
    chosen = producer.send(_msg(), queue_selector=lambda qs, m: qs[-1])
    assert chosen.message_queue == MessageQueue("t", "broker-b", 1)
    with pytest.raises(SparkMQError) as err:
        producer.send(_msg(), queue_selector=lambda qs, m: MessageQueue("t", "broker-z", 0))
    assert err.value.code is ErrorCode.QUEUE_ID_ILLEGAL


def test_bodies_above_the_threshold_are_compressed(producer: Producer, cluster: FakeCluster) -> None:
    big = bytes(range(256)) * 20 + b"x"                       # 5121 bytes, compressible
    exact = b"y" * 4096
    producer.send(_msg(big))
    producer.send(_msg(exact))
    payloads = [p for b in (BA, BB) for _, p in cluster.brokers[b].sent]
    compressed = [p for p in payloads if p["compressed"]]
    plain = [p for p in payloads if not p["compressed"]]
    assert len(compressed) == 1 and len(plain) == 1
    wire_body = base64.b64decode(compressed[0]["body"])
    assert len(wire_body) < len(big)
    assert inflate(wire_body, COMPRESSED) == big
    assert base64.b64decode(plain[0]["body"]) == exact


def test_async_and_oneway_sends(producer: Producer, cluster: FakeCluster) -> None:
    seen: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        seen.append((result, error))
        done.set()

    future = producer.send_async(_msg(b"async"), callback)
    assert future.result(5).status is SendStatus.SEND_OK
    assert done.wait(5) and seen[0][1] is None and seen[0][0] == future.result()
    cluster.down |= {BA, BB}
    failed = producer.send_async(_msg(b"doomed"))
    assert isinstance(failed.exception(10), RemotingError)
    cluster.down.clear()
    with pytest.raises(SparkMQError):                         # validation happens at the call
        producer.send_async(Message("t", b""))
    producer.send_oneway(_msg(b"one-way"))
    producer.shutdown()                                       # waits for queued one-way sends
    bodies = [base64.b64decode(p["body"]) for b in (BA, BB) for _, p in cluster.brokers[b].sent]
    batched = [base64.b64decode(m["body"]) for b in (BA, BB) for _, _, content in cluster.brokers[b].batches
               for m in content]
    # send_async gathers messages into batch requests; a one-way send is a single request
    assert b"one-way" in bodies and b"async" in batched
    with pytest.raises(SparkMQError) as err:
        producer.send(_msg())
    assert err.value.code is ErrorCode.SERVICE_NOT_AVAILABLE


@pytest.mark.parametrize("arrow", [False, True])
def test_batch_send_goes_to_one_queue(producer: Producer, cluster: FakeCluster, arrow: bool) -> None:
    msgs = [_msg(f"b{i}".encode(), tags="T", keys=(f"k{i}",), properties={"i": str(i)}) for i in range(5)]
    results = producer.send_batch(msgs, arrow=arrow)
    assert len(results) == 5 and len({r.message_queue for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(5))
    broker = cluster.brokers[BA if results[0].broker_name == "broker-a" else BB]
    topic, params, content = broker.batches[0]
    assert topic == "t" and params["compressed"] == "false" and params["producer_group"] == "pg"
    if arrow:
        assert [r.body for r in content] == [m.body for m in msgs] and content[2].keys == ("k2",)
    else:
        assert [base64.b64decode(m["body"]) for m in content] == [m.body for m in msgs]
        assert content[1]["properties"] == {"i": "1"} and len({m["msg_id"] for m in content}) == 5
    with pytest.raises(SparkMQError):
        producer.send_batch([_msg(), _msg(topic="u")])
    with pytest.raises(SparkMQError):
        producer.send_batch([])


def test_a_batch_with_a_large_body_compresses_every_body(producer: Producer, cluster: FakeCluster) -> None:
    msgs = [_msg(b"z" * 5000), _msg(b"w" * 2000)]
    producer.send_batch(msgs)
    _, params, content = next(b for x in (BA, BB) for b in cluster.brokers[x].batches)
    assert params["compressed"] == "true"
    assert [inflate(base64.b64decode(m["body"]), COMPRESSED) for m in content] == [m.body for m in msgs]


def test_a_batch_of_small_bodies_is_not_compressed(producer: Producer, cluster: FakeCluster) -> None:
    # RocketMQ compresses bodies above the threshold, not batches whose small bodies add up past it.
    msgs = [_msg(b"z" * 3000), _msg(b"w" * 3000)]
    producer.send_batch(msgs)
    _, params, content = next(b for x in (BA, BB) for b in cluster.brokers[x].batches)
    assert params["compressed"] == "false"
    assert [base64.b64decode(m["body"]) for m in content] == [m.body for m in msgs]


def test_unknown_topic_uses_a_default_route_over_every_master(producer: Producer, cluster: FakeCluster) -> None:
    results = [producer.send(_msg(topic="fresh")) for _ in range(8)]
    assert {r.broker_name for r in results} == {"broker-a", "broker-b"}
    assert {r.queue_id for r in results} <= {0, 1, 2, 3}
    cluster.topics["fresh"] = {"broker-b": 6}                 # the broker registered it
    time.sleep(producer.config.route_miss_retry_s + 0.05)
    assert {producer.send(_msg(topic="fresh")).broker_name for _ in range(4)} == {"broker-b"}


def test_read_only_topic_has_no_write_queue(producer: Producer, cluster: FakeCluster) -> None:
    cluster.topics["ro"] = {"broker-a": 4, "broker-b": 4}
    with pytest.raises(SparkMQError) as err:
        producer.send(_msg(topic="ro"))
    assert err.value.code is ErrorCode.NO_PERMISSION


def _read_only_until_asked(cluster: FakeCluster, topic: str, asks: int | None) -> httpx.MockTransport:
    """``topic`` on broker-a alone, read-only (no writable queue on any live master, as while a DLedger leadership
    moves) until the name servers were asked for its route ``asks`` times (None: for good)."""
    cluster.topics[topic] = {"broker-a": 4}
    asked = [0]

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/routes/{topic}":
            asked[0] += 1
            if asks is not None and asked[0] >= asks:
                cluster.topics[topic] = {"broker-a": 6}
        return cluster.handle(request)
    return httpx.MockTransport(handle)


def _retry_loop(kind: str, transport: httpx.MockTransport, topic: str) -> tuple[str, MessageQueue]:
    """Run ``kind``'s send loop (the threaded or the asyncio producer) over ``transport``'s name servers with an
    attempt that stores nothing and answers where it was sent."""
    from sparkmq.platform.client import AsyncProducer

    if kind == "threaded":
        with Producer("pg", _config(), transport=transport) as threaded:
            return threaded._with_retries(topic, None, None, lambda addr, mq, left: (addr, mq))

    async def run() -> tuple[str, MessageQueue]:
        async def attempt(addr: str, mq: MessageQueue, left: float) -> tuple[str, MessageQueue]:
            return addr, mq
        producer = AsyncProducer("pg", _config())
        producer._routes = TopicRouteCache(NameServerClient([NS1, NS2], 3.0, transport=transport))
        async with producer:
            return await producer._with_retries(topic, None, None, attempt)
    return asyncio.run(run())


@pytest.mark.parametrize("kind", ["threaded", "asyncio"])
def test_no_writable_queue_is_waited_for_within_the_send_budget(cluster: FakeCluster, kind: str) -> None:
    """Both producers (one decision logic, platform/client/send_retry.py): a route with no writable queue is asked
    for again and, with no other broker to try, awaited a little, rather than failing the send at once."""
    assert _retry_loop(kind, _read_only_until_asked(cluster, "moving", asks=2), "moving") == \
        (BA, MessageQueue("moving", "broker-a", 0))
    transport = _read_only_until_asked(cluster, "stuck", asks=None)
    began = time.monotonic()
    with pytest.raises(SparkMQError) as err:
        _retry_loop(kind, transport, "stuck")
    elapsed = time.monotonic() - began
    assert err.value.code is ErrorCode.NO_PERMISSION and "no writable queue" in err.value.message
    # 1 + 2 attempts, a pause after each but the last (no pause would only delay the error), within the budget.
    assert 0.3 <= elapsed < _config().send_timeout_s, elapsed
    assert sum(1 for _, _, path in cluster.requests if path == "/routes/stuck") >= 2, "the route was asked again"


def test_the_asyncio_producer_sends_on_a_cached_default_route_without_a_worker_thread(
        cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic no name server knows yet gets a default route; until it is due to be asked for again
    (``route_miss_retry_s``) the asyncio producer takes it from the cache, as the threaded one does, instead of a
    worker-thread hop per send (that hop was every send's for the first second of a new topic)."""
    from sparkmq.platform.client import aio

    hops: list[object] = []
    real_to_thread = asyncio.to_thread

    async def counted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(aio.asyncio, "to_thread", counted)

    async def run() -> list[bool]:
        producer = aio.AsyncProducer("pg", _config())
        producer._routes = TopicRouteCache(NameServerClient([NS1, NS2], 3.0, transport=cluster.transport()),
                                           miss_retry_s=3600)
        routes = [await producer._route("brand-new", allow_default=True) for _ in range(20)]
        return [r.is_default for r in routes]

    assert asyncio.run(run()) == [True] * 20
    assert len(hops) == 1                                         # the first one asked the name servers


def test_the_asyncio_consumers_rebalance_loop_ends_when_cancelled_as_a_notice_arrives() -> None:
    """The shutdown cancels the rebalance loop; a membership notice setting its event in the same loop pass made
    Python 3.11's ``asyncio.wait_for`` return instead of raising, and the loop (awaited by the shutdown) ran on:
    ``async with consumer`` then never ended.  The loop now stops once the consumer is not running."""
    from sparkmq.platform.client import AsyncConsumer

    async def run() -> bool:
        consumer = AsyncConsumer("cg", _config(rebalance_interval_s=3600))
        consumer._state = "running"
        loop_task = asyncio.get_running_loop().create_task(consumer._rebalance_loop())
        await asyncio.sleep(0)              # waiting for the event
        consumer._rebalance_due.set()       # a notice: the event's waiter finishes in the next pass ...
        await asyncio.sleep(0)
        consumer._state = "stopping"        # ... and the shutdown cancels the loop right then
        loop_task.cancel()
        done, _ = await asyncio.wait({loop_task}, timeout=3)
        consumer._namesrv.close()
        return loop_task in done

    assert asyncio.run(run())


def test_producer_heartbeats_and_probes_isolated_brokers(cluster: FakeCluster) -> None:
    cfg = _config(heartbeat_interval_s=0.05, fault_detect_interval_s=0.05)
    with Producer("pg", cfg, transport=cluster.transport()) as producer:
        cluster.down.add(BA)
        for _ in range(3):
            producer.send(_msg())
        assert not producer.fault.is_available("broker-a")
        cluster.down.clear()
        wait_until(lambda: producer.fault.is_available("broker-a"), 5, "the probe to lift the isolation",
                   interval=0.02)
        beat = wait_until(lambda: cluster.brokers[BB].heartbeats, 5, "a heartbeat to broker-b", interval=0.02)[0]
        assert beat["producer_groups"] == ["pg"] and beat["client_id"] == producer.client_id


# -- subscriptions, strategies, rebalance ----------------------------------------------------------

def test_subscription_expressions() -> None:
    assert Subscription.parse("t", None).tags is None and Subscription.parse("t", " * ").expression == "*"
    s = Subscription.parse("t", "B ||A|| B")
    assert s.tags == frozenset({"A", "B"}) and s.expression == "A || B"
    assert s.to_dict() == {"topic": "t", "expression": "A || B", "type": "TAG"}
    for bad in ("||", "A || *"):
        with pytest.raises(SparkMQError):
            Subscription.parse("t", bad)


def test_strategy_and_enum_spellings() -> None:
    assert resolve_strategy("AVERAGELY").name == "averagely"
    assert resolve_strategy("consistent_hash").name == "consistent-hash"
    strategy = AllocateAveragely()
    assert resolve_strategy(strategy) is strategy
    assert parse_consume_from_where("first_offset") is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    with pytest.raises(SparkMQError):
        resolve_strategy("random")
    with pytest.raises(SparkMQError):
        parse_consume_from_where("middle")


class _Recorder:
    def __init__(self) -> None:
        self.added: list[ProcessQueue] = []
        self.removed: list[ProcessQueue] = []


def _rebalancer(cluster: FakeCluster, me: str, *, model: MessageModel = MessageModel.CLUSTERING,
                cfw: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                subs: tuple[str, ...] = ("t",), ts: int | None = None) -> tuple[RebalanceImpl, _Recorder, Callable]:
    transport = cluster.transport()
    ns = NameServerClient([NS1], 1.0, transport=transport)
    routes = TopicRouteCache(ns)
    pool = BrokerClientPool(1.0, transport=transport)
    store = RemoteOffsetStore("g", pool, lambda mq: routes.get(mq.topic).master_addr(mq.broker_name))
    rec = _Recorder()
    impl = RebalanceImpl("g", me, message_model=model, strategy=AllocateAveragely(), consume_from_where=cfw,
                         consume_timestamp_ms=ts, subscriptions={t: Subscription.parse(t, "*") for t in subs},
                         routes=routes, brokers=pool, offset_store=store,
                         new_process_queue=lambda mq, off: ProcessQueue(mq, off),
                         on_added=rec.added.append, on_removed=rec.removed.append)

    def close() -> None:
        pool.close()
        ns.close()
    return impl, rec, close


def test_rebalance_allocates_diffs_and_commits_dropped_queues(cluster: FakeCluster) -> None:
    for b in cluster.brokers.values():
        b.members = ["c1", "c2"]
        b.bounds = {("t", 0): (0, 50), ("t", 1): (3, 60)}
    cluster.brokers[BA].committed[("g", "t", 1)] = 17
    impl, rec, close = _rebalancer(cluster, "c1")
    assert impl.rebalance() is True
    assert [f"{q.key}" for q in impl.assignment()] == ["broker-a/0", "broker-a/1"]
    starts = {pq.mq.queue_id: pq.next_offset for pq in rec.added}
    assert starts == {0: 50, 1: 17}                           # new queue: max offset; committed: its offset
    assert impl.rebalance() is False                          # same view, no change
    # c2 leaves: c1 takes everything.
    for b in cluster.brokers.values():
        b.members = ["c1"]
    assert impl.rebalance() is True and len(impl.assignment()) == 4
    # c0 and c2 join: c1 is in the middle of three and keeps one queue (4 queues / 3 -> 2, 1, 1).
    pqs = impl.process_queues()
    held = pqs[MessageQueue("t", "broker-a", 1)]
    held.on_pulled([ReceivedMessage("t", "broker-a", 1, o, "", "", b"x") for o in (17, 18, 19)], 20)
    held.remove([held._msgs[18]])                             # 17 still in flight
    for b in cluster.brokers.values():
        b.members = ["c0", "c1", "c2"]
    assert impl.rebalance() is True
    assert [q.key for q in impl.assignment()] == ["broker-b/0"]
    assert held.dropped and held in rec.removed
    assert cluster.brokers[BA].committed[("g", "t", 1)] == 17  # the smallest unfinished offset
    close()


def test_rebalance_keeps_queues_while_not_yet_a_member(cluster: FakeCluster) -> None:
    for b in cluster.brokers.values():
        b.members = ["c1"]
    impl, rec, close = _rebalancer(cluster, "c1")
    impl.rebalance()
    assert len(impl.assignment()) == 4
    asked: list[str] = []
    impl.on_not_member = asked.append
    for b in cluster.brokers.values():
        b.members = ["c2"]
    assert impl.rebalance() is False and len(impl.assignment()) == 4 and asked == ["t"]
    cluster.down |= {BA, BB}                                  # nobody answers: keep everything too
    assert impl.rebalance() is False and len(impl.assignment()) == 4
    close()


@pytest.mark.parametrize("cfw, expected", [(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, 3),
                                           (ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, 60),
                                           (ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, 7)])
def test_where_a_new_group_starts(cluster: FakeCluster, cfw: ConsumeFromWhere, expected: int) -> None:
    cluster.brokers[BA].bounds = {("t", 1): (3, 60)}
    impl, _, close = _rebalancer(cluster, "c1", cfw=cfw, ts=1_700_000_000_000)
    assert impl.compute_pull_from_where(MessageQueue("t", "broker-a", 1)) == expected
    if cfw is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
        asked = [r for r in cluster.requests if r[2].endswith("/queues/1/offsets")]
        assert asked
    close()


def test_broadcasting_takes_every_queue_and_manual_assignment_is_exact(cluster: FakeCluster) -> None:
    impl, _, close = _rebalancer(cluster, "c1", model=MessageModel.BROADCASTING)
    impl.rebalance()
    assert len(impl.assignment()) == 4                         # no member list needed
    assert not any(p.startswith("/consumers/g") and m == "GET" and p.count("/") == 2
                   for _, m, p in cluster.requests)
    mine = [MessageQueue("t", "broker-b", 1)]
    impl.assign(mine)
    assert impl.rebalance() is True and impl.assignment() == mine
    replaced = impl.replace(mine[0], 5)
    assert replaced.next_offset == 5 and impl.process_queues()[mine[0]] is replaced
    with pytest.raises(SparkMQError):
        impl.replace(MessageQueue("t", "broker-a", 0), 1)
    close()


# -- admin over fakes ------------------------------------------------------------------------------

def test_admin_creates_topics_on_every_master_and_aggregates_offsets(cluster: FakeCluster) -> None:
    with AdminClient(_config(), transport=cluster.transport()) as admin:
        assert admin.masters() == {"broker-a": BA, "broker-b": BB}
        out = admin.create_topic("orders", 8, 8)
        assert set(out) == {BA, BB}
        assert cluster.brokers[BA].topic_configs["orders"]["read_queue_nums"] == 8
        admin.create_topic("solo", broker_addrs=[BB])
        assert "solo" not in cluster.brokers[BA].topic_configs
        with pytest.raises(SparkMQError):
            admin.create_topic("x", perm=9)
        with pytest.raises(SparkMQError):
            admin.masters("no-such-cluster")
        cluster.brokers[BA].committed[("g", "t", 0)] = 4
        cluster.brokers[BB].committed[("g", "t", 1)] = 9
        assert admin.group_offsets("g") == {MessageQueue("t", "broker-a", 0): 4, MessageQueue("t", "broker-b", 1): 9}
        cluster.brokers[BA].members = ["x"]
        cluster.brokers[BB].members = ["y", "x"]
        assert admin.group_members("g") == ["x", "y"]
        assert admin.topic_list() == ["t"]
        msg = admin.view_message(encode_offset_msg_id(BB, 1234))
        assert msg.body == b"hi" and msg.broker_name == "broker-b"
        with pytest.raises(SparkMQError) as err:
            admin.view_message("nothex")
        assert err.value.code is ErrorCode.MESSAGE_ID_ILLEGAL


# -- scheduler --------------------------------------------------------------------------------------

def test_scheduler_runs_periodic_and_triggered_tasks_and_survives_errors() -> None:
    calls: list[str] = []
    boom = threading.Event()

    def failing() -> None:
        calls.append("fail")
        boom.set()
        raise RuntimeError("one bad round")

    s = Scheduler("t")
    s.every("slow", 3600, lambda: calls.append("slow"), initial_delay_s=3600)
    s.every("bad", 3600, failing)
    s.start()
    assert boom.wait(5)
    s.trigger("slow")
    assert s.wait_idle(5)
    s.stop()
    assert calls == ["fail", "slow"]
    assert not any(t.name == "sparkmq-t" for t in threading.enumerate())


def test_producer_heartbeats_a_broker_it_meets_at_once(producer: Producer, cluster: FakeCluster) -> None:
    assert producer.config.heartbeat_interval_s == 30.0
    result = producer.send(_msg())
    broker = cluster.brokers[BA if result.broker_name == "broker-a" else BB]
    wait_until(lambda: broker.heartbeats, 5, "a heartbeat", interval=0.02)
    assert broker.heartbeats[0]["producer_groups"] == ["pg"]


def test_accumulator_groups_smaller_than_in_flight_wait_and_flush_sends_them() -> None:
    """A lone message leaves at once; later ones leave once as many as are in flight, or when those are answered."""
    import concurrent.futures

    from sparkmq.platform.client.accumulator import Accumulator
    from sparkmq.platform.common.message import Message

    sent: list[tuple[int, concurrent.futures.Future[Any]]] = []

    def start(msgs: list[Message]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        sent.append((len(msgs), future))
        return future

    def answer(i: int) -> None:
        size, future = sent[i]
        future.set_result([None] * size)

    def blocking(_msgs: Any) -> Any:
        raise AssertionError("every batch goes through the starter")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        acc = Accumulator(blocking, pool, starter=start, max_in_flight=4)
        futures = [acc.add(Message("T", b"x"))]
        assert [s for s, _ in sent] == [1]           # nothing in flight: at once
        futures.append(acc.add(Message("T", b"x")))
        assert [s for s, _ in sent] == [1, 1]        # as many as in flight (1)
        futures += [acc.add(Message("T", b"x")) for _ in range(3)]
        assert [s for s, _ in sent] == [1, 1, 2]     # 2 waited for 2 in flight; the third waits for 4
        answer(0)
        assert [s for s, _ in sent] == [1, 1, 2]     # 1 waiting < 3 in flight: still waits
        answer(1)
        answer(2)                                    # nothing in flight: it leaves
        assert [s for s, _ in sent] == [1, 1, 2, 1]
        futures += [acc.add(Message("T", b"x")) for _ in range(2)]
        assert [s for s, _ in sent] == [1, 1, 2, 1, 1]  # 1 >= 1 in flight leaves; the next waits for 2
        threading.Timer(0.05, lambda: [answer(i) for i in range(3, len(sent))]).start()
        assert acc.flush(5)
        assert all(f.done() and f.exception() is None for f in futures)


def test_accumulator_bounds_unanswered_bytes_and_refuses_after_max_block() -> None:
    """A caller that outruns the broker waits for room (Kafka's buffer.memory / max.block.ms): it goes on as soon
    as an answer frees room, and after ``max_block_s`` it gets PRODUCER_BUFFER_FULL with nothing queued."""
    import concurrent.futures

    from sparkmq.platform.client.accumulator import Accumulator
    from sparkmq.platform.common.message import Message

    sent: list[tuple[int, concurrent.futures.Future[Any]]] = []

    def start(msgs: list[Message]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        sent.append((len(msgs), future))
        return future

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        acc = Accumulator(lambda _m: [], pool, starter=start, max_in_flight=1, buffer_bytes=300, max_block_s=0.2)
        first = acc.add(Message("T", b"a" * 100))               # in flight
        queued = [acc.add(Message("T", b"b" * 100)) for _ in range(2)]  # 300 bytes unanswered: full
        began = time.monotonic()
        with pytest.raises(SparkMQError) as refused:
            acc.add(Message("T", b"c" * 100))
        assert refused.value.code is ErrorCode.PRODUCER_BUFFER_FULL and time.monotonic() - began >= 0.19
        assert [n for n, _ in sent] == [1] and len(acc._queues["T"]) == 2  # the refused one was not queued

        threading.Timer(0.1, lambda: sent[0][1].set_result([None])).start()
        began = time.monotonic()
        late = acc.add(Message("T", b"d" * 100))                # waits for the first answer, then is queued
        assert 0.05 < time.monotonic() - began < 5 and first.done()
        assert [n for n, _ in sent] == [1, 2]                   # the answer sent what waited ...
        sent[1][1].set_result([None, None])
        assert [n for n, _ in sent] == [1, 2, 1]                # ... and then the late one
        sent[2][1].set_result([None])
        assert acc.flush(5) and all(f.done() and f.exception() is None for f in [first, *queued, late])


def test_queued_messages_and_futures_stay_out_of_the_collectors_lists_only_while_held() -> None:
    """While queued or in flight a message and its future are not tracked by the garbage collector (the
    accumulator holds them); once answered, refused, or tied to a callback or waiter, they are again, so a
    cycle through them can still be collected."""
    import concurrent.futures
    import gc
    import weakref

    from sparkmq.platform.client.accumulator import Accumulator
    from sparkmq.platform.common.message import Message
    from sparkmq.storage_native import IMPL

    native = IMPL == "native"
    sent: list[concurrent.futures.Future[Any]] = []

    def start(msgs: list[Message]) -> concurrent.futures.Future[Any]:
        sent.append(concurrent.futures.Future())
        return sent[-1]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        acc = Accumulator(lambda _m: [], pool, starter=start, max_in_flight=1, buffer_bytes=200, max_block_s=0.05)
        messages = [Message("T", b"m" * 100) for _ in range(2)]
        futures = [acc.add(m) for m in messages]               # one in flight, one queued
        assert not any(gc.is_tracked(o) for o in [*messages, *futures]) or not native
        refused = Message("T", b"r" * 100)
        with pytest.raises(SparkMQError):
            acc.add(refused)                                     # the buffer is full
        assert gc.is_tracked(refused)                            # given back as it came
        futures[1].add_done_callback(lambda f: None)             # a callback may close a cycle: tracked
        assert gc.is_tracked(futures[1]) and (gc.is_tracked(futures[0]) is not native)
        sent[0].set_result([None])
        assert gc.is_tracked(futures[0]) and gc.is_tracked(messages[0])
        sent[1].set_result([None])
        assert acc.flush(5) and all(gc.is_tracked(o) for o in [*messages, *futures])

        # After its answer, a cycle through a message is garbage like any other.
        class Marker:
            """Lives in the cycle: it is freed (its weak reference dies) only if the cycle is collected."""

        marker = Marker()
        gone = weakref.ref(marker)
        looped = Message("T", b"l")
        looped.properties = {"self": looped, "marker": marker}  # type: ignore[dict-item]  # a careless caller's cycle
        acc.add(looped)
        sent[-1].set_result([None])
        del looped, marker
        gc.collect()
        assert gone() is None

        # A close whose flush times out gives back what stays queued.
        acc.add(Message("T", b"f" * 100))                      # in flight, never answered
        left = Message("T", b"q" * 100)
        acc.add(left)
        assert gc.is_tracked(left) is not native
        acc.close(0.05)
        assert gc.is_tracked(left)
        sent[-1].set_result([None])


def test_batched_futures_work_with_the_standard_library() -> None:
    """A batched future is a concurrent.futures.Future to wait(), as_completed() and callbacks, before and after
    its batch completes (its waiter and callback lists are made on first use)."""
    import concurrent.futures

    from sparkmq.platform.client.accumulator import BatchedFuture, complete_batch
    from sparkmq.platform.common.message import Message

    condition = threading.Condition()
    futures = [BatchedFuture(condition, Message("T", b"x")) for _ in range(3)]
    assert isinstance(futures[0], concurrent.futures.Future) and not any(f.done() for f in futures)
    early: list[Any] = []
    futures[0].add_done_callback(lambda f: early.append(f.result()))
    not_done = concurrent.futures.wait(futures, timeout=0.01).not_done
    assert len(not_done) == 3
    threading.Timer(0.05, lambda: complete_batch(futures, condition, ["r0", "r1", "r2"], None)).start()  # type: ignore[list-item]
    assert sorted(f.result(5) for f in concurrent.futures.as_completed(futures, timeout=5)) == ["r0", "r1", "r2"]
    assert early == ["r0"] and not concurrent.futures.wait(futures, timeout=0).not_done
    late: list[Any] = []
    futures[2].add_done_callback(lambda f: late.append(f.result()))  # already done: called at once
    assert late == ["r2"] and futures[1].exception() is None and futures[1].message is None

    failed = BatchedFuture(condition, Message("T", b"x"))
    complete_batch([failed], condition, None, RuntimeError("broker gone"))
    assert failed.done() and str(failed.exception()) == "broker gone"
    with pytest.raises(RuntimeError, match="broker gone"):
        failed.result()


def test_batch_results_are_made_when_read_and_concatenate_as_lists() -> None:
    """A packed batch answer reads as one SendResult per message: ids in order, consecutive queue offsets, each
    commit-log offset in its offsetMsgId; ``+`` with a list makes a list either way round."""
    from sparkmq.platform.common import protocol

    answer = protocol.SendPackedResponseHeader("SEND_OK", "t", "broker-a", 2, 40, 3, 1_700_000_000_000,
                                               "127.0.0.1:10911")
    offsets = [1000, 2024, 3048]
    results = producer_module.BatchSendResults(answer, ["id-0", "id-1", "id-2"], b"".join(
        o.to_bytes(8, "little") for o in offsets))
    assert len(results) == 3 and [r.msg_id for r in results] == ["id-0", "id-1", "id-2"]
    assert [r.queue_offset for r in results] == [40, 41, 42]
    assert all(r.status is SendStatus.SEND_OK and (r.topic, r.queue_id) == ("t", 2) for r in results)
    assert [int(r.offset_msg_id[-16:], 16) for r in results] == offsets
    assert results[-1].msg_id == "id-2" and [r.msg_id for r in results[1:]] == ["id-1", "id-2"]
    before = [results[0]]
    assert isinstance(before + results, list) and [r.msg_id for r in before + results] == ["id-0", "id-0", "id-1",
                                                                                            "id-2"]
    assert [r.msg_id for r in results + before] == ["id-0", "id-1", "id-2", "id-0"]


def test_an_idle_pooled_connection_is_dropped_by_the_client_before_the_server_would_close_it() -> None:
    """Clients expire idle connections well before a sparkmq server's keep-alive, so a request never crosses the
    server's close on the wire ("connection reset by peer", seen as an unreachable broker)."""
    import http.server

    from sparkmq.platform.common.limits import CLIENT_KEEPALIVE_EXPIRY_S, ConnectionLimits

    connections: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the connection stays open between requests

        def setup(self) -> None:
            connections.append(1)
            super().setup()

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = b'{"groups": []}'  # GET /consumers, answered the same for any path
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = remoting_module.BrokerClient(f"127.0.0.1:{server.server_address[1]}", timeout_s=5.0)
    try:
        assert CLIENT_KEEPALIVE_EXPIRY_S < ConnectionLimits().http_keep_alive_s / 2
        assert client.consumer_groups() == []
        assert client.consumer_groups() == []
        assert len(connections) == 1  # reused while fresh
        time.sleep(CLIENT_KEEPALIVE_EXPIRY_S + 0.5)  # idle past the client's expiry, not the server's keep-alive
        assert client.consumer_groups() == []
        assert len(connections) == 2  # the client opened a new connection rather than reuse the idle one
    finally:
        client.close()
        server.shutdown()
        server.server_close()


def test_the_spark_source_imports_without_the_whole_client_or_pandas() -> None:
    """Spark starts a Python process for each planner and stream runner of the ``sparkmq`` source, and each
    imports it: the client package hands out its names on first use, and nothing at import builds Arrow arrays
    from lists (pyarrow then imports pandas).  The package's table of names is its ``__all__`` (mypy checks that
    the type checkers' imports define ``__all__``), and every name resolves, to its submodule's object."""
    probe = ("import sys, importlib, sparkmq.pipelines.source, sparkmq.platform.client as client\n"
             "heavy = sorted(m for m in ('pandas', 'sparkmq.platform.client.admin', 'sparkmq.platform.client.aio',"
             " 'sparkmq.platform.client.push_consumer') if m in sys.modules)\n"
             "same = sorted(client.__all__) == sorted(client._EXPORTS)\n"
             "wrong = [n for n, m in client._EXPORTS.items()"
             " if getattr(client, n) is not getattr(importlib.import_module(m, client.__name__), n)]\n"
             "print(heavy, same, wrong)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["[]", "True", "[]"], done.stdout + done.stderr
    from sparkmq.platform import client
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        _ = client.NoSuchName  # type: ignore[attr-defined]
