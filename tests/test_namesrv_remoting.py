"""The name server speaks RocketMQ's remoting protocol on its one port (a real name-server process).

Frames are written as the Java client writes them (``rmq_wire``: JSON and ROCKETMQ headers); brokers register
over HTTP on the same port, as sparkmq's brokers do.  Route answers are checked byte for byte where RocketMQ's
clients parse them by hand (Go splits ``brokerAddrs`` on ``,`` and ``:``): compact JSON, quoted broker ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from acl_users import ACL_SETTINGS, ALICE, ROOT
from rmq_wire import RawClient, java_sign

from procs import NAMESRV, ProcessHarness, ServiceProcess
from sparkmq.platform.client.routes import NameServerRoutes, TopicRouteCache, TopicRouteInfo
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import RequestCode

TBW102 = {"read_queue_nums": 8, "write_queue_nums": 8, "perm": 7, "topic_sys_flag": 0}


def register(ns: ServiceProcess, name: str, addr: str, remoting: str | None, topics: dict[str, dict[str, int]],
             *, cluster: str = "DefaultCluster", broker_id: int = 0, version: int = 1,
             headers: dict[str, str] | None = None) -> None:
    """What a sparkmq broker's registration says (``POST /brokers/register``)."""
    body = {"cluster": cluster, "broker_name": name, "broker_id": broker_id, "broker_addr": addr,
            "remoting_addr": remoting, "data_version": version, "topic_configs": topics}
    resp = httpx.post(ns.url + "/brokers/register", json=body, headers=headers or {})
    assert resp.status_code == 200, resp.text


def q(n: int, perm: int = 6) -> dict[str, int]:
    return {"read_queue_nums": n, "write_queue_nums": n, "perm": perm, "topic_sys_flag": 0}


@pytest.fixture
def ns(procs: ProcessHarness) -> ServiceProcess:
    return procs.start("namesrv", NAMESRV)


def test_route_is_rocketmqs_topic_route_data(ns: ServiceProcess) -> None:
    register(ns, "broker-a", "127.0.0.1:20911", "127.0.0.1:20912", {"orders": q(4), "TBW102": TBW102})
    register(ns, "broker-a", "127.0.0.1:20913", None, {}, broker_id=1)
    register(ns, "broker-b", "127.0.0.1:21911", "127.0.0.1:21911", {"orders": q(2, 4)})
    for serialize in ("json", "rocketmq"):
        with RawClient(ns.addr) as client:
            reply = client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}, serialize=serialize)
        assert reply.code == 0, reply.remark
        body = bytes(reply.body)
        assert b" " not in body and b"\n" not in body, "compact: Go splits brokerAddrs by hand"
        assert b'"brokerAddrs":{"0":"127.0.0.1:20912","1":"127.0.0.1:20913"}' in body, body
        route = json.loads(body)
        assert route["brokerDatas"] == [
            {"cluster": "DefaultCluster", "brokerName": "broker-a", "enableActingMaster": False, "zoneName": None,
             "brokerAddrs": {"0": "127.0.0.1:20912", "1": "127.0.0.1:20913"}},
            {"cluster": "DefaultCluster", "brokerName": "broker-b", "enableActingMaster": False, "zoneName": None,
             "brokerAddrs": {"0": "127.0.0.1:21911"}}]
        assert route["queueDatas"] == [
            {"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0},
            {"brokerName": "broker-b", "readQueueNums": 2, "writeQueueNums": 2, "perm": 4, "topicSysFlag": 0}]
    # HTTP still answers on the same port
    assert httpx.get(ns.url + "/routes/orders").json()["queue_datas"][0]["broker_name"] == "broker-a"


def test_producer_new_topic_flow_through_tbw102(ns: ServiceProcess) -> None:
    """105(topic) -> TOPIC_NOT_EXIST -> 105(TBW102): the brokers that auto-create topics."""
    register(ns, "broker-a", "127.0.0.1:20911", "127.0.0.1:20911", {"TBW102": TBW102})
    register(ns, "broker-b", "127.0.0.1:21911", "127.0.0.1:21911", {"orders": q(4)})  # auto-create off
    with RawClient(ns.addr) as client:
        missing = client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "brand-new"})
        assert missing.code == 17 and missing.body == b""
        assert missing.remark == "No topic route info in name server for the topic: brand-new"
        default = client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    route = json.loads(bytes(default.body))
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-a"]
    assert route["queueDatas"][0]["perm"] & 2 and route["queueDatas"][0]["perm"] & 1, "writable, inherited"


