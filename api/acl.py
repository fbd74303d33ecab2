"""Access control of the broker's HTTP API, and the ACL administration endpoints (``docs/security.md``).

* :func:`broker_guard` -- the one :class:`~sparkmq.platform.auth.AccessGuard` of a broker, shared by its
  HTTP app, remoting adapter and gRPC servicer (built from the broker's ``acl_*`` settings on first use);
* :func:`http_access` -- the app-wide FastAPI dependency: with ACL on, every route but ``/health`` and the
  API docs needs a signed request whose user may do what the route does (:data:`ROUTE_NEEDS`); a route
  missing from the table needs a super user (safe for routes added later).  The name server and the gateway
  use it too, each with its own table (``app.state.route_needs``) and guard (``app.state.guard``);
* :data:`acl_router` -- ``/acl/users`` and ``/acl/policies``: what ``sparkmq admin user|acl`` calls; super
  users only while ACL is on;
* :func:`remoting_access` -- the same for a service's remoting requests over a table of what each code needs (the
  name server's; the broker's dispatcher in ``api/remoting`` keeps its families' tables): sparkmq's signature or a
  RocketMQ client's ``AclClientRPCHook`` is checked (``AccessGuard.authenticate_remoting``), the credential fields
  are removed from the frame, then what the code needs, an :class:`AnyOf` item meaning one of its pairs suffices
  (RocketMQ 5's ACL 2.0 contexts with several actions).

Authentication and authorization run before the endpoint, so a refused request changes nothing.
"""
from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool

from ..platform.auth import (
    CLUSTER,
    AccessGuard,
    Action,
    Need,
    PolicyEntry,
    Principal,
    Resource,
    User,
)
from ..platform.auth.signing import CREDENTIAL_FIELDS
from ..platform.common import http_contract as contract
from ..platform.common.errors import ErrorCode, SparkMQError
from ..platform.common.protocol import RequestCode
from ..platform.remoting import Frame
from .params import Declared, json_body

if TYPE_CHECKING:   # the name server imports this module too: not the whole broker
    from ..platform.broker.broker import Broker

__all__ = ["broker_guard", "http_access", "acl_router", "ROUTE_NEEDS", "OPEN", "SIGNED", "AnyOf", "NeedsOf",
           "RemotingNeedsOf", "remoting_access", "remoting_topic", "remoting_group"]

_guards: weakref.WeakKeyDictionary[Broker, AccessGuard] = weakref.WeakKeyDictionary()
_guards_lock = threading.Lock()


def broker_guard(broker: Broker) -> AccessGuard:
    """The access guard of ``broker`` (one per broker; its ACL lives in ``data_dir/config/acl.json``)."""
    with _guards_lock:
        guard = _guards.get(broker)
        if guard is None:
            cfg = broker.config
            guard = _guards[broker] = AccessGuard.open(
                cfg.data_dir, enabled=cfg.acl_enabled, super_user_access_key=cfg.acl_super_user_access_key,
                super_user_secret_key=cfg.acl_super_user_secret_key, clock_skew_s=cfg.acl_clock_skew_s)
        return guard


# -- what each route does ----------------------------------------------------------------------------------
#: Marker: the route needs no credentials at all (health checks, the API docs).
OPEN = "open"
#: Marker: any authenticated user may call the route (client trace events).
SIGNED = "signed"
#: Marker: super users only (ACL administration, and any route this table does not know).
SUPER = "super"

Params = dict[str, Any]
NeedsOf = Callable[[Params, Params, Any], list[Need]]


class AnyOf(list[Need]):
    """Needs of which one suffices (a route lookup: ``Pub`` or ``Sub`` or ``Get`` on the topic); a plain list
    needs every one."""


def _topic(name: object) -> list[Need]:
    return [(Action.SUB, Resource.topic(name))] if isinstance(name, str) else []


def _on(action: Action, kind: str, source: str = "path", key: str | None = None) -> NeedsOf:
    """``action`` on the topic/group named by a path parameter, query parameter or body field."""
    def needs(path: Params, query: Params, body: Any) -> list[Need]:
        where = {"path": path, "query": query, "body": body if isinstance(body, dict) else {}}[source]
        name = where.get(key or kind)
        if not isinstance(name, str):
            return []  # the endpoint refuses the request itself (a field missing or of the wrong type)
        return [(action, _KINDS[kind](name))]
    return needs


