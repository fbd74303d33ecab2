"""Access control of the name server and the standalone gateway, against real processes (docs/security.md).

One module-wide platform, ACL on everywhere, ``root`` the bootstrap super user of every service:

* a name server (``[namesrv]`` config file, ACL in its data dir), with a broker registering with it (the broker
  signs its registrations with its bootstrap credentials: the route would not exist otherwise);
* a gateway (``[gateway]`` config file, its own ACL) forwarding as the user ``gw``.

Users, per service::

    name server  alice: Sub on Topic:orders-*, Group:cg-*     gw: Pub on Topic:*     bob: no policy
                 dora (from the topic-deletion test on): Delete on Topic:orders-del only
    broker       alice: Pub,Sub on Topic:orders-*, Sub on Group:cg-*       gw: Pub on Topic:orders-*
    gateway      alice: Pub on Topic:orders-*, Pub on Topic:other-*, Deny Pub on Topic:orders-secret
                 bob: no policy

Every refused request is checked for its stable code (401 AUTHENTICATION_FAILED, 403 NO_PERMISSION) and for
changing nothing: the name server's brokers, topics and routes, the broker's commit log, and the ACL of the
service asked are read (as root) before and after.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from acl_users import ACL_SETTINGS, ALICE, BOB, ROOT, STALE_MS, WRONG, ok

from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, child_env, wait_until, write_conf
from sparkmq.platform.auth import Credentials, Signer
from sparkmq.platform.auth.signing import grpc_signature
from sparkmq.platform.client import PullConsumer
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.producer import Producer
from sparkmq.platform.client.remoting import SigningAuth
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message

pytestmark = pytest.mark.cluster

GW = Credentials("gw", "gateway-secret-1")
GATEWAY = "sparkmq.api.gateway_main"
#: A registration nobody made: refused ones must not add it.
FAKE_BROKER = {"cluster": "FakeCluster", "broker_name": "broker-fake", "broker_id": 0,
               "broker_addr": "127.0.0.1:1", "data_version": 1,
               "topic_configs": {"orders-fake": {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}}}


def _toml(path: Path, table: str, **values: Any) -> Path:
    lines = [f"[{table}]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _acl_keys(data_dir: Path) -> dict[str, Any]:
    return {"data_dir": str(data_dir), **ACL_SETTINGS}


@dataclass
class Platform:
    """The module's services and how to reach them."""

    procs: ProcessHarness
    tmp: Path
    namesrv: ServiceProcess
    broker: ServiceProcess
    gateway: ServiceProcess

    def http(self, service: ServiceProcess, credentials: Credentials | None = ROOT) -> httpx.Client:
        return httpx.Client(base_url=service.url, timeout=10, auth=SigningAuth(credentials) if credentials else None)

    def acl(self, service: ServiceProcess) -> dict[str, Any]:
        with self.http(service) as http:
            return {"users": ok(http.get("/acl/users"))["users"], "policies": ok(http.get("/acl/policies"))}

    def namesrv_state(self) -> dict[str, Any]:
        """What a refused name-server request must not change."""
        with self.http(self.namesrv) as http:
            cluster = ok(http.get("/cluster"))
            return {"brokers": cluster["brokers"], "clusters": cluster["clusters"],
                    "live": sorted(cluster["live_brokers"]), "topics": ok(http.get("/topics"))["topics"],
                    "route": ok(http.get("/routes/orders-1")), "acl": self.acl(self.namesrv)}

    def max_offset(self) -> int:
        with self.http(self.broker) as http:
            return int(ok(http.get("/broker"))["commitlog"]["max_offset"])

    def gateway_state(self) -> dict[str, Any]:
        """What a refused gateway request must not change (read until two reads agree)."""
        last = None
        while (now := {"max_offset": self.max_offset(), "acl": self.acl(self.gateway)}) != last:
            last = now
            time.sleep(0.1)
        return now

    def client_config(self, credentials: Credentials | None, **extra: Any) -> ClientConfig:
        keys = {"access_key": credentials.access_key, "secret_key": credentials.secret_key} if credentials else {}
        return ClientConfig(namesrv_addrs=self.namesrv.addr, request_timeout_s=5.0, route_refresh_interval_s=0.5,
                            offset_store_dir=str(self.tmp / "offsets"), trace_enabled=False, **keys, **extra)


