"""Authentication and access control against real processes: a name server and a broker with ACL on, reached
over HTTP, binary remoting and gRPC (the official ``rocketmq-python-client`` too).

Every refused request is checked twice: its stable code (AUTHENTICATION_FAILED for a missing, wrong, tampered
or replayed signature; NO_PERMISSION for a user the ACL does not allow) and that it changed nothing (the
commit log's max offset, the topics, a group's offsets and the ACL itself are compared before and after).

Users of the module's broker (``root`` is the config's bootstrap super user)::

    alice  Pub,Sub on Topic:orders-*; Sub on Group:cg-*; Deny Pub on Topic:orders-secret
    bob    no policy at all
    carol  Pub on Topic:orders-* from 10.0.0.0/8 only (the tests connect from 127.0.0.1)
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import pytest
from acl_users import ACL_SETTINGS, ALICE, BOB, CAROL, ROOT, STALE_MS, WRONG, ok
from rmq_wire import java_sign

from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, child_env, wait_until, write_conf
from sparkmq.platform.auth import Credentials, Signer
from sparkmq.platform.auth.signing import grpc_signature
from sparkmq.platform.client import ConsumeStatus, PushConsumer
from sparkmq.platform.client.broker_remoting import send_ext
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.producer import Producer as SparkProducer
from sparkmq.platform.client.remoting import SigningAuth
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message as SparkMessage
from sparkmq.platform.common.protocol import RequestCode
from sparkmq.platform.remoting import SyncRemotingClient

pytestmark = pytest.mark.cluster

GROUP = "cg-1"


@dataclass
class AclPlatform:
    """The module's name server and ACL-enabled broker, and how to reach it."""

    procs: ProcessHarness
    tmp: Path
    namesrv: ServiceProcess
    broker: ServiceProcess
    remoting_addr: str
    grpc_addr: str

    def http(self, credentials: Credentials | None = ROOT) -> httpx.Client:
        return httpx.Client(base_url=self.broker.url, timeout=10,
                            auth=SigningAuth(credentials) if credentials else None)

    def client_config(self, credentials: Credentials | None = ROOT, **extra: Any) -> ClientConfig:
        keys = {"access_key": credentials.access_key, "secret_key": credentials.secret_key} if credentials else {}
        return ClientConfig(namesrv_addrs=self.namesrv.addr, request_timeout_s=5.0, route_refresh_interval_s=0.5,
                            offset_store_dir=str(self.tmp / "offsets"), trace_enabled=False, **keys, **extra)

    def state(self) -> dict[str, Any]:
        """What a refused request must not change: commit-log max offset, topics, offsets, users, policies
        (read until two reads agree: a request answered just before may still be settling, e.g. a POP ack)."""
        last = None
        while (now := self._read_state()) != last:
            last = now
            time.sleep(0.1)
        return now

    def _read_state(self) -> dict[str, Any]:
        with self.http() as http:
            return {"max_offset": http.get("/broker").json()["commitlog"]["max_offset"],
                    "topics": sorted(t["topic"] for t in http.get("/topics").json()["topics"]),
                    "offsets": http.get(f"/consumers/{GROUP}/offsets").json()["offsets"],
                    "users": http.get("/acl/users").json()["users"],
                    "policies": http.get("/acl/policies").json()["policies"]}


def _start_broker(procs: ProcessHarness, tmp: Path, namesrv: ServiceProcess) -> ServiceProcess:
    conf = write_conf(tmp / "broker.toml", tmp / "broker", **ACL_SETTINGS)
    # No trace records: they are appended after a send returns, and would move the commit log between the
    # snapshots that prove a refused request changed nothing.
    return procs.start("broker", BROKER, "--config", str(conf), "--namesrv", namesrv.addr, "--grpc-port", "0",
                       "--register-interval-s", "0.5", "--no-trace")


def _endpoints(namesrv: ServiceProcess) -> tuple[str, str]:
    def found() -> tuple[str, str] | None:
        live = httpx.get(f"{namesrv.url}/cluster", timeout=5).json()["live_brokers"]
        for info in live.values():
            if info.get("remoting_addr") and info.get("grpc_addr"):
                return info["remoting_addr"], info["grpc_addr"]
        return None
    return wait_until(found, 20, "the broker registered with its remoting and gRPC endpoints")


