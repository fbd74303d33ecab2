"""Name server: the route table in-process, then two real name server processes over HTTP."""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from procs import NAMESRV, ProcessHarness, ServiceProcess, wait_until
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.namesrv import (
    NameServerConfig,
    RouteTable,
    TopicConfig,
    is_readable,
    is_writeable,
    perm_to_string,
)

CLUSTER = "DefaultCluster"
A_ADDR, A_HA = "127.0.0.1:10911", "127.0.0.1:10912"
A_SLAVE, A_SLAVE_HA = "127.0.0.1:10921", "127.0.0.1:10922"
B_ADDR = "127.0.0.1:10931"


def snapshot(table: RouteTable) -> tuple[dict[str, Any], list[str]]:
    """The table's state without heartbeat ages (which move with the clock)."""
    info = table.cluster_info(now=0.0).to_dict()
    for live in info["live_brokers"].values():
        live.pop("last_heartbeat_age_s")
    routes = {t: table.topic_route(t).to_dict() for t in table.topic_list()}  # type: ignore[union-attr]
    return {"cluster": info, "routes": routes}, table.topic_list()


@pytest.fixture
def table() -> RouteTable:
    """A route table with a 120 s expiry whose clock the tests pass explicitly."""
    return RouteTable(NameServerConfig(broker_expiry_s=120.0), clock=lambda: 0.0)


# -- config -----------------------------------------------------------------------------------

def test_config_defaults_follow_rocketmq() -> None:
    cfg = NameServerConfig()
    assert (cfg.host, cfg.port, cfg.scan_interval_s, cfg.broker_expiry_s) == ("127.0.0.1", 9876, 5.0, 120.0)


@pytest.mark.parametrize("kwargs, bad", [
    ({"port": -1}, "-1"), ({"port": 65536}, "65536"), ({"port": True}, "True"), ({"host": ""}, "''"),
    ({"scan_interval_s": 0}, "0"), ({"broker_expiry_s": float("nan")}, "nan"), ({"broker_expiry_s": "5"}, "'5'"),
])
def test_config_rejects_bad_values_naming_them(kwargs: dict[str, Any], bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        NameServerConfig(**kwargs)


# -- route table ------------------------------------------------------------------------------

def test_register_and_route(table: RouteTable) -> None:
    assert table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, A_HA, 1,
                                 {"TopicA": TopicConfig(4, 4, 6), "TopicRO": TopicConfig(2, 2, 4)},
                                 remoting_addr="127.0.0.1:10913", now=0.0)
    route = table.topic_route("TopicA")
    assert route is not None
    assert route.to_dict() == {
        "queue_datas": [{"broker_name": "broker-a", "read_queue_nums": 4, "write_queue_nums": 4, "perm": 6,
                         "topic_sys_flag": 0}],
        "broker_datas": [{"cluster": CLUSTER, "broker_name": "broker-a", "broker_addrs": {"0": A_ADDR},
                          "ha_addrs": {"0": A_HA}, "remoting_addrs": {"0": "127.0.0.1:10913"}, "grpc_addrs": {}}],
    }
    assert table.topic_list() == ["TopicA", "TopicRO"]
    assert table.topic_route("Nobody") is None
    info = table.cluster_info(now=3.0)
    assert info.clusters == {CLUSTER: ["broker-a"]}
    assert info.live_brokers[A_ADDR].data_version == 1
    assert info.live_brokers[A_ADDR].last_heartbeat_age_s == 3.0
    json.dumps(info.to_dict())  # JSON-ready as is


def test_unchanged_data_version_only_refreshes_heartbeat(table: RouteTable) -> None:
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, A_HA, 1, {"T": TopicConfig(4, 4, 6)}, now=0.0)
    before = snapshot(table)
    # Same version, different topics: a heartbeat; the configs are not re-read.
    assert not table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, A_HA, 1,
                                     {"T": TopicConfig(8, 8, 6), "U": TopicConfig()}, now=100.0)
    assert snapshot(table) == before
    assert table.scan_expired(now=200.0) == []  # refreshed at 100: silent 100 s <= 120 s
    # A new version is read in full, and the topics it no longer reports lose this broker.
    assert table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, A_HA, 2, {"U": TopicConfig(8, 8, 6)}, now=201.0)
    assert table.topic_list() == ["U"]
    assert table.topic_route("U").queue_datas[0].write_queue_nums == 8  # type: ignore[union-attr]