def _signed(service: ServiceProcess, credentials: Credentials | None, method: str, path: str,
            body: Any = None, *, age_ms: int = 0, sent_body: Any = None, sent_path: str | None = None
            ) -> httpx.Response:
    """One request signed by hand: ``age_ms`` back-dates it, ``sent_body``/``sent_path`` replace what was signed."""
    raw = json.dumps(body).encode() if body is not None else b""
    headers = {"content-type": "application/json"} if body is not None else {}
    with httpx.Client(base_url=service.url, timeout=10) as http:
        request = http.build_request(method, path, content=raw, headers=headers)
        if credentials is not None:
            request.headers.update(Signer(credentials).http_headers(
                method, request.url.raw_path.decode(), raw, timestamp_ms=int(time.time() * 1000) - age_ms))
        if sent_body is not None or sent_path is not None:
            content = json.dumps(sent_body).encode() if sent_body is not None else raw
            request = http.build_request(method, sent_path or path, content=content, headers=dict(request.headers))
            request.headers["content-length"] = str(len(content))
        return http.send(request)


def _start_namesrv(procs: ProcessHarness, tmp: Path, *port: str) -> ServiceProcess:
    conf = _toml(tmp / "namesrv.toml", "namesrv", **_acl_keys(tmp / "namesrv"))
    return procs.start("namesrv", NAMESRV, "--config", str(conf), "--scan-interval-s", "0.5", *port)


def _start_gateway(procs: ProcessHarness, tmp: Path, namesrv: ServiceProcess) -> ServiceProcess:
    conf = _toml(tmp / "gateway.toml", "gateway", **_acl_keys(tmp / "gateway"), access_key=GW.access_key,
                 secret_key=GW.secret_key)
    return procs.start("gateway", GATEWAY, "--namesrv", namesrv.addr, "--config", str(conf), "--send-timeout-s", "5")


def _policy(http: httpx.Client, subject: str, *entries: dict[str, Any]) -> None:
    ok(http.post("/acl/policies", json={"subject": subject, "entries": list(entries)}))


def _users(http: httpx.Client, *users: Credentials) -> None:
    for user in users:
        ok(http.post("/acl/users", json={"access_key": user.access_key, "secret_key": user.secret_key}))


