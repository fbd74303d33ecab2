"""The ACL model, store, signatures and guard on their own (no processes): ``sparkmq.platform.auth``."""
from __future__ import annotations

import ipaddress
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from sparkmq.platform.auth import (
    CLUSTER,
    AccessGuard,
    AclStore,
    AclTable,
    Action,
    Credentials,
    Decision,
    Policy,
    PolicyEntry,
    Principal,
    Resource,
    ResourcePattern,
    Signer,
    User,
    acl_path,
    parse_actions,
)
from sparkmq.platform.auth.signing import (
    grpc_date_ms,
    grpc_signature,
    parse_grpc,
    parse_http,
    parse_remoting,
)
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.remoting import Frame

SECRET = "alice-secret-1"
IP = ipaddress.ip_address


def entry(resource: str, actions: str, decision: str = "Allow", *ips: str) -> PolicyEntry:
    return PolicyEntry.from_dict({"resource": resource, "actions": actions, "decision": decision,
                                  "source_ips": list(ips)})


def table(*entries: PolicyEntry, super_user: bool = False) -> AclTable:
    return AclTable({"alice": User("alice", SECRET, super_user)}, {"alice": Policy("alice", entries)})


# -- the model -------------------------------------------------------------------------------------------
def test_error_codes_are_rocketmqs() -> None:
    """Both refusals answer RocketMQ's NO_PERMISSION (16), as its ACL does; the exact one rides in errorCode."""
    assert ErrorCode.AUTHENTICATION_FAILED.remoting_code == 16 and ErrorCode.AUTHENTICATION_FAILED.http_status == 401
    assert ErrorCode.NO_PERMISSION.remoting_code == 16 and ErrorCode.NO_PERMISSION.http_status == 403
    assert len({c.name for c in ErrorCode}) == len(ErrorCode)


def test_deny_beats_allow_whatever_the_order() -> None:
    for entries in ([entry("Topic:orders-*", "Pub"), entry("Topic:orders-secret", "Pub", "Deny")],
                    [entry("Topic:orders-secret", "Pub", "Deny"), entry("Topic:orders-*", "Pub")]):
        t = table(*entries)
        assert t.decide("alice", Action.PUB, Resource.topic("orders-secret"), None) is Decision.DENY
        assert t.decide("alice", Action.PUB, Resource.topic("orders-eu"), None) is Decision.ALLOW


def test_prefix_star_and_exact_patterns() -> None:
    t = table(entry("Topic:orders-*", "Pub"), entry("Group:*", "Sub"), entry("Topic:audit", "Sub"))
    assert t.decide("alice", Action.PUB, Resource.topic("orders-1"), None) is Decision.ALLOW
    assert t.decide("alice", Action.PUB, Resource.topic("orders"), None) is Decision.DENY  # "orders-" is the prefix
    assert t.decide("alice", Action.SUB, Resource.topic("orders-1"), None) is Decision.DENY  # action not granted
    assert t.decide("alice", Action.SUB, Resource.group("anything"), None) is Decision.ALLOW
    assert t.decide("alice", Action.SUB, Resource.topic("audit"), None) is Decision.ALLOW
    assert t.decide("alice", Action.SUB, Resource.topic("audit2"), None) is Decision.DENY
    everything = table(entry("*", "All"))
    assert everything.decide("alice", Action.DELETE, Resource.topic("x"), None) is Decision.ALLOW
    assert everything.decide("alice", Action.GET, CLUSTER, None) is Decision.ALLOW
    assert table(entry("Cluster", "Get")).decide("alice", Action.GET, CLUSTER, None) is Decision.ALLOW


def test_retry_and_dlq_topics_are_their_groups() -> None:
    assert Resource.topic("%RETRY%cg-1") == Resource.group("cg-1") == Resource.topic("%DLQ%cg-1")
    t = table(entry("Group:cg-*", "Sub"))
    assert t.decide("alice", Action.SUB, Resource.topic("%RETRY%cg-1"), None) is Decision.ALLOW


def test_no_entry_and_unknown_user_deny_and_super_user_allows() -> None:
    assert table().decide("alice", Action.PUB, Resource.topic("t"), None) is Decision.DENY
    assert table(entry("*", "All")).decide("bob", Action.PUB, Resource.topic("t"), None) is Decision.DENY
    root = table(entry("*", "All", "Deny"), super_user=True)
    assert root.decide("alice", Action.DELETE, Resource.topic("t"), None) is Decision.ALLOW


