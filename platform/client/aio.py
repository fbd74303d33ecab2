"""asyncio clients beside the threaded ones: :class:`AsyncProducer` and :class:`AsyncConsumer`.

Both run on the caller's event loop and talk to brokers over the remoting protocol
(``docs/remoting.md``) through one :class:`~sparkmq.platform.remoting.AsyncRemotingClient` each: the
same connection class the threaded clients use on their loop thread.  Name servers stay HTTP: routes
come from the threaded :class:`~.routes.TopicRouteCache`, asked in a worker thread
(``asyncio.to_thread``) only when a route is missing or due for a refresh.

* **Remoting only.**  A broker whose route names no remoting endpoint cannot be used: a send to it
  fails with SERVICE_NOT_AVAILABLE saying so (retried on another broker like any unavailable one,
  which is then avoided for a while), and a consumer warns once and cannot pull that broker's queues
  (it retries them every ``pull_error_backoff_s``); serve such brokers with the threaded clients.
  ``ClientConfig(transport="http")`` is refused.
* **One loop.**  A client belongs to the loop it was started on; start, use and shut it down there.

:class:`AsyncProducer` routes, retries and avoids slow brokers exactly as :class:`~.producer.Producer`
does: the same decisions (:mod:`.send_retry`: which queue next, which failures to retry, waiting within the
send budget while no live master has a writable queue or a broker has no master), the same
:class:`~.fault.QueueSelector`, :class:`~.fault.LatencyFaultTolerance` and
:func:`~.producer.select_by_sharding_key`; a batch is packed natively by ``encode_batch`` and stored in one
queue at consecutive offsets.

:class:`AsyncConsumer` is a clustering member of a consumer group: it heartbeats its subscriptions,
allocates the topics' read queues over the group's members with a strategy of :mod:`.allocation`,
long-polls each held queue in its own task and yields the messages one by one (``async for``).
It rebalances at once when a broker pushes NOTIFY_CONSUMER_IDS_CHANGED on its connection, and every
``rebalance_interval_s``.  A message counts as consumed once the next one is asked for, or
:meth:`AsyncConsumer.commit` / :meth:`AsyncConsumer.shutdown` is called after it was yielded; the
offset committed per queue is the smallest one not consumed yet (RocketMQ's semantics: a crash
repeats messages, never loses them).

Example::

    async with AsyncProducer("pg", config) as producer:
        result = await producer.send(Message("orders", b"hello", tags="A"))

    consumer = AsyncConsumer("cg", config, consume_from_where="FIRST_OFFSET")
    consumer.subscribe("orders", "A || B")
    async with consumer:
        async for message in consumer:
            handle(message)
"""
from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import msgspec

from ...storage_native import StoreError, encode_batch
from ..common import protocol as p
from ..common.errors import ErrorCode, SparkMQError
from ..common.failure_log import FailureLog
from ..common.filtering import FILTER_TAG
from ..common.ids import UniqueIdGenerator
from ..common.message import Message, SendResult
from ..common.protocol import PULL_OUTCOME_CODES, SEND_OUTCOME_CODES, PullStatus, RequestCode, ResponseCode
from ..common.system_topics import DELAY_PROPERTIES, RETRY_PREFIX, retry_topic
from ..common.validation import validate_group, validate_topic
from ..common.wire import ReceivedMessage
from ..remoting import AsyncRemotingClient, Ext, Frame, RemotingError, Reply, Response
from .allocation import DEFAULT_STRATEGY, AllocateStrategy, MessageQueue
from .broker_remoting import (
    decode_members,
    decode_packed,
    decode_pulled,
    decode_send,
    ext_signer,
    heartbeat_data,
    packed_ext,
    properties_text,
    pull_ext,
    send_ext,
)
from .config import DEFAULT_CONSUME_TIMESTAMP_BACK_S, ClientConfig
from .endpoints import remoting_endpoint
from .fault import LatencyFaultTolerance, QueueSelector
from .process_queue import ProcessQueue
from .producer import (
    BROKER_FAULT_CODES,
    RETRYABLE_CODES,
    BatchSendResults,
    check_batch,
    check_body,
    select_by_sharding_key,
)
from .rebalance import (
    ConsumeFromWhere,
    MessageSelector,
    Subscription,
    parse_consume_from_where,
    resolve_strategy,
)
from .remoting import NameServerClient
from .routes import UNREACHABLE_PASS_OVER_S, TopicRouteCache, TopicRouteInfo, mark_unreachable
from .send_retry import Failover, OrderedQueue, RetryPolicy

__all__ = ["AsyncProducer", "AsyncConsumer"]

log = logging.getLogger("sparkmq.client")

T = TypeVar("T")
#: Properties that ask for a delay: a message with any of them is not sent packed (:meth:`AsyncProducer.send`).
_DELAY_KEYS = frozenset(DELAY_PROPERTIES)

_SUCCESS = frozenset({ResponseCode.SUCCESS})
_encode_json = msgspec.json.Encoder().encode
_QUERY_OK = frozenset({ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND})

#: Retryable failures about the topic on that broker, not the broker itself: refresh the route, do not
#: isolate the broker (the threaded producer's split of ``RETRYABLE_CODES``).
_TOPIC_FAULT_CODES = RETRYABLE_CODES - BROKER_FAULT_CODES