@pytest.fixture(scope="module")
def platform(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    tmp = tmp_path_factory.mktemp("acl-ns-gw")
    namesrv = _start_namesrv(module_procs, tmp)
    conf = write_conf(tmp / "broker.toml", tmp / "broker", **ACL_SETTINGS)
    broker = module_procs.start("broker", BROKER, "--config", str(conf), "--namesrv", namesrv.addr,
                                "--register-interval-s", "0.5", "--no-trace", "--grpc-port", "0")
    with httpx.Client(base_url=namesrv.url, timeout=10, auth=SigningAuth(ROOT)) as http:
        _users(http, ALICE, BOB, GW)
        # Group:cg-*: a consumer's retry topic (%RETRY%cg-...) is its group's resource.
        _policy(http, "alice", {"resource": "Topic:orders-*", "actions": ["Sub"]},
                {"resource": "Group:cg-*", "actions": ["Sub"]})
        _policy(http, "gw", {"resource": "Topic:*", "actions": ["Pub"]})
    with httpx.Client(base_url=broker.url, timeout=10, auth=SigningAuth(ROOT)) as http:
        _users(http, ALICE, GW)
        _policy(http, "alice", {"resource": "Topic:orders-*", "actions": ["Pub", "Sub"]},
                {"resource": "Group:cg-*", "actions": ["Sub"]})
        _policy(http, "gw", {"resource": "Topic:orders-*", "actions": ["Pub"]})
        for topic in ("orders-1", "orders-secret", "other-1"):
            ok(http.post("/topics", json={"topic": topic, "read_queue_nums": 2, "write_queue_nums": 2}))
    gateway = _start_gateway(module_procs, tmp, namesrv)
    with httpx.Client(base_url=gateway.url, timeout=10, auth=SigningAuth(ROOT)) as http:
        _users(http, ALICE, BOB)
        _policy(http, "alice", {"resource": "Topic:orders-*", "actions": ["Pub"]},
                {"resource": "Topic:other-*", "actions": ["Pub"]},
                {"resource": "Topic:orders-secret", "actions": ["Pub"], "decision": "Deny"})
    plat = Platform(module_procs, tmp, namesrv, broker, gateway)

    def routed() -> bool:
        with plat.http(namesrv) as http:
            return all(http.get(f"/routes/{t}").status_code == 200 for t in ("orders-1", "other-1"))
    # The broker's registrations are signed: without that no route would ever appear.
    wait_until(routed, 20, "the broker's signed registration to route orders-1 and other-1")
    yield plat


# -- name server -------------------------------------------------------------------------------------------
def test_name_server_refuses_bad_signatures_and_unpermitted_users_and_changes_nothing(platform: Platform) -> None:
    ns = platform.namesrv
    other = {**FAKE_BROKER, "broker_name": "broker-other"}
    refusals = [
        ("no credentials: route", lambda: _signed(ns, None, "GET", "/routes/orders-1"), 401),
        ("no credentials: register", lambda: _signed(ns, None, "POST", "/brokers/register", FAKE_BROKER), 401),
        ("no credentials: ACL", lambda: _signed(ns, None, "GET", "/acl/users"), 401),
        ("wrong secret", lambda: _signed(ns, WRONG, "GET", "/routes/orders-1"), 401),
        ("wrong secret: register", lambda: _signed(ns, WRONG, "POST", "/brokers/register", FAKE_BROKER), 401),
        ("tampered body", lambda: _signed(ns, ROOT, "POST", "/brokers/register", FAKE_BROKER, sent_body=other), 401),
        ("tampered path", lambda: _signed(ns, ROOT, "DELETE", "/topics/orders-fake", sent_path="/topics/orders-1"),
         401),
        ("replayed", lambda: _signed(ns, ROOT, "POST", "/brokers/register", FAKE_BROKER, age_ms=STALE_MS), 401),
        ("no policy: route", lambda: _signed(ns, BOB, "GET", "/routes/orders-1"), 403),
        ("no policy: register", lambda: _signed(ns, BOB, "POST", "/brokers/register", FAKE_BROKER), 403),
        ("not granted: register", lambda: _signed(ns, ALICE, "POST", "/brokers/register", FAKE_BROKER), 403),
        ("not granted: unregister", lambda: _signed(ns, ALICE, "POST", "/brokers/unregister", {
            "cluster": "DefaultCluster", "broker_name": "broker-a", "broker_id": 0,
            "broker_addr": platform.broker.addr}), 403),
        ("not granted: delete topic", lambda: _signed(ns, ALICE, "DELETE", "/topics/orders-1"), 403),
        ("not granted: list", lambda: _signed(ns, ALICE, "GET", "/topics"), 403),
        ("not granted: cluster", lambda: _signed(ns, ALICE, "GET", "/cluster"), 403),
        ("not granted: other topic's route", lambda: _signed(ns, ALICE, "GET", "/routes/other-1"), 403),
        ("ACL admin needs a super user", lambda: _signed(ns, ALICE, "POST", "/acl/users", {
            "access_key": "mallory", "secret_key": "mallory-secret"}), 403),
    ]
    before = platform.namesrv_state()
    assert before["live"] == [platform.broker.addr]
    for what, attempt, status in refusals:
        resp = attempt()
        expected = "AUTHENTICATION_FAILED" if status == 401 else "NO_PERMISSION"
        assert (resp.status_code, resp.json()["code"]) == (status, expected), f"{what}: {resp.text}"
        assert platform.namesrv_state() == before, f"{what} changed something"
    # The right users succeed.
    assert ok(_signed(ns, ALICE, "GET", "/routes/orders-1"))["broker_datas"]
    assert ok(_signed(ns, GW, "GET", "/routes/other-1"))["broker_datas"]
    assert ok(_signed(ns, ROOT, "POST", "/brokers/register", FAKE_BROKER))["changed"]
    assert "broker-fake" in platform.namesrv_state()["brokers"]
    assert ok(_signed(ns, ROOT, "POST", "/brokers/unregister", {k: FAKE_BROKER[k] for k in (
        "cluster", "broker_name", "broker_id", "broker_addr")}))["removed"]
    with platform.http(ns, None) as http:
        assert http.get("/health").status_code == 200, "health checks need no credentials"
        assert http.get("/openapi.json").status_code == 200, "the API docs need no credentials"


def test_refusals_and_acl_changes_are_audited(platform: Platform) -> None:
    _signed(platform.namesrv, BOB, "GET", "/routes/orders-1")
    _signed(platform.gateway, BOB, "POST", "/topics/orders-1/messages", {"body": "x"})
    for service in (platform.namesrv, platform.gateway):
        wait_until(lambda s=service: "denied user=bob" in s.log() and "resource=Topic:orders-1" in s.log(), 5,
                   f"the audit line of bob's refusal at the {service.kind}")
        log = service.log()
        assert "acl change by user=root" in log and "create user bob" in log, log[-3000:]
        assert not any(c.secret_key in log for c in (ROOT, ALICE, BOB, GW)), "secrets are never logged"


# -- gateway -----------------------------------------------------------------------------------------------
def test_gateway_refuses_bad_signatures_and_unpermitted_users_and_changes_nothing(platform: Platform) -> None:
    gw = platform.gateway
    msg = {"body": "via the gateway"}
    path = "/topics/orders-1/messages"
    refusals = [
        ("no credentials", lambda: _signed(gw, None, "POST", path, msg), 401),
        ("wrong secret", lambda: _signed(gw, WRONG, "POST", path, msg), 401),
        ("tampered body", lambda: _signed(gw, ALICE, "POST", path, msg, sent_body={"body": "evil"}), 401),
        ("tampered path", lambda: _signed(gw, ALICE, "POST", path, msg, sent_path="/topics/orders-secret/messages"),
         401),
        ("replayed", lambda: _signed(gw, ALICE, "POST", path, msg, age_ms=STALE_MS), 401),
        ("unknown user", lambda: _signed(gw, GW, "POST", path, msg), 401),  # a broker user, not the gateway's
        ("no policy", lambda: _signed(gw, BOB, "POST", path, msg), 403),
        ("no policy: batch", lambda: _signed(gw, BOB, "POST", "/topics/orders-1/batch", {"messages": [msg]}), 403),
        ("no policy: route", lambda: _signed(gw, BOB, "GET", "/routes/orders-1"), 403),
        ("deny beats allow", lambda: _signed(gw, ALICE, "POST", "/topics/orders-secret/messages", msg), 403),
        ("the gateway's own user may not", lambda: _signed(gw, ALICE, "POST", "/topics/other-1/messages", msg), 403),
        ("ACL admin needs a super user", lambda: _signed(gw, ALICE, "POST", "/acl/users", {
            "access_key": "mallory", "secret_key": "mallory-secret"}), 403),
    ]
    before = platform.gateway_state()
    for what, attempt, status in refusals:
        resp = attempt()
        expected = "AUTHENTICATION_FAILED" if status == 401 else "NO_PERMISSION"
        assert (resp.status_code, resp.json()["code"]) == (status, expected), f"{what}: {resp.text}"
        assert platform.gateway_state() == before, f"{what} changed something"
    sent = ok(_signed(gw, ALICE, "POST", path, msg))
    assert sent["status"] == "SEND_OK" and sent["topic"] == "orders-1"
    batch = ok(_signed(gw, ALICE, "POST", "/topics/orders-1/batch", {"messages": [msg, msg]}))
    assert len(batch["results"]) == 2
    assert platform.gateway_state()["max_offset"] > before["max_offset"]
    assert ok(_signed(gw, ALICE, "GET", "/routes/orders-1"))["write_queues"]
    with platform.http(gw, None) as http:
        assert http.get("/health").status_code == 200


# -- administration: CLI, policy changes, restarts ---------------------------------------------------------
def _cli(*args: str, credentials: Credentials = ROOT, namesrv: str, ok: bool = True) -> Any:
    env = child_env(SPARKMQ_ACCESS_KEY=credentials.access_key, SPARKMQ_SECRET_KEY=credentials.secret_key,
                    SPARKMQ_NEW_USER_SECRET="dave-secret-1")
    done = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", namesrv, "--json", *args],
                          env=env, capture_output=True, text=True, timeout=60)
    assert "dave-secret-1" not in done.stdout + done.stderr, "secrets are never printed"
    if not ok:
        return done
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def test_gateway_policy_changes_apply_within_seconds_and_survive_a_restart(platform: Platform) -> None:
    gw, ns = platform.gateway, platform.namesrv.addr
    msg = {"body": "from bob"}
    assert _signed(gw, BOB, "POST", "/topics/orders-1/messages", msg).status_code == 403
    _cli("acl", "create", "bob", "--resource", "Topic:orders-1", "--actions", "Pub", "--server", gw.addr,
         namesrv=ns)
    wait_until(lambda: _signed(gw, BOB, "POST", "/topics/orders-1/messages", msg).status_code == 200, 5,
               "bob's new gateway policy applied without a restart")
    denied = _cli("user", "list", "--server", gw.addr, credentials=ALICE, namesrv=ns, ok=False)
    assert denied.returncode == 1 and "NO_PERMISSION" in denied.stderr
    before = platform.acl(gw)
    platform.gateway.stop()
    platform.gateway = gw = _start_gateway(platform.procs, platform.tmp, platform.namesrv)
    assert platform.acl(gw) == before
    assert ok(_signed(gw, BOB, "POST", "/topics/orders-1/messages", msg))["status"] == "SEND_OK"
    assert _signed(gw, BOB, "POST", "/topics/orders-secret/messages", msg).status_code == 403