@pytest.fixture(scope="module")
def acl(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclPlatform]:
    tmp = tmp_path_factory.mktemp("acl")
    namesrv = module_procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    broker = _start_broker(module_procs, tmp, namesrv)
    remoting_addr, grpc_addr = _endpoints(namesrv)
    platform = AclPlatform(module_procs, tmp, namesrv, broker, remoting_addr, grpc_addr)
    with platform.http() as http:
        for user in (ALICE, BOB, CAROL):
            ok(http.post("/acl/users", json={"access_key": user.access_key, "secret_key": user.secret_key}))
        ok(http.post("/acl/policies", json={"subject": "alice", "entries": [
            {"resource": "Topic:orders-*", "actions": ["Pub", "Sub"]},
            {"resource": "Group:cg-*", "actions": ["Sub"]},
            {"resource": "Topic:orders-secret", "actions": ["Pub"], "decision": "Deny"}]}))
        ok(http.post("/acl/policies", json={"subject": "carol", "entries": [
            {"resource": "Topic:orders-*", "actions": ["Pub"], "source_ips": ["10.0.0.0/8"]}]}))
        for topic in ("orders-1", "orders-secret"):
            ok(http.post("/topics", json={"topic": topic, "read_queue_nums": 2, "write_queue_nums": 2}))
        ok(http.post("/topics/orders-1/messages", json={"body": "seed"}))
        ok(http.post(f"/consumers/{GROUP}/offsets", json={"offsets": [{"topic": "orders-1", "queue_id": 0,
                                                                        "offset": 0}]}))
    wait_until(lambda: _routed(namesrv, "orders-1"), 20, "the route of orders-1")
    yield platform


def _routed(namesrv: ServiceProcess, topic: str) -> bool:
    return httpx.get(f"{namesrv.url}/routes/{topic}", timeout=5).status_code == 200


# -- HTTP --------------------------------------------------------------------------------------------------
def _http_send(acl: AclPlatform, credentials: Credentials | None, path: str, body: dict[str, Any], *,
               method: str = "POST", age_ms: int = 0, sent_body: dict[str, Any] | None = None) -> httpx.Response:
    """One request signed by hand: ``age_ms`` back-dates it, ``sent_body`` replaces the body after signing."""
    raw = json.dumps(body).encode()
    with acl.http(None) as http:
        request = http.build_request(method, path, content=raw, headers={"content-type": "application/json"})
        if credentials is not None:
            request.headers.update(Signer(credentials).http_headers(
                method, request.url.raw_path.decode(), raw, timestamp_ms=int(time.time() * 1000) - age_ms))
        if sent_body is not None:
            tampered = json.dumps(sent_body).encode()
            request = http.build_request(method, path, content=tampered, headers=dict(request.headers))
            request.headers["content-length"] = str(len(tampered))
        return http.send(request)


