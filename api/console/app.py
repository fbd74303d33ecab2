"""The console's HTTP side: a JSON API under ``/api`` over :class:`AdminClient`, and the page that uses it.

Every endpoint is a thin call into :class:`~sparkmq.platform.client.admin.AdminClient` (the same client as
``sparkmq admin``): the console adds paging, search, previews and charts, never admin logic of its own.
Errors are the platform's ``{"code", "message"}`` answers (:mod:`sparkmq.api.errors`), which the page shows
as they are.  Tables are paged on the server so a cluster of 1,000 topics and 1,000 groups answers one page
of rows, each row's details fetched in parallel.

With access control on (:mod:`.auth`), every endpoint but ``/api/session`` needs a signed-in session, and
its admin calls are signed with that user's credentials: the brokers decide, and their NO_PERMISSION is
what the page shows.  Answers carry ``may_*`` flags (from the user's policy) so the page hides or disables
what would be refused.
"""
from __future__ import annotations

import base64
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from ...platform.auth import CLUSTER, Action, Resource
from ...platform.client.admin import AdminClient, merge_group_clients
from ...platform.common.errors import ErrorCode, SparkMQError
from ...platform.common.perm import PERM_READ_WRITE, perm_to_string
from ...platform.common.protocol import REPORT_RANGES, ConsumeType, held_queue_key, parse_held_queue
from ...platform.common.system_topics import (
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MSG_ID,
    is_system_topic,
)
from ...platform.common.wire import ReceivedMessage
from ..errors import install_error_handlers
from .auth import COOKIE, ConsoleAuth, Session
from .docs import install_docs
from .history import Sampler, SeriesStore

__all__ = ["create_app", "STATIC_DIR", "MAX_PAGE_SIZE"]

log = logging.getLogger("sparkmq.console")
T = TypeVar("T")

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: The largest page a table asks for.
MAX_PAGE_SIZE = 200
#: Chart ranges the page offers from its live samples, in seconds (the time-range picker).
CHART_RANGES_S = (300, 900, 3600)
#: The longer ranges, from the lake's report tables: seconds -> the brokers' range name.
REPORT_RANGE_S = {seconds: name for name, (seconds, _) in REPORT_RANGES.items() if seconds > max(CHART_RANGES_S)}
#: Parallel admin calls per request (one per table row).
_FANOUT = 8

router = APIRouter(prefix="/api")


# -- dependencies -------------------------------------------------------------------------------------

def _session(request: Request) -> Session | None:
    """The signed-in session when ACL is on (AUTHENTICATION_FAILED without one), None when ACL is off."""
    auth: ConsoleAuth = request.app.state.auth
    if not auth.acl_enabled():
        return None
    session = auth.get(request.cookies.get(COOKIE))
    if session is None:
        raise SparkMQError(ErrorCode.AUTHENTICATION_FAILED, "access control is on: sign in with your access key")
    return session


SessionDep = Annotated[Session | None, Depends(_session)]


def _admin(request: Request, session: SessionDep) -> AdminClient:
    # A signed-in user's own signed client: the brokers decide what it may do.
    return session.admin if session is not None else request.app.state.admin


def _may(session: Session | None, action: Action, resource: Resource) -> bool:
    """Whether the page should offer ``action`` on ``resource`` (always with ACL off)."""
    return session is None or session.may(action, resource)


def _sampler(request: Request) -> Sampler:
    return request.app.state.sampler


def _pool(request: Request) -> ThreadPoolExecutor:
    return request.app.state.pool


AdminDep = Annotated[AdminClient, Depends(_admin)]
SamplerDep = Annotated[Sampler, Depends(_sampler)]
PoolDep = Annotated[ThreadPoolExecutor, Depends(_pool)]
PageDep = Annotated[int, Query(ge=1, description="1-based page number")]
SizeDep = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="rows per page")]


def _page(names: list[str], q: str, page: int, size: int) -> tuple[list[str], int]:
    """The ``page``-th slice of ``names`` containing ``q`` (case-insensitive) and how many matched."""
    needle = q.strip().lower()
    matched = [n for n in names if needle in n.lower()] if needle else names
    return matched[(page - 1) * size: page * size], len(matched)