# Resource.topic names a group's %RETRY% / %DLQ% topic as the group, as every other entry point does.
_KINDS: dict[str, Callable[[str], Resource]] = {"topic": Resource.topic, "group": Resource.group}


def _all(*parts: NeedsOf) -> NeedsOf:
    return lambda path, query, body: [n for part in parts for n in part(path, query, body)]


def _cluster(action: Action) -> NeedsOf:
    return lambda path, query, body: [(action, CLUSTER)]


def _items(container: Any, key: str) -> list[Any]:
    """``container[key]`` when the body is an object and that field a list, else [] (a body of the wrong shape
    needs nothing here: the endpoint's own validation refuses it)."""
    value = container.get(key) if isinstance(container, dict) else None
    return value if isinstance(value, list) else []


def _heartbeat(path: Params, query: Params, body: Any) -> list[Need]:
    needs: list[Need] = []
    for consumer in _items(body, "consumers"):
        if isinstance(consumer, dict):
            if isinstance(consumer.get("group"), str):
                needs.append((Action.SUB, Resource.group(consumer["group"])))
            for sub in _items(consumer, "subscriptions"):
                needs += _topic(sub.get("topic")) if isinstance(sub, dict) else []
    return needs


def _unregister(path: Params, query: Params, body: Any) -> list[Need]:
    return [(Action.SUB, Resource.group(g)) for g in _items(body, "consumer_groups") if isinstance(g, str)]


def _offset_entries(path: Params, query: Params, body: Any) -> list[Need]:
    return [n for e in _items(body, "offsets") if isinstance(e, dict) for n in _topic(e.get("topic"))]


def _lock_queues(path: Params, query: Params, body: Any) -> list[Need]:
    if not isinstance(body, dict):
        return []
    needs = _on(Action.SUB, "group", "body")(path, query, body)
    return needs + [n for q in _items(body, "queues") if isinstance(q, dict) for n in _topic(q.get("topic"))]


_SUB_GROUP = _on(Action.SUB, "group")
_GET_CLUSTER = _cluster(Action.GET)