def test_expiry_removes_the_silent_brokers_topics_and_name(table: RouteTable) -> None:
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 1,
                          {"Shared": TopicConfig(4, 4, 6), "OnlyA": TopicConfig(4, 4, 6)}, now=0.0)
    table.register_broker(CLUSTER, "broker-b", 0, B_ADDR, None, 1, {"Shared": TopicConfig(2, 2, 6)}, now=0.0)
    table.register_broker(CLUSTER, "broker-b", 0, B_ADDR, None, 1, {"Shared": TopicConfig(2, 2, 6)}, now=60.0)
    assert table.scan_expired(now=120.0) == []  # exactly the expiry is not "longer than"
    removed = table.scan_expired(now=120.5)
    assert [(b.broker_name, b.broker_id, b.broker_addr) for b in removed] == [("broker-a", 0, A_ADDR)]
    assert table.topic_list() == ["Shared"]
    shared = table.topic_route("Shared")
    assert shared is not None
    assert [q.broker_name for q in shared.queue_datas] == [b.broker_name for b in shared.broker_datas] == ["broker-b"]
    assert table.cluster_info().clusters == {CLUSTER: ["broker-b"]}
    assert table.broker_data("broker-a") is None
    assert [b.broker_name for b in table.scan_expired(now=181.0)] == ["broker-b"]
    assert table.topic_list() == [] and table.cluster_info().clusters == {}


def test_master_expiry_keeps_slave_reads_but_clears_write(table: RouteTable) -> None:
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, A_HA, 1, {"T": TopicConfig(4, 4, 6)}, now=0.0)
    table.register_broker(CLUSTER, "broker-a", 1, A_SLAVE, A_SLAVE_HA, 1, {"T": TopicConfig(4, 4, 6)}, now=0.0)
    route = table.topic_route("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: A_ADDR, 1: A_SLAVE}
    table.register_broker(CLUSTER, "broker-a", 1, A_SLAVE, A_SLAVE_HA, 1, {}, now=100.0)  # heartbeat
    assert [b.broker_id for b in table.scan_expired(now=121.0)] == [0]
    route = table.topic_route("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {1: A_SLAVE} and route.broker_datas[0].master_addr is None
    assert route.queue_datas[0].perm == 4 and not is_writeable(route.queue_datas[0].perm)
    # The master comes back: its registration restores the perm it announces.
    assert table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, A_HA, 1, {"T": TopicConfig(4, 4, 6)}, now=130.0)
    assert table.topic_route("T").queue_datas[0].perm == 6  # type: ignore[union-attr]


def test_slave_topics_do_not_define_routes(table: RouteTable) -> None:
    table.register_broker(CLUSTER, "broker-a", 1, A_SLAVE, None, 1, {"T": TopicConfig(4, 4, 6)}, now=0.0)
    assert table.topic_list() == []
    assert table.cluster_info().brokers["broker-a"].broker_addrs == {1: A_SLAVE}
    # Promoted: the same address re-registers as master and moves to id 0.
    assert table.register_broker(CLUSTER, "broker-a", 0, A_SLAVE, None, 2, {"T": TopicConfig(4, 4, 6)}, now=1.0)
    assert table.cluster_info().brokers["broker-a"].broker_addrs == {0: A_SLAVE}
    assert table.topic_list() == ["T"]


def test_unregister(table: RouteTable) -> None:
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 1, {"T": TopicConfig()}, now=0.0)
    before = snapshot(table)
    assert not table.unregister_broker(CLUSTER, "broker-x", 0, A_ADDR)  # not who registered there
    assert not table.unregister_broker(CLUSTER, "broker-a", 1, A_ADDR)
    assert not table.unregister_broker(CLUSTER, "broker-a", 0, B_ADDR)
    assert snapshot(table) == before
    assert table.unregister_broker(CLUSTER, "broker-a", 0, A_ADDR)
    assert table.topic_list() == [] and table.cluster_info().brokers == {}
    assert not table.unregister_broker(CLUSTER, "broker-a", 0, A_ADDR)


@pytest.mark.parametrize("perm, readable, writeable, text", [
    (6, True, True, "RW-"), (4, True, False, "R--"), (2, False, True, "-W-"), (0, False, False, "---"),
    (7, True, True, "RWX"),
])
def test_perm_semantics(table: RouteTable, perm: int, readable: bool, writeable: bool, text: str) -> None:
    assert (is_readable(perm), is_writeable(perm), perm_to_string(perm)) == (readable, writeable, text)
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 1, {"T": TopicConfig(4, 4, perm)}, now=0.0)
    assert table.topic_route("T").queue_datas[0].perm == perm  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [8, -1, True, "6"])