def test_cluster_topics_and_deletion(ns: ServiceProcess) -> None:
    register(ns, "broker-a", "127.0.0.1:20911", "127.0.0.1:20912", {"orders": q(4), "events": q(1)})
    register(ns, "broker-c", "127.0.0.1:22911", "127.0.0.1:22911", {"orders": q(4)}, cluster="Other")
    with RawClient(ns.addr) as client:
        info = json.loads(bytes(client.request(RequestCode.GET_BROKER_CLUSTER_INFO).body))
        assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"], "Other": ["broker-c"]}
        assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": "127.0.0.1:20912"}
        topics = json.loads(bytes(client.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body))
        assert topics == {"topicList": ["events", "orders"]}
        by_cluster = client.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "Other"})
        assert json.loads(bytes(by_cluster.body)) == {"topicList": ["orders"]}
        system = json.loads(bytes(client.request(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS).body))
        assert system == {"topicList": ["DefaultCluster", "broker-a", "Other", "broker-c"],
                          "brokerAddr": "127.0.0.1:20911"}
        # forget orders in one cluster only, then everywhere
        one_cluster = {"topic": "orders", "clusterName": "Other"}
        assert client.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, one_cluster).code == 0
        route = json.loads(bytes(client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).body))
        assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-a"]
        assert client.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "orders"}).code == 0
        assert client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).code == 17
        # a code the name server does not serve, a header missing its field, a bad topic name
        unsupported = client.request(RequestCode.REGISTER_BROKER, {})
        assert unsupported.code == 3 and unsupported.ext["errorCode"] == "REQUEST_CODE_NOT_SUPPORTED"
        assert client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {}).code == 29
        assert client.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "no spaces"}).code == 29


