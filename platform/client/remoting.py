"""Thin HTTP wrappers over the name server and broker APIs (``docs/http-api.md``).

* :class:`NameServerClient` asks one name server at a time and sticks to the one that
  answered; when it stops answering, the next one is tried, so clients keep working
  while any name server is up.
* :class:`BrokerClient` is one pooled ``httpx.Client`` per broker address with one
  method per endpoint; :class:`AsyncBrokerClient` does the two long polls (pull and
  membership changes) on an ``httpx.AsyncClient`` for the consumers' event loop.

Every error response ``{"code", "message"}`` becomes ``SparkMQError(ErrorCode[code], message)``;
a connection failure or timeout becomes :class:`RemotingError` (a ``SparkMQError`` with
code ``SERVICE_NOT_AVAILABLE``), so callers handle one exception type.
"""
from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ..auth.signing import Credentials, Signer
from ..common.errors import ErrorCode, SparkMQError
from ..common.limits import client_pool_limits
from ..common.protocol import PullResult, PullStatus, ReportSeries, pull_status
from ..common.tls import TlsSettings, http_verify
from ..common.wire import (
    ARROW_STREAM,
    PULL_HEADERS,
    PULL_SCHEMA,
    ReceivedMessage,
    from_ipc,
    received_from_arrow,
    received_from_json,
)
from ..remoting import RemotingError
from .endpoints import remoting_endpoint

__all__ = [
    "RemotingError",
    "PullResult",
    "ArrowPullResult",
    "error_from_response",
    "NameServerClient",
    "BrokerClient",
    "BrokerClientPool",
    "AsyncBrokerClient",
    "base_url",
    "SigningAuth",
    "signing_auth",
]

log = logging.getLogger("sparkmq.client")


def _seg(value: object) -> str:
    """One URL path segment: topics and groups may hold '%' (``%RETRY%g``, ``%DLQ%g``), so quote everything."""
    return quote(str(value), safe="")

#: Pull statuses, re-exported for the client's modules (defined once, in the protocol module).
FOUND = PullStatus.FOUND
NO_NEW_MSG = PullStatus.NO_NEW_MSG
NO_MATCHED_MSG = PullStatus.NO_MATCHED_MSG
OFFSET_TOO_SMALL = PullStatus.OFFSET_TOO_SMALL
OFFSET_OVERFLOW = PullStatus.OFFSET_OVERFLOW
NO_MATCHED_QUEUE = PullStatus.NO_MATCHED_QUEUE
OFFSET_RESET = PullStatus.OFFSET_RESET


#: Requests are small and answered at once: without TCP_NODELAY the body write (httpcore writes
#: headers and body separately) waits for the server's delayed ACK, ~40 ms per request.
_SOCKET_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def _sync_transport(limits: httpx.Limits, tls: TlsSettings | None = None) -> httpx.HTTPTransport:
    return httpx.HTTPTransport(limits=limits, socket_options=_SOCKET_OPTIONS, verify=http_verify(tls))