def test_cidr_rules_match_only_their_sources() -> None:
    t = table(entry("Topic:t", "Pub", "Allow", "10.0.0.0/8", "::1/128"))
    assert t.decide("alice", Action.PUB, Resource.topic("t"), IP("10.1.2.3")) is Decision.ALLOW
    assert t.decide("alice", Action.PUB, Resource.topic("t"), IP("127.0.0.1")) is Decision.DENY
    assert t.decide("alice", Action.PUB, Resource.topic("t"), IP("::1")) is Decision.ALLOW
    assert t.decide("alice", Action.PUB, Resource.topic("t"), IP("::ffff:10.0.0.9")) is Decision.ALLOW
    assert t.decide("alice", Action.PUB, Resource.topic("t"), None) is Decision.DENY
    deny_remote = table(entry("Topic:t", "Pub"), entry("Topic:t", "Pub", "Deny", "192.168.0.0/16"))
    assert deny_remote.decide("alice", Action.PUB, Resource.topic("t"), IP("192.168.1.1")) is Decision.DENY
    assert deny_remote.decide("alice", Action.PUB, Resource.topic("t"), IP("127.0.0.1")) is Decision.ALLOW


def test_actions_and_patterns_parse_or_say_what_is_wrong() -> None:
    assert parse_actions("All") == frozenset(Action)
    assert parse_actions(["admin"]) == {Action.CREATE, Action.UPDATE, Action.DELETE, Action.GET, Action.LIST}
    assert str(ResourcePattern.parse("topic:orders-*")) == "Topic:orders-*"
    assert str(ResourcePattern.parse("Cluster")) == "Cluster"
    for bad in ("Queue:x", "Topic:", "Topic:a b", "nothing"):
        with pytest.raises(ValueError):
            ResourcePattern.parse(bad)
    for bad_actions in ("Publish", ""):
        with pytest.raises(ValueError):
            parse_actions(bad_actions)
    with pytest.raises(ValueError, match="source address"):
        entry("Topic:t", "Pub", "Allow", "10.0.0.300/8")
    with pytest.raises(ValueError, match="unknown policy entry field"):
        PolicyEntry.from_dict({"resource": "Topic:t", "actions": "Pub", "decisoin": "Deny"})


def test_secrets_never_show_in_reprs_or_views() -> None:
    user = User("alice", SECRET)
    assert SECRET not in repr(user) and SECRET not in json.dumps(user.to_dict())
    assert SECRET not in repr(Credentials("alice", SECRET))
    assert SECRET not in repr(Signer(Credentials("alice", SECRET)))
    cfg = BrokerConfig(acl_enabled=True, acl_super_user_access_key="root", acl_super_user_secret_key=SECRET)
    assert SECRET not in repr(cfg) and SECRET not in json.dumps(cfg.to_dict(), default=str)
    client = ClientConfig(namesrv_addrs="127.0.0.1:9876", access_key="alice", secret_key=SECRET)
    assert SECRET not in repr(client) and client.credentials == Credentials("alice", SECRET)
    with pytest.raises(ValueError) as info:
        User("alice", "short")
    assert "short" not in str(info.value)


def test_config_keys_are_validated() -> None:
    assert BrokerConfig().acl_enabled is False  # off by default
    with pytest.raises(ValueError, match="go together"):
        BrokerConfig(acl_super_user_access_key="root")
    with pytest.raises(ValueError, match="acl_enabled"):
        BrokerConfig(acl_enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="go together"):
        ClientConfig(namesrv_addrs="127.0.0.1:9876", access_key="alice")