def test_kv_configs(procs: ProcessHarness, tmp_path: Path) -> None:
    ns = procs.start("namesrv", NAMESRV, "--data-dir", str(tmp_path / "ns"))
    with RawClient(ns.addr) as client:
        missing = client.request(RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "orders"})
        assert missing.code == 22 and missing.remark == "No config item, Namespace: ORDER_TOPIC_CONFIG Key: orders"
        assert client.request(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"}).code == 22
        for key, value in (("orders", "broker-a:4;broker-b:4"), ("events", "broker-a:1")):
            assert client.request(RequestCode.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": key,
                                                              "value": value}).code == 0
        got = client.request(RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "orders"})
        assert got.code == 0 and got.ext["value"] == "broker-a:4;broker-b:4"
        events = {"namespace": "ORDER_TOPIC_CONFIG", "key": "events"}
        assert client.request(RequestCode.DELETE_KV_CONFIG, events).code == 0
        assert client.request(RequestCode.PUT_KV_CONFIG, {"namespace": "N"}).code == 29
    ns.stop()
    ns = procs.start("namesrv", NAMESRV, "--data-dir", str(tmp_path / "ns"))  # kept across a restart
    with RawClient(ns.addr) as client:
        listed = client.request(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"})
    assert json.loads(bytes(listed.body)) == {"table": {"orders": "broker-a:4;broker-b:4"}}


def test_acl_on_the_name_servers_remoting(procs: ProcessHarness, tmp_path: Path) -> None:
    conf = tmp_path / "ns.toml"
    settings = {**ACL_SETTINGS, "data_dir": str(tmp_path / "ns")}
    conf.write_text("[namesrv]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    ns = procs.start("namesrv", NAMESRV, "--config", str(conf))
    signer_headers = _http_signer(ROOT)
    # alice may only subscribe to orders
    for path, body in (("/acl/users", {"access_key": ALICE.access_key, "secret_key": ALICE.secret_key}),
                       ("/acl/policies", {"subject": "alice", "entries": [{"resource": "Topic:orders",
                                                                           "actions": ["Sub"]}]})):
        raw = json.dumps(body).encode()
        resp = httpx.post(ns.url + path, content=raw, headers={"content-type": "application/json",
                                                               **signer_headers("POST", path, raw)})
        assert resp.status_code == 200, resp.text
    with RawClient(ns.addr) as client:
        def ask(code: int, ext: dict[str, str], who: Any = ALICE):
            return client.request(code, java_sign(ext, b"", who.access_key, who.secret_key) if who else ext)

        assert ask(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).code == 17  # allowed; nothing routed
        refused = ask(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "events"})
        assert (refused.code, refused.ext["errorCode"]) == (16, "NO_PERMISSION")
        unsigned = ask(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}, who=None)
        assert (unsigned.code, unsigned.ext["errorCode"]) == (16, "AUTHENTICATION_FAILED")
        assert ask(RequestCode.GET_KV_CONFIG, {"namespace": "N", "key": "k"}).code == 22  # any signed user
        assert ask(RequestCode.PUT_KV_CONFIG, {"namespace": "N", "key": "k", "value": "v"}).code == 16
        assert ask(RequestCode.PUT_KV_CONFIG, {"namespace": "N", "key": "k", "value": "v"}, who=ROOT).code == 0
        assert ask(RequestCode.GET_BROKER_CLUSTER_INFO, {}).code == 16


def _http_signer(credentials: Any):
    from sparkmq.platform.auth import Signer

    signer = Signer(credentials)
    return lambda method, path, body: signer.http_headers(method, path, body)


# -- sparkmq's client reads its routes over remoting ----------------------------------------------------------
def test_client_routes_over_remoting_with_failover(procs: ProcessHarness) -> None:
    ns1, ns2 = procs.start_many([("namesrv", NAMESRV, []), ("namesrv", NAMESRV, [])])
    for ns in (ns1, ns2):
        register(ns, "broker-a", "127.0.0.1:20911", "127.0.0.1:20912", {"orders": q(2), "TBW102": TBW102})
        register(ns, "broker-a", "127.0.0.1:20913", None, {}, broker_id=1)
    routes = NameServerRoutes([ns1.addr, ns2.addr], timeout_s=3.0)
    try:
        data = routes.topic_route("orders")
        assert isinstance(data, p.TopicRouteData)
        route = TopicRouteInfo.from_route_data("orders", data)
        assert [qq.key for qq in route.write_queues] == ["broker-a/0", "broker-a/1"]
        assert route.master_addr("broker-a") == "127.0.0.1:20912" and route.read_addr("broker-a") == "127.0.0.1:20912"
        with pytest.raises(SparkMQError) as err:
            routes.topic_route("nobody")
        assert err.value.code is ErrorCode.TOPIC_NOT_EXIST
        cache = TopicRouteCache(routes)
        default = cache.get("brand-new", allow_default=True)  # a producer's new topic: TBW102's brokers
        assert default.is_default and [qq.key for qq in default.write_queues][:1] == ["broker-a/0"]
        assert len(default.write_queues) == 4
        ns1.stop()  # the next name server answers
        assert TopicRouteInfo.from_route_data("orders", routes.topic_route("orders")).broker_names == ["broker-a"]
        assert routes.current == ns2.addr
        assert "broker-a" in routes.cluster_info().brokerAddrTable
        assert routes.topic_list() == ["TBW102", "orders"]
    finally:
        routes.close()