def test_http_refuses_bad_signatures_and_unpermitted_users_and_changes_nothing(acl: AclPlatform) -> None:
    msg = {"body": "hello"}
    refusals = [
        ("no credentials", lambda: _http_send(acl, None, "/topics/orders-1/messages", msg), 401),
        ("wrong secret", lambda: _http_send(acl, WRONG, "/topics/orders-1/messages", msg), 401),
        ("tampered body", lambda: _http_send(acl, ALICE, "/topics/orders-1/messages", msg,
                                             sent_body={"body": "evil"}), 401),
        ("tampered path", lambda: _http_send_to_other_path(acl), 401),
        ("replayed", lambda: _http_send(acl, ALICE, "/topics/orders-1/messages", msg, age_ms=STALE_MS), 401),
        ("no policy", lambda: _http_send(acl, BOB, "/topics/orders-1/messages", msg), 403),
        ("deny beats allow", lambda: _http_send(acl, ALICE, "/topics/orders-secret/messages", msg), 403),
        ("not granted: create", lambda: _http_send(acl, ALICE, "/topics", {"topic": "orders-new"}), 403),
        ("not granted: delete", lambda: _http_send(acl, ALICE, "/topics/orders-1", {}, method="DELETE"), 403),
        ("not granted: offsets", lambda: _http_send(acl, BOB, f"/consumers/{GROUP}/offsets", {
            "offsets": [{"topic": "orders-1", "queue_id": 0, "offset": 1}]}), 403),
        ("not granted: reset", lambda: _http_send(acl, ALICE, f"/consumers/{GROUP}/offsets/reset", {
            "topic": "orders-1", "offsets": {"0": 1}}), 403),
        ("other source address", lambda: _http_send(acl, CAROL, "/topics/orders-1/messages", msg), 403),
        ("ACL admin needs a super user", lambda: _http_send(acl, ALICE, "/acl/users", {
            "access_key": "mallory", "secret_key": "mallory-secret"}), 403),
    ]
    before = acl.state()
    for what, attempt, status in refusals:
        resp = attempt()
        expected = "AUTHENTICATION_FAILED" if status == 401 else "NO_PERMISSION"
        assert (resp.status_code, resp.json()["code"]) == (status, expected), f"{what}: {resp.text}"
        assert acl.state() == before, f"{what} changed something"
    sent = ok(_http_send(acl, ALICE, "/topics/orders-1/messages", msg))
    assert sent["status"] == "SEND_OK"
    assert acl.state()["max_offset"] > before["max_offset"]
    with acl.http(None) as http:
        assert http.get("/health").status_code == 200, "health checks need no credentials"


def test_a_groups_retry_topic_is_the_groups_resource_over_http(acl: AclPlatform) -> None:
    """``%RETRY%cg-1`` is ``Group:cg-1`` on HTTP as on remoting and the name server: alice (``Sub`` on
    ``Group:cg-*``, nothing on ``Topic:%RETRY%*``) reads it; bob (no policy) is refused."""
    retry = "%RETRY%cg-1"
    with acl.http() as http:  # the broker makes the retry topic: a message re-sent to the group lands there
        sent = ok(http.post("/topics/orders-1/messages", json={"body": "again"}))
        ok(http.post("/consumers/cg-1/resend", json={"msg_id": sent["offset_msg_id"]}))
    path = f"/topics/{quote(retry, safe='')}/queues/0/offsets"
    with acl.http(ALICE) as http:
        assert ok(http.get(path))["max_offset"] >= 1
    with acl.http(BOB) as http:
        resp = http.get(path)
    assert (resp.status_code, resp.json()["code"]) == (403, "NO_PERMISSION"), resp.text
    assert "resource=Group:cg-1" in acl.broker.log()


def _http_send_to_other_path(acl: AclPlatform) -> httpx.Response:
    """Signed for orders-1, sent to orders-2 (the signature covers the path)."""
    raw = b'{"body": "x"}'
    headers = Signer(ALICE).http_headers("POST", "/topics/orders-1/messages", raw)
    with acl.http(None) as http:
        return http.post("/topics/orders-2/messages", content=raw,
                         headers={**headers, "content-type": "application/json"})


def test_signed_clients_work_and_unsigned_clients_are_refused(acl: AclPlatform) -> None:
    for transport in ("remoting", "http"):
        with SparkProducer("pg-acl", acl.client_config(ALICE, transport=transport)) as producer:
            result = producer.send(SparkMessage("orders-1", b"signed " + transport.encode()))
            assert str(result.status) == "SEND_OK"
            with pytest.raises(SparkMQError) as info:
                producer.send(SparkMessage("orders-secret", b"denied"))
            assert info.value.code is ErrorCode.NO_PERMISSION
    before = acl.state()
    with SparkProducer("pg-anon", acl.client_config(None, retry_times=0)) as anonymous:
        with pytest.raises(SparkMQError) as info:
            anonymous.send(SparkMessage("orders-1", b"anonymous"))
    assert info.value.code is ErrorCode.AUTHENTICATION_FAILED
    assert acl.state() == before