# -- the store -------------------------------------------------------------------------------------------
def test_store_persists_atomically_and_survives_reopening(tmp_path: Path) -> None:
    path = acl_path(tmp_path)
    store = AclStore(path, bootstrap=User("root", "root-secret", True))
    store.create_user(User("alice", SECRET))
    store.put_policy("alice", [entry("Topic:orders-*", "Pub")])
    store.put_policy("alice", [entry("Topic:orders-*", "Pub,Sub"), entry("Group:cg", "Sub")])  # replaces by resource
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert not path.with_name(path.name + ".tmp").exists()
    on_disk = json.loads(path.read_text())
    assert [u["access_key"] for u in on_disk["users"]] == ["alice"], "the bootstrap user is never written"
    reopened = AclStore(path)
    policy = reopened.table.policies["alice"]
    assert [str(e.resource) for e in policy.entries] == ["Topic:orders-*", "Group:cg"]
    assert policy.entries[0].actions == {Action.PUB, Action.SUB}
    assert reopened.table.decide("alice", Action.SUB, Resource.topic("orders-1"), None) is Decision.ALLOW
    with pytest.raises(SparkMQError) as info:
        store.delete_user("root")
    assert info.value.code is ErrorCode.INVALID_ARGUMENT
    with pytest.raises(SparkMQError, match="exists"):
        store.create_user(User("alice", "other-secret"))
    with pytest.raises(SparkMQError, match="create the user first"):
        store.put_policy("nobody", [entry("Topic:t", "Pub")])
    assert store.delete_policy("alice", "Group:cg") == 1
    assert store.delete_user("alice") and "alice" not in AclStore(path).table.policies


def test_store_reloads_another_writers_change_and_keeps_the_last_good_table(tmp_path: Path) -> None:
    path = acl_path(tmp_path)
    reader = AclStore(path, reload_interval_s=0.05)
    seen: list[int] = []
    reader.add_listener(lambda t: seen.append(t.version))
    writer = AclStore(path)
    writer.create_user(User("alice", SECRET))
    time.sleep(0.06)
    assert reader.maybe_reload() and "alice" in reader.table.users and seen == [1]
    path.write_text("{ not json")
    time.sleep(0.06)
    assert not reader.maybe_reload() and "alice" in reader.table.users, "a broken file keeps the last good table"
    with pytest.raises(SparkMQError) as info:
        AclStore(path)
    assert info.value.code is ErrorCode.STORE_CORRUPT


# -- signatures ------------------------------------------------------------------------------------------
def test_http_signature_covers_method_path_query_body_and_time() -> None:
    signer = Signer(Credentials("alice", SECRET))
    headers = signer.http_headers("POST", "/topics/t/batch?queue_id=1", b"body", timestamp_ms=1000)
    good = parse_http("POST", "/topics/t/batch?queue_id=1", headers, b"body")
    assert good is not None and good.verify(SECRET) and good.timestamp_ms == 1000
    assert not good.verify("wrong-secret")
    for method, target, body in (("PUT", "/topics/t/batch?queue_id=1", b"body"),
                                 ("POST", "/topics/u/batch?queue_id=1", b"body"),
                                 ("POST", "/topics/t/batch?queue_id=2", b"body"),
                                 ("POST", "/topics/t/batch?queue_id=1", b"bodx")):
        tampered = parse_http(method, target, headers, body)
        assert tampered is not None and not tampered.verify(SECRET)
    nonce = good.nonce.hex()
    other_nonce = dict(headers, authorization=headers["authorization"].replace(nonce, nonce[::-1]))
    assert not parse_http("POST", "/topics/t/batch?queue_id=1", other_nonce, b"body").verify(SECRET)
    again = signer.http_headers("POST", "/topics/t/batch?queue_id=1", b"body", timestamp_ms=1000)
    assert again["authorization"] != headers["authorization"], "every request is signed with a fresh nonce"
    assert parse_http("GET", "/x", {}, b"") is None
    with pytest.raises(SparkMQError) as info:
        parse_http("GET", "/x", {"authorization": "Basic abc"}, b"")
    assert info.value.code is ErrorCode.AUTHENTICATION_FAILED


def _frame(code: int, ext: dict | None, body: bytes = b"") -> Frame:
    return Frame(code, 0, 1, ext, body, version=479)


def test_remoting_signature_rides_in_the_ext_fields() -> None:
    signer = Signer(Credentials("alice", SECRET))
    ext = signer.sign_ext(11, {"topic": "t", "queueId": "1"}, b"payload")
    frame = _frame(11, dict(ext), b"payload")
    signed = parse_remoting(frame)
    assert frame.ext == {"topic": "t", "queueId": "1"}, "the credential field leaves the frame"
    assert signed is not None and signed.verify(SECRET)
    assert parse_remoting(_frame(11, {"topic": "t"})) is None and parse_remoting(_frame(11, None)) is None
    nonce = ext["SparkMQSignature"].split(":")[2]
    other_nonce = dict(ext, SparkMQSignature=ext["SparkMQSignature"].replace(nonce, nonce[::-1]))
    for code, fields, body in ((10, ext, b"payload"), (11, ext, b"paylOad"), (11, dict(ext, topic="u"), b"payload"),
                               (11, dict(ext, extra="1"), b"payload"), (11, other_nonce, b"payload")):
        tampered = parse_remoting(_frame(code, dict(fields), body))
        assert tampered is not None and not tampered.verify(SECRET)
    with pytest.raises(SparkMQError) as info:
        parse_remoting(_frame(11, {"SparkMQSignature": "alice:12"}))
    assert info.value.code is ErrorCode.AUTHENTICATION_FAILED