def test_perm_out_of_range_is_invalid_argument(bad: object) -> None:
    with pytest.raises(SparkMQError) as err:
        TopicConfig(4, 4, bad)  # type: ignore[arg-type]
    assert err.value.code is ErrorCode.INVALID_ARGUMENT and repr(bad) in err.value.message


def test_topic_config_from_dict() -> None:
    assert TopicConfig.from_dict({"read_queue_nums": 4, "write_queue_nums": 2, "perm": 4}) == TopicConfig(4, 2, 4, 0)
    for bad in ({"read_queue_nums": 4, "perm": 6}, {"read_queue_nums": 4, "write_queue_nums": 4, "perm": 6, "x": 1},
                ["not", "a", "mapping"]):
        with pytest.raises(SparkMQError) as err:
            TopicConfig.from_dict(bad)  # type: ignore[arg-type]
        assert err.value.code is ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("topic", ["", "has space", "slash/topic", "a" * 128, "ünïcode"])
def test_bad_topic_names_are_topic_illegal_and_change_nothing(table: RouteTable, topic: str) -> None:
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 1, {"Good": TopicConfig()}, now=0.0)
    before = snapshot(table)
    for call in (
        lambda: table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 2,
                                      {"AlsoGood": TopicConfig(), topic: TopicConfig()}, now=1.0),
        lambda: table.topic_route(topic),
        lambda: table.delete_topic(topic),
    ):
        with pytest.raises(SparkMQError) as err:
            call()
        assert err.value.code is ErrorCode.TOPIC_ILLEGAL
    assert snapshot(table) == before
    assert table.cluster_info().live_brokers[A_ADDR].data_version == 1


@pytest.mark.parametrize("field, value", [
    ("cluster", ""), ("cluster", "bad cluster"), ("broker_name", "x" * 128), ("broker_id", -1),
    ("broker_id", True), ("broker_addr", "127.0.0.1"), ("broker_addr", "127.0.0.1:0"),
    ("broker_addr", "127.0.0.1:99999"), ("ha_addr", "nope"), ("data_version", -1), ("data_version", 1.5),
])
def test_bad_registration_arguments_change_nothing(table: RouteTable, field: str, value: object) -> None:
    good = {"cluster": CLUSTER, "broker_name": "broker-a", "broker_id": 0, "broker_addr": A_ADDR,
            "ha_addr": A_HA, "data_version": 1, "topic_configs": {"T": TopicConfig()}}
    table.register_broker(**good, now=0.0)  # type: ignore[arg-type]
    before = snapshot(table)
    with pytest.raises(SparkMQError) as err:
        table.register_broker(**{**good, field: value, "data_version": good["data_version"] + 1
                                 if field != "data_version" else value}, now=1.0)  # type: ignore[arg-type]
    assert err.value.code is ErrorCode.INVALID_ARGUMENT
    assert snapshot(table) == before


def test_delete_topic(table: RouteTable) -> None:
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 1, {"T": TopicConfig()}, now=0.0)
    table.register_broker("Other", "broker-b", 0, B_ADDR, None, 1, {"T": TopicConfig()}, now=0.0)
    assert table.delete_topic("T", cluster="Other")
    assert [q.broker_name for q in table.topic_route("T").queue_datas] == ["broker-a"]  # type: ignore[union-attr]
    assert not table.delete_topic("T", cluster="Other")
    assert table.delete_topic("T") and table.topic_route("T") is None and not table.delete_topic("T")
    # Like RocketMQ, a broker re-adds it with its next data version (a heartbeat does not).
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 1, {"T": TopicConfig()}, now=1.0)
    assert table.topic_list() == []
    table.register_broker(CLUSTER, "broker-a", 0, A_ADDR, None, 2, {"T": TopicConfig()}, now=2.0)
    assert table.topic_list() == ["T"]