class SigningAuth(httpx.Auth):
    """Signs every request with the client's credentials (``SPARKMQ-HMAC-SHA256``, docs/security.md): method,
    raw path and query, body and the time, so a broker with ACL on knows who asks and that nothing changed."""

    requires_request_body = True

    def __init__(self, credentials: Credentials) -> None:
        self._signer = Signer(credentials)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Add the ``authorization`` and ``x-sparkmq-date`` headers."""
        target = request.url.raw_path.decode("ascii")
        request.headers.update(self._signer.http_headers(request.method, target, request.content))
        yield request


def signing_auth(credentials: Credentials | None) -> SigningAuth | None:
    """The httpx ``auth`` of a client with ``credentials`` (None: requests go unsigned)."""
    return SigningAuth(credentials) if credentials is not None else None


def base_url(addr: str, tls: TlsSettings | None = None) -> str:
    """``http://host:port`` for a ``host:port`` address (``https`` when ``tls`` connects; an URL is returned
    unchanged)."""
    if addr.startswith(("http://", "https://")):
        return addr
    return f"{tls.scheme if tls is not None else 'http'}://{addr}"


def _transport_error(addr: str, exc: httpx.HTTPError) -> RemotingError:
    timed_out = isinstance(exc, httpx.TimeoutException)
    kind = "timed out" if timed_out else "unreachable"
    return RemotingError(addr, f"{kind} ({type(exc).__name__}: {exc})", timed_out=timed_out)


def _code_for_status(status: int) -> ErrorCode:
    # Only used when the body carries no code we know (a proxy page, a route that does not exist).
    if status == 503:
        return ErrorCode.SERVICE_NOT_AVAILABLE
    return ErrorCode.INTERNAL_ERROR if status >= 500 else ErrorCode.INVALID_ARGUMENT


def error_from_response(resp: httpx.Response) -> SparkMQError:
    """The ``SparkMQError`` an error response stands for.

    A known ``code`` maps back exactly; an unknown one (a newer server) keeps its name in
    the message under the code of its HTTP status, as does a body that is not an error object.

    Example::

        >>> r = httpx.Response(404, json={"code": "TOPIC_NOT_EXIST", "message": "no topic t"})
        >>> str(error_from_response(r))
        'TOPIC_NOT_EXIST: no topic t'
    """
    try:
        body = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        name, message = body["code"], str(body.get("message", ""))
        code = ErrorCode.__members__.get(name)
        if code is not None:
            return SparkMQError(code, message)
        return SparkMQError(_code_for_status(resp.status_code), f"{name}: {message}")
    text = resp.text[:300] if resp.content else resp.reason_phrase
    return SparkMQError(_code_for_status(resp.status_code), f"HTTP {resp.status_code}: {text}")


def _json(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        raise error_from_response(resp)
    try:
        return resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"{resp.url}: the answer is not JSON ({exc})") from None


@dataclass(frozen=True)
class ArrowPullResult:
    """One pull answered in Arrow, kept columnar: ``table`` has ``wire.PULL_SCHEMA``, bodies as stored."""

    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    table: Any  # pyarrow.Table (Any: the client does not need pyarrow's types at import time)


def _pull_params(offset: int, max_messages: int, tags: str, wait_ms: int, group: str | None,
                 client_id: str | None, filter_type: str = "TAG", expression: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"offset": offset, "max": max_messages, "tags": tags or "*", "wait_ms": wait_ms}
    if filter_type and filter_type.upper() != "TAG":
        # SQL92: the expression travels in its own parameter; tags stay "*" for brokers that ignore the type.
        params.update(filter_type=filter_type.upper(), expression=expression or "", tags="*")
    if group:
        params["group"] = group
    if client_id:
        params["client_id"] = client_id
    return params


def _parse_pull(resp: httpx.Response) -> PullResult:
    if resp.status_code >= 400:
        raise error_from_response(resp)
    if resp.headers.get("content-type", "").startswith(ARROW_STREAM):
        h = resp.headers
        messages = received_from_arrow(from_ipc(resp.content)) if resp.content else []
        return PullResult(pull_status(h.get(PULL_HEADERS["status"], FOUND if messages else NO_NEW_MSG)),
                          int(h.get(PULL_HEADERS["next_offset"], 0)), int(h.get(PULL_HEADERS["min_offset"], 0)),
                          int(h.get(PULL_HEADERS["max_offset"], 0)), messages)
    body = _json(resp)
    return PullResult(pull_status(body["status"]), int(body["next_offset"]), int(body.get("min_offset", 0)),
                      int(body.get("max_offset", 0)), [received_from_json(m) for m in body.get("messages") or ()])


# -- name servers ---------------------------------------------------------------------------

class NameServerClient:
    """Asks name servers for routes and the cluster view, failing over between them.

    Requests go to the last name server that answered; a connection failure or a 5xx
    moves on to the next one (in the configured order, wrapping around).  A 4xx answer is
    a real answer (for example TOPIC_NOT_EXIST) and is raised as is.

    Example::

        >>> ns = NameServerClient(["127.0.0.1:9876", "127.0.0.1:9877"], timeout_s=3.0)
        >>> ns.current
        '127.0.0.1:9876'
        >>> ns.close()
    """

    def __init__(self, addrs: Sequence[str], timeout_s: float, *, transport: httpx.BaseTransport | None = None,
                 credentials: Credentials | None = None, tls: TlsSettings | None = None) -> None:
        if not addrs:
            raise ValueError("at least one name server address is needed")
        self.addrs = tuple(addrs)
        self._timeout = timeout_s
        self._tls = tls  # HTTPS when it connects
        self._index = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=timeout_s, auth=signing_auth(credentials),
                                  transport=transport or _sync_transport(client_pool_limits(max_connections=20), tls))

    @property
    def current(self) -> str:
        """The name server requests go to first."""
        return self.addrs[self._index]

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """``method path`` on the current name server, failing over; the decoded JSON answer."""
        with self._lock:
            start = self._index
        last: SparkMQError | None = None
        for step in range(len(self.addrs)):
            index = (start + step) % len(self.addrs)
            addr = self.addrs[index]
            try:
                resp = self._http.request(method, base_url(addr, self._tls) + path, **kwargs)
            except httpx.HTTPError as exc:
                last = _transport_error(addr, exc)
                log.debug("name server %s failed: %s", addr, last)
                continue
            if resp.status_code >= 500:
                last = error_from_response(resp)
                continue
            with self._lock:
                if self._index != index:
                    log.info("name server %s answers; switching to it from %s", addr, self.addrs[self._index])
                self._index = index
            return _json(resp)
        assert last is not None
        raise last

    def each(self, method: str, path: str, **kwargs: Any) -> dict[str, Any | SparkMQError]:
        """``method path`` on every name server: answer or error by address (for admin writes)."""
        out: dict[str, Any | SparkMQError] = {}
        for addr in self.addrs:
            try:
                out[addr] = _json(self._http.request(method, base_url(addr, self._tls) + path, **kwargs))
            except httpx.HTTPError as exc:
                out[addr] = _transport_error(addr, exc)
            except SparkMQError as exc:
                out[addr] = exc
        return out

    def topic_route(self, topic: str) -> dict[str, Any]:
        """``GET /routes/{topic}``: ``{"queue_datas": [...], "broker_datas": [...]}``; TOPIC_NOT_EXIST if none."""
        return self.request("GET", f"/routes/{_seg(topic)}")

    def cluster_info(self) -> dict[str, Any]:
        """``GET /cluster``: clusters, brokers (addresses by id) and live broker addresses."""
        return self.request("GET", "/cluster")

    def topic_list(self) -> list[str]:
        """``GET /topics``: every topic some live broker serves, sorted."""
        return list(self.request("GET", "/topics")["topics"])

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()


# -- brokers ---------------------------------------------------------------------------------

class BrokerClient:
    """The broker API at one address over one pooled ``httpx.Client``; every method raises ``SparkMQError``.

    Example::

        >>> b = BrokerClient("127.0.0.1:10911", timeout_s=3.0)
        >>> b.url
        'http://127.0.0.1:10911'
        >>> b.close()
    """

    def __init__(self, addr: str, timeout_s: float, *, transport: httpx.BaseTransport | None = None,
                 credentials: Credentials | None = None, tls: TlsSettings | None = None) -> None:
        self.addr = addr
        self.url = base_url(addr, tls)  # HTTPS when ``tls`` connects
        self._timeout = timeout_s
        # Sends come from many threads at once; keep enough idle connections for them.
        limits = client_pool_limits(max_connections=200, max_keepalive_connections=64)
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, auth=signing_auth(credentials),
                                  transport=transport or _sync_transport(limits, tls))

    def _call(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, timeout=timeout if timeout is not None else self._timeout,
                                      **kwargs)
        except httpx.HTTPError as exc:
            raise _transport_error(self.addr, exc) from None

    def _get(self, path: str, **kwargs: Any) -> Any:
        return _json(self._call("GET", path, **kwargs))

    def _post(self, path: str, body: Any, **kwargs: Any) -> Any:
        return _json(self._call("POST", path, json=body, **kwargs))

    # sending
    def send(self, topic: str, message: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """``POST /topics/{topic}/messages`` with one message object; the send result object."""
        return self._post(f"/topics/{_seg(topic)}/messages", dict(message), timeout=timeout)

    def send_batch(self, topic: str, params: Mapping[str, Any], *, messages: list[dict[str, Any]] | None = None,
                   arrow: bytes | None = None, timeout: float | None = None) -> dict[str, Any]:
        """``POST /topics/{topic}/batch``: JSON ``messages`` or an Arrow IPC stream of SEND_SCHEMA."""
        query = {k: v for k, v in params.items() if v is not None}
        if arrow is not None:
            resp = self._call("POST", f"/topics/{_seg(topic)}/batch", params=query, content=arrow,
                              headers={"Content-Type": ARROW_STREAM}, timeout=timeout)
            return _json(resp)
        return self._post(f"/topics/{_seg(topic)}/batch", {"messages": messages or []}, params=query, timeout=timeout)

    # pulling
    def pull_arrow_table(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, *,
                         tags: str = "*", timeout: float | None = None,
                         broker_name: str | None = None) -> ArrowPullResult:
        """One pull as an Arrow table (``wire.PULL_SCHEMA``), never long-polling; for bulk readers (Spark).

        Unlike ``pull(arrow=True)`` nothing is turned into Python objects: bodies stay as
        stored (compressed when ``sys_flag`` says so).  Unfiltered pulls take the broker's
        bulk path (up to 16384 messages); given ``broker_name`` (the ``broker_name`` column),
        they ask for the stored records and decode them here, sparing the broker's CPU
        (``record_columns``).  INTERNAL_ERROR when the broker does not answer in Arrow.
        """
        params = _pull_params(offset, max_messages, tags, 0, None, None)
        records = broker_name is not None and (tags or "*").strip() == "*"
        if records:
            params["form"] = "records"
        resp = self._call("GET", f"/topics/{_seg(topic)}/queues/{queue_id}/messages", headers={"Accept": ARROW_STREAM},
                          params=params, timeout=timeout)
        if resp.status_code >= 400:
            raise error_from_response(resp)
        if not resp.headers.get("content-type", "").startswith(ARROW_STREAM):
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"{self.addr} answered a pull with "
                                                         f"{resp.headers.get('content-type')!r}, not Arrow")
        h = resp.headers
        table = from_ipc(resp.content) if resp.content else PULL_SCHEMA.empty_table()
        if records and broker_name is not None and h.get(PULL_HEADERS["form"]) == "records":
            import pyarrow as pa

            from ..common.record_columns import decode_records  # numpy: bulk readers only

            table = pa.Table.from_batches([decode_records(table.column("record"), broker_name)])
        return ArrowPullResult(h[PULL_HEADERS["status"]], int(h[PULL_HEADERS["next_offset"]]),
                               int(h[PULL_HEADERS["min_offset"]]), int(h[PULL_HEADERS["max_offset"]]), table)

    def pull(self, topic: str, queue_id: int, offset: int, max_messages: int = 32, *, tags: str = "*",
             wait_ms: int = 0, group: str | None = None, client_id: str | None = None, arrow: bool = False,
             timeout: float | None = None, filter_type: str = "TAG", expression: str | None = None) -> PullResult:
        """``GET /topics/{topic}/queues/{queue_id}/messages``; ``timeout`` must exceed ``wait_ms``.

        ``filter_type="SQL92"`` with ``expression`` filters by message properties on the broker.
        """
        headers = {"Accept": ARROW_STREAM} if arrow else None
        resp = self._call("GET", f"/topics/{_seg(topic)}/queues/{queue_id}/messages", headers=headers,
                          params=_pull_params(offset, max_messages, tags, wait_ms, group, client_id,
                                              filter_type, expression),
                          timeout=timeout if timeout is not None else self._timeout + wait_ms / 1000)
        return _parse_pull(resp)

    def queue_offsets(self, topic: str, queue_id: int, timestamp: int | None = None) -> dict[str, int]:
        """``GET .../offsets``: ``min_offset``, ``max_offset`` and, for a timestamp, ``offset``."""
        params = {"timestamp": timestamp} if timestamp is not None else None
        return self._get(f"/topics/{_seg(topic)}/queues/{queue_id}/offsets", params=params)

    # clients and groups
    def heartbeat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /clients/heartbeat``: ``{"groups": {group: {"version": n}}}``."""
        return self._post("/clients/heartbeat", dict(body))

    def unregister(self, client_id: str, producer_groups: Sequence[str] = (),
                   consumer_groups: Sequence[str] = ()) -> dict[str, Any]:
        """``POST /clients/unregister``."""
        return self._post("/clients/unregister", {"client_id": client_id, "producer_groups": list(producer_groups),
                                                  "consumer_groups": list(consumer_groups)})

    def consumer_groups(self) -> list[str]:
        """``GET /consumers``: the groups with members on this broker."""
        return list(self._get("/consumers")["groups"])

    def consumer_group(self, group: str) -> dict[str, Any]:
        """``GET /consumers/{group}``: version, sorted member ids, model and subscriptions."""
        return self._get(f"/consumers/{_seg(group)}")

    def consumer_ids(self, group: str) -> list[str]:
        """The group's member ids, sorted (``GET /consumers/{group}``'s ``members``)."""
        return sorted(self.consumer_group(group).get("members") or [])

    def group_changes(self, group: str, version: int, wait_ms: int, timeout: float | None = None) -> dict[str, Any]:
        """``GET /consumers/{group}/changes``: long-polls until the membership version differs from ``version``."""
        return self._get(f"/consumers/{_seg(group)}/changes", params={"version": version, "wait_ms": wait_ms},
                         timeout=timeout if timeout is not None else self._timeout + wait_ms / 1000)

    # offsets
    def commit_offsets(self, group: str, offsets: Sequence[Mapping[str, Any]]) -> int:
        """``POST /consumers/{group}/offsets``; how many were committed."""
        answer = self._post(f"/consumers/{_seg(group)}/offsets", {"offsets": [dict(o) for o in offsets]})
        return int(answer["committed"])

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """``GET /consumers/{group}/offsets/{topic}/{queue_id}``; -1 when never committed."""
        return int(self._get(f"/consumers/{_seg(group)}/offsets/{_seg(topic)}/{queue_id}")["offset"])

    def group_offsets(self, group: str, topic: str | None = None) -> dict[str, dict[str, int]]:
        """``GET /consumers/{group}/offsets``: ``{topic: {queue_id (str): offset}}``."""
        params = {"topic": topic} if topic else None
        return dict(self._get(f"/consumers/{_seg(group)}/offsets", params=params).get("offsets") or {})

    def group_lag(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """``GET /consumers/{group}/lag``: ``total_lag`` and per-queue broker / consumer offsets."""
        params = {"topic": topic} if topic else None
        return self._get(f"/consumers/{_seg(group)}/lag", params=params)

    # topics
    def topics(self) -> list[dict[str, Any]]:
        """``GET /topics``: this broker's topic configs."""
        return list(self._get("/topics")["topics"])

    def topic(self, topic: str) -> dict[str, Any]:
        """``GET /topics/{topic}``: one config."""
        return self._get(f"/topics/{_seg(topic)}")

    def create_topic(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /topics``: create or update; the config as stored."""
        return self._post("/topics", dict(config))

    def delete_topic(self, topic: str) -> dict[str, Any]:
        """``DELETE /topics/{topic}``: ``{"topic", "deleted"}``."""
        return _json(self._call("DELETE", f"/topics/{_seg(topic)}"))

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """``GET /topics/{topic}/stats``: min/max offset and last store time per queue."""
        return self._get(f"/topics/{_seg(topic)}/stats")

    # message features (issue 4)
    def send_half(self, topic: str, message: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """``POST /topics/{topic}/half``: store a transaction's half message (invisible); ``transaction_id`` etc."""
        return self._post(f"/topics/{_seg(topic)}/half", dict(message), timeout=timeout)

    def end_transaction(self, transaction_id: str, producer_group: str, action: str, *,
                        from_check: bool = False, offset_msg_id: str | None = None,
                        queue_offset: int | None = None) -> dict[str, Any]:
        """``POST /transactions/{id}``: COMMIT, ROLLBACK or UNKNOWN; TRANSACTION_NOT_FOUND when unknown or settled."""
        return self._post(f"/transactions/{_seg(transaction_id)}", {"producer_group": producer_group, "action": action,
                                                              "from_check": from_check})

    def transaction_checks(self, producer_group: str, client_id: str, wait_ms: int,
                           timeout: float | None = None) -> list[dict[str, Any]]:
        """``GET /transactions/checks``: long-polls for the check-backs due for ``producer_group``."""
        answer = self._get("/transactions/checks", params={"producer_group": producer_group, "client_id": client_id,
                                                           "wait_ms": wait_ms},
                           timeout=timeout if timeout is not None else self._timeout + wait_ms / 1000)
        return list(answer.get("checks") or [])

    def send_back(self, group: str, offset_msg_id: str, *, delay_level: int = 0, reason: str = "",
                  max_reconsume_times: int = 16, msg_id: str | None = None,
                  origin_topic: str | None = None) -> dict[str, Any]:
        """``POST /consumers/{group}/send-back``: a failed message to ``%RETRY%<group>`` (or the DLQ);
        ``msg_id`` and ``origin_topic`` are the remoting client's (unused here)."""
        return self._post(f"/consumers/{_seg(group)}/send-back", {
            "offset_msg_id": offset_msg_id, "delay_level": delay_level, "reason": reason,
            "max_reconsume_times": max_reconsume_times})

    def dlq_messages(self, group: str, offset: int = 0, max_messages: int = 32) -> dict[str, Any]:
        """``GET /dlq/{group}``: ``messages`` (as in a pull, bodies inflated) and ``next_offset``."""
        answer = self._get(f"/dlq/{_seg(group)}", params={"offset": offset, "max": max_messages})
        answer["messages"] = [received_from_json(m) for m in answer.get("messages") or ()]
        return answer

    def redrive(self, group: str, *, msg_ids: Sequence[str] | None = None, all_messages: bool = False,
                topic: str | None = None, tags: str | None = None) -> dict[str, Any]:
        """``POST /dlq/{group}/redrive``: send DLQ messages back to their original topics."""
        body: dict[str, Any] = {"msg_ids": list(msg_ids)} if msg_ids else {"all": all_messages, "topic": topic,
                                                                          "tags": tags}
        return self._post(f"/dlq/{_seg(group)}/redrive", body)

    def reset_offsets(self, group: str, topic: str, *, timestamp: int | None = None,
                      offsets: Mapping[int, int] | None = None) -> dict[str, Any]:
        """``POST /consumers/{group}/offsets/reset``: by ``timestamp`` (ms) or to ``offsets`` (queue id -> offset)."""
        body: dict[str, Any] = {"topic": topic}
        if timestamp is not None:
            body["timestamp"] = timestamp
        if offsets is not None:
            body["offsets"] = {str(q): int(o) for q, o in offsets.items()}
        return self._post(f"/consumers/{_seg(group)}/offsets/reset", body)

    def recall_timer(self, msg_id: str) -> dict[str, Any]:
        """``DELETE /timers/{msg_id}``: ``{"msg_id", "recalled"}``."""
        return _json(self._call("DELETE", f"/timers/{_seg(msg_id)}"))

    def lock_queues(self, group: str, client_id: str, queues: Sequence[tuple[str, int]],
                    broker_name: str = "") -> set[tuple[str, int]]:
        """``POST /locks/lock``: the ``(topic, queue_id)`` pairs this client holds now (locked or renewed);
        ``broker_name`` is the remoting client's (unused here)."""
        answer = self._post("/locks/lock", {"group": group, "client_id": client_id,
                                            "queues": [{"topic": t, "queue_id": q} for t, q in queues]})
        return {(str(x["topic"]), int(x["queue_id"])) for x in answer.get("locked") or ()}

    def unlock_queues(self, group: str, client_id: str, queues: Sequence[tuple[str, int]],
                      broker_name: str = "") -> dict[str, Any]:
        """``POST /locks/unlock``."""
        return self._post("/locks/unlock", {"group": group, "client_id": client_id,
                                            "queues": [{"topic": t, "queue_id": q} for t, q in queues]})

    # messages, broker
    def message(self, offset_msg_id: str) -> ReceivedMessage:
        """``GET /messages/{offset_msg_id}``: one stored message, body inflated."""
        return received_from_json(self._get(f"/messages/{_seg(offset_msg_id)}"))

    def broker_info(self) -> dict[str, Any]:
        """``GET /broker``: name, id, role, commit log bounds."""
        return self._get("/broker")

    def query_messages(self, params: Mapping[str, Any]) -> list[ReceivedMessage]:
        """``GET /query/messages``: messages found through this broker's lake index."""
        return [received_from_json(m) for m in self._get("/query/messages", params=dict(params))["messages"]]

    def post_trace(self, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``POST /trace``: client trace events (``send``, ``consume``) for the broker's trace topic."""
        return self._post("/trace", {"events": list(events)})

    def trace(self, msg_id: str) -> dict[str, Any]:
        """``GET /trace/{msg_id}``: the message's path from this broker's ``message_trace`` table."""
        return self._get(f"/trace/{_seg(msg_id)}")

    def replication(self) -> dict[str, Any]:
        """``GET /broker/ha``: the broker's replication state (a master's slaves, a slave's master)."""
        return self._get("/broker/ha")

    def dledger_status(self) -> dict[str, Any]:
        """``GET /broker/dledger``: the broker's DLedger member (role, term, leader, commit offset, ...)."""
        return self._get("/broker/dledger")

    def dledger_transfer(self, to_id: str, timeout: float | None = None) -> dict[str, Any]:
        """``POST /broker/dledger/transfer``: hand the leadership to member ``to_id``; answers once it leads."""
        return self._post("/broker/dledger/transfer", {"to": to_id}, timeout=timeout)

    def health(self, timeout: float | None = None) -> dict[str, Any]:
        """``GET /health``."""
        return self._get("/health", timeout=timeout)

    def ping(self, timeout: float | None = None) -> None:
        """Whether the broker answers at all (``GET /health``; RemotingError when it does not)."""
        self.health(timeout)

    # the lake's reports and alerts, re-send (the console's admin calls)
    def alerts(self, state: str = "open", limit: int = 500) -> list[dict[str, Any]]:
        """``GET /alerts``: rows of the lake's ``alerts`` table (``state`` "open" or "all")."""
        return list(self._get("/alerts", params={"state": state, "limit": limit}).get("alerts") or [])

    def alert_rules(self) -> dict[str, Any]:
        """``GET /alerts/rules``: ``{"rules": [...], "error"}``, the rules this broker's lake evaluates."""
        return self._get("/alerts/rules")

    def report(self, kind: str, name: str, range_name: str) -> ReportSeries:
        """``GET /reports/{kind}s/{name}``: this broker's report rows of a topic or group, bucketed."""
        return ReportSeries.from_dict(self._get(f"/reports/{_seg(kind)}s/{_seg(name)}",
                                                params={"range": range_name}))

    def resend(self, group: str, msg_id: str) -> dict[str, Any]:
        """``POST /consumers/{group}/resend``: a copy of the message into ``%RETRY%<group>``."""
        return self._post(f"/consumers/{_seg(group)}/resend", {"msg_id": msg_id})

    def whoami(self) -> dict[str, Any]:
        """``GET /acl/whoami``: who this broker takes the caller for."""
        return self._get("/acl/whoami")

    # access control (docs/security.md); super users only while ACL is on
    def acl_users(self) -> list[dict[str, Any]]:
        """``GET /acl/users``: access keys and super-user flags (never secrets)."""
        return list(self._get("/acl/users")["users"])

    def acl_create_user(self, access_key: str, secret_key: str, *, super_user: bool = False,
                        update: bool = False) -> dict[str, Any]:
        """``POST /acl/users``: create a user (or, with ``update``, change its secret and flag)."""
        return self._post("/acl/users", {"access_key": access_key, "secret_key": secret_key,
                                         "super_user": super_user, "update": update})

    def acl_delete_user(self, access_key: str) -> dict[str, Any]:
        """``DELETE /acl/users/{access_key}``: ``{"access_key", "deleted"}``."""
        return _json(self._call("DELETE", f"/acl/users/{_seg(access_key)}"))

    def acl_policies(self, subject: str | None = None) -> list[dict[str, Any]]:
        """``GET /acl/policies``: every policy, or one subject's."""
        return list(self._get("/acl/policies", params={"subject": subject} if subject else None)["policies"])

    def acl_put_policy(self, subject: str, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``POST /acl/policies``: add entries (``resource``, ``actions``, ``decision``, ``source_ips``)."""
        return self._post("/acl/policies", {"subject": subject, "entries": [dict(e) for e in entries]})

    def acl_delete_policy(self, subject: str, resource: str | None = None) -> dict[str, Any]:
        """``DELETE /acl/policies/{subject}``: one resource's entry, or all; ``{"subject", "removed"}``."""
        params = {"resource": resource} if resource else None
        return _json(self._call("DELETE", f"/acl/policies/{_seg(subject)}", params=params))

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()


class BrokerClientPool:
    """One :class:`BrokerClient` per address, made on first use; thread-safe.

    Example::

        >>> pool = BrokerClientPool(timeout_s=3.0)
        >>> pool.get("127.0.0.1:10911") is pool.get("127.0.0.1:10911")
        True
        >>> pool.close()
    """

    def __init__(self, timeout_s: float, *, transport: httpx.BaseTransport | None = None,
                 remoting: bool = False, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None) -> None:
        """``remoting``: reach a broker over its remoting endpoint when a route named one (HTTP otherwise);
        ``transport`` (an httpx transport, tests pass ``httpx.MockTransport``) forces HTTP; ``credentials``
        sign every request (brokers with ACL on)."""
        self._timeout = timeout_s
        self._credentials = credentials
        self._tls = tls  # both transports over TLS when it connects
        self._transport = transport
        self._remoting = remoting and transport is None
        self._clients: dict[str, Any] = {}
        self._http_clients: dict[str, BrokerClient] = {}
        self._lock = threading.Lock()
        self._sync: Any = None

    def get(self, addr: str) -> Any:
        """The messaging client for ``addr``: a :class:`~.broker_remoting.RemotingBrokerClient` when the pool speaks
        remoting and a route named the broker's endpoint, else the HTTP :class:`BrokerClient`.  Both answer the calls
        producers and consumers make (sends, pulls, heartbeats, offsets, locks, send-back, transactions, trace); admin
        calls are made on :meth:`http`."""
        endpoint = remoting_endpoint(addr) if self._remoting else None
        with self._lock:
            client = self._clients.get(addr)
            if client is not None and (endpoint is None or getattr(client, "remoting_addr", None) == endpoint):
                return client
            if endpoint is not None:
                from .broker_remoting import RemotingBrokerClient, sync_transport  # noqa: PLC0415  # import cycle

                if self._sync is None:
                    self._sync = sync_transport(self._timeout, self._tls)
                client = RemotingBrokerClient(addr, endpoint, self._timeout, self._sync,
                                              credentials=self._credentials)
            else:
                client = self._http_locked(addr)
            self._clients[addr] = client
            return client

    def http(self, addr: str) -> BrokerClient:
        """The HTTP client for ``addr`` (admin calls, and anything remoting has no request for)."""
        with self._lock:
            return self._http_locked(addr)

    def _http_locked(self, addr: str) -> BrokerClient:
        client = self._http_clients.get(addr)
        if client is None:
            client = self._http_clients[addr] = BrokerClient(addr, self._timeout, transport=self._transport,
                                                             credentials=self._credentials, tls=self._tls)
        return client

    def close(self) -> None:
        """Close every client."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            clients += [c for c in self._http_clients.values() if c not in clients]
            self._http_clients = {}
            sync, self._sync = self._sync, None
        for client in clients:
            client.close()
        if sync is not None:
            sync.close()


class AsyncBrokerClient:
    """The two long polls (pull, membership changes) on one shared ``httpx.AsyncClient``.

    One instance serves every broker (requests carry full URLs), so a consumer holding a
    long poll per queue needs one connection per poll and nothing else.
    """

    def __init__(self, *, transport: httpx.AsyncBaseTransport | None = None,
                 credentials: Credentials | None = None, tls: TlsSettings | None = None) -> None:
        # No connection cap: every assigned queue holds a long poll open at all times.
        limits = client_pool_limits(max_connections=None, max_keepalive_connections=256)
        self._tls = tls  # HTTPS when it connects
        self._http = httpx.AsyncClient(auth=signing_auth(credentials),
            transport=transport or httpx.AsyncHTTPTransport(limits=limits, socket_options=_SOCKET_OPTIONS,
                                                            verify=http_verify(tls)))

    async def pull(self, addr: str, topic: str, queue_id: int, offset: int, max_messages: int, *, tags: str,
                   wait_ms: int, timeout: float, group: str | None = None, client_id: str | None = None,
                   arrow: bool = False, filter_type: str = "TAG", expression: str | None = None) -> PullResult:
        """Async twin of :meth:`BrokerClient.pull`."""
        headers = {"Accept": ARROW_STREAM} if arrow else None
        try:
            resp = await self._http.get(f"{base_url(addr, self._tls)}/topics/{_seg(topic)}/queues/{queue_id}/messages",
                                        params=_pull_params(offset, max_messages, tags, wait_ms, group, client_id,
                                                            filter_type, expression),
                                        headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise _transport_error(addr, exc) from None
        return _parse_pull(resp)

    async def group_changes(self, addr: str, group: str, version: int, wait_ms: int,
                            timeout: float) -> dict[str, Any]:
        """Async twin of :meth:`BrokerClient.group_changes`."""
        try:
            resp = await self._http.get(f"{base_url(addr, self._tls)}/consumers/{_seg(group)}/changes",
                                        params={"version": version, "wait_ms": wait_ms}, timeout=timeout)
        except httpx.HTTPError as exc:
            raise _transport_error(addr, exc) from None
        return _json(resp)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()