def test_grpc_signature_is_the_official_clients() -> None:
    from rocketmq.v5.util import signature as official
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    assert grpc_signature(SECRET, date) == official.Signature.sign(SECRET, date)
    header = f"MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature={grpc_signature(SECRET, date)}"
    claim = parse_grpc({"authorization": header, "x-mq-date-time": date})
    assert claim is not None and claim.verify(SECRET) and not claim.verify("wrong-secret")
    assert abs(grpc_date_ms(date, time.time()) - time.time() * 1000) < 2000
    empty = "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=abcd"
    assert parse_grpc({"authorization": empty}) is None, "the Python client's header without credentials"
    with pytest.raises(SparkMQError):
        grpc_date_ms("yesterday", time.time())


# -- the guard -------------------------------------------------------------------------------------------
def _guard(tmp_path: Path, now: list[float]) -> AccessGuard:
    store = AclStore(acl_path(tmp_path), reload_interval_s=0.0)
    store.create_user(User("alice", SECRET))
    store.put_policy("alice", [entry("Topic:orders-*", "Pub")])
    return AccessGuard(store, enabled=True, clock_skew_s=300, clock=lambda: now[0])


def test_guard_refuses_old_wrong_and_missing_signatures(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [1_700_000_000.0]
    guard = _guard(tmp_path, now)
    signer = Signer(Credentials("alice", SECRET), clock=lambda: now[0])
    headers = signer.http_headers("POST", "/topics/orders-1/messages", b"{}")
    assert guard.authenticate_http("POST", "/topics/orders-1/messages", headers, b"{}", "127.0.0.1") == \
        Principal("alice")
    caplog.set_level(logging.INFO, logger="sparkmq.audit")
    now[0] += 301  # the same request, replayed after the window
    cases = [headers, {}, Signer(Credentials("alice", "wrong-secret")).http_headers("POST", "/x", b"")]
    for h in cases:
        with pytest.raises(SparkMQError) as info:
            guard.authenticate_http("POST", "/topics/orders-1/messages", h, b"{}", "127.0.0.1")
        assert info.value.code is ErrorCode.AUTHENTICATION_FAILED
    assert len([r for r in caplog.records if r.name == "sparkmq.audit"]) == 3
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def test_guard_decisions_follow_policy_changes_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    guard = _guard(tmp_path, [time.time()])
    alice = Principal("alice")
    need = [(Action.PUB, Resource.topic("orders-1"))]
    guard.authorize(alice, need, "127.0.0.1", "test")
    guard.store.put_policy("alice", [entry("Topic:orders-1", "Pub", "Deny")])
    caplog.set_level(logging.WARNING, logger="sparkmq.audit")
    with pytest.raises(SparkMQError) as info:
        guard.authorize(alice, need, "127.0.0.1:5000", "test")
    assert info.value.code is ErrorCode.NO_PERMISSION and "orders-1" in info.value.message
    line = [r.getMessage() for r in caplog.records if r.name == "sparkmq.audit"][-1]
    assert "user=alice" in line and "from=127.0.0.1:5000" in line and "resource=Topic:orders-1" in line
    guard.store.delete_policy("alice", "Topic:orders-1")
    guard.authorize(alice, need, "127.0.0.1", "test")
    guard.authorize(alice, [(Action.PUB, Resource.topic("x")), (Action.PUB, Resource.topic("orders-2"))],
                    "127.0.0.1", "test", any_of=True)



#: What each protocol's request carries without credentials, and with a claim that does not parse.
_UNSIGNED: dict[str, object] = {"http": {}, "remoting": {"topic": "t"}, "grpc": {}}
_MALFORMED: dict[str, object] = {"http": {"authorization": "Basic abc"}, "remoting": {"SparkMQSignature": "x"},
                                 "grpc": {"authorization": "MQv2-HMAC-SHA1 nonsense"}}


def _signed_claim(protocol: str, access_key: str, secret: str, at: float) -> object:
    """What a client of ``protocol`` sends signed with these keys at ``at`` (epoch seconds)."""
    if protocol == "grpc":
        date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))
        return {"x-mq-date-time": date, "authorization": f"MQv2-HMAC-SHA1 Credential={access_key}, "
                f"SignedHeaders=x-mq-date-time, Signature={grpc_signature(secret, date)}"}
    signer = Signer(Credentials(access_key, secret), clock=lambda: at)
    if protocol == "http":
        return signer.http_headers("POST", "/topics/orders-1/messages", b"{}")
    return signer.sign_ext(10, {"topic": "t"}, b"x")


