"""Broker components in-process: config, topic table, client manager, queue locks, long polling."""
from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from procs import wait_until
from sparkmq.platform.broker.broker import Broker
from sparkmq.platform.broker.client_manager import ClientManager, ConsumerData, MessageModel, Subscription
from sparkmq.platform.broker.config import BrokerConfig, BrokerRole
from sparkmq.platform.broker.locks import QueueLockManager
from sparkmq.platform.broker.offsets import ConsumerOffsetManager
from sparkmq.platform.broker.processors import OutgoingMessage
from sparkmq.platform.broker.registration import RegistrationService
from sparkmq.platform.broker.topics import AUTO_CREATE_TEMPLATE_TOPIC, TopicConfig, TopicConfigManager
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.perm import is_readable, is_writeable
from sparkmq.platform.common.protocol import PullStatus
from sparkmq.platform.common.validation import declared_fields, describe
from sparkmq.platform.common.waiters import WaiterRegistry
from sparkmq.platform.store import FlushMode

SMALL_STORE = {"segment_size": 1 << 20, "max_message_size": 64 * 1024, "max_properties_size": 8000}


def code_of(excinfo: pytest.ExceptionInfo[SparkMQError]) -> ErrorCode:
    return excinfo.value.code



# -- config -----------------------------------------------------------------------------------

def test_config_defaults_follow_rocketmq(tmp_path: Path) -> None:
    cfg = BrokerConfig(data_dir=tmp_path)
    assert (cfg.cluster, cfg.broker_name, cfg.broker_id, cfg.role, cfg.port) == (
        "DefaultCluster", "broker-a", 0, BrokerRole.ASYNC_MASTER, 10911)
    assert (cfg.register_interval_s, cfg.client_expiry_s, cfg.long_polling_max_ms, cfg.offset_persist_interval_s,
            cfg.queue_lock_expiry_s, cfg.auto_create_topic, cfg.default_topic_queue_nums) == (
        30.0, 120.0, 15000, 5.0, 60.0, True, 4)
    store = cfg.store_config()
    assert store.root == tmp_path / "store" and store.store_host == "127.0.0.1:10911"
    assert cfg.topics_path == tmp_path / "config" / "topics.json"
    assert cfg.lake_table_path("consumer_offsets") == tmp_path / "lake" / "consumer_offsets"


