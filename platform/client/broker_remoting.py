"""The client's side of the remoting protocol (``docs/remoting.md``): one broker over its binary endpoint.

:class:`RemotingBrokerClient` answers the calls producers and consumers make (sends, pulls, heartbeats,
offsets, locks, send-back, transactions, trace) over remoting, with the same method names and results
as the HTTP :class:`~.remoting.BrokerClient`; every other call (admin: topics, DLQ, resets, queries) is
the HTTP client's.  The hot paths are typed and native: a batch is packed by ``encode_batch`` (C), a
pull's records are decoded by ``decode_records`` (C) into :class:`~..common.wire.ReceivedMessage`.

Pushes from the broker on the connection: rebalance notices wake :meth:`AsyncRemotingBrokers.group_changes`;
transaction check-backs queue for :meth:`RemotingBrokerClient.transaction_checks`.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from ...storage_native import decode_records
from ..auth.signing import Credentials, Signer
from ..common import protocol as p
from ..common.errors import ErrorCode, SparkMQError
from ..common.message import SendResult, send_status
from ..common.protocol import PullResult, RequestCode, pull_status
from ..common.tls import TlsSettings
from ..common.wire import ReceivedMessage, decode_body, encode_body, inflate
from ..remoting import AsyncRemotingClient, Frame, Response, SyncRemotingClient
from .remoting import BrokerClient

__all__ = ["decode_answer", "RemotingBrokerClient", "AsyncRemotingBrokers", "AsyncBrokerRouter", "decode_pulled",
           "offset_msg_ids", "header_encoder",
           "on_offset_reset", "forget_offset_reset"]

H = TypeVar("H", bound=p.Header)

_encode = msgspec.msgpack.Encoder().encode
_decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}


def decode_answer(data: bytes | memoryview, kind: type[H]) -> H:
    """A broker's header as ``kind``; INTERNAL_ERROR when it is not one (a broker speaking another version)."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        return decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"the broker's {kind.__name__} is malformed: {exc}") from None


def header_encoder(credentials: Credentials | None) -> Callable[[int, p.Header, bytes | memoryview], bytes]:
    """``encode(code, header, body)`` -> the frame's header bytes: msgpack, signed with ``credentials`` when given
    (the credential block in front, docs/security.md)."""
    if credentials is None:
        return lambda code, header, body: _encode(header)
    signer = Signer(credentials)
    return lambda code, header, body: signer.remoting_header(code, _encode(header), body)


def _inflate_compressed(body: bytes) -> bytes:
    return inflate(body, 1)


def decode_pulled(response: Response, broker_name: str) -> PullResult:
    """A PULL_MESSAGE answer as a :class:`PullResult` of received messages (records decoded natively)."""
    header = decode_answer(response.header, p.PullResponse)
    messages = (decode_records(response.body, broker_name, ReceivedMessage, _inflate_compressed)
                if header.count else [])
    return PullResult(pull_status(header.status), header.next_offset, header.min_offset, header.max_offset, messages)


def decode_batch_answer(response: Response) -> tuple[p.SendBatchResponse, bytes]:
    """A SEND_BATCH answer: the header and each message's commit-log offset packed."""
    return decode_answer(response.header, p.SendBatchResponse), bytes(response.body)


def offset_msg_ids(store_host: str, offsets: bytes) -> list[str]:
    """The offsetMsgId of each packed commit-log offset (int64 little-endian) on ``store_host``."""
    from ..common.ids import offset_msg_id_prefix  # noqa: PLC0415  # a rarely used helper's import

    prefix = offset_msg_id_prefix(store_host)
    return [f"{prefix}{o:016X}" for o in memoryview(offsets).cast("q")]


def _send_result(r: p.SendResponse) -> SendResult:
    return SendResult(send_status(r.status), r.msg_id, r.offset_msg_id, r.topic, r.broker_name, r.queue_id,
                      r.queue_offset, r.store_timestamp)