def _each(pool: ThreadPoolExecutor, fn: Callable[[str], T], names: Iterable[str]) -> list[T | SparkMQError]:
    """``fn`` over ``names`` in parallel; a stable error becomes that row's error instead of failing the page."""
    def safe(name: str) -> T | SparkMQError:
        try:
            return fn(name)
        except SparkMQError as exc:
            return exc
    return list(pool.map(safe, names))


def _error(exc: SparkMQError) -> dict[str, str]:
    return {"code": exc.code.name, "message": exc.message}


# -- sign-in (ACL on) ---------------------------------------------------------------------------------

class SignInForm(BaseModel):
    """An access key and its secret key (kept on the server for the session; never answered or logged)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    access_key: str = Field(description="the user's access key")
    secret_key: str = Field(description="the user's secret key", repr=False)


def _auth(request: Request) -> ConsoleAuth:
    return request.app.state.auth


AuthDep = Annotated[ConsoleAuth, Depends(_auth)]


@router.get("/session")
def session_info(request: Request, auth: AuthDep) -> dict[str, Any]:
    """Whether ACL is on and, if so, who is signed in: access key, super-user flag, policy entries."""
    if not auth.acl_enabled():
        return {"acl_enabled": False, "signed_in": False}
    session = auth.get(request.cookies.get(COOKIE))
    return {"acl_enabled": True, "signed_in": session is not None, **(session.view() if session else {})}


@router.post("/session")
def sign_in(form: SignInForm, request: Request, response: Response, auth: AuthDep) -> dict[str, Any]:
    """Sign in (ACL on): every master must accept the keys (AUTHENTICATION_FAILED otherwise).  The answer sets
    an HttpOnly cookie holding a random session id; the keys stay on the server."""
    if not auth.acl_enabled():
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "access control is off: the console needs no sign-in")
    session = auth.sign_in(form.access_key.strip(), form.secret_key)
    auth.sign_out(request.cookies.get(COOKIE))  # a previous session of this browser ends
    response.set_cookie(COOKIE, session.sid, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
    return {"acl_enabled": True, "signed_in": True, **session.view()}


@router.delete("/session")
def sign_out(request: Request, response: Response, auth: AuthDep) -> dict[str, Any]:
    """Sign out: the session and its keys are forgotten."""
    auth.sign_out(request.cookies.get(COOKIE))
    response.delete_cookie(COOKIE, path="/")
    return {"signed_in": False}


# -- cluster ------------------------------------------------------------------------------------------

@router.get("/cluster")
def cluster(admin: AdminDep, pool: PoolDep, request: Request, session: SessionDep) -> dict[str, Any]:
    """Every broker the name servers know, each with its own ``GET /broker`` (role, version, disk use,
    replication, commit log, topic and client counts), its write rate from the console's samples, and each
    master's lake state."""
    if session is not None:
        request.app.state.sampler.use_for_brokers(admin)
    lake_answer = pool.submit(admin.lake_status)  # each master's /health, in parallel with every GET /broker
    info = admin.cluster_list()
    live: dict[str, Any] = info.get("live_brokers") or {}  # addr -> its last registration (age, gRPC address)
    rows = []
    for cluster_name, names in sorted((info.get("clusters") or {}).items()):
        for name in sorted(names):
            addrs = ((info.get("brokers") or {}).get(name) or {}).get("broker_addrs") or {}
            for broker_id, addr in sorted(addrs.items()):
                rows.append({"cluster": cluster_name, "broker_name": name, "broker_id": int(broker_id), "addr": addr})
    answers = _each(pool, admin.broker_info, [r["addr"] for r in rows])
    store: SeriesStore = request.app.state.series
    for row, answer in zip(rows, answers, strict=True):
        if isinstance(answer, SparkMQError):
            row.update(reachable=False, error=_error(answer))
            continue
        commitlog = answer.get("commitlog") or {}
        replication = answer.get("replication") or {}
        row.update(reachable=True, role=answer.get("role"), version=answer.get("version"), disk=answer.get("disk"),
                   topics=answer.get("topics"), clients=answer.get("clients"),
                   remoting_addr=answer.get("remoting_addr"), commitlog=commitlog,
                   stored_bytes=(commitlog.get("max_offset") or 0) - (commitlog.get("min_offset") or 0),
                   replication=replication, live=row["addr"] in live, registration=live.get(row["addr"]),
                   write_bytes_per_s=store.latest_rate(f"broker:{row['broker_name']}:bytes")
                   if row["broker_id"] == 0 else None)
    try:
        lake: dict[str, Any] = lake_answer.result()
    except SparkMQError as exc:
        lake = {"error": _error(exc)}
    return {"namesrv_addrs": list(admin.config.namesrv_addrs), "brokers": rows, "lake": lake}