#: (method, route path) -> OPEN, SIGNED, or the function of (path params, query params, JSON body) giving the
#: (action, resource) pairs the request needs.  Routes not listed need a super user.
ROUTE_NEEDS: dict[tuple[str, str], str | NeedsOf] = {
    ("GET", "/health"): OPEN,
    ("GET", "/docs"): OPEN,
    # sends
    ("POST", "/topics/{topic}/messages"): _on(Action.PUB, "topic"),
    ("POST", "/topics/{topic}/half"): _on(Action.PUB, "topic"),
    ("POST", "/topics/{topic}/batch"): _on(Action.PUB, "topic"),
    ("POST", "/transactions/{transaction_id}"): _on(Action.PUB, "group", "body", "producer_group"),
    ("GET", "/transactions/checks"): _on(Action.PUB, "group", "query", "producer_group"),
    ("DELETE", "/timers/{msg_id}"): _cluster(Action.UPDATE),
    # pulls and consumer groups
    ("GET", "/topics/{topic}/queues/{queue_id}/messages"): _all(_on(Action.SUB, "topic"),
                                                                _on(Action.SUB, "group", "query")),
    ("GET", "/topics/{topic}/queues/{queue_id}/offsets"): _on(Action.SUB, "topic"),
    ("POST", "/clients/heartbeat"): _heartbeat,
    ("POST", "/clients/unregister"): _unregister,
    ("GET", "/consumers"): _cluster(Action.LIST),
    ("GET", "/consumers/{group}"): _SUB_GROUP,
    ("GET", "/consumers/{group}/changes"): _SUB_GROUP,
    ("POST", "/consumers/{group}/offsets"): _all(_SUB_GROUP, _offset_entries),
    ("GET", "/consumers/{group}/offsets"): _all(_SUB_GROUP, _on(Action.SUB, "topic", "query")),
    ("GET", "/consumers/{group}/offsets/{topic}/{queue_id}"): _all(_SUB_GROUP, _on(Action.SUB, "topic")),
    ("GET", "/consumers/{group}/lag"): _on(Action.GET, "group"),
    ("POST", "/consumers/{group}/send-back"): _SUB_GROUP,
    ("POST", "/consumers/{group}/offsets/reset"): _all(_on(Action.UPDATE, "group"),
                                                       _on(Action.UPDATE, "topic", "body")),
    ("POST", "/locks/lock"): _lock_queues,
    ("POST", "/locks/unlock"): _lock_queues,
    ("GET", "/dlq/{group}"): _SUB_GROUP,
    ("POST", "/dlq/{group}/redrive"): _on(Action.UPDATE, "group"),
    # Like a re-drive: an operator changing what the group consumes (Update on the group), not a producer
    # (no Pub on the origin topic) nor a member (Sub would let any consumer of the group replay anything).
    ("POST", "/consumers/{group}/resend"): _on(Action.UPDATE, "group"),
    # topics
    ("GET", "/topics"): _cluster(Action.LIST),
    ("POST", "/topics"): _on(Action.CREATE, "topic", "body"),
    ("GET", "/topics/{topic}"): _on(Action.GET, "topic"),
    ("DELETE", "/topics/{topic}"): _on(Action.DELETE, "topic"),
    ("GET", "/topics/{topic}/stats"): _on(Action.GET, "topic"),
    # messages, trace, broker state
    ("GET", "/messages/{offset_msg_id}"): _GET_CLUSTER,
    ("GET", "/query/messages"): _GET_CLUSTER,
    ("POST", "/trace"): SIGNED,
    ("GET", "/trace/{msg_id}"): _GET_CLUSTER,
    ("GET", "/alerts"): _GET_CLUSTER,
    ("GET", "/alerts/rules"): _GET_CLUSTER,
    # Report rows of one topic or group: what its stats and lag routes need.
    ("GET", "/reports/topics/{topic}"): _on(Action.GET, "topic"),
    ("GET", "/reports/groups/{group}"): _on(Action.GET, "group"),
    ("GET", "/broker"): _GET_CLUSTER,
    ("GET", "/broker/ha"): _GET_CLUSTER,
    ("GET", "/broker/ha/sync"): _GET_CLUSTER,
    ("GET", "/broker/dledger"): _GET_CLUSTER,
    ("POST", "/broker/dledger/transfer"): _cluster(Action.UPDATE),
    ("GET", "/metrics"): _GET_CLUSTER,
    ("GET", "/acl/whoami"): SIGNED,
}


#: Bodies larger than this are verified in the threadpool, not on the event loop.
_INLINE_VERIFY_BYTES = 1 << 20


def _target(request: Request) -> str:
    """The raw path and query the client signed."""
    scope = request.scope
    raw = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return (raw + (b"?" + query if query else b"")).decode("latin-1")


def _peer(request: Request) -> str | None:
    return request.client.host if request.client is not None else None


async def http_access(request: Request) -> Principal | None:
    """The app-wide dependency: authenticate and authorize the request (ACL on), else let it through.

    The principal is kept on ``request.state.principal`` for endpoints that need to know who called.
    """
    guard: AccessGuard | None = getattr(request.app.state, "guard", None)
    if guard is None or not guard.enabled:
        return None
    route = request.scope.get("route")
    path = getattr(route, "path", request.url.path)
    # Each app brings its table (name server, gateway); the broker's is the default.
    rule = getattr(request.app.state, "route_needs", ROUTE_NEEDS).get((request.method, path), SUPER)
    if rule == OPEN:
        return None
    limit = getattr(request.app.state, "max_request_bytes", None)
    if limit is None:
        limit = getattr(getattr(getattr(request.app.state, "broker", None), "config", None), "max_request_bytes",
                        None)
    declared = request.headers.get("content-length")
    if limit is not None and declared is not None and declared.isdigit() and int(declared) > limit:
        raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE, f"the request is {declared} bytes, the limit is {limit}")
    body = await request.body()
    peer = _peer(request)
    what = f"{request.method} {path}"
    target = _target(request)
    if len(body) > _INLINE_VERIFY_BYTES:  # digesting a big body would hold up every other request on the loop
        principal = await run_in_threadpool(guard.authenticate_http, request.method, target, request.headers, body,
                                            peer)
    else:
        principal = guard.authenticate_http(request.method, target, request.headers, body, peer)
    request.state.principal = principal
    if rule == SUPER:
        guard.require_super_user(principal, peer, what)
    elif callable(rule):
        parsed: Any = None
        if body and request.headers.get("content-type", "").startswith("application/json"):
            try:
                parsed = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError):
                parsed = None  # the endpoint refuses it as INVALID_ARGUMENT
        needs = rule(dict(request.path_params), dict(request.query_params), parsed)
        guard.authorize(principal, needs, peer, what, any_of=isinstance(needs, AnyOf))
    return principal