def test_a_signed_producer_and_pull_consumer_work_and_unsigned_clients_are_refused(platform: Platform) -> None:
    """Producer and PullConsumer with credentials in ClientConfig: route lookups at the name server and sends,
    pulls and offsets at the broker are all signed by alice."""
    with Producer("pg-ns-acl", platform.client_config(ALICE)) as producer:
        sent = {producer.send(Message("orders-1", f"signed {i}".encode())).msg_id for i in range(6)}
    consumer = PullConsumer("cg-ns-acl", platform.client_config(ALICE), consume_from_where="FIRST_OFFSET")
    consumer.subscribe("orders-1")
    consumer.start()
    try:
        got: dict[str, bytes] = {}

        def polled_all() -> bool:
            got.update((m.msg_id, m.body) for m in consumer.poll(0.5))
            return sent <= set(got)
        wait_until(polled_all, 20, "the signed pull consumer's messages", interval=0)
    finally:
        consumer.shutdown()
    before = platform.namesrv_state()
    with Producer("pg-anon", platform.client_config(None, retry_times=0)) as anonymous:
        with pytest.raises(SparkMQError) as info:
            anonymous.send(Message("orders-1", b"anonymous"))
    assert info.value.code is ErrorCode.AUTHENTICATION_FAILED
    with Producer("pg-bob", platform.client_config(BOB, retry_times=0)) as unpermitted:
        with pytest.raises(SparkMQError) as info:
            unpermitted.send(Message("orders-1", b"bob has no route"))
    assert info.value.code is ErrorCode.NO_PERMISSION
    assert platform.namesrv_state() == before