def test_a_signed_push_consumer_consumes_over_remoting(acl: AclPlatform) -> None:
    """Pulls, heartbeats, offsets and the group's retry topic, all as alice (Sub on Topic:orders-*, Group:cg-*)."""
    got: list[bytes] = []

    def listener(messages: list[Any]) -> Any:
        got.extend(m.body for m in messages)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("cg-push", acl.client_config(ALICE, rebalance_interval_s=0.5, heartbeat_interval_s=0.5),
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe("orders-1")
    consumer.register_listener(listener)
    consumer.start()
    try:
        with SparkProducer("pg-push", acl.client_config(ALICE)) as producer:
            producer.send(SparkMessage("orders-1", b"for the push consumer"))
        wait_until(lambda: b"for the push consumer" in got, 20, "the signed push consumer's delivery")
    finally:
        consumer.shutdown()


# -- remoting ----------------------------------------------------------------------------------------------
def _remoting(acl: AclPlatform, credentials: Credentials | None, code: int, ext: dict[str, str], body: bytes = b"",
              *, sent_body: bytes | None = None, java: bool = False, age_ms: int = 0) -> ErrorCode | None:
    """One remoting request signed by hand (sparkmq's signer, or RocketMQ's AclClientRPCHook scheme written from its
    description: ``rmq_wire.java_sign``); the error code it got (None = success)."""
    if credentials is not None and java:
        ext = java_sign(ext, body, credentials.access_key, credentials.secret_key)
    elif credentials is not None:
        ext = Signer(credentials).sign_ext(code, ext, body, timestamp_ms=int(time.time() * 1000) - age_ms)
    client = SyncRemotingClient(request_timeout_s=5)
    try:
        client.request(acl.remoting_addr, code, ext, body if sent_body is None else sent_body)
    except SparkMQError as exc:
        return exc.code
    finally:
        client.close()
    return None


def test_remoting_refuses_bad_signatures_and_unpermitted_users_and_changes_nothing(acl: AclPlatform) -> None:
    send = send_ext("pg", "orders-1", 0, "", born_timestamp=int(time.time() * 1000))
    secret = send_ext("pg", "orders-secret", 0, "", born_timestamp=int(time.time() * 1000))
    commit = p.ext_fields(p.UpdateConsumerOffsetRequestHeader(GROUP, "orders-1", 0, 1))
    code_send, code_commit = RequestCode.SEND_MESSAGE_V2, RequestCode.UPDATE_CONSUMER_OFFSET
    refusals = [
        ("no credentials", lambda: _remoting(acl, None, code_send, send, b"x"), ErrorCode.AUTHENTICATION_FAILED),
        ("wrong secret", lambda: _remoting(acl, WRONG, code_send, send, b"x"), ErrorCode.AUTHENTICATION_FAILED),
        ("wrong secret, Java's scheme", lambda: _remoting(acl, WRONG, code_send, send, b"x", java=True),
         ErrorCode.AUTHENTICATION_FAILED),
        ("tampered body", lambda: _remoting(acl, ALICE, code_send, send, b"x", sent_body=b"y"),
         ErrorCode.AUTHENTICATION_FAILED),
        ("replayed", lambda: _remoting(acl, ALICE, code_send, send, b"x", age_ms=STALE_MS),
         ErrorCode.AUTHENTICATION_FAILED),
        ("tampered body, Java's scheme", lambda: _remoting(acl, ALICE, code_send, send, b"x", sent_body=b"y",
                                                           java=True), ErrorCode.AUTHENTICATION_FAILED),
        ("no policy", lambda: _remoting(acl, BOB, code_send, send, b"x"), ErrorCode.NO_PERMISSION),
        ("deny beats allow", lambda: _remoting(acl, ALICE, code_send, secret, b"x"), ErrorCode.NO_PERMISSION),
        ("not granted: offsets", lambda: _remoting(acl, BOB, code_commit, commit), ErrorCode.NO_PERMISSION),
        ("other source address", lambda: _remoting(acl, CAROL, code_send, send, b"x"), ErrorCode.NO_PERMISSION),
    ]
    before = acl.state()
    for what, attempt, code in refusals:
        assert attempt() is code, what
        assert acl.state() == before, f"{what} changed something"
    assert _remoting(acl, ALICE, code_send, send, b"x") is None
    assert _remoting(acl, ALICE, code_send, send, b"x", java=True) is None  # a Java client's AclClientRPCHook
    assert _remoting(acl, ALICE, code_commit, commit) is None
    after = acl.state()
    assert after["max_offset"] > before["max_offset"] and after["offsets"]["orders-1"]["0"] == 1


# -- gRPC (the official client's protocol) -----------------------------------------------------------------
def _grpc_meta(credentials: Credentials | None, *, age_s: float = 0, signed_date: str | None = None
               ) -> tuple[tuple[str, str], ...]:
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - age_s))
    meta = [("x-mq-client-id", "acl-test-client"), ("x-mq-date-time", date)]
    if credentials is not None:
        signature = grpc_signature(credentials.secret_key, signed_date or date)
        meta.append(("authorization", f"MQv2-HMAC-SHA1 Credential={credentials.access_key}, "
                                      f"SignedHeaders=x-mq-date-time, Signature={signature}"))
    return tuple(meta)


