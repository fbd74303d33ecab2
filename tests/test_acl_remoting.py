"""ACL over remoting extFields: RocketMQ's ``AclClientRPCHook`` signature and sparkmq's own, on real sockets.

A RemotingServer whose handler runs :func:`~sparkmq.api.acl.remoting_access` before doing anything: a refused
request must answer 16 (NO_PERMISSION) with the exact ``errorCode`` and must not reach the handler.  The Java
signature is made by ``rmq_wire.java_sign`` (written from the algorithm's description) and checked against
vectors computed with ``openssl dgst -sha1 -hmac`` and RocketMQ's own ``AclSignerTest``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rmq_wire import RawClient, java_sign

from sparkmq.api.acl import SIGNED, remoting_access, remoting_group, remoting_topic
from sparkmq.api.remoting.admin import admin_handlers, admin_needs
from sparkmq.platform.auth import AccessGuard, AclStore, Action, Credentials, PolicyEntry, Signer, User, acl_path
from sparkmq.platform.auth.signing import EXT_SIGNATURE, rocketmq_content, rocketmq_signature
from sparkmq.platform.common.protocol import RequestCode
from sparkmq.platform.remoting import LoopThread, RemotingServer, Reply

ALICE = Credentials("alice", "alice-secret-1")
ROOT = Credentials("root", "root-secret-1")


# -- known answers -----------------------------------------------------------------------------------------
def test_hmac_sha1_known_answers() -> None:
    # RocketMQ's AclSignerTest: calSignature("RocketMQ", "12345678")
    assert rocketmq_signature("12345678", b"RocketMQ") == "IUc8rrO/0gDch8CjObLQsW2rsiA="
    # a SEND_MESSAGE_V2 header: values in Java's key order (AccessKey < a < b < e < g), then the body;
    # expected value from:
    #   printf 'alicePGTopicTest01700000000000Hello' | openssl dgst -sha1 -hmac s3cret-key -binary | base64
    ext = {"b": "TopicTest", "AccessKey": "alice", "a": "PG", "e": "0", "g": "1700000000000",
           "Signature": "ignored"}
    content = rocketmq_content(ext, b"Hello")
    assert content == b"alicePGTopicTest01700000000000Hello"
    assert rocketmq_signature("s3cret-key", content) == "eP/Xg9fKJ9K4twVZ1Qhz6NTiVI0="
    assert java_sign({k: v for k, v in ext.items() if k not in ("AccessKey", "Signature")}, b"Hello", "alice",
                     "s3cret-key")["Signature"] == "eP/Xg9fKJ9K4twVZ1Qhz6NTiVI0="


def test_java_key_order_is_utf16_order() -> None:
    # U+FB01 sorts after U+1F600 in code points but before it in UTF-16 (a surrogate pair starts with 0xD83D)
    assert rocketmq_content({"\U0001F600": "b", "\uFB01": "a"}, b"") == b"ba"
    # clients up to 4.9.3 (version <= 399) added _UNIQUE_KEY_QUERY after signing: left out for them only
    ext = {"topic": "t", "_UNIQUE_KEY_QUERY": "true"}
    assert rocketmq_content(ext, b"", 399) == b"t" and rocketmq_content(ext, b"", 401) == b"truet"


# -- a server guarded like the name server's ------------------------------------------------------------------
def _heartbeat(frame) -> list:
    body = json.loads(bytes(frame.body))
    needs: list = []
    for consumer in body.get("consumerDataSet", ()):
        needs += remoting_group(consumer["groupName"], Action.SUB)
        needs += [n for s in consumer.get("subscriptionDataSet", ()) if not s["topic"].startswith("%RETRY%")
                  for n in remoting_topic(s["topic"], Action.SUB)]
    return needs


#: A table in the shape services give remoting_access (RocketMQ 5's ACL 2.0 rules for these codes).
NEEDS = {
    RequestCode.SEND_MESSAGE_V2: lambda f: (remoting_group(f.ext["a"], Action.SUB) if f.ext["b"].startswith("%RETRY%")
                                            else remoting_topic(f.ext["b"], Action.PUB)),
    RequestCode.SPARKMQ_SEND_PACKED: lambda f: remoting_topic(f.ext["topic"], Action.PUB),
    RequestCode.PULL_MESSAGE: lambda f: (remoting_topic(f.ext["topic"], Action.SUB)
                                         + remoting_group(f.ext["consumerGroup"], Action.SUB)),
    RequestCode.GET_MAX_OFFSET: lambda f: remoting_topic(f.ext["topic"], Action.SUB, Action.GET),
    RequestCode.HEART_BEAT: _heartbeat,
    RequestCode.UPDATE_AND_CREATE_TOPIC: lambda f: remoting_topic(f.ext["topic"], Action.CREATE),
    RequestCode.SPARKMQ_POST_TRACE: lambda f: SIGNED,
}


class GuardedServer:
    """A RemotingServer on its own loop thread whose handler checks ACL, then records what it was asked."""

    def __init__(self, guard: AccessGuard) -> None:
        self.guard = guard
        self.done: list[tuple[int, dict]] = []  # (code, ext) of each request that reached the handler
        self.loop_thread = LoopThread(name="test-acl-remoting").start()
        self.server = self.loop_thread.run(RemotingServer(self._handle).start("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.server.port}"

    def _handle(self, conn, frame) -> Reply:
        remoting_access(self.guard, frame, conn.peer, NEEDS)
        self.done.append((frame.code, dict(frame.ext or {})))
        return Reply(0, {"ok": "true"})

    def stop(self) -> None:
        self.loop_thread.run(self.server.stop(1.0))
        self.loop_thread.stop()


@contextlib.contextmanager
def guarded(tmp_path: Path, enabled: bool = True, skew_s: float = 60.0) -> Iterator[GuardedServer]:
    store = AclStore(acl_path(tmp_path), bootstrap=User(ROOT.access_key, ROOT.secret_key, super_user=True),
                     reload_interval_s=0.0)
    store.create_user(User(ALICE.access_key, ALICE.secret_key))
    store.put_policy("alice", [PolicyEntry.from_dict({"resource": "Topic:orders", "actions": ["Pub"]}),
                               PolicyEntry.from_dict({"resource": "Group:cg", "actions": ["Sub"]}),
                               PolicyEntry.from_dict({"resource": "Topic:events", "actions": ["Sub"]})])
    server = GuardedServer(AccessGuard(store, enabled=enabled, clock_skew_s=skew_s))
    try:
        yield server
    finally:
        server.stop()


SEND_V2 = {"a": "PG", "b": "orders", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000000", "h": "0",
           "i": "UNIQ_KEY\u0001ID\u0002", "j": "0", "k": "false", "m": "false"}


@pytest.mark.parametrize("serialize", ["json", "rocketmq"])
def test_java_signature_lets_the_request_through_without_its_fields(tmp_path: Path, serialize: str) -> None:
    with guarded(tmp_path) as server, RawClient(server.addr) as client:
        reply = client.request(RequestCode.SEND_MESSAGE_V2, java_sign(SEND_V2, b"hello", "alice", ALICE.secret_key),
                               b"hello", serialize=serialize)
        assert reply.code == 0, reply.remark
        # with a SecurityToken too (signed as one more field)
        reply = client.request(RequestCode.SEND_MESSAGE_V2,
                               java_sign(SEND_V2, b"x", "alice", ALICE.secret_key, token="tok"), b"x",
                               serialize=serialize)
        assert reply.code == 0, reply.remark
    assert [code for code, _ext in server.done] == [310, 310]
    assert all(ext == SEND_V2 for _code, ext in server.done), "the handler never sees credentials"


def _refused(reply, error_code: str) -> None:
    assert (reply.code, (reply.ext or {}).get("errorCode")) == (16, error_code), (reply.code, reply.ext, reply.remark)


def test_missing_wrong_and_tampered_credentials_are_refused_and_change_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sparkmq.audit")
    good = java_sign(SEND_V2, b"hello", "alice", ALICE.secret_key)
    cases = {
        "no credentials": (SEND_V2, b"hello"),
        "wrong secret": (java_sign(SEND_V2, b"hello", "alice", "not-her-secret"), b"hello"),
        "unknown user": (java_sign(SEND_V2, b"hello", "mallory", ALICE.secret_key), b"hello"),
        "body changed": (good, b"hellO"),
        "header changed": (dict(good, b="orders2"), b"hello"),
        "field added": (dict(good, z="1"), b"hello"),
        "no signature": ({k: v for k, v in good.items() if k != "Signature"}, b"hello"),
        "empty access key": (java_sign(SEND_V2, b"hello", "", ALICE.secret_key), b"hello"),
    }
    with guarded(tmp_path) as server, RawClient(server.addr) as client:
        for ext, body in cases.values():
            _refused(client.request(RequestCode.SEND_MESSAGE_V2, ext, body), "AUTHENTICATION_FAILED")
        # the connection stays usable: a good request still goes through
        assert client.request(RequestCode.SEND_MESSAGE_V2, good, b"hello").code == 0
    assert len(server.done) == 1
    assert sum("denied" in r.getMessage() for r in caplog.records) == len(cases)
    assert not any(ALICE.secret_key in r.getMessage() for r in caplog.records)


def test_authorization_follows_rocketmqs_acl_2(tmp_path: Path) -> None:
    """Alice may Pub on orders, Sub on events and group cg; everything else is NO_PERMISSION."""
    pull = {"consumerGroup": "cg", "topic": "events", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
            "sysFlag": "2", "commitOffset": "0", "suspendTimeoutMillis": "15000", "subscription": "*",
            "subVersion": "0", "expressionType": "TAG"}
    with guarded(tmp_path) as server, RawClient(server.addr) as client:
        def ask(code: int, ext: dict, body: bytes = b"", who: Credentials = ALICE):
            return client.request(code, java_sign(ext, body, who.access_key, who.secret_key), body)

        assert ask(RequestCode.SEND_MESSAGE_V2, SEND_V2, b"m").code == 0
        _refused(ask(RequestCode.SEND_MESSAGE_V2, dict(SEND_V2, b="events"), b"m"), "NO_PERMISSION")
        assert ask(RequestCode.PULL_MESSAGE, pull).code == 0
        _refused(ask(RequestCode.PULL_MESSAGE, dict(pull, consumerGroup="other")), "NO_PERMISSION")
        _refused(ask(RequestCode.PULL_MESSAGE, dict(pull, topic="orders")), "NO_PERMISSION")
        # a send-back to the group's retry topic needs Sub on the group, not Pub on the topic
        assert ask(RequestCode.SEND_MESSAGE_V2, dict(SEND_V2, a="cg", b="%RETRY%cg"), b"m").code == 0
        # offsets of a queue: what a consumer (Sub) asks
        assert ask(RequestCode.GET_MAX_OFFSET, {"topic": "events", "queueId": "0"}).code == 0
        heartbeat = (b'{"clientID":"c1","consumerDataSet":[{"groupName":"cg","subscriptionDataSet":'
                     b'[{"topic":"events"},{"topic":"%RETRY%cg"}]}],"producerDataSet":[]}')
        assert ask(RequestCode.HEART_BEAT, {}, heartbeat).code == 0
        _refused(ask(RequestCode.HEART_BEAT, {}, heartbeat.replace(b'"events"', b'"orders"')), "NO_PERMISSION")
        # admin requests need admin actions; a code the table does not know needs a super user
        _refused(ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "orders"}), "NO_PERMISSION")
        _refused(ask(29999, {}), "NO_PERMISSION")
        assert ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "orders"}, who=ROOT).code == 0
        assert ask(29999, {}, who=ROOT).code == 0
    assert [code for code, _ in server.done] == [310, 11, 310, 30, 34, 17, 29999]


def test_sparkmq_signature_in_ext_fields(tmp_path: Path) -> None:
    ext = {"topic": "orders", "count": "2"}
    with guarded(tmp_path) as server, RawClient(server.addr) as client:
        signer = Signer(ALICE)
        signed = signer.sign_ext(RequestCode.SPARKMQ_SEND_PACKED, ext, b"packed")
        assert set(signed) == {"topic", "count", EXT_SIGNATURE} and ext == {"topic": "orders", "count": "2"}
        assert client.request(RequestCode.SPARKMQ_SEND_PACKED, signed, b"packed").code == 0
        # the same claim on another code, body or header, an old one, or a wrong secret: refused
        for code, sent, body in ((RequestCode.SEND_MESSAGE, signed, b"packed"),
                                 (RequestCode.SPARKMQ_SEND_PACKED, signed, b"packeD"),
                                 (RequestCode.SPARKMQ_SEND_PACKED, dict(signed, count="3"), b"packed"),
                                 (RequestCode.SPARKMQ_SEND_PACKED,
                                  signer.sign_ext(30001, ext, b"p", timestamp_ms=int(time.time() * 1000) - 120_000),
                                  b"p"),
                                 (RequestCode.SPARKMQ_SEND_PACKED,
                                  Signer(Credentials("alice", "not-her-secret")).sign_ext(30001, ext, b"p"), b"p"),
                                 (RequestCode.SPARKMQ_SEND_PACKED, dict(ext, SparkMQSignature="alice:1:zz"), b"p")):
            _refused(client.request(code, sent, body), "AUTHENTICATION_FAILED")
        # both clients may sign the same way on one server; a sparkmq-signed request of a user without the right
        _refused(client.request(RequestCode.SPARKMQ_SEND_PACKED,
                                signer.sign_ext(30001, {"topic": "events", "count": "1"}, b"p"), b"p"),
                 "NO_PERMISSION")
    assert server.done == [(30001, ext)]


def test_acl_off_lets_everything_through_without_credential_fields(tmp_path: Path) -> None:
    with guarded(tmp_path, enabled=False) as server, RawClient(server.addr) as client:
        assert client.request(RequestCode.SEND_MESSAGE_V2, SEND_V2, b"x").code == 0
        signed = java_sign(SEND_V2, b"x", "who", "ever-secret")
        assert client.request(RequestCode.SEND_MESSAGE_V2, signed, b"x").code == 0
        assert client.request(30001, Signer(ALICE).sign_ext(30001, {"topic": "t"}, b""), b"").code == 0
    assert [ext for _c, ext in server.done] == [SEND_V2, SEND_V2, {"topic": "t"}]


def test_every_admin_code_has_a_rule(tmp_path: Path) -> None:
    """The admin requests say what they need (the dispatcher asks a super user for a code without a rule)."""
    class Host:
        broker = None

        def connection_of(self, client_id: str):
            return None

    needs = admin_needs(Host())  # type: ignore[arg-type]
    assert set(needs) == set(admin_handlers(Host())) == _admin_codes()  # type: ignore[arg-type]
    from sparkmq.platform.remoting import Frame

    stats = needs[RequestCode.GET_CONSUME_STATS](Frame(208, 0, 1, {"consumerGroup": "cg", "topic": "t"}, b""))
    assert {(a.value, str(r)) for a, r in stats} == {("Get", "Group:cg"), ("Get", "Topic:t")}
    body = b'{"groupName":"cg","retryMaxTimes":3}'
    assert needs[RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP](Frame(200, 0, 1, {}, body))[0][0] is Action.UPDATE
    assert needs[RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP](Frame(200, 0, 1, {}, b"{bad")) == []


def _admin_codes() -> set[int]:
    return {17, 215, 21, 351, 202, 300, 28, 208, 203, 222, 200, 201, 352, 207}