def _authenticate(guard: AccessGuard, protocol: str, claim: Any) -> Principal:
    if protocol == "http":
        return guard.authenticate_http("POST", "/topics/orders-1/messages", claim, b"{}", "10.1.2.3")
    if protocol == "remoting":
        return guard.authenticate_remoting(_frame(10, dict(claim), b"x"), "10.1.2.3")
    return guard.authenticate_grpc(claim, "ipv4:10.1.2.3:5000", "SendMessage")


@pytest.mark.parametrize("protocol", ["http", "remoting", "grpc"])
def test_every_protocol_is_authenticated_and_audited_by_one_implementation(
        protocol: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """HTTP, remoting and gRPC claims go through the same checks (window, user, signature), and each refusal is
    one audit line naming who (``-`` when no claim names anybody) and from where, never a secret."""
    now = [1_700_000_000.0]
    guard = _guard(tmp_path, now)
    caplog.set_level(logging.INFO, logger="sparkmq.audit")
    assert _authenticate(guard, protocol, _signed_claim(protocol, "alice", SECRET, now[0])) == Principal("alice")
    refusals = {  # what is sent -> (who the audit line names, a part of the message)
        "wrong secret": (_signed_claim(protocol, "alice", "wrong-secret", now[0]), "alice", "does not match"),
        "unknown key": (_signed_claim(protocol, "mallory", SECRET, now[0]), "mallory", "is unknown"),
        "stale": (_signed_claim(protocol, "alice", SECRET, now[0] - 301), "alice",
                  "s away from the server's clock (the window is 300 s)"),
        "none": (_UNSIGNED[protocol], "-",
                 "Credentials(access_key, secret_key)" if protocol == "grpc" else "sign the request"),
        "malformed": (_MALFORMED[protocol], "-", ""),
    }
    for name, (claim, who, says) in refusals.items():
        caplog.clear()
        with pytest.raises(SparkMQError) as info:
            _authenticate(guard, protocol, claim)
        assert info.value.code is ErrorCode.AUTHENTICATION_FAILED and says in info.value.message, name
        lines = [r.getMessage() for r in caplog.records if r.name == "sparkmq.audit"]
        assert len(lines) == 1 and lines[0].startswith(f"denied user={who} from=") and "10.1.2.3" in lines[0], \
            (name, lines)
        assert SECRET not in lines[0] and "wrong-secret" not in lines[0]


@pytest.mark.parametrize("route, body", [
    (("POST", "/clients/heartbeat"), {"client_id": "c", "consumers": -5}),
    (("POST", "/clients/heartbeat"), {"client_id": "c", "consumers": [{"group": "g", "subscriptions": 7}]}),
    (("POST", "/clients/unregister"), {"client_id": "c", "consumer_groups": 3}),
    (("POST", "/consumers/{group}/offsets"), {"offsets": 1.5}),
    (("POST", "/locks/lock"), {"group": "g", "client_id": "c", "queues": True}),
])
def test_route_needs_of_a_body_of_the_wrong_shape_are_empty_not_an_error(
        route: tuple[str, str], body: dict[str, Any]) -> None:
    """What an HTTP request needs is read from its body before the endpoint validates it: a list field that is
    not a list needs nothing (the endpoint then refuses the body), it does not raise (a fuzzer found the
    heartbeat's ``consumers: <int>`` answered INTERNAL_ERROR with ACL on)."""
    from sparkmq.api.acl import ROUTE_NEEDS

    needs_of = ROUTE_NEEDS[route]
    assert callable(needs_of)
    needs = needs_of({"group": "g"}, {}, body)
    assert all(action is not None for action, _ in needs)