def test_grpc_refuses_bad_signatures_and_unpermitted_users_and_changes_nothing(acl: AclPlatform) -> None:
    from rocketmq.grpc_protocol import definition_pb2 as definition
    from rocketmq.grpc_protocol import service_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2_grpc as stubs

    def request(topic: str) -> Any:
        msg = definition.Message(topic=definition.Resource(name=topic), body=b"grpc")
        msg.system_properties.message_id = uuid.uuid4().hex.upper()
        msg.system_properties.message_type = definition.MessageType.NORMAL
        return pb.SendMessageRequest(messages=[msg])

    unauthorized, forbidden = definition.Code.UNAUTHORIZED, definition.Code.FORBIDDEN
    old_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 3600))
    refusals = [
        ("no credentials", "orders-1", _grpc_meta(None), unauthorized),
        ("wrong secret", "orders-1", _grpc_meta(WRONG), unauthorized),
        ("tampered date", "orders-1", _grpc_meta(ALICE, signed_date=old_date), unauthorized),
        ("replayed", "orders-1", _grpc_meta(ALICE, age_s=STALE_MS / 1000), unauthorized),
        ("no policy", "orders-1", _grpc_meta(BOB), forbidden),
        ("deny beats allow", "orders-secret", _grpc_meta(ALICE), forbidden),
        ("other source address", "orders-1", _grpc_meta(CAROL), forbidden),
    ]
    before = acl.state()
    with grpc.insecure_channel(acl.grpc_addr) as channel:
        stub = stubs.MessagingServiceStub(channel)
        for what, topic, meta, code in refusals:
            answer = stub.SendMessage(request(topic), metadata=meta, timeout=10)
            assert answer.status.code == code, f"{what}: {answer.status}"
            assert acl.state() == before, f"{what} changed something"
        ok = stub.SendMessage(request("orders-1"), metadata=_grpc_meta(ALICE), timeout=10)
        assert ok.status.code == definition.Code.OK, ok.status
    assert acl.state()["max_offset"] > before["max_offset"]


def test_the_official_client_with_credentials_works_and_without_is_refused(acl: AclPlatform) -> None:
    import rocketmq
    config = rocketmq.ClientConfiguration(acl.grpc_addr, rocketmq.Credentials(ALICE.access_key, ALICE.secret_key),
                                          request_timeout=5)
    producer = rocketmq.Producer(config, ("orders-1",))
    producer.startup()
    try:
        msg = rocketmq.Message()
        msg.topic, msg.body = "orders-1", b"from the official client"
        receipt = producer.send(msg)
        assert receipt.message_id
    finally:
        producer.shutdown()
    consumer = rocketmq.SimpleConsumer(config, "cg-official", {"orders-1": rocketmq.FilterExpression()},
                                       await_duration=3)
    consumer.startup()
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while not any(m.body == b"from the official client" for m in got) and time.monotonic() < deadline:
            got += consumer.receive(32, 15) or []
        assert any(m.body == b"from the official client" for m in got)
        for m in got:
            consumer.ack(m)
    finally:
        consumer.shutdown()
    before = acl.state()
    anonymous = rocketmq.ClientConfiguration(acl.grpc_addr, rocketmq.Credentials(), request_timeout=5)
    refused = rocketmq.Producer(anonymous, ("orders-1",))
    with contextlib.suppress(Exception):  # startup itself may already be refused (its route query is)
        refused.startup()
    try:
        msg = rocketmq.Message()
        msg.topic, msg.body = "orders-1", b"anonymous"
        # The anonymous route query is refused; the client drops the status and raises a bare Exception.
        with pytest.raises(Exception, match="failed to fetch topic:orders-1 route"):
            refused.send(msg)
    finally:
        with contextlib.suppress(Exception):
            refused.shutdown()
    assert acl.state()["max_offset"] == before["max_offset"]