# -- topics -------------------------------------------------------------------------------------------

class TopicForm(BaseModel):
    """A topic to create or update on every master."""

    model_config = ConfigDict(extra="forbid")

    topic: str = Field(description="the topic name")
    read_queue_nums: int = Field(8, description="read queues per broker")
    write_queue_nums: int = Field(8, description="write queues per broker")
    perm: int = Field(PERM_READ_WRITE, description="6 read-write, 4 read only, 2 write only")
    order: bool = Field(False, description="an ordered topic")


def _topic_row(admin: AdminClient, topic: str, session: Session | None = None) -> dict[str, Any]:
    route = admin.topic_route(topic)
    return {"topic": topic, "system": is_system_topic(topic), "brokers": route.broker_names,
            "may_delete": _may(session, Action.DELETE, Resource.topic(topic)),
            "read_queues": sum(q.read_queue_nums for q in route.queue_datas),
            "write_queues": sum(q.write_queue_nums for q in route.queue_datas),
            "perm": sorted({perm_to_string(q.perm) for q in route.queue_datas})}


@router.get("/topics")
def topics(admin: AdminDep, pool: PoolDep, session: SessionDep, q: str = "", page: PageDep = 1,
           size: SizeDep = 20, system: bool = False) -> dict[str, Any]:
    """One page of topics whose name contains ``q`` (system topics only with ``system``), each with its
    brokers, queue counts and permissions from its route; ``may_create`` / ``may_delete``: what the
    signed-in user's policy allows."""
    names = [t for t in admin.topic_list() if system or not is_system_topic(t)]
    shown, total = _page(names, q, page, size)
    rows = []
    for name, answer in zip(shown, _each(pool, lambda t: _topic_row(admin, t, session), shown), strict=True):
        rows.append({"topic": name, "error": _error(answer)} if isinstance(answer, SparkMQError) else answer)
    return {"total": total, "page": page, "size": size, "items": rows,
            "may_create": session is None or session.may_create_topics()}


@router.get("/topics/{topic}")
def topic_detail(topic: str, admin: AdminDep, sampler: SamplerDep, session: SessionDep) -> dict[str, Any]:
    """A topic's route (per broker: queues, perm) and every queue's min/max offset and last store time."""
    route = admin.topic_route(topic)
    queues = [dataclasses.asdict(s) for s in admin.topic_stats(topic)]
    sampler.watch("topic", topic, admin if session is not None else None)
    return {"topic": topic, "route": [{**dataclasses.asdict(q), "perm_text": perm_to_string(q.perm),
                                       "master_addr": route.master_addr(q.broker_name)} for q in route.queue_datas],
            "queues": queues, "messages": sum(q["max_offset"] - q["min_offset"] for q in queues)}


@router.post("/topics")
def create_topic(form: TopicForm, admin: AdminDep) -> dict[str, Any]:
    """Create (or update) a topic on every master; the stored config by broker address."""
    stored = admin.create_topic(form.topic, read_queue_nums=form.read_queue_nums,
                                write_queue_nums=form.write_queue_nums, perm=form.perm, order=form.order)
    return {"topic": form.topic, "brokers": stored}


@router.delete("/topics/{topic}")
def delete_topic(topic: str, admin: AdminDep) -> dict[str, Any]:
    """Delete a topic from every master and name server (the page asks for confirmation first)."""
    if is_system_topic(topic):
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{topic} is a system topic: the console does not delete it")
    return {"topic": topic, **admin.delete_topic(topic)}


# -- consumer groups ----------------------------------------------------------------------------------

def _group_summary(admin: AdminClient, group: str) -> dict[str, Any]:
    views = admin.group_info(group)
    members = sorted({m for v in views.values() for m in v.get("members") or ()})
    first = next((v for v in views.values() if v.get("members")), {})
    return {"group": group, "members": len(members), "consume_type": first.get("consume_type"),
            "message_model": first.get("message_model"), "total_lag": admin.group_lag(group).total_lag}