class _AsyncClient:
    """What both asyncio clients share: routes, the remoting pool, background tasks and the lifecycle state."""

    def __init__(self, group: str, config: ClientConfig) -> None:
        self.group = validate_group(group)
        if config.transport != "remoting":
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the asyncio clients speak remoting only; "
                                                           f"transport={config.transport!r} is not supported")
        self.config = config
        self.client_id = config.new_client_id()
        self._namesrv = NameServerClient(config.namesrv_addrs, config.request_timeout_s,
                                         credentials=config.credentials, tls=config.tls_settings)
        self._routes = TopicRouteCache(self._namesrv, miss_retry_s=config.route_miss_retry_s)
        self._remoting: AsyncRemotingClient | None = None
        self._sign = ext_signer(config.credentials)  # signs requests for brokers with ACL on
        self._tasks: set[asyncio.Task[Any]] = set()
        self._no_endpoint_warned: set[str] = set()
        self._state = "created"

    # -- lifecycle helpers -------------------------------------------------------------------
    def _begin(self, on_push: Callable[[str, Frame], Reply | None] | None = None) -> None:
        if self._state != "created":
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"{self._what()} is {self._state}")
        self._state = "starting"
        self._remoting = AsyncRemotingClient(request_timeout_s=self.config.request_timeout_s, on_push=on_push,
                                             ssl_context=self.config.tls_settings.client_context_if_connecting())

    def _what(self) -> str:
        return f"{type(self).__name__} {self.group}"

    def _check_running(self) -> None:
        if self._state != "running":
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"{self._what()} is {self._state}, not running")

    def _background(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task the client owns: kept referenced until done, cancelled by :meth:`_cancel_tasks`."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.group}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _every(self, name: str, interval_s: float, fn: Callable[[], Awaitable[Any]]) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await fn()
                except Exception:  # periodic work must outlive one bad round
                    log.exception("%s of %s failed", name, self._what())
        self._background(loop(), name)

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _close(self) -> None:
        if self._remoting is not None:
            await self._remoting.close()
        self._namesrv.close()
        self._state = "stopped"

    # -- routes and requests -----------------------------------------------------------------
    async def _route(self, topic: str, *, allow_default: bool = False) -> TopicRouteInfo:
        """The route of ``topic``: the cached one, else fetched in a worker thread (name servers are HTTP).

        A new topic's default route is used from the cache too until it is due to be asked for again (every
        ``route_miss_retry_s``), as the threaded producer does: not a worker-thread hop per send meanwhile."""
        route = self._routes.usable(topic)
        if route is not None:
            return route
        return await asyncio.to_thread(self._routes.get, topic, allow_default=allow_default)

    async def _refresh_routes(self) -> None:
        await asyncio.to_thread(self._routes.refresh_all)

    def _endpoint(self, addr: str) -> str:
        endpoint = remoting_endpoint(addr)
        if endpoint is None:
            message = (f"broker {addr} has no remoting endpoint in its route; the asyncio clients speak "
                       "remoting only (use the threaded clients for HTTP-only brokers)")
            if addr not in self._no_endpoint_warned:
                self._no_endpoint_warned.add(addr)
                log.warning("%s: %s", self._what(), message)
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, message)
        return endpoint

    async def _request(self, addr: str, code: RequestCode, ext: Ext = None, body: bytes = b"",
                       timeout: float | None = None, ok: frozenset[int] = _SUCCESS) -> Response:
        """One request to the broker at address ``addr`` (as routes name it), on its remoting connection."""
        assert self._remoting is not None
        return await self._remoting.request(self._endpoint(addr), code, self._sign(code, ext, body), body,
                                            timeout, ok)

    def _cached_addrs(self, topics: Sequence[str], *, masters_only: bool = False) -> list[str]:
        addrs: set[str] = set()
        for topic in topics:
            route = self._routes.cached(topic)
            if route is not None:
                addrs.update(route.master_addrs() if masters_only else route.all_addrs())
        return sorted(addrs)

    async def _unregister(self, addrs: Sequence[str], req: p.UnregisterClientRequestHeader) -> None:
        for addr in addrs:
            try:
                await self._request(addr, RequestCode.UNREGISTER_CLIENT, req)
            except SparkMQError as exc:
                log.debug("unregistering %s from %s failed: %s", self.client_id, addr, exc)