def test_concurrent_registration_and_scans_stay_consistent() -> None:
    clock = {"now": 0.0}
    table = RouteTable(NameServerConfig(broker_expiry_s=1.0), clock=lambda: clock["now"])

    def broker(i: int) -> None:
        for version in range(200):
            table.register_broker(CLUSTER, f"broker-{i}", 0, f"127.0.0.1:{20000 + i}", None, version,
                                  {"Shared": TopicConfig(), f"Own{i}": TopicConfig()})

    def scanner() -> None:
        for _ in range(200):
            table.scan_expired()
            table.cluster_info()

    threads = [threading.Thread(target=broker, args=(i,)) for i in range(4)] + [threading.Thread(target=scanner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    route = table.topic_route("Shared")
    assert route is not None and len(route.queue_datas) == len(route.broker_datas) == 4
    clock["now"] = 5.0
    assert len(table.scan_expired()) == 4 and table.topic_list() == []


# -- real name server processes ---------------------------------------------------------------

def start_namesrvs(procs: ProcessHarness, count: int, *extra: str) -> list[ServiceProcess]:
    """Start ``count`` name servers at once (free loopback ports; they boot in parallel), each with ``extra``."""
    return procs.start_many([("namesrv", NAMESRV, list(extra))] * count, ready_timeout=20)


def _registration(broker_name: str, addr: str, version: int, **topics: dict[str, int]) -> dict[str, Any]:
    return {"cluster": CLUSTER, "broker_name": broker_name, "broker_id": 0, "broker_addr": addr,
            "ha_addr": None, "data_version": version, "topic_configs": topics}


@pytest.mark.cluster
def test_two_name_servers_route_and_expire_a_silent_broker(procs: ProcessHarness) -> None:
    expiry = 2.0
    servers = start_namesrvs(procs, 2, "--broker-expiry-s", str(expiry), "--scan-interval-s", "0.25")
    clients = [httpx.Client(base_url=s.url, timeout=5) for s in servers]
    topic = {"read_queue_nums": 3, "write_queue_nums": 3, "perm": 6, "topic_sys_flag": 0}
    body = _registration("broker-a", A_ADDR, 1, TopicA=topic)
    for client in clients:  # a broker registers with every name server
        resp = client.post("/brokers/register", json=body)
        assert resp.status_code == 200 and resp.json() == {"changed": True, "master_addr": A_ADDR,
                                                           "master_ha_addr": None}
    # Name servers never talk to each other: what only one is told, only that one knows.
    assert clients[0].post("/brokers/register", json=_registration("broker-b", B_ADDR, 1, TopicB=topic)).is_success
    assert clients[1].get("/routes/TopicB").status_code == 404

    routes = [c.get("/routes/TopicA") for c in clients]
    assert [r.status_code for r in routes] == [200, 200]
    assert routes[0].json() == routes[1].json() == {
        "queue_datas": [{"broker_name": "broker-a", **topic}],
        "broker_datas": [{"cluster": CLUSTER, "broker_name": "broker-a", "broker_addrs": {"0": A_ADDR},
                          "ha_addrs": {}, "remoting_addrs": {}, "grpc_addrs": {}}],
    }
    # Heartbeats (same data version) keep broker-a alive past the expiry ...
    until = time.monotonic() + expiry * 1.25
    while True:
        for client in clients:
            assert client.post("/brokers/register", json=body).json()["changed"] is False
        last_beat = time.monotonic()
        if last_beat >= until:
            break
        time.sleep(0.4)
    assert all(c.get("/routes/TopicA").status_code == 200 for c in clients)
    # ... and once they stop, both name servers drop it after the expiry, on their own.
    dropped_after: list[float | None] = [None, None]

    def both_dropped() -> bool:
        for i, client in enumerate(clients):
            if dropped_after[i] is None and client.get("/routes/TopicA").status_code == 404:
                dropped_after[i] = time.monotonic() - last_beat
        return None not in dropped_after
    wait_until(both_dropped, expiry + 5 - (time.monotonic() - last_beat), "both name servers to drop the silent broker")
    # Not before the expiry (less the few ms between a server's clock reading and ours), and soon after it.
    assert all(expiry - 0.2 <= t <= expiry + 2.0 for t in dropped_after), dropped_after  # type: ignore[operator]
    for client in clients:
        missing = client.get("/routes/TopicA")
        assert missing.json()["code"] == "TOPIC_NOT_EXIST"
        assert "broker-a" not in client.get("/cluster").json()["brokers"]
        assert client.get("/topics").json() == {"topics": []}  # broker-b is silent too on name server 0
        client.close()


def _state(client: httpx.Client) -> tuple[Any, Any]:
    cluster = client.get("/cluster").json()
    for live in cluster["live_brokers"].values():
        live.pop("last_heartbeat_age_s")
    return cluster, client.get("/topics").json()


@pytest.mark.cluster
def test_bad_input_over_http_is_a_stable_error_and_changes_nothing(procs: ProcessHarness) -> None:
    (server,) = start_namesrvs(procs, 1)  # default 120 s expiry: nothing expires during the test
    client = httpx.Client(base_url=server.url, timeout=5)
    topic = {"read_queue_nums": 4, "write_queue_nums": 4, "perm": 6}
    good = _registration("broker-a", A_ADDR, 1, TopicA=topic)
    assert client.post("/brokers/register", json=good).json()["changed"] is True
    before = _state(client)
    json_headers = {"content-type": "application/json"}

    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("POST", "/brokers/register", {"content": b'{"cluster": "c", ', "headers": json_headers}, 400,
         "INVALID_ARGUMENT"),
        ("POST", "/brokers/register", {"content": b"[]", "headers": json_headers}, 400, "INVALID_ARGUMENT"),
        ("POST", "/brokers/register", {"json": {"cluster": CLUSTER}}, 400, "INVALID_ARGUMENT"),
        ("POST", "/brokers/register", {"json": {**good, "data_version": 2, "broker_id": "0"}}, 400,
         "INVALID_ARGUMENT"),
        ("POST", "/brokers/register", {"json": {**good, "data_version": 2, "broker_addr": "localhost"}}, 400,
         "INVALID_ARGUMENT"),
        ("POST", "/brokers/register",
         {"json": {**good, "data_version": 2, "topic_configs": {"TopicA": {**topic, "perm": 9}}}}, 400,
         "INVALID_ARGUMENT"),
        ("POST", "/brokers/register",
         {"json": {**good, "data_version": 2, "topic_configs": {"TopicA": {"perm": 6}}}}, 400, "INVALID_ARGUMENT"),
        ("POST", "/brokers/register",
         {"json": {**good, "data_version": 2, "topic_configs": {"TopicB": topic, "bad topic!": topic}}}, 400,
         "TOPIC_ILLEGAL"),
        ("POST", "/brokers/register",
         {"json": {**good, "data_version": 2, "topic_configs": {"x" * 128: topic}}}, 400, "TOPIC_ILLEGAL"),
        ("POST", "/brokers/unregister", {"json": {"cluster": CLUSTER, "broker_addr": A_ADDR}}, 400,
         "INVALID_ARGUMENT"),
        ("POST", "/brokers/unregister", {"content": b"not json", "headers": json_headers}, 400, "INVALID_ARGUMENT"),
        ("GET", "/routes/bad%20topic", {}, 400, "TOPIC_ILLEGAL"),
        ("GET", "/routes/" + "y" * 128, {}, 400, "TOPIC_ILLEGAL"),
        ("GET", "/routes/NoSuchTopic", {}, 404, "TOPIC_NOT_EXIST"),
        ("DELETE", "/topics/bad%2Ctopic", {}, 400, "TOPIC_ILLEGAL"),
        ("DELETE", "/topics/TopicA?cluster=bad%20cluster", {}, 400, "INVALID_ARGUMENT"),
    ]
    for method, path, kwargs, status, code in cases:
        resp = client.request(method, path, **kwargs)
        assert resp.status_code == status, (method, path, kwargs, resp.text)
        body = resp.json()
        assert set(body) == {"code", "message"} and body["code"] == code and body["message"], (path, body)
        assert _state(client) == before, (method, path, kwargs)

    malformed = client.post("/brokers/register", content=b'{"cluster": ', headers=json_headers).json()
    assert malformed["message"].startswith("malformed JSON at position")

    # The good paths of the remaining endpoints.
    assert client.get("/health").json() == {"status": "ok", "live_brokers": 1, "topics": 1}
    assert client.delete("/topics/TopicA").json() == {"topic": "TopicA", "deleted": True}
    assert client.delete("/topics/TopicA").json() == {"topic": "TopicA", "deleted": False}
    assert client.post("/brokers/unregister", json={"cluster": CLUSTER, "broker_name": "broker-a", "broker_id": 0,
                                                    "broker_addr": A_ADDR}).json() == {"removed": True}
    assert client.get("/cluster").json() == {"clusters": {}, "brokers": {}, "live_brokers": {}}
    assert "/routes/{topic}" in client.get("/openapi.json").json()["paths"]
    client.close()