# -- policy changes ----------------------------------------------------------------------------------------
def test_cli_manages_users_and_acls_and_changes_apply_within_seconds(acl: AclPlatform) -> None:
    env = child_env(SPARKMQ_ACCESS_KEY=ROOT.access_key, SPARKMQ_SECRET_KEY=ROOT.secret_key,
                    SPARKMQ_NEW_USER_SECRET="dave-secret-1")

    def cli(*args: str) -> Any:
        done = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", acl.namesrv.addr,
                               "--json", *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + done.stdout
        assert "dave-secret-1" not in done.stdout + done.stderr, "secrets are never printed"
        return json.loads(done.stdout)

    dave = Credentials("dave", "dave-secret-1")
    assert cli("user", "create", "dave") == [{"broker": acl.broker.addr, "access_key": "dave", "super_user": False}]
    assert any(u["access_key"] == "dave" for u in cli("user", "list"))
    msg = {"body": "from dave"}
    assert _http_send(acl, dave, "/topics/orders-1/messages", msg).status_code == 403
    cli("acl", "create", "dave", "--resource", "Topic:orders-*", "--actions", "Pub", "--source-ip", "127.0.0.0/8")
    assert {"subject": "dave", "resource": "Topic:orders-*"}.items() <= cli("acl", "list", "dave")[0].items()
    wait_until(lambda: _http_send(acl, dave, "/topics/orders-1/messages", msg).status_code == 200, 5,
               "dave's new policy applied without a restart")
    cli("acl", "create", "dave", "--resource", "Topic:orders-1", "--actions", "Pub", "--decision", "Deny")
    wait_until(lambda: _http_send(acl, dave, "/topics/orders-1/messages", msg).status_code == 403, 5,
               "the deny applied")
    cli("acl", "delete", "dave", "--resource", "Topic:orders-1")
    cli("user", "delete", "dave")
    assert _http_send(acl, dave, "/topics/orders-1/messages", msg).json()["code"] == "AUTHENTICATION_FAILED"
    denied = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", acl.namesrv.addr,
                             "user", "list"], env=child_env(SPARKMQ_ACCESS_KEY="alice",
                                                            SPARKMQ_SECRET_KEY=ALICE.secret_key),
                            capture_output=True, text=True, timeout=60)
    assert denied.returncode == 1 and "NO_PERMISSION" in denied.stderr


def test_a_changed_file_applies_within_seconds_and_policies_survive_a_restart(acl: AclPlatform) -> None:
    """Run last: it restarts the module's broker."""
    erin = Credentials("erin", "erin-secret-1")
    path = acl.tmp / "broker" / "config" / "acl.json"
    data = json.loads(path.read_text())
    data["users"].append({"access_key": erin.access_key, "secret_key": erin.secret_key, "super_user": False})
    data["policies"].append({"subject": "erin", "entries": [{"resource": "Topic:orders-1", "actions": ["Pub"]}]})
    data["version"] += 1
    tmp = path.with_name("edit.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # what a slave copying its master's file, or an operator, does
    msg = {"body": "from erin"}
    wait_until(lambda: _http_send(acl, erin, "/topics/orders-1/messages", msg).status_code == 200, 5,
               "the edited file applied without a restart")
    before = acl.state()
    acl.broker.stop()
    acl.broker = _start_broker(acl.procs, acl.tmp, acl.namesrv)
    assert acl.state()["users"] == before["users"] and acl.state()["policies"] == before["policies"]
    assert _http_send(acl, erin, "/topics/orders-1/messages", msg).status_code == 200
    assert _http_send(acl, erin, "/topics/orders-secret/messages", msg).status_code == 403
    assert _http_send(acl, ALICE, "/topics/orders-secret/messages", msg).status_code == 403
    assert _http_send(acl, ALICE, "/topics/orders-1/messages", msg).status_code == 200