class AsyncProducer(_AsyncClient):
    """Sends messages of one producer group from asyncio code, over remoting.

    Args:
        group: the producer group (reported in heartbeats, stored with each message).
        config: the client settings (name servers, timeouts, retries, compression).

    Routing, retries (``retry_times`` more attempts on another broker within ``send_timeout_s``; ordered
    sends are never retried), latency fault tolerance and compression are those of the threaded
    :class:`~.producer.Producer`.  Heartbeats go every ``heartbeat_interval_s`` to the masters of the
    topics it sends to, and at once to a broker first met.  Concurrent sends from many tasks share
    one connection per broker.

    Example::

        async with AsyncProducer("pg", ClientConfig(namesrv_addrs="127.0.0.1:9876")) as producer:
            one = await producer.send(Message("orders", b"hello", tags="A"))
            many = await producer.send_batch([Message("orders", b"a"), Message("orders", b"b")])
            assert many[1].queue_offset == many[0].queue_offset + 1
    """

    def __init__(self, group: str, config: ClientConfig) -> None:
        super().__init__(group, config)
        self.fault = LatencyFaultTolerance()
        self._selector = QueueSelector(self.fault if config.send_latency_fault_enable else None)
        self._retries = RetryPolicy(config, self._selector, self.fault)
        self._ids = UniqueIdGenerator()
        self._met_addrs: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> AsyncProducer:
        """Start the periodic work (route refresh, heartbeats, fault probes) on the running loop; returns self."""
        self._begin()
        cfg = self.config
        self._every("routes", cfg.route_refresh_interval_s, self._refresh_routes)
        self._every("heartbeat", cfg.heartbeat_interval_s, self.send_heartbeats)
        if cfg.send_latency_fault_enable:
            self._every("fault-detect", cfg.fault_detect_interval_s, self._probe_isolated)
        self._state = "running"
        return self

    async def shutdown(self) -> None:
        """Stop the periodic work, unregister from the brokers and close the connections.

        Await your sends first: a send still in flight fails with SERVICE_NOT_AVAILABLE.
        """
        if self._state != "running":
            self._state = "stopped"
            return
        self._state = "stopping"
        await self._cancel_tasks()
        await self._unregister(self._known_addrs(), p.UnregisterClientRequestHeader(self.client_id, self.group))
        await self._close()

    async def __aenter__(self) -> AsyncProducer:
        return await self.start() if self._state == "created" else self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- sends -------------------------------------------------------------------------------
    async def send(self, msg: Message, timeout: float | None = None, *,
                   sharding_key: str | None = None) -> SendResult:
        """Send one message and wait until a broker stored it.

        ``timeout`` (seconds, default ``send_timeout_s``) bounds every attempt together.  With a
        ``sharding_key`` the send is ordered: messages with equal keys go to one queue, and it is not
        retried.  Raises ``SparkMQError`` (the last attempt's error when every attempt failed).

        Example::

            result = await producer.send(Message("orders", b"o-1", keys=("o-1",)), sharding_key="customer-7")
        """
        self._check_running()
        topic, body, compressed = self._prepare(msg)
        if _DELAY_KEYS.isdisjoint(msg.properties):
            # Packed as a batch of one (``encode_batch``, in C), as the threaded producer's ``send_async`` does: no
            # properties string here, no Python object per message in the broker.  messaging.e2e_latency_aio,
            # A B A B A B on one day: p99 12.6, 12.8 and 9.5 ms with SEND_MESSAGE_V2, 11.3, 9.7 and 7.4 packed.
            wire = msg if body is msg.body else Message(msg.topic, body, msg.tags, msg.keys, msg.properties, msg.flag)
            return (await self._send_packed(topic, [wire], compressed, timeout, sharding_key))[0]
        # A delay asked for by a property: SEND_MESSAGE_V2, whose broker side parks it (the packed path refuses it).
        born_ms = int(time.time() * 1000)
        msg_id = self._ids.next_id(born_ms)  # kept across retries: a duplicate after a timeout has the same id

        props = properties_text(msg.properties, tags=msg.tags, keys=msg.keys, msg_id=msg_id)

        async def attempt(addr: str, mq: MessageQueue, left: float) -> SendResult:
            ext = send_ext(self.group, topic, mq.queue_id, props, born_timestamp=born_ms, flag=msg.flag,
                           compressed=compressed)
            answer = await self._request(addr, RequestCode.SEND_MESSAGE_V2, ext, body, left, SEND_OUTCOME_CODES)
            return decode_send(answer, msg_id, topic, mq.broker_name)

        return await self._with_retries(topic, timeout, self._ordered(sharding_key), attempt)

    async def send_batch(self, msgs: Sequence[Message], timeout: float | None = None, *,
                         sharding_key: str | None = None) -> Sequence[SendResult]:
        """Send messages of one topic to one queue in one request; one result per message, consecutive offsets
        (a sequence that makes each :class:`SendResult` when it is read: the answer comes packed).

        The batch is validated and packed once (``encode_batch``, which also makes the message ids);
        a retry sends the same bytes.  Every body is compressed when the largest one is above
        ``compress_threshold``.  Ordering and retries as for :meth:`send`.

        Example::

            results = await producer.send_batch([Message("orders", f"m{i}".encode()) for i in range(100)])
        """
        self._check_running()
        topic, compress = check_batch(msgs, self.config.max_message_size, self.config.compress_threshold)
        wire = [Message(m.topic, zlib.compress(bytes(m.body), self.config.compress_level), m.tags, m.keys,
                        m.properties, m.flag) for m in msgs] if compress else list(msgs)
        return await self._send_packed(topic, wire, compress, timeout, sharding_key)

    async def _send_packed(self, topic: str, wire: Sequence[Message], compressed: bool, timeout: float | None,
                           sharding_key: str | None) -> Sequence[SendResult]:
        """SPARKMQ_SEND_PACKED of ``wire`` (validated, bodies already compressed if ``compressed``), with retries."""
        born_ms = int(time.time() * 1000)
        try:
            data, ids, _ = self._ids.with_state(
                born_ms, lambda prefix, month, counter: encode_batch(wire, prefix, month, counter, born_ms))
        except StoreError as exc:  # the native encoder's validation, as a client error code
            raise SparkMQError(ErrorCode[exc.code], exc.message) from None

        async def attempt(addr: str, mq: MessageQueue, left: float) -> Sequence[SendResult]:
            req = packed_ext(topic, len(ids), self.group, mq.queue_id, compressed, sharding_key=sharding_key)
            answer, offsets = decode_packed(await self._request(addr, RequestCode.SPARKMQ_SEND_PACKED, req, data, left,
                                                                SEND_OUTCOME_CODES))
            return BatchSendResults(answer, ids, offsets)

        return await self._with_retries(topic, timeout, self._ordered(sharding_key), attempt)

    def _prepare(self, msg: Message) -> tuple[str, bytes, bool]:
        """Validate ``msg``; its topic, wire body (compressed above the threshold) and whether it was compressed."""
        if not isinstance(msg, Message):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"expected a Message, got {type(msg).__name__}")
        topic = validate_topic(msg.topic)
        check_body(msg.body, self.config.max_message_size)
        body = bytes(msg.body)
        if len(body) > self.config.compress_threshold:
            return topic, zlib.compress(body, self.config.compress_level), True
        return topic, body, False

    @staticmethod
    def _ordered(sharding_key: str | None) -> OrderedQueue | None:
        if sharding_key is None:
            return None
        return lambda route: select_by_sharding_key(route.write_queues, sharding_key)

    async def _with_retries(self, topic: str, timeout: float | None, ordered: OrderedQueue | None,
                            attempt_fn: Callable[[str, MessageQueue, float], Awaitable[T]]) -> T:
        """Await ``attempt_fn(addr, queue, time_left)`` until it succeeds, retrying on other brokers (the decisions
        are :mod:`.send_retry`'s, shared with the threaded producer)."""
        attempts = self._retries.begin(topic, timeout, ordered)
        for _ in attempts:
            step = attempts.next_step(await self._route(topic, allow_default=True))
            if isinstance(step, Failover):
                await self._fail_over(topic, step)
                continue
            if step.addr not in self._met_addrs:
                # A broker first met hears of this producer now, not at the next period.
                self._met_addrs.add(step.addr)
                self._background(self.send_heartbeats(), "heartbeat")
            try:
                result = await attempt_fn(step.addr, step.queue, step.time_left)
            except SparkMQError as exc:
                await self._fail_over(topic, attempts.failed(step, exc))
                continue
            attempts.succeeded(step)
            return result
        raise attempts.give_up()

    async def _fail_over(self, topic: str, failover: Failover | None) -> None:
        """Ask for ``topic``'s route again (in a worker thread: name servers are HTTP) and pause, as ``failover``
        says."""
        if failover is None:
            return
        if failover.refresh:
            try:
                await asyncio.to_thread(self._routes.refresh, topic)
            except SparkMQError:
                pass  # the cached route stays; the next attempt decides
        if pause_s := failover.pause_s():
            await asyncio.sleep(pause_s)

    # -- periodic work -----------------------------------------------------------------------
    def _known_addrs(self) -> list[str]:
        return self._cached_addrs(self._routes.topics(), masters_only=True)

    async def send_heartbeats(self) -> None:
        """Tell every master this producer sends to that it is alive (done every ``heartbeat_interval_s``)."""
        body = heartbeat_data({"client_id": self.client_id, "producer_groups": [self.group], "consumers": []})
        for addr in self._known_addrs():
            try:
                await self._request(addr, RequestCode.HEART_BEAT, None, body)
            except SparkMQError as exc:
                log.debug("producer heartbeat to %s failed: %s", addr, exc)

    async def _probe_isolated(self) -> None:
        # Like the threaded producer: an isolated broker that answers again is usable again at once.
        for broker_name in self.fault.unreachable_brokers():
            addr = next((a for t in self._routes.topics() if (r := self._routes.cached(t))
                         and (a := r.master_addr(broker_name))), None)
            if addr is None:
                continue
            try:
                assert self._remoting is not None
                await self._remoting.request(self._endpoint(addr), RequestCode.SPARKMQ_PING, timeout=1.0)
            except SparkMQError:
                continue
            log.info("broker %s (%s) answers again; lifting its isolation", broker_name, addr)
            self.fault.remove(broker_name)