# -- remoting requests -------------------------------------------------------------------------------------
#: What a remoting request needs: items of which each must be allowed -- a :data:`Need`, or an :class:`AnyOf`
#: of which one suffices (RocketMQ's contexts with several actions) -- or :data:`SIGNED` (any signed user).
RemotingNeedsOf = Callable[[Frame], "list[Need | AnyOf] | str"]


def remoting_topic(name: str | None, *actions: Action) -> list[Need | AnyOf]:
    """``actions`` (any one of them) on the topic ``name``; nothing for a missing name (the handler refuses it)."""
    if not name:
        return []
    resource = Resource.topic(name)
    return [AnyOf((a, resource) for a in actions) if len(actions) > 1 else (actions[0], resource)]


def remoting_group(name: str | None, *actions: Action) -> list[Need | AnyOf]:
    """``actions`` (any one of them) on the consumer or producer group ``name``."""
    if not name:
        return []
    resource = Resource.group(name)
    return [AnyOf((a, resource) for a in actions) if len(actions) > 1 else (actions[0], resource)]


def remoting_access(guard: AccessGuard | None, frame: Frame, peer: str | None,
                    needs: dict[int, RemotingNeedsOf]) -> Principal | None:
    """Authenticate and authorize a remoting request (ACL on), before its handler runs; None with ACL off.

    The credential fields leave ``frame.ext`` either way (a handler never sees them); AUTHENTICATION_FAILED or
    NO_PERMISSION (both RocketMQ's response code 16) otherwise, audited, and nothing has changed.  ``needs`` is
    the service's table (the name server's ``NAMESRV_REMOTING_NEEDS``); a code it does not list needs a super
    user.  (The broker's dispatcher, ``api/remoting``, does the same over its request families' tables.)
    """
    if guard is None or not guard.enabled:
        if frame.ext:
            for name in CREDENTIAL_FIELDS:
                frame.ext.pop(name, None)
        return None
    principal = guard.authenticate_remoting(frame, peer)
    rule = needs.get(frame.code)
    code_name = RequestCode(frame.code).name if frame.code in RequestCode._value2member_map_ else str(frame.code)
    what = f"remoting {code_name}"
    if rule is None:
        guard.require_super_user(principal, peer, what)
        return principal
    wanted = rule(frame)
    if isinstance(wanted, str):  # SIGNED, the one string a rule answers: any authenticated caller
        return principal
    for item in wanted:
        if isinstance(item, AnyOf):
            guard.authorize(principal, item, peer, what, any_of=True)
        else:
            guard.authorize(principal, [item], peer, what)
    return principal


# -- ACL administration ----------------------------------------------------------------------------------
acl_router = APIRouter(prefix="/acl", tags=["acl"])

AccessKeyParam = Annotated[str, Declared(contract.AccessKey)]


def _guard(request: Request) -> AccessGuard:
    return request.app.state.guard


GuardDep = Annotated[AccessGuard, Depends(_guard)]


def _who(request: Request) -> Principal | None:
    return getattr(request.state, "principal", None)


def _invalid(exc: ValueError) -> SparkMQError:
    return SparkMQError(ErrorCode.INVALID_ARGUMENT, str(exc))