@router.get("/groups")
def groups(admin: AdminDep, pool: PoolDep, q: str = "", page: PageDep = 1, size: SizeDep = 20) -> dict[str, Any]:
    """One page of consumer groups whose name contains ``q``, each with its member count, type and total lag."""
    shown, total = _page(admin.group_list(), q, page, size)
    rows = []
    for name, answer in zip(shown, _each(pool, lambda g: _group_summary(admin, g), shown), strict=True):
        rows.append({"group": name, "error": _error(answer)} if isinstance(answer, SparkMQError) else answer)
    return {"total": total, "page": page, "size": size, "items": rows}


@router.get("/group-names")
def group_names(admin: AdminDep, q: str = "", size: SizeDep = MAX_PAGE_SIZE) -> dict[str, Any]:
    """Just the names of the groups containing ``q`` (at most ``size``): the dead-letters page's suggestions,
    without the per-group calls of ``/groups``."""
    shown, total = _page(admin.group_list(), q, 1, size)
    return {"total": total, "names": shown}


@router.get("/groups/{group}")
def group_detail(group: str, admin: AdminDep, sampler: SamplerDep, request: Request,
                 session: SessionDep) -> dict[str, Any]:
    """A group: members with their protocol (consume type), subscriptions per broker, lag per queue and in
    total, and its consume rate from the console's samples; ``may_reset``: the user may move its offsets."""
    views = admin.group_info(group)
    lag = admin.group_lag(group)
    sampler.watch("group", group, admin if session is not None else None)
    store: SeriesStore = request.app.state.series
    subscriptions = {s["topic"]: s for v in views.values() for s in v.get("subscriptions") or ()}
    clients = merge_group_clients(views)
    holders: dict[str, list[str]] = {}
    for c in clients:
        for key in c.held_queues:
            holders.setdefault(key, []).append(c.client_id)
    return {"group": group, "members": sorted({m for v in views.values() for m in v.get("members") or ()}),
            "clients": [{"client_id": c.client_id, "consume_type": c.consume_type, "message_model": c.message_model,
                         "held_queues": [_held_view(k) for k in c.held_queues],
                         # POP (gRPC) members are handed messages by the broker: they never hold a queue.
                         "holds_queues": c.consume_type != str(ConsumeType.POP)} for c in clients],
            "brokers": views, "subscriptions": list(subscriptions.values()), "total_lag": lag.total_lag,
            "queues": [{**dataclasses.asdict(q),
                        "held_by": holders.get(held_queue_key(q.topic, q.broker_name, q.queue_id), [])}
                       for q in lag.queues],
            "consume_per_s": store.latest_rate(f"group:{group}:consumed"),
            "may_reset": _may(session, Action.UPDATE, Resource.group(group))}


def _held_view(key: str) -> dict[str, Any]:
    topic, broker, queue_id = parse_held_queue(key)
    return {"topic": topic, "broker_name": broker, "queue_id": queue_id}


class ResetForm(BaseModel):
    """Where to move a group's offsets of one topic: ``earliest``, ``latest``, a ``timestamp`` or exact ``offsets``."""

    model_config = ConfigDict(extra="forbid")

    topic: str
    mode: Literal["earliest", "latest", "timestamp", "offsets"]
    timestamp: int | None = Field(None, description="epoch ms (mode timestamp)")
    offsets: dict[str, int] | None = Field(None, description='{"broker/queue_id": offset} (mode offsets)')
    apply: bool = Field(False, description="false: only the preview; true: move the offsets")


def _reset_targets(admin: AdminClient, form: ResetForm) -> dict[str, int] | None:
    """Exact per-queue targets for every mode but ``timestamp`` (which the brokers resolve themselves)."""
    if form.mode == "offsets":
        if not form.offsets:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "mode offsets needs offsets {\"broker/queue_id\": n}")
        return dict(form.offsets)
    if form.mode == "timestamp":
        if form.timestamp is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "mode timestamp needs a timestamp (epoch ms)")
        return None
    pick = "min_offset" if form.mode == "earliest" else "max_offset"
    return {f"{s.broker_name}/{s.queue_id}": getattr(s, pick) for s in admin.topic_stats(form.topic)}