class AsyncConsumer(_AsyncClient):
    """A clustering member of a consumer group for asyncio code: ``async for message in consumer``.

    Args:
        group: the consumer group.
        config: the client settings (pull batch, long poll, flow control, intervals).
        consume_from_where: where a queue the group never committed starts (``LAST_OFFSET`` by default,
            ``FIRST_OFFSET`` or ``TIMESTAMP`` with ``config.consume_timestamp_ms``).
        allocate_strategy: a strategy of :mod:`.allocation` or its name (``"averagely"`` by default).
        auto_commit: commit consumed offsets every ``offset_commit_interval_s`` (else only
            :meth:`commit`, a queue taken away and :meth:`shutdown` commit).

    Each held queue is long-polled by its own task; a queue stops being pulled while it holds more than
    ``flow_control_max_messages`` messages (or ``flow_control_max_bytes``, or an offset span above
    ``max_offset_span``) not yet consumed, so buffering is bounded per queue.  Messages are re-checked
    against the subscription's tags.  Iterate from one task at a time.  There is no send-back: a
    message yielded is consumed once the iteration moves on.  Messages other members of the group sent back
    (``%RETRY%<group>``, subscribed by itself) are yielded too, with their original topic and reconsume count.

    Example::

        consumer = AsyncConsumer("cg", ClientConfig(namesrv_addrs="127.0.0.1:9876"),
                                 consume_from_where="FIRST_OFFSET")
        consumer.subscribe("orders", "TagA || TagB")
        async with consumer:
            async for message in consumer:
                await handle(message)        # consumed once the loop asks for the next one
                if message.body == b"stop":
                    break
    """

    #: ``consume_type`` in heartbeats: the client pulls underneath and hands messages over, like a push consumer.
    consume_type = p.ConsumeType.PUSH

    def __init__(self, group: str, config: ClientConfig, *,
                 consume_from_where: str | ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 allocate_strategy: str | AllocateStrategy = DEFAULT_STRATEGY, auto_commit: bool = True) -> None:
        super().__init__(group, config)
        self.consume_from_where = parse_consume_from_where(consume_from_where)
        self.auto_commit = auto_commit
        self._strategy = resolve_strategy(allocate_strategy)
        self._subscriptions: dict[str, Subscription] = {}
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._pulls: dict[MessageQueue, asyncio.Task[None]] = {}
        #: The offset the broker holds per held queue, as far as this client knows (unchanged ones are not resent).
        self._committed: dict[MessageQueue, int] = {}
        #: Per broker address: a master that is down fails every commit until it is back; logged quietly.
        self._commit_failures: dict[str, FailureLog] = {}
        #: Pulled messages not yet yielded, in arrival order; those of a dropped queue are skipped.
        self._ready: deque[tuple[ProcessQueue, ReceivedMessage]] = deque()
        self._in_hand: tuple[ProcessQueue, ReceivedMessage] | None = None
        self._wakeup = asyncio.Event()
        self._rebalance_due = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()

    # -- configuration --------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | MessageSelector = "*", filter_type: str = "TAG") -> None:
        """Consume ``topic``'s messages matching ``expression`` (``"*"``, ``"A || B"``, or SQL92 with
        ``filter_type="SQL92"`` / a :class:`~.rebalance.MessageSelector`).

        May be called after :meth:`start`: a heartbeat and a rebalance follow at once.

        Example::

            consumer.subscribe("orders", "TagA || TagB")
        """
        validate_topic(topic)
        if isinstance(expression, MessageSelector):
            filter_type = expression.filter_type
            expression = expression.expression
        self._subscriptions[topic] = Subscription.parse(topic, expression, filter_type)
        if self._state == "running":
            self._background(self._resubscribe(), "subscribe")

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic`` (its queues are committed and dropped by a rebalance, triggered now)."""
        self._subscriptions.pop(topic, None)
        if self._state == "running":
            self._background(self._resubscribe(), "subscribe")

    async def _resubscribe(self) -> None:
        await self.send_heartbeats()
        self._rebalance_due.set()

    @property
    def subscriptions(self) -> dict[str, str]:
        """Topic -> expression."""
        return {t: s.expression for t, s in self._subscriptions.items()}

    def assignment(self, *, include_retry: bool = False) -> list[MessageQueue]:
        """The queues this consumer holds now, sorted; the group's retry topic (``%RETRY%<group>``, subscribed
        by itself) is plumbing and left out unless ``include_retry``."""
        return sorted(q for q in self._pqs if include_retry or not q.topic.startswith(RETRY_PREFIX))

    def process_queue(self, mq: MessageQueue) -> ProcessQueue | None:
        """The process queue (in-flight messages, flow-control state) of a held queue, or None."""
        return self._pqs.get(mq)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> AsyncConsumer:
        """Join the group and take this member's queues before returning (heartbeat, then a first rebalance).

        A consumer starting from the last offset thus holds its queues, and their start offsets,
        before the caller sends anything.  Returns self.
        """
        if not self._subscriptions:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{self._what()} subscribes to nothing; subscribe() first")
        # Members of a group share its retry topic's queues: messages other members sent back come through here.
        retry = retry_topic(self.group)
        self._subscriptions.setdefault(retry, Subscription(retry, "*", None))
        self._begin(on_push=self._on_push)
        try:
            for topic in sorted(self._subscriptions):
                try:
                    await self._route(topic)
                except SparkMQError as exc:
                    # The group's retry topic exists only once a message was sent back: not worth a warning.
                    (log.debug if topic == retry else log.warning)("no route for %s yet (will retry): %s", topic, exc)
            await self.send_heartbeats()
            self._state = "running"
            await self.rebalance()
        except BaseException:
            self._state = "stopping"
            await self._cancel_tasks()
            await self._cancel_pulls()
            await self._close()
            raise
        cfg = self.config
        self._every("routes", cfg.route_refresh_interval_s, self._refresh_consumer_routes)
        self._every("heartbeat", cfg.heartbeat_interval_s, self.send_heartbeats)
        if self.auto_commit:
            self._every("commit", cfg.offset_commit_interval_s, self._auto_commit)
        self._background(self._rebalance_loop(), "rebalance")
        return self

    async def shutdown(self) -> None:
        """Stop pulling, commit what was consumed (the message last yielded included), leave the group, close.

        A waiting ``async for`` ends.
        """
        await self._stop(finish_in_hand=True)

    async def _stop(self, *, finish_in_hand: bool) -> None:
        if self._state not in ("running", "starting"):
            self._state = "stopped"
            return
        self._state = "stopping"
        self._wakeup.set()
        await self._cancel_tasks()
        await self._cancel_pulls()
        if finish_in_hand:
            self._finish_in_hand()
        self._in_hand = None
        offsets = {mq: pq.commit_offset() for mq, pq in self._pqs.items()}
        for pq in self._pqs.values():
            pq.drop()
        self._ready.clear()
        try:
            await self._commit_offsets(offsets, raise_errors=True)
        except SparkMQError as exc:
            log.warning("final offset commit of %s failed: %s", self.group, exc)
        addrs = self._cached_addrs(sorted(self._topics()))
        self._pqs.clear()
        await self._unregister(addrs, p.UnregisterClientRequestHeader(self.client_id, consumerGroup=self.group))
        await self._close()

    async def _cancel_pulls(self) -> None:
        pulls = list(self._pulls.values())
        self._pulls.clear()
        for task in pulls:
            task.cancel()
        await asyncio.gather(*pulls, return_exceptions=True)

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start() if self._state == "created" else self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # Leaving on an exception: the message being handled did not finish, so it is not committed.
        await self._stop(finish_in_hand=exc_type is None)

    # -- consuming -------------------------------------------------------------------------------
    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ReceivedMessage:
        """The next message; the one yielded before is consumed now.  Ends once the consumer stops."""
        self._finish_in_hand()
        while True:
            if self._state == "created":
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"{self._what()} is not started")
            if self._state not in ("running", "starting"):
                raise StopAsyncIteration  # nothing more is handed out once shutdown began
            while self._ready:
                pq, msg = self._ready.popleft()
                if not pq.dropped:  # a queue taken away: its new owner delivers the message
                    self._in_hand = (pq, msg)
                    return msg
            self._wakeup.clear()
            await self._wakeup.wait()  # cancel-safe: nothing was taken yet

    async def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        """The next message, or None when none came within ``timeout`` seconds or the consumer stopped.

        Example::

            message = await consumer.receive(timeout=1.0)
        """
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except (TimeoutError, StopAsyncIteration):
            return None

    def _finish_in_hand(self) -> None:
        if self._in_hand is not None:
            pq, msg = self._in_hand
            self._in_hand = None
            pq.remove([msg])

    async def commit(self) -> dict[MessageQueue, int]:
        """Commit now, per held queue, the offset of the first message not consumed yet; the offsets.

        The message last yielded counts as consumed.  Raises the first broker error (the other
        brokers' offsets are still committed).

        Example::

            async for message in consumer:
                await handle(message)
                await consumer.commit()      # at most this message is repeated after a crash
        """
        self._finish_in_hand()
        offsets = {mq: pq.commit_offset() for mq, pq in self._pqs.items() if not pq.dropped}
        await self._commit_offsets(offsets, raise_errors=True)
        return offsets

    async def _auto_commit(self) -> None:
        # The message in hand may still be processing: it is not counted here.
        await self._commit_offsets({mq: pq.commit_offset() for mq, pq in self._pqs.items() if not pq.dropped})

    async def _commit_offsets(self, offsets: dict[MessageQueue, int], *, raise_errors: bool = False) -> None:
        """COMMIT_OFFSETS of the entries that changed since their last commit, one request per master."""
        by_addr: dict[str, dict[MessageQueue, int]] = {}
        error: SparkMQError | None = None
        for mq, offset in offsets.items():
            if self._committed.get(mq) == offset:
                continue
            route = self._routes.cached(mq.topic)
            addr = route.master_addr(mq.broker_name) if route is not None else None
            if addr is None:
                error = error or SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE,
                                              f"broker {mq.broker_name} has no master for offsets")
                continue
            by_addr.setdefault(addr, {})[mq] = offset
        for addr, entries in sorted(by_addr.items()):
            body = _encode_json(p.UpdateConsumerOffsetsBody(self.group, [
                p.UpdateConsumerOffsetEntry(mq.topic, mq.queue_id, offset) for mq, offset in sorted(entries.items())]))
            failures = self._commit_failures.get(addr)
            if failures is None:
                failures = self._commit_failures[addr] = FailureLog(
                    log, f"committing offsets of {self.group} to {addr}")
            try:
                await self._request(addr, RequestCode.SPARKMQ_UPDATE_CONSUMER_OFFSETS, None, body)
            except SparkMQError as exc:
                failures.failure("%d offsets: %s", len(entries), exc)
                error = error or exc
                continue
            failures.success()
            self._committed.update(entries)
        if error is not None and raise_errors:
            raise error

    # -- pulling ---------------------------------------------------------------------------------
    def _take(self, mq: MessageQueue, offset: int, *, stored: bool) -> None:
        cfg = self.config
        pq = ProcessQueue(mq, offset, max_messages=cfg.flow_control_max_messages,
                          max_bytes=cfg.flow_control_max_bytes, max_span=cfg.max_offset_span)
        self._pqs[mq] = pq
        if stored:
            self._committed[mq] = offset
        else:  # a start chosen by consume_from_where: committed at the next commit, so a restart resumes here
            self._committed.pop(mq, None)
        self._pulls[mq] = asyncio.get_running_loop().create_task(self._pull_loop(pq),
                                                                 name=f"pull-{mq.topic}@{mq.key}")

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        """Long-poll one queue until it is dropped: flow control, pull, tag re-check, hand over."""
        cfg = self.config
        mq = pq.mq
        while not pq.dropped:
            if pq.flow_control_reason() is not None:
                pq.flow_control_times += 1
                await pq.wait_for_room(cfg.flow_control_backoff_s)  # consumption wakes it at once
                continue
            route = self._routes.cached(mq.topic)
            addr = route.read_addr(mq.broker_name) if route is not None else None
            if route is None or addr is None:
                await asyncio.sleep(cfg.pull_error_backoff_s)
                continue
            sub = self._subscriptions.get(mq.topic) or Subscription(mq.topic, "*", None)
            sql = sub.filter_type != FILTER_TAG
            offset = pq.next_offset
            ext = pull_ext(self.group, mq.topic, mq.queue_id, offset, cfg.pull_batch_size, expression=sub.expression,
                           filter_type=sub.filter_type if sql else "TAG",
                           wait_ms=route.read_wait_ms(mq.broker_name, addr, cfg.long_poll_wait_ms),
                           client_id=self.client_id)
            begin = time.monotonic()
            try:
                response = await self._request(addr, RequestCode.SPARKMQ_PULL_PACKED, ext, b"", cfg.pull_timeout_s,
                                               PULL_OUTCOME_CODES)
                result = decode_pulled(response, mq.broker_name)
            except SparkMQError as exc:
                log.debug("pull of %s@%s at %d failed: %s", mq.topic, mq.key, offset, exc)
                if isinstance(exc, RemotingError) and not exc.timed_out:
                    mark_unreachable(addr, UNREACHABLE_PASS_OVER_S)  # read from a slave meanwhile
                await asyncio.sleep(cfg.pull_error_backoff_s)
                continue
            if pq.dropped:
                break
            status = result.status
            if status is PullStatus.FOUND:
                kept = [m for m in result.messages if sub.matches(m.tags)]
                pq.on_pulled(kept, result.next_offset)
                if kept:
                    if mq.topic.startswith(RETRY_PREFIX):
                        for m in kept:
                            m.restore_retry_origin()
                    self._ready.extend((pq, m) for m in kept)
                    self._wakeup.set()
                continue
            if status is PullStatus.OFFSET_RESET:
                log.info("%s: the offset of %s@%s was reset to %d; restarting there", self.group, mq.topic, mq.key,
                         result.next_offset)
                if self._pqs.get(mq) is pq and self._state == "running":
                    pq.drop()
                    self._take(mq, result.next_offset, stored=True)
                return
            if status in (PullStatus.OFFSET_TOO_SMALL, PullStatus.OFFSET_OVERFLOW):
                log.warning("%s@%s: offset %d is %s; moving to %d", mq.topic, mq.key, offset, status,
                            result.next_offset)
            pq.on_pulled([], result.next_offset)
            if status not in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG) or (
                    result.next_offset == offset and time.monotonic() - begin < 0.05):
                # Nothing held the request (no such queue yet): do not spin on it.
                await asyncio.sleep(cfg.flow_control_backoff_s * 2)

    # -- membership and rebalance ------------------------------------------------------------------
    def _on_push(self, addr: str, frame: Frame) -> Reply | None:
        """A broker's request on one of this consumer's connections (the loop runs it): a membership notice
        rebalances, a GET_CONSUMER_RUNNING_INFO is answered."""
        if frame.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            return Reply(body=self.running_info())
        if frame.code != RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            return None
        try:
            group = frame.header_as(p.ConsumerGroupRequestHeader).consumerGroup
        except SparkMQError as exc:
            log.warning("bad notice from %s: %s", addr, exc)
            return None
        if group == self.group:
            log.info("group %s membership changed on %s; rebalancing", self.group, addr)
            self._rebalance_due.set()
        return None

    def running_info(self) -> bytes:
        """This consumer's GET_CONSUMER_RUNNING_INFO answer (RocketMQ's ConsumerRunningInfo JSON)."""
        props = {p.PROP_NAMESERVER_ADDR: ";".join(self.config.namesrv_addrs),
                 p.PROP_CONSUME_TYPE: p.CONSUME_TYPE_NAMES[str(self.consume_type)], p.PROP_CONSUME_ORDERLY: "false",
                 p.PROP_CLIENT_VERSION: str(p.CLIENT_VERSION), "messageModel": str(p.MessageModel.CLUSTERING),
                 "consumeFromWhere": str(self.consume_from_where), "consumerGroup": self.group}
        subs = [p.SubscriptionDataBody(s.topic, s.expression, expressionType=s.filter_type or "TAG")
                for _, s in sorted(self._subscriptions.items())]
        queues = [(p.MessageQueueData(mq.topic, mq.broker_name, mq.queue_id),
                   p.ProcessQueueInfo(pq.commit_offset(), cachedMsgCount=pq.msg_count, droped=pq.dropped))
                  for mq, pq in sorted(self._pqs.items())]
        return p.consumer_running_info(props, subs, queues)

    async def _rebalance_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._rebalance_due.wait(), self.config.rebalance_interval_s)
            except TimeoutError:
                pass
            if self._state != "running":
                # Cancelled by the shutdown just as a notice set the event: Python 3.11's wait_for then returns
                # instead of raising, and this loop must not outlive the consumer (its shutdown awaits it).
                return
            self._rebalance_due.clear()
            try:
                await self.rebalance()
            except Exception:
                log.exception("rebalance of %s failed", self.group)

    def _topics(self) -> set[str]:
        return set(self._subscriptions) | {mq.topic for mq in self._pqs}

    async def send_heartbeats(self) -> None:
        """Heartbeat every broker serving the subscribed topics with the subscriptions (every
        ``heartbeat_interval_s``); this binds the connection the brokers push notices to."""
        for topic in sorted(self._subscriptions):
            if self._routes.cached(topic) is None:
                try:
                    await self._route(topic)
                except SparkMQError:
                    continue
        subs = [s.to_dict() for _, s in sorted(self._subscriptions.items())]
        held = [p.held_queue_key(q.topic, q.broker_name, q.queue_id) for q in self.assignment(include_retry=True)]
        body = heartbeat_data({"client_id": self.client_id, "producer_groups": [], "consumers": [{
            "group": self.group, "consume_type": str(self.consume_type),
            "message_model": str(p.MessageModel.CLUSTERING),
            "consume_from_where": str(self.consume_from_where), "subscriptions": subs, "held_queues": held}]})
        for addr in self._cached_addrs(sorted(self._topics())):
            try:
                await self._request(addr, RequestCode.HEART_BEAT, None, body)
            except SparkMQError as exc:
                log.debug("heartbeat of %s to %s failed: %s", self.client_id, addr, exc)

    async def _refresh_consumer_routes(self) -> None:
        topics = sorted(self._topics())
        before = {t: r.read_queues if (r := self._routes.cached(t)) else None for t in topics}
        await self._refresh_routes()
        if before != {t: r.read_queues if (r := self._routes.cached(t)) else None for t in topics}:
            # A broker came or went: heartbeat it and rebalance now rather than at the next period.
            await self.send_heartbeats()
            self._rebalance_due.set()

    async def rebalance(self) -> bool:
        """Recompute this member's queues now (also done on notices and every ``rebalance_interval_s``);
        whether the assignment changed.  A queue given up is committed first; a new one starts at the
        group's committed offset, or where ``consume_from_where`` says."""
        async with self._rebalance_lock:
            if self._state != "running":
                return False
            changed = False
            for topic in sorted(self._subscriptions):
                wanted = await self._allocate(topic)
                if wanted is not None:
                    changed |= await self._update(topic, wanted)
            for topic in sorted({mq.topic for mq in self._pqs} - set(self._subscriptions)):
                changed |= await self._update(topic, set())
            if changed:
                log.info("%s of %s holds %s", self.client_id, self.group,
                         [f"{q.topic}@{q.key}" for q in self.assignment()])
                # The brokers show who holds what: tell them now, not at the next heartbeat period.
                self._background(self.send_heartbeats(), "heartbeat")
            return changed

    async def _allocate(self, topic: str) -> set[MessageQueue] | None:
        try:
            route = await self._route(topic)
        except SparkMQError as exc:
            log.debug("no route for %s yet: %s", topic, exc)
            return None
        members = await self._members(route)
        if members is None:
            log.warning("rebalance of %s/%s skipped: no broker answered with the group's members", self.group, topic)
            return None
        if self.client_id not in members:
            # Our heartbeat has not reached that broker yet: keep what we hold, heartbeat, settle next round.
            log.info("rebalance of %s/%s: %s is not among the members %s yet", self.group, topic,
                     self.client_id, members)
            self._background(self.send_heartbeats(), "heartbeat")
            return None
        return set(self._strategy.allocate(self.group, self.client_id, list(route.read_queues), members))

    async def _members(self, route: TopicRouteInfo) -> list[str] | None:
        masters = route.master_addrs()
        for addr in masters + [a for a in route.all_addrs() if a not in masters]:
            try:
                response = await self._request(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                               {"consumerGroup": self.group})
            except SparkMQError as exc:
                if exc.code is ErrorCode.GROUP_NOT_EXIST:  # none here (yet): our heartbeat is on its way
                    return []
                log.debug("group %s members from %s failed: %s", self.group, addr, exc)
                continue
            return decode_members(response)
        return None

    async def _update(self, topic: str, wanted: set[MessageQueue]) -> bool:
        changed = False
        for mq in sorted(mq for mq in self._pqs if mq.topic == topic and mq not in wanted):
            await self._drop(mq)
            changed = True
        for mq in sorted(wanted - set(self._pqs)):
            try:
                offset, stored = await self._start_offset(mq)
            except SparkMQError as exc:
                # Leave it for the next round rather than guess a start (which could skip or repeat).
                log.warning("cannot find where to start %s@%s for %s: %s", topic, mq.key, self.group, exc)
                continue
            if self._state != "running" or mq in self._pqs:
                continue
            self._take(mq, offset, stored=stored)
            log.info("%s takes %s@%s from offset %d", self.client_id, topic, mq.key, offset)
            changed = True
        return changed

    async def _drop(self, mq: MessageQueue) -> None:
        """Give ``mq`` up: stop pulling it, skip its undelivered messages, commit where its next owner starts."""
        pq = self._pqs.pop(mq)
        pq.drop()
        task = self._pulls.pop(mq, None)
        if task is not None:
            task.cancel()
        offset = pq.commit_offset()
        try:
            await self._commit_offsets({mq: offset}, raise_errors=True)
        except SparkMQError as exc:
            log.warning("committing the offset of dropped %s@%s failed: %s", mq.topic, mq.key, exc)
        self._committed.pop(mq, None)
        log.info("%s drops %s@%s at offset %d", self.client_id, mq.topic, mq.key, offset)

    async def _start_offset(self, mq: MessageQueue) -> tuple[int, bool]:
        """Where a queue taken now starts, and whether that is the group's committed offset."""
        route = await self._route(mq.topic)
        master = route.master_addr(mq.broker_name)
        if master is None:  # the group's offsets live on the master: without it the start is unknown
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {mq.broker_name} has no master for offsets")
        response = await self._request(master, RequestCode.QUERY_CONSUMER_OFFSET,
                                       p.QueryConsumerOffsetRequestHeader(self.group, mq.topic, mq.queue_id, False),
                                       ok=_QUERY_OK)
        if response.code == ResponseCode.SUCCESS:
            return response.header_as(p.OffsetResponseHeader).offset, True
        addr = route.read_addr(mq.broker_name)
        if addr is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {mq.broker_name} has no address")
        cfw = self.consume_from_where
        timestamp = None
        if cfw is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            timestamp = self.config.consume_timestamp_ms
            if timestamp is None:
                timestamp = int((time.time() - DEFAULT_CONSUME_TIMESTAMP_BACK_S) * 1000)
        response = await self._request(addr, RequestCode.SPARKMQ_QUEUE_OFFSETS,
                                       p.QueueRequestHeader(mq.topic, mq.queue_id, timestamp))
        bounds = response.header_as(p.QueueOffsetsResponseHeader)
        if cfw is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return bounds.minOffset, False
        if cfw is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and bounds.offset is not None:
            return bounds.offset, False
        return bounds.maxOffset, False