def test_grpc_route_lookups_reach_the_name_server_signed_by_the_broker(platform: Platform) -> None:
    """The official clients' QueryRoute: the broker checks the caller, then asks the name server as itself."""
    from rocketmq.grpc_protocol import definition_pb2 as definition
    from rocketmq.grpc_protocol import service_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2_grpc as stubs
    with platform.http(platform.namesrv) as http:
        live = ok(http.get("/cluster"))["live_brokers"]
    grpc_addr = next(info["grpc_addr"] for info in live.values() if info.get("grpc_addr"))
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    meta = (("x-mq-client-id", "ns-acl-client"), ("x-mq-date-time", date),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ALICE.access_key}, SignedHeaders=x-mq-date-time, "
                              f"Signature={grpc_signature(ALICE.secret_key, date)}"))
    with grpc.insecure_channel(grpc_addr) as channel:
        route = stubs.MessagingServiceStub(channel).QueryRoute(
            pb.QueryRouteRequest(topic=definition.Resource(name="orders-1")), metadata=meta, timeout=10)
    assert route.status.code == definition.Code.OK, route.status
    assert len(route.message_queues) >= 2


def test_deleting_a_topic_at_the_name_server_needs_delete_on_that_topic(platform: Platform) -> None:
    """As at a broker (RocketMQ ACL 2.0): ``Delete`` on ``Topic:<name>``, not ``Update`` on ``Cluster``."""
    ns, topic = platform.namesrv, "orders-del"
    dora = Credentials("dora", "dora-secret-1")
    with platform.http(platform.broker) as http:
        ok(http.post("/topics", json={"topic": topic, "read_queue_nums": 1, "write_queue_nums": 1}))
    wait_until(lambda: _signed(ns, ROOT, "GET", f"/routes/{topic}").status_code == 200, 20, f"the route of {topic}")
    with platform.http(ns) as http:
        _users(http, dora)
        # Delete on this one topic and nothing else; alice keeps Sub on Topic:orders-*, gw Pub on Topic:*.
        _policy(http, "dora", {"resource": f"Topic:{topic}", "actions": ["Delete"]})
    before = platform.namesrv_state()
    assert topic in before["topics"]
    refusals = [("alice: Sub only", ALICE, topic), ("bob: no policy", BOB, topic), ("gw: Pub only", GW, topic),
                ("dora: another topic", dora, "orders-1")]
    for what, who, target in refusals:
        resp = _signed(ns, who, "DELETE", f"/topics/{target}")
        assert (resp.status_code, resp.json()["code"]) == (403, "NO_PERMISSION"), f"{what}: {resp.text}"
        assert platform.namesrv_state() == before, f"{what} changed something"
    assert ok(_signed(ns, dora, "DELETE", f"/topics/{topic}")) == {"topic": topic, "deleted": True}
    assert topic not in ok(_signed(ns, ROOT, "GET", "/topics"))["topics"]
    assert _signed(ns, ROOT, "GET", f"/routes/{topic}").json()["code"] == "TOPIC_NOT_EXIST"
    assert ok(_signed(ns, ROOT, "GET", "/routes/orders-1"))["broker_datas"], "other topics keep their routes"