@router.post("/groups/{group}/reset")
def reset_offsets(group: str, form: ResetForm, admin: AdminDep) -> dict[str, Any]:
    """Preview (``apply`` false) or apply a reset of ``group``'s offsets of ``form.topic``.

    The preview lists every queue with its committed offset, the target and how many messages move
    (negative: consumed again); a timestamp's targets are known once applied (each broker finds the first
    message at or after it).  Applying moves running consumers at once.
    """
    targets = _reset_targets(admin, form)
    current = {f"{mq.broker_name}/{mq.queue_id}": off for mq, off in admin.group_offsets(group, form.topic).items()}
    stats = {f"{s.broker_name}/{s.queue_id}": s for s in admin.topic_stats(form.topic)}
    applied: dict[str, int] | None = None
    if form.apply:
        result = admin.reset_offsets(group, form.topic, timestamp=form.timestamp if targets is None else None,
                                     offsets=targets)
        applied = {f"{mq.broker_name}/{mq.queue_id}": off for mq, off in result.items()}
    final = applied if applied is not None else targets
    rows = []
    for queue in sorted(set(stats) | set(current) | set(final or {}), key=_queue_order):
        s = stats.get(queue)
        target = None if final is None else final.get(queue)
        cur = current.get(queue)
        rows.append({"queue": queue, "current": cur, "target": target,
                     "min_offset": s.min_offset if s else None, "max_offset": s.max_offset if s else None,
                     "moves": None if target is None or cur is None else target - cur})
    return {"group": group, "topic": form.topic, "mode": form.mode, "applied": applied is not None, "queues": rows}


def _queue_order(key: str) -> tuple[str, int]:
    broker, _, queue = key.rpartition("/")
    return broker, int(queue) if queue.isdigit() else -1


# -- messages and trace -------------------------------------------------------------------------------

def message_json(m: ReceivedMessage) -> dict[str, Any]:
    """A message for the page: its place, ids, times, every property, and the body as base64."""
    return {"topic": m.topic, "broker_name": m.broker_name, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id, "tags": m.tags, "keys": list(m.keys),
            "properties": dict(m.properties), "born_timestamp": m.born_timestamp, "born_host": m.born_host,
            "store_timestamp": m.store_timestamp, "store_host": m.store_host, "reconsume_times": m.reconsume_times,
            "body_size": len(m.body), "body_base64": base64.b64encode(m.body).decode("ascii")}


@router.get("/messages")
def messages(admin: AdminDep, topic: str | None = None, key: str | None = None, msg_id: str | None = None,
             begin: int | None = None, end: int | None = None,
             max_hits: Annotated[int, Query(alias="max", ge=1, le=64)] = 32) -> dict[str, Any]:
    """Messages by ``msg_id`` (the producer's id through the lake's index, or an offsetMsgId read from its
    broker), by ``topic`` + ``key``, or by ``topic`` + store-time range (``begin``/``end``, epoch ms)."""
    if msg_id:
        msg_id = msg_id.strip()
        found: list[ReceivedMessage] = []
        lake_error: SparkMQError | None = None
        try:
            found = admin.query_messages(msg_id=msg_id, max_hits=max_hits)
        except SparkMQError as exc:
            lake_error = exc
        if not found:
            try:  # an offsetMsgId names its broker and commit-log position: no index needed
                found = [admin.view_message(msg_id)]
            except SparkMQError as exc:
                if lake_error is not None and exc.code is not ErrorCode.MESSAGE_NOT_FOUND:
                    raise lake_error from None
                found = []
    elif topic:
        if not key and begin is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "with a topic give a key or a time range (begin, end)")
        found = admin.query_messages(topic=topic.strip(), key=key or None, begin_ms=begin, end_ms=end,
                                     max_hits=max_hits)
    else:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "give a message id, or a topic with a key or a time range")
    return {"messages": [message_json(m) for m in found]}


class ResendForm(BaseModel):
    """A message to have one consumer group consume again."""

    model_config = ConfigDict(extra="forbid")

    msg_id: str = Field(description="the message's offsetMsgId (or its msgId, found through the lake's index)")
    group: str = Field(description="the consumer group that consumes it again (only that group)")


@router.post("/messages/resend")
def resend(form: ResendForm, admin: AdminDep) -> dict[str, Any]:
    """Re-send a message to one group: a copy in ``%RETRY%<group>`` that only that group consumes (reconsume
    count 0).  MESSAGE_NOT_FOUND, GROUP_NOT_EXIST, NO_PERMISSION (Update on the group) as the brokers say."""
    return admin.resend(form.msg_id.strip(), form.group.strip())