@acl_router.get("/whoami")
def whoami(request: Request, guard: GuardDep) -> dict[str, Any]:
    """Who signed this request: access key, super-user flag, policy entries and the address seen (any signed
    user; the console shows only what they may do).  With ACL off: ``acl_enabled`` false and no user."""
    principal = _who(request)
    if not guard.enabled or principal is None:
        return {"acl_enabled": False, "access_key": None, "super_user": False, "entries": [], "peer_ip": None}
    guard.store.maybe_reload()
    policy = guard.store.table.policies.get(principal.access_key)
    return {"acl_enabled": True, "access_key": principal.access_key, "super_user": principal.super_user,
            "entries": [e.to_dict() for e in policy.entries] if policy is not None else [],
            "peer_ip": _peer(request)}


@acl_router.get("/users")
def list_users(guard: GuardDep) -> dict[str, Any]:
    """Every user (access key and super-user flag; secrets are never answered)."""
    guard.store.maybe_reload()
    users = sorted(guard.store.table.users.values(), key=lambda u: u.access_key)
    return {"users": [u.to_dict() for u in users]}


@acl_router.post("/users")
def create_user(body: Annotated[contract.UserBody, Depends(json_body(contract.UserBody))], request: Request,
                guard: GuardDep) -> dict[str, Any]:
    """Create a user, or with ``update`` change an existing one's secret and flag (INVALID_ARGUMENT if it
    exists and ``update`` is false)."""
    try:
        user = User(body.access_key, body.secret_key, body.super_user)
    except ValueError as exc:
        raise _invalid(exc) from None
    guard.store.create_user(user, replace_existing=body.update)
    guard.audit_change(_who(request), _peer(request), f"{'update' if body.update else 'create'} user "
                                                      f"{user.access_key} super_user={user.super_user}")
    return user.to_dict()


@acl_router.delete("/users/{access_key}")
def delete_user(access_key: Annotated[AccessKeyParam, Path()], request: Request,
                guard: GuardDep) -> dict[str, Any]:
    """Delete a user and its policy; ``deleted`` is false when there was none."""
    deleted = guard.store.delete_user(access_key)
    if deleted:
        guard.audit_change(_who(request), _peer(request), f"delete user {access_key}")
    return {"access_key": access_key, "deleted": deleted}


@acl_router.get("/policies")
def list_policies(guard: GuardDep, subject: Annotated[AccessKeyParam | None, Query()] = None
                  ) -> dict[str, Any]:
    """Every policy, or one subject's."""
    guard.store.maybe_reload()
    policies = sorted(guard.store.table.policies.values(), key=lambda p: p.subject)
    return {"policies": [p.to_dict() for p in policies if subject is None or p.subject == subject]}


@acl_router.post("/policies")
def put_policy(body: Annotated[contract.PolicyBody, Depends(json_body(contract.PolicyBody))], request: Request,
               guard: GuardDep) -> dict[str, Any]:
    """Add entries to a user's policy (INVALID_ARGUMENT for an unknown user or a bad entry)."""
    try:
        entries = [PolicyEntry.from_dict(msgspec.structs.asdict(e)) for e in body.entries]
    except ValueError as exc:
        raise _invalid(exc) from None
    policy = guard.store.put_policy(body.subject, entries)
    guard.audit_change(_who(request), _peer(request), f"put policy of {body.subject}: "
                                                      f"{[e.to_dict() for e in entries]}")
    return policy.to_dict()


@acl_router.delete("/policies/{subject}")
def delete_policy(subject: Annotated[AccessKeyParam, Path()], request: Request, guard: GuardDep,
                  resource: Annotated[str | None, Query(description="only the entry for this resource")] = None,
                  ) -> dict[str, Any]:
    """Remove a user's entry for ``resource``, or every entry; ``removed`` counts them."""
    try:
        removed = guard.store.delete_policy(subject, resource)
    except ValueError as exc:
        raise _invalid(exc) from None
    if removed:
        guard.audit_change(_who(request), _peer(request), f"delete policy of {subject} "
                                                          f"resource={resource or '(all)'}: {removed} entries")
    return {"subject": subject, "removed": removed}