def test_name_server_policy_changes_apply_within_seconds_and_survive_a_restart(platform: Platform) -> None:
    """Run last: it restarts the module's name server (on the same port, so the broker finds it again)."""
    ns = platform.namesrv
    dave = Credentials("dave", "dave-secret-1")
    created = _cli("user", "create", "dave", "--server", ns.addr, namesrv=ns.addr)
    assert created == [{"broker": ns.addr, "access_key": "dave", "super_user": False}]
    assert _signed(ns, dave, "GET", "/routes/orders-1").status_code == 403
    _cli("acl", "create", "dave", "--resource", "Topic:orders-*", "--actions", "Get", "--server", ns.addr,
         namesrv=ns.addr)
    wait_until(lambda: _signed(ns, dave, "GET", "/routes/orders-1").status_code == 200, 5,
               "dave's new policy applied without a restart")
    _cli("acl", "create", "dave", "--resource", "Topic:orders-1", "--actions", "Get", "--decision", "Deny",
         "--server", ns.addr, namesrv=ns.addr)
    wait_until(lambda: _signed(ns, dave, "GET", "/routes/orders-1").status_code == 403, 5, "the deny applied")
    rows = _cli("acl", "list", "dave", "--server", ns.addr, namesrv=ns.addr)
    assert {(r["resource"], r["decision"]) for r in rows} == {("Topic:orders-*", "Allow"), ("Topic:orders-1", "Deny")}
    before = platform.acl(ns)
    ns.stop()
    platform.namesrv = ns = _start_namesrv(platform.procs, platform.tmp, "--port", str(ns.port))
    assert platform.acl(ns) == before, "the name server's ACL survived its restart"
    # The broker registers again (signed) and the routes come back; dave's policy still holds.
    wait_until(lambda: _signed(ns, ROOT, "GET", "/routes/orders-1").status_code == 200, 20,
               "the broker's signed re-registration")
    assert _signed(ns, dave, "GET", "/routes/orders-1").status_code == 403
    assert ok(_signed(ns, dave, "GET", "/routes/orders-secret"))["broker_datas"]
    _cli("user", "delete", "dave", "--server", ns.addr, namesrv=ns.addr)
    assert _signed(ns, dave, "GET", "/routes/orders-secret").json()["code"] == "AUTHENTICATION_FAILED"