class _PushInbox:
    """What brokers pushed to this process, whichever connection it came on (a client's last heartbeat binds
    one): check-backs per producer group, and rebalance notices for the consumers' watches."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._checks: dict[str, collections.deque[p.TransactionCheckNotice]] = {}
        #: (remoting addr, group) -> the events of the watches waiting on it, with their loops.
        self._watches: dict[tuple[str, str], list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        #: group -> the consumers of this process told about pushed offset resets.
        self._reset_handlers: dict[str, list[Callable[[p.OffsetResetNotice], None]]] = {}

    def on_offset_reset(self, group: str, handler: Callable[[p.OffsetResetNotice], None]) -> None:
        with self._lock:
            self._reset_handlers.setdefault(group, []).append(handler)

    def forget_offset_reset(self, group: str, handler: Callable[[p.OffsetResetNotice], None]) -> None:
        with self._lock:
            handlers = self._reset_handlers.get(group, [])
            if handler in handlers:
                handlers.remove(handler)

    def offset_reset(self, notice: p.OffsetResetNotice) -> None:
        with self._lock:
            handlers = list(self._reset_handlers.get(notice.group, ()))
        for handler in handlers:
            handler(notice)

    def watch(self, key: tuple[str, str], event: asyncio.Event) -> None:
        with self._lock:
            self._watches.setdefault(key, []).append((asyncio.get_running_loop(), event))

    def unwatch(self, key: tuple[str, str], event: asyncio.Event) -> None:
        with self._lock:
            waiting = self._watches.get(key, [])
            waiting[:] = [(loop, e) for loop, e in waiting if e is not event]
            if not waiting:
                self._watches.pop(key, None)

    def group_changed(self, addr: str, group: str) -> None:
        with self._lock:
            waiting = list(self._watches.get((addr, group), ()))
        for loop, event in waiting:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    def add_check(self, notice: p.TransactionCheckNotice) -> None:
        with self._lock:
            self._checks.setdefault(notice.producer_group, collections.deque(maxlen=10_000)).append(notice)
            self._lock.notify_all()

    def take_checks(self, group: str, wait_s: float, max_count: int = 32) -> list[p.TransactionCheckNotice]:
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                queue = self._checks.get(group)
                if queue:
                    return [queue.popleft() for _ in range(min(max_count, len(queue)))]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._lock.wait(left)


#: One inbox per process: check-backs arrive on whichever connection the producer's heartbeat bound.
_INBOX = _PushInbox()


def _on_push(addr: str, frame: Frame) -> None:
    """Where every pushed notice lands, from any connection (the pools' callback)."""
    if frame.code == RequestCode.CHECK_TRANSACTION_STATE:
        _INBOX.add_check(decode_answer(frame.header, p.TransactionCheckNotice))
    elif frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
        notice = decode_answer(frame.header, p.GroupChangedNotice)
        _INBOX.group_changed(addr, notice.group)
    elif frame.code == RequestCode.NOTIFY_OFFSET_RESET:
        _INBOX.offset_reset(decode_answer(frame.header, p.OffsetResetNotice))


def on_offset_reset(group: str, handler: Callable[[p.OffsetResetNotice], None]) -> None:
    """Call ``handler(notice)`` (on a connection's loop thread) when a broker pushes an offset reset of ``group``."""
    _INBOX.on_offset_reset(group, handler)


def forget_offset_reset(group: str, handler: Callable[[p.OffsetResetNotice], None]) -> None:
    """Stop calling ``handler`` (a consumer shutting down)."""
    _INBOX.forget_offset_reset(group, handler)


class RemotingBrokerClient:
    """One broker over remoting (``remoting_addr``), known to callers by its HTTP address ``addr``.

    Methods not listed here go to an HTTP :class:`BrokerClient` of ``addr`` (admin calls).
    """

    def __init__(self, addr: str, remoting_addr: str, timeout_s: float, transport: SyncRemotingClient, *,
                 credentials: Credentials | None = None) -> None:
        """``credentials`` sign every request (brokers with ACL on), the HTTP fallback's too."""
        self.addr = addr
        self.remoting_addr = remoting_addr
        self._timeout = timeout_s
        self._remoting = transport
        self._credentials = credentials
        self._header = header_encoder(credentials)
        self._http: BrokerClient | None = None
        self._http_lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Admin calls stay on HTTP (the same processors answer them there).
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._http_client(), name)

    def _http_client(self) -> BrokerClient:
        with self._http_lock:
            if self._http is None:
                self._http = BrokerClient(self.addr, self._timeout, credentials=self._credentials)
            return self._http

    def request(self, code: RequestCode, header: p.Header, body: bytes | memoryview = b"",
                timeout: float | None = None) -> Response:
        """One request on the broker's connection (RemotingError on a transport failure)."""
        return self._remoting.request(self.remoting_addr, code, self._header(code, header, body), body,
                                      timeout if timeout is not None else self._timeout)

    # -- typed hot paths --------------------------------------------------------------------
    def send_message(self, req: p.SendRequest, body: bytes, timeout: float | None = None) -> SendResult:
        """SEND_MESSAGE: one message, written and answered on the calling thread (a synchronous send
        waits for its answer anyway: the shared connection's loop thread would only add two hand-offs)."""
        answer = self._remoting.request_direct(self.remoting_addr, RequestCode.SEND_MESSAGE,
                                               self._header(RequestCode.SEND_MESSAGE, req, body), body,
                                               timeout if timeout is not None else self._timeout)
        return _send_result(decode_answer(answer.header, p.SendResponse))

    def send_packed(self, req: p.SendBatchRequest, data: bytes,
                    timeout: float | None = None) -> tuple[p.SendBatchResponse, bytes]:
        """SEND_BATCH: a packed batch; (the answer, each message's commit-log offset packed)."""
        return decode_batch_answer(self.request(RequestCode.SEND_BATCH, req, data, timeout))

    def send_packed_future(self, req: p.SendBatchRequest, data: bytes,
                           timeout: float | None = None) -> concurrent.futures.Future[Response]:
        """SEND_BATCH without blocking: a future of the raw answer (decode with :func:`decode_batch_answer`)."""
        return self._remoting.request_future(self.remoting_addr, RequestCode.SEND_BATCH,
                                             self._header(RequestCode.SEND_BATCH, req, data), data,
                                             timeout if timeout is not None else self._timeout)

    def pull_request(self, req: p.PullRequest, broker_name: str, timeout: float | None = None) -> PullResult:
        """PULL_MESSAGE: ``timeout`` must exceed the request's ``wait_ms``."""
        wait = timeout if timeout is not None else self._timeout + req.wait_ms / 1000
        return decode_pulled(self.request(RequestCode.PULL_MESSAGE, req, b"", wait), broker_name)

    # -- the HTTP client's calls, answered over remoting ------------------------------------
    def send(self, topic: str, message: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """One message given as the HTTP JSON object (``body`` base64 or utf8); the send result object."""
        req, body = _send_request(topic, message)
        return self.send_message(req, body, timeout).to_dict()

    def send_half(self, topic: str, message: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """A transaction's half message; its answer carries ``transaction_id``."""
        req, body = _send_request(topic, message)
        r = decode_answer(self.request(RequestCode.SEND_HALF, req, body, timeout).header, p.SendResponse)
        return {"status": r.status, "transaction_id": r.transaction_id, "msg_id": r.msg_id,
                "offset_msg_id": r.offset_msg_id, "topic": r.topic, "broker_name": r.broker_name,
                "queue_id": r.queue_id, "queue_offset": r.queue_offset, "store_timestamp": r.store_timestamp}

    def end_transaction(self, transaction_id: str, producer_group: str, action: str, *,
                        from_check: bool = False) -> dict[str, Any]:
        """COMMIT, ROLLBACK or UNKNOWN an open transaction."""
        r = decode_answer(self.request(RequestCode.END_TRANSACTION,
                                 p.EndTransactionRequest(transaction_id, producer_group, action, from_check)).header,
                    p.EndTransactionResponse)
        sent = None if r.send_result is None else _send_result(r.send_result).to_dict()
        return {"transaction_id": r.transaction_id, "action": r.action, "send_result": sent}

    def transaction_checks(self, producer_group: str, client_id: str, wait_ms: int,
                           timeout: float | None = None) -> list[dict[str, Any]]:
        """Check-backs the broker pushed for ``producer_group`` (waits up to ``wait_ms`` for one)."""
        return [{"transaction_id": c.transaction_id, "topic": c.topic, "msg_id": c.msg_id,
                 "offset_msg_id": c.offset_msg_id, "check_times": c.check_times, "body": encode_body(c.body),
                 "properties": dict(c.properties)}
                for c in _INBOX.take_checks(producer_group, wait_ms / 1000)]

    def heartbeat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """HEARTBEAT (binds this client to the connection for pushed notices): ``{"groups": {g: {"version"}}}``."""
        req = msgspec.convert(dict(body), p.HeartbeatRequest)
        r = decode_answer(self.request(RequestCode.HEARTBEAT, req).header, p.HeartbeatResponse)
        return {"groups": {g: {"version": v} for g, v in r.versions.items()}}

    def unregister(self, client_id: str, producer_groups: Sequence[str] = (),
                   consumer_groups: Sequence[str] = ()) -> dict[str, Any]:
        """UNREGISTER_CLIENT."""
        r = decode_answer(self.request(RequestCode.UNREGISTER_CLIENT,
                                 p.UnregisterRequest(client_id, list(producer_groups), list(consumer_groups))).header,
                    p.HeartbeatResponse)
        return {"groups": {g: {"version": v} for g, v in r.versions.items()}}

    def queue_offsets(self, topic: str, queue_id: int, timestamp: int | None = None) -> dict[str, int]:
        """A queue's ``min_offset``, ``max_offset`` and, for a timestamp, ``offset``."""
        req = p.QueueOffsetsRequest(topic, queue_id, timestamp)
        r = decode_answer(self.request(RequestCode.QUEUE_OFFSETS, req).header,
                    p.QueueOffsetsResponse)
        out = {"min_offset": r.min_offset, "max_offset": r.max_offset}
        if r.offset is not None:
            out["offset"] = r.offset
        return out

    def consumer_group(self, group: str) -> dict[str, Any]:
        """A group's version, sorted member ids, settings, subscriptions and members (``GET /consumers/{group}``)."""
        r = decode_answer(self.request(RequestCode.GROUP_INFO, p.GroupInfoRequest(group)).header, p.GroupInfoResponse)
        return {"group": r.group, "version": r.version, "members": list(r.members), "message_model": r.message_model,
                "consume_type": r.consume_type, "consume_from_where": r.consume_from_where,
                "subscriptions": [msgspec.structs.asdict(s) for s in r.subscriptions],
                "clients": [msgspec.structs.asdict(c) for c in r.clients]}

    def commit_offsets(self, group: str, offsets: Sequence[Mapping[str, Any]]) -> int:
        """How many of the ``{"topic", "queue_id", "offset"}`` entries were committed."""
        entries = [p.CommitOffsetEntry(str(o["topic"]), int(o["queue_id"]), int(o["offset"])) for o in offsets]
        return decode_answer(self.request(RequestCode.COMMIT_OFFSETS, p.CommitOffsetsRequest(group, entries)).header,
                       p.CommitOffsetsResponse).committed

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset; -1 when never committed."""
        req = p.QueryOffsetRequest(group, topic, queue_id)
        return decode_answer(self.request(RequestCode.QUERY_OFFSET, req).header,
                       p.QueryOffsetResponse).offset

    def lock_queues(self, group: str, client_id: str, queues: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        """The ``(topic, queue_id)`` pairs this client holds now."""
        req = p.LockRequest(group, client_id, [p.QueueRefData(t, q) for t, q in queues])
        r = decode_answer(self.request(RequestCode.LOCK_QUEUES, req).header, p.LockResponse)
        return {(q.topic, q.queue_id) for q in r.queues}

    def unlock_queues(self, group: str, client_id: str, queues: Sequence[tuple[str, int]]) -> dict[str, Any]:
        """Release queues this client holds."""
        req = p.LockRequest(group, client_id, [p.QueueRefData(t, q) for t, q in queues])
        r = decode_answer(self.request(RequestCode.UNLOCK_QUEUES, req).header, p.LockResponse)
        return {"unlocked": [{"topic": q.topic, "queue_id": q.queue_id} for q in r.queues]}

    def send_back(self, group: str, offset_msg_id: str, *, delay_level: int = 0, reason: str = "",
                  max_reconsume_times: int = 16) -> dict[str, Any]:
        """A failed message to ``%RETRY%<group>`` (or the DLQ)."""
        r = decode_answer(self.request(RequestCode.SEND_BACK, p.SendBackRequest(
            group, offset_msg_id, delay_level, reason, max_reconsume_times)).header, p.SendBackResponse)
        return {"status": r.status, "topic": r.topic, "delay_level": r.delay_level,
                "reconsume_times": r.reconsume_times, "msg_id": r.msg_id, "offset_msg_id": r.offset_msg_id}

    def post_trace(self, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Client trace events for the broker's trace topic."""
        r = decode_answer(self.request(RequestCode.POST_TRACE, p.PostTraceRequest([dict(e) for e in events])).header,
                    p.PostTraceResponse)
        return {"accepted": r.accepted, "dropped": r.dropped, "enabled": r.enabled}

    def close(self) -> None:
        """Close the HTTP fallback (the remoting connection belongs to the pool's transport)."""
        if self._http is not None:
            self._http.close()


def _send_request(topic: str, message: Mapping[str, Any]) -> tuple[p.SendRequest, bytes]:
    """The typed request and body of an HTTP-shaped message object."""
    body = decode_body(message["body"], message.get("body_encoding", "base64"))
    fields = {k: v for k, v in message.items()
              if k not in ("body", "body_encoding", "born_host") and v is not None}
    return msgspec.convert({"topic": topic, **fields}, p.SendRequest), body


class AsyncRemotingBrokers:
    """The consumers' asyncio side: long-polling pulls and membership watches over remoting, per broker.

    Lives on the consumer's event loop.  Rebalance notices pushed by a broker wake the matching
    :meth:`group_changes` wait at once (no long poll per group).
    """

    def __init__(self, timeout_s: float, *, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None) -> None:
        self._timeout = timeout_s
        self._client = AsyncRemotingClient(
            on_push=_on_push, ssl_context=tls.client_context_if_connecting() if tls is not None else None)
        self._header = header_encoder(credentials)

    async def request(self, remoting_addr: str, code: RequestCode, header: p.Header, body: bytes = b"",
                      timeout: float | None = None) -> Response:
        """One request on the broker's connection."""
        return await self._client.request(remoting_addr, code, self._header(code, header, body), body,
                                          timeout if timeout is not None else self._timeout)

    async def pull(self, remoting_addr: str, req: p.PullRequest, broker_name: str, timeout: float) -> PullResult:
        """PULL_MESSAGE with long polling (``timeout`` exceeds ``req.wait_ms``)."""
        return decode_pulled(await self.request(remoting_addr, RequestCode.PULL_MESSAGE, req, b"", timeout),
                             broker_name)

    async def group_changes(self, remoting_addr: str, group: str, version: int, wait_ms: int,
                            timeout: float) -> dict[str, Any]:
        """``{"version", "members"}`` once the group's version differs from ``version``, or after ``wait_ms``."""
        key = (remoting_addr, group)
        event = asyncio.Event()
        _INBOX.watch(key, event)  # before asking: a notice in between is not missed
        try:
            answer = await self._group_info(remoting_addr, group, timeout)
            if answer["version"] != version:
                return answer
            try:
                await asyncio.wait_for(event.wait(), wait_ms / 1000)
            except TimeoutError:
                pass
            return await self._group_info(remoting_addr, group, timeout)
        finally:
            _INBOX.unwatch(key, event)

    async def _group_info(self, remoting_addr: str, group: str, timeout: float) -> dict[str, Any]:
        r = decode_answer((await self.request(remoting_addr, RequestCode.GROUP_INFO, p.GroupInfoRequest(group), b"",
                                        timeout)).header, p.GroupInfoResponse)
        return {"version": r.version, "members": list(r.members)}

    async def heartbeat(self, remoting_addr: str, body: Mapping[str, Any]) -> None:
        """HEARTBEAT on this loop's connection, so pushed notices come to it."""
        await self.request(remoting_addr, RequestCode.HEARTBEAT, msgspec.convert(dict(body), p.HeartbeatRequest))

    async def aclose(self) -> None:
        """Close every connection."""
        await self._client.close()


def sync_transport(timeout_s: float, tls: TlsSettings | None = None) -> SyncRemotingClient:
    """A threaded remoting client whose pushes reach this module's inbox (TLS when ``tls`` connects)."""
    ctx = tls.client_context_if_connecting() if tls is not None else None
    return SyncRemotingClient(request_timeout_s=timeout_s, on_push=_on_push, ssl_context=ctx)


class AsyncBrokerRouter:
    """The consumers' per-broker async calls (``pull``, ``group_changes``), over remoting where the route names a
    broker's endpoint (and the config allows it), else over HTTP; same signatures as ``AsyncBrokerClient``."""

    def __init__(self, timeout_s: float, *, remoting: bool = True, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None) -> None:
        from .remoting import AsyncBrokerClient  # noqa: PLC0415  # the HTTP side, only built when needed

        self._http = AsyncBrokerClient(credentials=credentials, tls=tls)
        self._remoting = AsyncRemotingBrokers(timeout_s, credentials=credentials, tls=tls) if remoting else None

    def _endpoint(self, addr: str) -> str | None:
        from .endpoints import remoting_endpoint  # noqa: PLC0415

        return remoting_endpoint(addr) if self._remoting is not None else None

    async def pull(self, addr: str, topic: str, queue_id: int, offset: int, max_messages: int, *, tags: str,
                   wait_ms: int, timeout: float, group: str | None = None, client_id: str | None = None,
                   arrow: bool = False, filter_type: str = "TAG", expression: str | None = None,
                   broker_name: str = "") -> PullResult:
        """One long-polling pull of a queue (see ``AsyncBrokerClient.pull``)."""
        endpoint = self._endpoint(addr)
        if endpoint is None or self._remoting is None:
            return await self._http.pull(addr, topic, queue_id, offset, max_messages, tags=tags, wait_ms=wait_ms,
                                         timeout=timeout, group=group, client_id=client_id, arrow=arrow,
                                         filter_type=filter_type, expression=expression)
        sql = filter_type and filter_type.upper() != "TAG"
        req = p.PullRequest(topic, queue_id, offset, max_messages, group, client_id, None if sql else (tags or "*"),
                            filter_type.upper() if filter_type else "TAG", expression if sql else None, wait_ms)
        return await self._remoting.pull(endpoint, req, broker_name, timeout)

    async def group_changes(self, addr: str, group: str, version: int, wait_ms: int,
                            timeout: float) -> dict[str, Any]:
        """Wait for the group's membership version to move (pushed notices over remoting)."""
        endpoint = self._endpoint(addr)
        if endpoint is None or self._remoting is None:
            return await self._http.group_changes(addr, group, version, wait_ms, timeout)
        return await self._remoting.group_changes(endpoint, group, version, wait_ms, timeout)

    async def aclose(self) -> None:
        """Close every connection."""
        await self._http.aclose()
        if self._remoting is not None:
            await self._remoting.aclose()