@router.get("/trace/{msg_id}")
def trace(msg_id: str, admin: AdminDep) -> dict[str, Any]:
    """A message's path (send, store, deliver, consume, retry, dlq) in time order with the ms between steps."""
    return {"msg_id": msg_id, "events": admin.trace(msg_id.strip())}


# -- dead letters -------------------------------------------------------------------------------------

@router.get("/dlq/{group}")
def dead_letters(group: str, admin: AdminDep, session: SessionDep, topic: str | None = None,
                 max_messages: Annotated[int, Query(alias="max", ge=1, le=5000)] = 500) -> dict[str, Any]:
    """A group's dead letters (optionally of one original ``topic``) with their origin and failure reason."""
    rows = []
    for m in admin.dlq_messages(group, max_messages):
        origin = m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC)
        if topic and origin != topic:
            continue
        rows.append({**message_json(m), "origin_topic": origin,
                     "origin_msg_id": m.properties.get(PROPERTY_ORIGIN_MSG_ID),
                     "reason": m.properties.get(PROPERTY_DLQ_REASON)})
    return {"group": group, "messages": rows, "may_redrive": _may(session, Action.UPDATE, Resource.group(group))}


class RedriveForm(BaseModel):
    """Dead letters to send back: the selected ``msg_ids``, or ``all`` (of one original ``topic`` if given)."""

    model_config = ConfigDict(extra="forbid")

    msg_ids: list[str] | None = None
    all: bool = False
    topic: str | None = None


@router.post("/dlq/{group}/redrive")
def redrive(group: str, form: RedriveForm, admin: AdminDep) -> dict[str, Any]:
    """Send dead letters back to their original topics; ``redriven`` counts what moved."""
    if bool(form.msg_ids) == form.all:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "select messages (msg_ids) or all, not both")
    return admin.redrive(group, msg_ids=form.msg_ids or None, all=form.all, topic=form.topic or None)


# -- alerts -------------------------------------------------------------------------------------------

@router.get("/alerts")
def alerts(admin: AdminDep, pool: PoolDep, limit: Annotated[int, Query(ge=1, le=5000)] = 500) -> dict[str, Any]:
    """Every master's alerts from the lake's report rules: ``firing`` (open, oldest first), ``resolved``
    (newest first) and ``rules``: each configured rule (kind, threshold, for how long, severity, filters, the
    brokers evaluating it) with its firing / resolved counts; a rule that raised alerts but is no longer
    configured is listed too (``configured`` false).  ``rule_errors``: brokers whose ``[alerts]`` is bad."""
    configured = pool.submit(admin.alert_rules)  # in parallel with the alerts
    firing: list[dict[str, Any]] = []
    resolved: list[dict[str, Any]] = []
    for broker, rows in admin.alerts(resolved=True, limit=limit).items():
        for row in rows:
            (resolved if row.get("resolved_at") else firing).append({**row, "broker": broker})
    firing.sort(key=lambda a: (a.get("raised_at") or "", a.get("alert_id") or ""))
    resolved.sort(key=lambda a: a.get("resolved_at") or "", reverse=True)
    rules: dict[str, dict[str, Any]] = {}

    def rule_of(name: str, seed: dict[str, Any]) -> dict[str, Any]:
        return rules.setdefault(name, {**seed, "rule": name, "brokers": [], "firing": 0, "resolved": 0,
                                       "last_raised_at": None})

    errors: dict[str, str] = {}
    for broker, answer in configured.result().items():
        if answer.get("error"):
            errors[broker] = answer["error"]
        for r in answer.get("rules") or ():
            rule_of(r["name"], {**r, "configured": True})["brokers"].append(broker)
    for row in firing + resolved:
        rule = rule_of(row["rule"], {"severity": row.get("severity"), "threshold": row.get("threshold"),
                                     "configured": False})
        rule["firing" if not row.get("resolved_at") else "resolved"] += 1
        rule["last_raised_at"] = max(filter(None, (rule["last_raised_at"], row.get("raised_at"))), default=None)
    return {"firing": firing, "resolved": resolved, "rules": sorted(rules.values(), key=lambda r: r["rule"]),
            "rule_errors": errors}


# -- lake and charts ----------------------------------------------------------------------------------

@router.get("/lake")
def lake(admin: AdminDep) -> dict[str, Any]:
    """Each master's lake: its state and every job's state, last batch, rows, restarts and last error."""
    return {"brokers": admin.lake_status()}