def test_config_from_mapping_routes_overrides_and_refuses_unknown_keys(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_mapping({"broker_name": "b1", "namesrv_addrs": "127.0.0.1:1;127.0.0.1:2"},
                                    {"segment_size": 8 << 20, "store_host": "10.0.0.1:1"},
                                    data_dir=tmp_path, port=12345, flush_mode="SYNC_FLUSH", cluster=None,
                                    advertised_addr="127.0.0.2:12345")
    assert cfg.broker_name == "b1" and cfg.cluster == "DefaultCluster" and cfg.port == 12345
    assert cfg.namesrv_addrs == ("127.0.0.1:1", "127.0.0.1:2")
    store = cfg.store_config()
    # The store always writes the advertised address, whatever [store] said.
    assert store.flush_mode is FlushMode.SYNC_FLUSH and store.segment_size == 8 << 20
    assert store.store_host == "127.0.0.2:12345"
    assert cfg.bound_to(999).addr == "127.0.0.2:12345"
    assert BrokerConfig(data_dir=tmp_path, port=0).bound_to(4321).addr == "127.0.0.1:4321"
    with pytest.raises(ValueError, match="unknown broker setting"):
        BrokerConfig.from_mapping({"brokerName": "x"})
    with pytest.raises(ValueError, match="unknown store setting"):
        BrokerConfig.from_mapping({}, {"segmentsize": 1})
    with pytest.raises(ValueError, match="unknown setting"):
        BrokerConfig.from_mapping({}, {}, bogus=1)


@pytest.mark.parametrize("kwargs, bad", [
    ({"port": 70000}, "70000"), ({"broker_id": True}, "True"), ({"broker_name": "a b"}, "a b"),
    ({"client_expiry_s": 0}, "0"), ({"namesrv_addrs": "nohost"}, "nohost"), ({"role": "MASTER"}, "MASTER"),
    ({"broker_id": 1}, "broker_id 1"), ({"store": {"segment_size": 100}}, "segment_size"),
    ({"default_topic_queue_nums": 0}, "0"),
])
def test_config_rejects_bad_values_naming_them(tmp_path: Path, kwargs: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        BrokerConfig(data_dir=tmp_path, **kwargs)


#: The settings __post_init__ checked by hand before their limits became part of their types.
_DECLARED = {
    "cluster", "broker_name", "broker_id", "host", "port", "remoting_port", "grpc_port", "advertised_addr", "ha_port",
    "ha_master_addr", "dledger_group", "dledger_heartbeat_ms", "dledger_max_missed_heartbeats",
    "dledger_wait_for_ack_ms", "ha_in_sync_max_gap_bytes", "ha_flush_slave_timeout_ms", "ha_slave_sync_interval_s",
    "register_interval_s", "register_timeout_s", "client_expiry_s", "client_scan_interval_s",
    "offset_persist_interval_s", "offset_reset_fence_s", "queue_lock_expiry_s", "timer_max_delay_s",
    "transaction_check_first_s", "transaction_check_interval_s", "log_summary_interval_s", "transaction_check_max",
    "long_polling_max_ms", "pop_min_invisible_ms", "default_topic_queue_nums", "pull_max_bytes", "max_request_bytes",
    "wait_time_ms_in_send_queue", "wait_time_ms_in_pull_queue", "os_page_cache_busy_timeout_ms", "max_pending_acks",
    "max_held_pulls", "acl_clock_skew_s", "auto_create_topic", "trace_enabled", "dledger_enabled", "acl_enabled",
}


def test_every_declared_setting_refuses_a_wrong_type_naming_the_setting_and_the_value(tmp_path: Path) -> None:
    declared = {name: tp for name, tp in declared_fields(BrokerConfig)}
    assert _DECLARED <= set(declared), sorted(_DECLARED - set(declared))
    for name, tp in declared.items():
        kind = {"true or false": "bool"}.get(describe(tp), "")
        # A bool is no number, a number no bool, and neither is a string.
        bad: object = 1 if kind == "bool" else (True if not isinstance(getattr(BrokerConfig, name), str) else 5)
        with pytest.raises(ValueError) as info:
            BrokerConfig(data_dir=tmp_path, **{name: bad})
        assert str(info.value) == f"{name} must be {describe(tp)}, got {bad!r}"


@pytest.mark.parametrize("name, bad", [
    ("port", -1), ("port", 65536), ("remoting_port", -2), ("dledger_heartbeat_ms", 9),
    ("dledger_max_missed_heartbeats", 101), ("max_request_bytes", 1023), ("pull_max_bytes", 2**31),
    ("register_timeout_s", float("inf")), ("acl_clock_skew_s", -1.0), ("ha_master_addr", "h:0"),
    ("advertised_addr", "127.0.0.1:10911\n"), ("host", " "), ("cluster", "c" * 128),
])
def test_config_bounds_name_the_setting_and_the_value(tmp_path: Path, name: str, bad: object) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be .*, got {re.escape(repr(bad))}$"):
        BrokerConfig(data_dir=tmp_path, **{name: bad})


# -- topic table ------------------------------------------------------------------------------

@pytest.fixture
def topics(tmp_path: Path) -> TopicConfigManager:
    manager = TopicConfigManager(tmp_path / "config" / "topics.json", default_queue_nums=4)
    manager.load()
    return manager


def test_topic_create_update_get_list_delete(topics: TopicConfigManager) -> None:
    seen: list[int] = []
    topics.add_listener(seen.append)
    v0 = topics.data_version
    cfg = topics.create_or_update("orders", 8, 8, 6, order=True)
    assert cfg == TopicConfig("orders", 8, 8, 6, 0, True)
    assert topics.get("orders") == cfg and topics.require("orders") == cfg and cfg.queue_count == 8
    assert topics.data_version == v0 + 1 and seen == [v0 + 1]
    # An update that changes nothing is no change: no version, no registration.
    topics.create_or_update("orders", 8, 8, 6, order=True)
    assert topics.data_version == v0 + 1 and seen == [v0 + 1]
    topics.create_or_update("orders", 16, 8, 4)
    assert topics.get("orders").queue_count == 16 and topics.data_version == v0 + 2
    assert "orders" in [t.topic for t in topics.list()]
    assert topics.delete("orders") is True and topics.get("orders") is None
    assert topics.delete("orders") is False
    assert topics.data_version == v0 + 3 and seen == [v0 + 1, v0 + 2, v0 + 3]
    with pytest.raises(SparkMQError) as exc:
        topics.require("orders")
    assert code_of(exc) is ErrorCode.TOPIC_NOT_EXIST


@pytest.mark.parametrize("args, code", [
    (("bad topic",), ErrorCode.TOPIC_ILLEGAL), (("t", 0, 4), ErrorCode.INVALID_ARGUMENT),
    (("t", 4, 2000), ErrorCode.INVALID_ARGUMENT), (("t", 4, 4, 8), ErrorCode.INVALID_ARGUMENT),
    (("t", 4, 4, True), ErrorCode.INVALID_ARGUMENT), (("t", "4", 4), ErrorCode.INVALID_ARGUMENT),
])
def test_topic_bad_values_change_nothing(topics: TopicConfigManager, args: tuple, code: ErrorCode) -> None:
    before = (topics.data_version, topics.list(), topics.path.read_bytes())
    with pytest.raises(SparkMQError) as exc:
        topics.create_or_update(*args)
    assert code_of(exc) is code
    assert (topics.data_version, topics.list(), topics.path.read_bytes()) == before


def test_perm_bits_mirror_rocketmq() -> None:
    assert is_readable(6) and is_writeable(6)
    assert is_readable(4) and not is_writeable(4)  # 4: writes forbidden
    assert not is_readable(2) and is_writeable(2)  # 2: reads forbidden


@pytest.mark.parametrize("topic", ["RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                                   "RMQ_SYS_TRANS_OP_HALF_TOPIC", "%RETRY%cg", "%DLQ%cg", "TBW102", "rmq_sys_x"])
def test_system_topics_are_refused_to_the_admin_api(topics: TopicConfigManager, topic: str) -> None:
    version = topics.data_version
    for call in (lambda: topics.create_or_update(topic, 4, 4), lambda: topics.delete(topic)):
        with pytest.raises(SparkMQError) as exc:
            call()
        assert code_of(exc) is ErrorCode.NO_PERMISSION
    assert topics.data_version == version
    assert not topics.can_auto_create(topic)


def test_broker_creates_system_topics_itself(topics: TopicConfigManager) -> None:
    names = {t.topic for t in topics.list()}
    assert {"RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
            AUTO_CREATE_TEMPLATE_TOPIC} <= names
    assert topics.get("SCHEDULE_TOPIC_XXXX").queue_count == 18
    cfg = topics.ensure_system_topic("%RETRY%cg")
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (1, 1, 6)
    assert topics.ensure_system_topic("%RETRY%cg") is cfg
    with pytest.raises(SparkMQError) as exc:
        topics.ensure_system_topic("ordinary")
    assert code_of(exc) is ErrorCode.INVALID_ARGUMENT


def test_many_new_system_topics_are_one_table_change(topics: TopicConfigManager) -> None:
    # A heartbeat naming 1,000 new groups creates 1,000 retry topics: one write and one version, not 1,000.
    version = topics.data_version
    names = [f"%RETRY%bulk-{i}" for i in range(1000)] + ["%RETRY%cg2"]
    configs = topics.ensure_system_topics(names)
    assert [c.topic for c in configs] == names and topics.data_version == version + 1
    assert topics.ensure_system_topics(names) == configs and topics.data_version == version + 1
    with pytest.raises(SparkMQError):
        topics.ensure_system_topics(["%RETRY%fine", "ordinary"])
    assert topics.get("%RETRY%fine") is None and topics.data_version == version + 1


def test_auto_create_only_when_enabled_and_only_when_asked(tmp_path: Path, topics: TopicConfigManager) -> None:
    version = topics.data_version
    assert topics.queue_count("fresh") == 4
    assert topics.for_send("fresh") == TopicConfig("fresh", 4, 4)
    assert topics.get("fresh") is None and topics.data_version == version  # looking creates nothing
    assert topics.auto_create_topic("fresh") == TopicConfig("fresh", 4, 4)
    assert topics.get("fresh") is not None and topics.data_version == version + 1
    assert topics.queue_count("%DLQ%x") is None
    off = TopicConfigManager(tmp_path / "off.json", auto_create=False)
    off.load()
    assert off.get(AUTO_CREATE_TEMPLATE_TOPIC) is None and off.queue_count("fresh") is None
    with pytest.raises(SparkMQError) as exc:
        off.for_send("fresh")
    assert code_of(exc) is ErrorCode.TOPIC_NOT_EXIST


def test_topic_table_persists_atomically_and_reloads(tmp_path: Path, topics: TopicConfigManager) -> None:
    topics.create_or_update("a", 2, 3, 4, order=True)
    topics.create_or_update("b", 5, 5, 2)
    version = topics.data_version
    data = json.loads(topics.path.read_text())
    assert data["data_version"] == version and {t["topic"] for t in data["topics"]} >= {"a", "b"}
    assert not list(topics.path.parent.glob("*.tmp"))
    again = TopicConfigManager(topics.path)
    again.load()
    assert again.list() == topics.list()
    # A restart counts as a change, so name servers re-read the table.
    assert again.data_version == version + 1


def test_corrupt_topic_table_is_store_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text('{"data_version": 1, "topics": [{"topic": "a", "perm": 99}]}')
    with pytest.raises(SparkMQError) as exc:
        TopicConfigManager(path).load()
    assert code_of(exc) is ErrorCode.STORE_CORRUPT


# -- client manager ---------------------------------------------------------------------------

class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def consumer(group: str = "cg", *topics: str, model: str = "CLUSTERING") -> ConsumerData:
    return ConsumerData(group, message_model=model, subscriptions=tuple(Subscription(t) for t in topics or ("t",)))


def test_group_version_moves_on_join_and_leave_only() -> None:
    clients = ClientManager(expiry_s=120, clock=Clock())
    assert clients.heartbeat("c1", ["pg"], [consumer("cg", "t")]) == {"cg": 1}
    assert clients.heartbeat("c1", ["pg"], [consumer("cg", "t")]) == {"cg": 1}  # plain heartbeat
    assert clients.heartbeat("c1", [], [consumer("cg", "t", "u")]) == {"cg": 1}  # subscription change only
    assert clients.heartbeat("c2", [], [consumer("cg", "t")]) == {"cg": 2}
    info = clients.group_info("cg")
    assert info.members == ["c1", "c2"] and info.version == 2 and info.message_model is MessageModel.CLUSTERING
    assert [s.topic for s in info.subscriptions] == ["t", "u"]
    assert clients.unregister("c1", ["pg"], ["cg"]) == {"cg": 3}
    assert clients.unregister("c1", [], ["cg"]) == {"cg": 3}  # not a member any more: no change
    assert clients.unregister("c2", [], ["cg"]) == {"cg": 4}
    assert clients.consumer_groups() == [] and clients.group_info("cg").members == []
    assert clients.group_info("cg").version == 4  # the version survives the empty group
    assert clients.heartbeat("c3", [], [consumer("cg")]) == {"cg": 5}
    assert clients.group_info("never").to_dict()["version"] == 0


def test_silent_clients_expire_and_leave_listeners_hear_it() -> None:
    clock = Clock()
    clients = ClientManager(expiry_s=120, clock=clock)
    left: list[tuple[str, list[str]]] = []
    clients.add_leave_listener(lambda g, ids: left.append((g, ids)))
    clients.heartbeat("old", ["pg"], [consumer("cg")])
    clock.now += 100
    clients.heartbeat("new", [], [consumer("cg")])
    assert clients.client_count() == 2 and clients.version("cg") == 2
    clock.now += 21  # "old" silent 121 s, "new" 21 s
    assert clients.scan_expired() == ["old"]
    assert clients.members("cg") == ["new"] and clients.version("cg") == 3
    assert clients.producer_groups() == {} and left == [("cg", ["old"])]
    assert clients.scan_expired() == [] and clients.version("cg") == 3


def test_scan_thread_expires_clients() -> None:
    clients = ClientManager(expiry_s=0.05, scan_interval_s=0.02).start()
    try:
        clients.heartbeat("c1", [], [consumer("cg")])
        wait_until(lambda: clients.members("cg") == [], what="expiry by the scan thread")
        assert clients.version("cg") == 2
    finally:
        clients.stop()


@pytest.mark.parametrize("call, code", [
    (lambda c: c.heartbeat("", [], []), ErrorCode.INVALID_ARGUMENT),
    (lambda c: c.heartbeat("c 1", [], []), ErrorCode.INVALID_ARGUMENT),
    (lambda c: c.heartbeat("c9", ["bad group"], [consumer("cg")]), ErrorCode.GROUP_ILLEGAL),
    (lambda c: c.heartbeat("c9", [], [consumer("cg"), consumer("cg")]), ErrorCode.INVALID_ARGUMENT),
    (lambda c: ConsumerData("cg", message_model="BOTH"), ErrorCode.INVALID_ARGUMENT),
    (lambda c: Subscription("bad topic"), ErrorCode.TOPIC_ILLEGAL),
])
def test_bad_heartbeats_change_nothing(call, code: ErrorCode) -> None:
    clients = ClientManager(clock=Clock())
    clients.heartbeat("c1", ["pg"], [consumer("cg")])
    before = (clients.group_info("cg"), clients.producer_groups(), clients.client_count())
    with pytest.raises(SparkMQError) as exc:
        call(clients)
    assert code_of(exc) is code
    assert (clients.group_info("cg"), clients.producer_groups(), clients.client_count()) == before


def test_change_waiter_wakes_on_join_from_another_thread_and_times_out_otherwise() -> None:
    clients = ClientManager(clock=Clock())
    clients.heartbeat("c1", [], [consumer("cg")])

    async def scenario() -> None:
        # Already different: answers at once.
        assert await clients.wait_change("cg", 0, 10) == (1, ["c1"])
        # Nothing changes: answers at the timeout with the same version.
        started = time.monotonic()
        assert await clients.wait_change("cg", 1, 0.2) == (1, ["c1"])
        assert time.monotonic() - started >= 0.2
        # A join from another thread wakes the waiter long before its 30 s timeout.
        waiter = asyncio.create_task(clients.wait_change("cg", 1, 30))
        await asyncio.to_thread(wait_until, lambda: clients._waiters.waiting("cg") == 1)
        started = time.monotonic()
        threading.Thread(target=clients.heartbeat, args=("c2", [], [consumer("cg")])).start()
        assert await asyncio.wait_for(waiter, 10) == (2, ["c1", "c2"])
        assert time.monotonic() - started < 10

    asyncio.run(scenario())


# -- queue locks ------------------------------------------------------------------------------

def test_locks_are_exclusive_expire_renew_and_unlock_only_by_owner() -> None:
    clock = Clock()
    locks = QueueLockManager(expiry_s=60, clock=clock)
    q0, q1, q2 = ("t", 0), ("t", 1), ("t", 2)
    assert locks.lock("g", "c1", [q0, q1]) == [q0, q1]
    assert locks.lock("g", "c2", [q1, q2]) == [q2]
    assert locks.lock("other-group", "c2", [q1]) == [q1]  # locks are per group
    assert locks.owner("g", "t", 1) == "c1"
    clock.now += 50
    assert locks.lock("g", "c1", [q1]) == [q1]  # renew q1 at t=50; q0 is not renewed
    clock.now += 20  # t=70: q0 expired (70 s old), q1 is 20 s old
    assert locks.lock("g", "c2", [q0, q1]) == [q0]
    assert locks.owner("g", "t", 0) == "c2" and locks.is_locked_by("g", "t", 1, "c1")
    assert locks.unlock("g", "c2", [q1]) == []  # not the owner
    assert locks.owner("g", "t", 1) == "c1"
    assert locks.unlock("g", "c1", [q1, q0]) == [q1]
    assert locks.owner("g", "t", 1) is None
    assert locks.unlock_client("g", "c2") == 2 and locks.owner("g", "t", 0) is None


@pytest.mark.parametrize("queues, code", [
    ([("t", -1)], ErrorCode.QUEUE_ID_ILLEGAL), ([("bad topic", 0)], ErrorCode.TOPIC_ILLEGAL),
    ([("t",)], ErrorCode.INVALID_ARGUMENT), ([("t", True)], ErrorCode.QUEUE_ID_ILLEGAL),
])
def test_bad_lock_requests_lock_nothing(queues: list, code: ErrorCode) -> None:
    locks = QueueLockManager()
    with pytest.raises(SparkMQError) as exc:
        locks.lock("g", "c1", [("t", 0), *queues])
    assert code_of(exc) is code
    assert locks.owner("g", "t", 0) is None


# -- long polling -----------------------------------------------------------------------------

def test_waiter_registry_wakes_from_threads_and_never_loses_a_wakeup() -> None:
    registry: WaiterRegistry[str] = WaiterRegistry()
    assert registry.notify("k") == 0  # nobody waits: nothing to do

    async def scenario() -> None:
        task = asyncio.create_task(registry.wait("k", 30))
        await asyncio.to_thread(wait_until, lambda: registry.waiting("k") == 1)
        assert await asyncio.to_thread(registry.notify, "k") == 1
        assert await asyncio.wait_for(task, 10) is True
        assert registry.waiting() == 0
        # The condition became true before the wait: ready() short-cuts it.
        assert await registry.wait("k", 30, ready=lambda: True) is True
        assert await registry.wait("k", 0.05) is False
        registry.close()
        assert await registry.wait("k", 30) is False  # closed: answers at once

    asyncio.run(asyncio.wait_for(scenario(), 20))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig(data_dir=tmp_path, port=10911, store=SMALL_STORE)).start()
    yield b
    b.shutdown()


def send_when_held(broker: Broker, topic: str, queue_id: int, *bodies_and_tags: tuple[bytes, str]) -> None:
    """In a thread: wait until a pull is held on the queue, then send."""
    def run() -> None:
        wait_until(lambda: broker.holds.held(topic, queue_id) == 1, what="a held pull")
        for body, tag in bodies_and_tags:
            broker.send_processor.send(topic, OutgoingMessage(body, tag), queue_id=queue_id)
    threading.Thread(target=run, daemon=True).start()


def test_held_pull_returns_as_soon_as_a_message_lands(broker: Broker) -> None:
    broker.admin_processor.create_or_update_topic("lp", 2, 2)

    async def scenario() -> tuple[float, object]:
        send_when_held(broker, "lp", 1, (b"wake", "A"))
        started = time.monotonic()
        result = await broker.pull_processor.pull("lp", 1, 0, 32, wait_ms=10_000)
        return time.monotonic() - started, result

    elapsed, result = asyncio.run(scenario())
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"wake"]
    assert elapsed < 8  # woken by the put, not by the 10 s timeout
    assert broker.holds.held() == 0


def test_held_pull_answers_at_its_timeout_when_nothing_lands(broker: Broker) -> None:
    broker.send_processor.send("lp2", OutgoingMessage(b"x"), queue_id=0)
    started = time.monotonic()
    result = asyncio.run(broker.pull_processor.pull("lp2", 0, 1, 32, wait_ms=300))
    elapsed = time.monotonic() - started
    assert result.status is PullStatus.NO_NEW_MSG and result.next_offset == 1
    assert 0.3 <= elapsed < 5
    # wait_ms is capped by long_polling_max_ms; 0 answers at once.
    started = time.monotonic()
    assert asyncio.run(broker.pull_processor.pull("lp2", 0, 1, 32, wait_ms=0)).status is PullStatus.NO_NEW_MSG
    assert time.monotonic() - started < 1


def test_held_filtered_pull_ignores_other_tags_and_wakes_on_a_match(broker: Broker) -> None:
    broker.admin_processor.create_or_update_topic("lpf", 1, 1)

    async def scenario():
        def run() -> None:
            wait_until(lambda: broker.holds.held("lpf", 0) == 1, what="a held pull")
            broker.send_processor.send("lpf", OutgoingMessage(b"other", "B"), queue_id=0)
            # The pull is re-held after reading the non-matching message ...
            wait_until(lambda: broker.holds.held("lpf", 0) == 1 and broker.store.max_offset("lpf", 0) == 1)
            broker.send_processor.send("lpf", OutgoingMessage(b"mine", "A"), queue_id=0)
        threading.Thread(target=run, daemon=True).start()
        return await broker.pull_processor.pull("lpf", 0, 0, 32, "A", wait_ms=10_000)

    result = asyncio.run(scenario())
    assert result.status is PullStatus.FOUND and [m.body for m in result.messages] == [b"mine"]
    assert result.next_offset == 2


# -- registration -----------------------------------------------------------------------------

class _Recorder(http.server.BaseHTTPRequestHandler):
    """A stand-in name server that records what brokers post."""

    posts: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's spelling)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).posts.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_registration_reaches_every_name_server_despite_a_hanging_one() -> None:
    # A name server that accepts connections and never answers (the worst kind of unreachable).
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(16)
    _Recorder.posts = []
    recorder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    addrs = [f"127.0.0.1:{hanging.getsockname()[1]}", f"127.0.0.1:{recorder.server_address[1]}"]
    version = [1]
    service = RegistrationService(addrs, lambda: {"data_version": version[0]}, lambda: {"bye": True},
                                  interval_s=60, timeout_s=1)
    try:
        service.start()
        wait_until(lambda: len(_Recorder.posts) == 1, what="the first registration")
        # It arrived while the hanging name server was still hanging: nobody waited for it.
        assert service.status()[addrs[0]].failures == 0
        assert _Recorder.posts == [("/brokers/register", {"data_version": 1})]
        version[0] = 2
        service.trigger()  # the topic table changed: register now, not in 60 s
        wait_until(lambda: len(_Recorder.posts) == 2, what="the triggered registration")
        assert _Recorder.posts[1] == ("/brokers/register", {"data_version": 2})
        wait_until(lambda: service.status()[addrs[0]].failures >= 1, what="the hanging name server to time out")
        assert not service.healthy and service.status()[addrs[1]].ok
        results = service.stop()
        assert results == {addrs[0]: False, addrs[1]: True}
        assert _Recorder.posts[-1] == ("/brokers/unregister", {"bye": True})
    finally:
        service.stop(unregister=False)
        recorder.shutdown()
        recorder.server_close()
        hanging.close()


def test_deleted_topic_offsets_leave_the_table_and_stay_gone(tmp_path: Path) -> None:
    path = tmp_path / "consumer_offsets"
    offsets = ConsumerOffsetManager(path, "broker-a")
    offsets.commit("g1", "gone", 0, 5)
    offsets.commit("g2", "gone", 1, 6)
    offsets.commit("g1", "kept", 0, 7)
    offsets.persist()
    assert offsets.remove_topic("gone") == 2 and offsets.dirty_count() == 1
    offsets.commit("g1", "kept", 0, 8)
    assert offsets.persist() == 1
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert [(r["group"], r["topic"], r["offset"]) for r in rows] == [("g1", "kept", 8)]
    again = ConsumerOffsetManager(path, "broker-a")
    assert again.load() == 1 and again.offsets_of("g1") == {"kept": {0: 8}} and again.offsets_of("g2") == {}


def test_an_arrow_pull_below_the_retained_log_is_answered(tmp_path: Path) -> None:
    """The bulk (Arrow) pull of an offset whose segment retention deleted goes through the row pull (the lake
    tier's path): answered OFFSET_TOO_SMALL with the first retained offset, as the row pull is."""
    store = {**SMALL_STORE, "file_reserved_hours": 1, "delete_when_hours": (), "background_services": False}
    broker = Broker(BrokerConfig(data_dir=tmp_path, port=10911, store=store)).start()
    try:
        broker.admin_processor.create_or_update_topic("kept", 1, 1)
        for i in range(48):
            broker.send_processor.send("kept", OutgoingMessage(b"%d" % i + b"r" * 60_000), queue_id=0)
        segments = broker.store.commit_log.segments()
        assert len(segments) >= 3
        old = time.time() - 2 * 3600
        for _start, path in segments[:2]:
            os.utime(path, (old, old))
        assert broker.store.run_retention().segments == 2
        first = broker.store.min_offset("kept", 0)
        assert first > 0
        rows = broker.pull_processor.pull_once("kept", 0, 0, 8)
        result, batch = broker.pull_processor.pull_arrow_once("kept", 0, 0, 8)
        assert (result.status, result.next_offset) == (rows.status, rows.next_offset)
        assert result.status is PullStatus.OFFSET_TOO_SMALL and result.next_offset == first
        assert batch.num_rows == len(result.messages) == 0
    finally:
        broker.shutdown()