@router.get("/history")
def history(request: Request, session: SessionDep, admin: AdminDep, kind: Literal["group", "topic", "broker"],
            name: str, range_s: Annotated[int, Query(ge=10, le=max(REPORT_RANGE_S))] = 900) -> dict[str, Any]:
    """A chart's series over the last ``range_s`` seconds: a group's lag and consume rate, a topic's store
    rate, or a master's written bytes per second (``t`` in epoch seconds).  Up to an hour they are the
    console's live samples; the longer ranges (:data:`REPORT_RANGE_S`) come from the lake's per-minute report
    tables of every master (``source`` "reports", one point per ``step_s``)."""
    if range_s > max(CHART_RANGES_S):
        return _report_history(admin, kind, name, range_s)
    store: SeriesStore = request.app.state.series
    # The samples are shared by every session: with ACL on, show them only to a user who may read the source.
    resource = {"group": Resource.group, "topic": Resource.topic}.get(kind, lambda _: CLUSTER)(name)
    if not _may(session, Action.GET, resource):
        raise SparkMQError(ErrorCode.NO_PERMISSION, f"user {session.access_key if session else '-'!r} may not "
                                                    f"Get on {resource}")
    signed = session.admin if session is not None else None
    if kind == "group":
        request.app.state.sampler.watch("group", name, signed)
        lag = store.points(f"group:{name}:lag", range_s)
        return {"lag": lag, "tps": store.rate(f"group:{name}:consumed", range_s)}
    if kind == "topic":
        request.app.state.sampler.watch("topic", name, signed)
        return {"tps": store.rate(f"topic:{name}:stored", range_s)}
    return {"bytes_per_s": store.rate(f"broker:{name}:bytes", range_s)}


def _report_history(admin: AdminClient, kind: str, name: str, range_s: int) -> dict[str, Any]:
    """The report tables' series in the live series' shape (the brokers check the user's access themselves)."""
    range_name = REPORT_RANGE_S.get(range_s)
    if range_name is None or kind == "broker":
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"beyond an hour the charts read the report tables: "
                                                       f"range_s one of {sorted(REPORT_RANGE_S)} for a topic or "
                                                       f"group, got {range_s} for a {kind}")
    series = admin.report_series(kind, name, range_name)
    out: dict[str, Any] = {"source": "reports", "step_s": series.step_s, "truncated": series.truncated}
    if kind == "group":
        return {**out, "lag": [[p.t, p.lag] for p in series.points], "tps": [[p.t, p.tps_out] for p in series.points]}
    return {**out, "tps": [[p.t, p.tps_in] for p in series.points],
            "tps_out": [[p.t, p.tps_out] for p in series.points]}


@router.get("/config")
def console_config(admin: AdminDep) -> dict[str, Any]:
    """What the page needs to start: the name servers and the chart ranges offered."""
    return {"namesrv_addrs": list(admin.config.namesrv_addrs), "chart_ranges_s": list(CHART_RANGES_S),
            "report_ranges_s": sorted(REPORT_RANGE_S), "server_time_ms": int(time.time() * 1000)}


# -- the app ------------------------------------------------------------------------------------------

def create_app(admin: AdminClient, *, sample_interval_s: float = 2.0) -> FastAPI:
    """The console over ``admin`` (closed with the app): the page at ``/``, its API at ``/api``, docs at ``/docs``.

    Example::

        app = create_app(AdminClient(ClientConfig(namesrv_addrs="127.0.0.1:9876")))
    """
    series = SeriesStore()
    sampler = Sampler(admin, series, sample_interval_s)
    auth = ConsoleAuth(admin, on_drop=sampler.forget)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sampler.start()
        try:
            yield
        finally:
            sampler.stop()
            auth.close()
            app.state.pool.shutdown(wait=False, cancel_futures=True)
            admin.close()

    app = FastAPI(title="sparkmq console", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="The web console's API: cluster, topics, groups, messages, trace, dead letters, "
                              "alerts, lake; sign-in when access control is on.")
    app.state.admin = admin
    app.state.series = series
    app.state.sampler = sampler
    app.state.auth = auth
    app.state.pool = ThreadPoolExecutor(_FANOUT, thread_name_prefix="console")
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        # no-cache: a new console version is picked up by a reload
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    install_docs(app)
    install_error_handlers(app, log)
    return app
