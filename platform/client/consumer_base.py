"""What push and pull consumers share: routes, heartbeats, rebalance, offsets, and the pulling event loop.

Threads of one consumer:

* a **scheduler** thread (:class:`.scheduler.Scheduler`) for the periodic work -- route refresh
  (30 s), heartbeats with subscriptions to every broker serving the topics (30 s), rebalance
  (20 s, and at once on a membership notice), offset commits (5 s);
* an **asyncio loop** thread with one ``httpx.AsyncClient``: one pull task per held queue (a long
  poll at a time, flow-controlled by its :class:`.process_queue.ProcessQueue`) and one task per
  broker long-polling ``/consumers/{group}/changes`` that triggers the rebalance when the
  group's membership version moves;
* whatever the subclass adds (the push consumer's listener pool).

Subclasses implement :meth:`ConsumerBase._on_pulled`, called on the loop thread with the
messages of a pull that passed the client-side tag re-check.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Sequence
from typing import Any

from ..common import protocol as p
from ..common.backoff import Backoff, RetryDelays
from ..common.errors import ErrorCode, SparkMQError
from ..common.protocol import held_queue_key
from ..common.validation import validate_group, validate_topic
from ..common.wire import ReceivedMessage
from ..remoting import RemotingError
from ..remoting.loop import LoopThread
from .allocation import AllocateStrategy, MessageQueue
from .broker_remoting import (
    AsyncBrokerRouter,
    OffsetReset,
    forget_offset_reset,
    forget_running_info,
    on_offset_reset,
    on_running_info,
)
from .config import ClientConfig
from .offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from .process_queue import ProcessQueue
from .rebalance import (
    RETRY_TOPIC_PREFIX,
    ConsumeFromWhere,
    MessageModel,
    MessageSelector,
    RebalanceImpl,
    Subscription,
    parse_consume_from_where,
    parse_message_model,
    resolve_strategy,
)
from .remoting import (
    FOUND,
    NO_MATCHED_MSG,
    NO_NEW_MSG,
    OFFSET_OVERFLOW,
    OFFSET_RESET,
    OFFSET_TOO_SMALL,
    BrokerClientPool,
    NameServerClient,
)
from .routes import UNREACHABLE_PASS_OVER_S, TopicRouteCache, mark_unreachable
from .scheduler import Scheduler

__all__ = ["ConsumerBase"]

log = logging.getLogger("sparkmq.client")

#: A failing membership watch pauses ``pull_error_backoff_s``, doubling after each failure up to this (or to
#: ``pull_error_backoff_s`` when that is longer).
_WATCH_BACKOFF_MAX_S = 30.0


class ConsumerBase(ABC):
    """Shared lifecycle and machinery of :class:`PushConsumer` and :class:`PullConsumer`."""

    #: ``consume_type`` in heartbeats.
    consume_type = "PUSH"

    def __init__(self, group: str, config: ClientConfig, *, message_model: str | MessageModel,
                 allocate_strategy: str | AllocateStrategy, consume_from_where: str | ConsumeFromWhere) -> None:
        self.group = validate_group(group)
        self.config = config
        self.client_id = config.new_client_id()
        self.message_model = parse_message_model(message_model)
        self.consume_from_where = parse_consume_from_where(consume_from_where)
        self._subscriptions: dict[str, Subscription] = {}
        self._namesrv = NameServerClient(config.namesrv_addrs, config.request_timeout_s,
                                         credentials=config.credentials, tls=config.tls_settings)
        self._routes = TopicRouteCache(self._namesrv, miss_retry_s=config.route_miss_retry_s)
        self._brokers = BrokerClientPool(config.request_timeout_s, remoting=config.transport == "remoting",
                                         credentials=config.credentials, tls=config.tls_settings)
        self.offset_store: OffsetStore
        if self.message_model is MessageModel.BROADCASTING:
            self.offset_store = LocalOffsetStore(self.group, config.offset_store_dir)
        else:
            self.offset_store = RemoteOffsetStore(self.group, self._brokers, self._master_addr)
        self._rebalance = RebalanceImpl(
            self.group, self.client_id, message_model=self.message_model,
            strategy=resolve_strategy(allocate_strategy), consume_from_where=self.consume_from_where,
            consume_timestamp_ms=config.consume_timestamp_ms, subscriptions=self._subscriptions,
            routes=self._routes, brokers=self._brokers, offset_store=self.offset_store,
            new_process_queue=self._new_process_queue, on_added=self._start_pulling, on_removed=self._stop_pulling)
        self._scheduler = Scheduler(f"consumer-{group}")
        self._rebalance.on_not_member = lambda topic: self._scheduler.trigger("heartbeat")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: LoopThread | None = None
        #: True while this consumer's work may run on the loop: callbacks and timers it scheduled check it
        #: (the loop is shared, so stopping means closing this consumer's part of it, not the loop).
        self._on_loop = False
        self._async: AsyncBrokerRouter | None = None
        self._pull_tasks: dict[ProcessQueue, asyncio.Task[None]] = {}  # touched on the loop thread only
        self._watchers: dict[str, asyncio.Task[None]] = {}    # broker addr -> task, loop only
        # The group's membership version each broker answered our last heartbeat with: where the
        # change watcher starts, so a member joining right after our rebalance is not missed.
        self._versions: dict[str, int] = {}
        self._state_lock = threading.Lock()
        self._state = "created"
        self._manual = False  # PullConsumer.assign(): no group membership
        #: Set when a broker's membership version moved: the next rebalance first checks for an offset reset.
        self._offsets_check_due = False

    # -- configuration --------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | MessageSelector = "*", filter_type: str = "TAG") -> None:
        """Consume ``topic``'s messages that match ``expression``.

        ``filter_type="TAG"`` (default): ``"*"`` or ``"A || B"``; ``"SQL92"``: an SQL92 expression over
        message properties, evaluated by the broker.  A :class:`MessageSelector` carries both.  The
        expression is compiled here first, so a malformed one raises FILTER_EXPRESSION_ILLEGAL (with
        the position of the error) before anything is sent.  May be called after :meth:`start`; the
        next heartbeat and rebalance pick it up at once.
        """
        validate_topic(topic)
        if self._manual:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "this consumer uses assign(); it cannot also subscribe")
        if isinstance(expression, MessageSelector):
            filter_type = expression.filter_type
            expression = expression.expression
        self._subscriptions[topic] = Subscription.parse(topic, expression, filter_type)
        if self._state == "running":
            self._scheduler.trigger("heartbeat")
            self._scheduler.trigger("rebalance")

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic`` (its queues are dropped at the next rebalance, triggered now)."""
        self._subscriptions.pop(topic, None)
        if self._state == "running":
            self._scheduler.trigger("heartbeat")
            self._scheduler.trigger("rebalance")

    @property
    def subscriptions(self) -> dict[str, str]:
        """Topic -> expression (tag or SQL92; see :meth:`subscription`)."""
        return {t: s.expression for t, s in self._subscriptions.items()}

    def subscription(self, topic: str) -> Subscription | None:
        """The subscription of ``topic`` (expression and filter type), or None."""
        return self._subscriptions.get(topic)

    def assignment(self, *, include_retry: bool = False) -> list[MessageQueue]:
        """The queues of the subscribed topics this consumer holds now, sorted.

        The group's retry topic (``%RETRY%<group>``, subscribed by itself) is plumbing and left out
        unless ``include_retry``.
        """
        held = self._rebalance.assignment()
        return held if include_retry else [q for q in held if not q.topic.startswith(RETRY_TOPIC_PREFIX)]

    def process_queue(self, mq: MessageQueue) -> ProcessQueue | None:
        """The process queue of a held queue (flow-control and offset state), or None."""
        return self._rebalance.process_queues().get(mq)

    # -- lifecycle -------------------------------------------------------------------------------
    def _start_base(self) -> None:
        with self._state_lock:
            if self._state != "created":
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"consumer {self.group} is {self._state}")
            self._state = "starting"
        try:
            self.offset_store.load()
            self._start_loop()
            on_offset_reset(self.group, self._on_pushed_reset)
            on_running_info(self.client_id, self.running_info)
            for topic in self._topics():
                try:
                    self._routes.get(topic)
                except SparkMQError as exc:
                    # A retry topic only exists once a message failed: its missing route is normal.
                    level = logging.DEBUG if topic.startswith(RETRY_TOPIC_PREFIX) else logging.WARNING
                    log.log(level, "no route for %s yet (will retry): %s", topic, exc)
            self.send_heartbeats()
            with self._state_lock:
                self._state = "running"
            # The first rebalance runs before start() returns, so a consumer that starts from the
            # last offset holds its queues (and their start offsets) before the caller sends anything.
            self.rebalance()
        except BaseException:
            self._shutdown_base(commit=False)
            raise
        cfg = self.config
        self._scheduler.every("routes", cfg.route_refresh_interval_s, self._refresh_routes,
                              initial_delay_s=cfg.route_refresh_interval_s)
        self._scheduler.every("heartbeat", cfg.heartbeat_interval_s, self.send_heartbeats,
                              initial_delay_s=cfg.heartbeat_interval_s)
        self._scheduler.every("rebalance", cfg.rebalance_interval_s, self.rebalance,
                              initial_delay_s=cfg.rebalance_interval_s)
        self._scheduler.every("commit", cfg.offset_commit_interval_s, self._commit_quietly,
                              initial_delay_s=cfg.offset_commit_interval_s)
        # The first rebalance ran before the heartbeat task existed: report the queues it took at once.
        self._scheduler.trigger("heartbeat")
        self._scheduler.start()

    def _shutdown_base(self, *, commit: bool = True, before_commit: Any = None) -> None:
        """Stop pulling, run ``before_commit`` (drain listeners), commit, unregister, close everything."""
        with self._state_lock:
            if self._state in ("stopping", "stopped"):
                return
            self._state = "stopping"
        self._scheduler.stop()
        forget_offset_reset(self.group, self._on_pushed_reset)
        forget_running_info(self.client_id)
        if self._loop is not None and self._loop.is_running():
            self._run_on_loop(self._cancel_all_pulls()).result(timeout=30)
        if before_commit is not None:
            before_commit()
        if commit:
            try:
                self.commit_offsets(raise_errors=False)
            except SparkMQError as exc:
                log.warning("final offset commit of %s failed: %s", self.group, exc)
        self._before_leave()
        self._rebalance.drop_all()
        if not self._manual:
            for addr in self._broker_addrs():
                try:
                    self._brokers.get(addr).unregister(self.client_id, consumer_groups=[self.group])
                except SparkMQError as exc:
                    log.debug("unregistering %s from %s failed: %s", self.client_id, addr, exc)
        self._stop_loop()
        self._brokers.close()
        self._namesrv.close()
        with self._state_lock:
            self._state = "stopped"

    def _before_leave(self) -> None:  # noqa: B027 - optional hook
        """Subclass hook, run after the final commit and before the queues are dropped (release locks)."""

    # -- the event loop ---------------------------------------------------------------------------
    def _start_loop(self) -> None:
        # The process-wide remoting loop (uvloop), the one producers and admin clients use: a process
        # that publishes and consumes hands the GIL between fewer threads (e2e latency), and every
        # connection is served by one thread.
        loop_thread = self._loop_thread = LoopThread.acquire()
        self._loop = loop_thread.loop
        self._on_loop = True

        async def make_client() -> AsyncBrokerRouter:
            return AsyncBrokerRouter(self.config.request_timeout_s, remoting=self.config.transport == "remoting",
                                     credentials=self.config.credentials, tls=self.config.tls_settings)

        self._async = self._run_on_loop(make_client()).result(timeout=10)

    def _stop_loop(self) -> None:
        """Close this consumer's part of the shared loop: its pulls and watchers, its pending callbacks and
        timers, its broker connections; then let go of the loop."""
        loop_thread, self._loop_thread = self._loop_thread, None
        if loop_thread is None:
            return

        async def close() -> None:
            self._on_loop = False
            await self._cancel_all_pulls()
            if self._async is not None:
                await self._async.aclose()

        try:
            if loop_thread.running and not loop_thread.in_loop_thread:
                loop_thread.run(close(), timeout=30)
            else:
                self._on_loop = False
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.warning("closing the connections of %s failed: %r", self.group, exc)
        finally:
            LoopThread.release()

    def _run_on_loop(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call_on_loop(self, fn: Any, *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._if_on_loop, fn, *args)
            except RuntimeError:  # the loop closed in between: nothing left to start or stop
                pass

    def _if_on_loop(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` unless this consumer's part of the loop was closed meanwhile."""
        if self._on_loop:
            fn(*args)

    async def _cancel_all_pulls(self) -> None:
        tasks = list(self._pull_tasks.values()) + list(self._watchers.values())
        self._pull_tasks.clear()
        self._watchers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- pulling -----------------------------------------------------------------------------------
    def _new_process_queue(self, mq: MessageQueue, offset: int) -> ProcessQueue:
        cfg = self.config
        return ProcessQueue(mq, offset, max_messages=cfg.flow_control_max_messages,
                            max_bytes=cfg.flow_control_max_bytes, max_span=cfg.max_offset_span)

    def _start_pulling(self, pq: ProcessQueue) -> None:
        def start() -> None:
            if self._state in ("running", "starting") and not pq.dropped:
                assert self._loop is not None
                task = self._loop.create_task(self._pull_loop(pq), name=f"pull-{pq.mq.topic}@{pq.mq.key}")
                self._pull_tasks[pq] = task

                def forget(t: asyncio.Task[None]) -> None:
                    if self._pull_tasks.get(pq) is t:
                        del self._pull_tasks[pq]
                task.add_done_callback(forget)
        self._call_on_loop(start)

    def _stop_pulling(self, pq: ProcessQueue) -> None:
        def stop() -> None:
            task = self._pull_tasks.pop(pq, None)
            if task is not None:
                task.cancel()
        self._call_on_loop(stop)

    def _subscription_for(self, topic: str) -> Subscription:
        return self._subscriptions.get(topic) or Subscription(topic, "*", None)

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        """Long-poll one queue until it is dropped: flow control, pull, tag re-check, hand over."""
        cfg = self.config
        mq = pq.mq
        assert self._async is not None
        flow_logged = 0.0
        while not pq.dropped:
            own = pq.flow_control_reason()
            reason = own or self._extra_flow_control(pq)
            if reason is not None:
                pq.flow_control_times += 1
                if time.monotonic() - flow_logged > 10:
                    log.info("flow control on %s@%s (%s): %d messages, %d bytes, span %d", mq.topic, mq.key, reason,
                             pq.msg_count, pq.msg_bytes, pq.offset_span())
                    flow_logged = time.monotonic()
                if own is not None:  # woken as soon as consumption makes room, not a whole back-off later
                    await pq.wait_for_room(cfg.flow_control_backoff_s)
                else:
                    await asyncio.sleep(cfg.flow_control_backoff_s)
                continue
            route = self._routes.cached(mq.topic)
            addr = route.read_addr(mq.broker_name) if route is not None else None
            if route is None or addr is None:
                await asyncio.sleep(cfg.pull_error_backoff_s)
                continue
            sub = self._subscription_for(mq.topic)
            offset = pq.next_offset
            begin = time.monotonic()
            try:
                result = await self._async.pull(
                    addr, mq.topic, mq.queue_id, offset, cfg.pull_batch_size,
                    tags=sub.expression if sub.filter_type == "TAG" else "*",
                    wait_ms=route.read_wait_ms(mq.broker_name, addr, cfg.long_poll_wait_ms),
                    timeout=cfg.pull_timeout_s, group=self.group,
                    client_id=self.client_id, arrow=cfg.pull_format == "arrow", filter_type=sub.filter_type,
                    expression=sub.expression, broker_name=mq.broker_name)
            except SparkMQError as exc:
                log.debug("pull of %s@%s at %d failed: %s", mq.topic, mq.key, offset, exc)
                if isinstance(exc, RemotingError) and not exc.timed_out:
                    mark_unreachable(addr, UNREACHABLE_PASS_OVER_S)  # read from a slave meanwhile
                await asyncio.sleep(cfg.pull_error_backoff_s)
                continue
            if pq.dropped:
                break
            if result.status == FOUND:
                kept = [m for m in result.messages if sub.matches(m.tags)]
                pq.on_pulled(kept, result.next_offset)
                if kept:
                    self._on_pulled(pq, kept)
                continue
            if result.status == OFFSET_RESET:
                log.info("%s: the offset of %s@%s was reset to %d (pulling at %d); restarting there", self.group,
                         mq.topic, mq.key, result.next_offset, offset)
                self._restart_at(mq, result.next_offset)
                break  # this process queue is dropped: a new one pulls from the reset offset
            if result.status in (OFFSET_TOO_SMALL, OFFSET_OVERFLOW):
                log.warning("%s@%s: offset %d is %s; moving to %d", mq.topic, mq.key, offset, result.status,
                            result.next_offset)
            pq.on_pulled([], result.next_offset)
            if result.status not in (NO_NEW_MSG, NO_MATCHED_MSG) or (
                    result.next_offset == offset and time.monotonic() - begin < 0.05):
                # Nothing held the request (no such queue yet, or a broker that does not long-poll):
                # do not spin on it.
                await asyncio.sleep(cfg.flow_control_backoff_s * 2)

    def _extra_flow_control(self, pq: ProcessQueue) -> str | None:
        """Subclass hook: a reason to hold pulls beyond the process queue's own limits."""
        return None

    @abstractmethod
    def _on_pulled(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        """Called on the loop thread with a pull's messages (already in ``pq``)."""

    # -- membership change notices ------------------------------------------------------------------
    def _sync_watchers(self) -> None:
        if self._manual or self.message_model is MessageModel.BROADCASTING:
            return
        wanted = set(self._broker_addrs(masters_only=True))

        def sync() -> None:
            for addr in list(self._watchers):
                if addr not in wanted:
                    self._watchers.pop(addr).cancel()
            for addr in wanted - set(self._watchers):
                assert self._loop is not None
                self._watchers[addr] = self._loop.create_task(self._watch_changes(addr), name=f"changes-{addr}")
        self._call_on_loop(sync)

    async def _watch_changes(self, addr: str) -> None:
        """Long-poll ``/consumers/{group}/changes`` on one broker; trigger a rebalance when the version moves."""
        cfg = self.config
        assert self._async is not None
        # Unknown version: ask with 0 and take the answer as the baseline (no rebalance for it).
        version: int | None = self._versions.get(addr)
        delays = RetryDelays(Backoff(cfg.pull_error_backoff_s, max(cfg.pull_error_backoff_s, _WATCH_BACKOFF_MAX_S)))
        while True:
            try:
                answer = await self._async.group_changes(addr, self.group, 0 if version is None else version,
                                                         cfg.change_wait_ms, cfg.change_timeout_s)
            except SparkMQError as exc:
                log.debug("membership watch on %s failed: %s", addr, exc)
                await asyncio.sleep(delays.next_s())
                continue
            delays.reset()
            new = int(answer.get("version", 0))
            if version is not None and new != version:
                log.info("group %s membership changed on %s (version %d -> %d); rebalancing", self.group, addr,
                         version, new)
                # The version also moves when an admin resets the group's offsets: look at them first.
                self._offsets_check_due = True
                self._scheduler.trigger("rebalance")
            version = new

    # -- periodic work ---------------------------------------------------------------------------------
    def _topics(self) -> list[str]:
        topics = set(self._subscriptions)
        topics.update(mq.topic for mq in self._rebalance.assignment())
        fixed = self._rebalance.fixed_assignment
        if fixed is not None:
            topics.update(mq.topic for mq in fixed)
        return sorted(topics)

    def _master_addr(self, mq: MessageQueue) -> str | None:
        route = self._routes.cached(mq.topic)
        if route is None:
            try:
                route = self._routes.get(mq.topic)
            except SparkMQError:
                return None
        return route.master_addr(mq.broker_name)

    def _broker_addrs(self, *, masters_only: bool = False) -> list[str]:
        addrs: set[str] = set()
        for topic in self._topics():
            route = self._routes.cached(topic)
            if route is not None:
                addrs.update(route.master_addrs() if masters_only else route.all_addrs())
        return sorted(addrs)

    def _refresh_routes(self) -> None:
        before = {t: r.read_queues if (r := self._routes.cached(t)) else None for t in self._topics()}
        for topic in before:
            try:
                self._routes.refresh(topic)
            except SparkMQError as exc:
                log.debug("route refresh of %s failed: %s", topic, exc)
        after = {t: r.read_queues if (r := self._routes.cached(t)) else None for t in before}
        if before != after:
            # A broker came or went: rebalance now rather than at the next period.
            self._scheduler.trigger("rebalance")
            self._scheduler.trigger("heartbeat")

    def heartbeat_body(self) -> dict[str, Any]:
        """The ``POST /clients/heartbeat`` body: this client, its group, model, subscriptions and held queues."""
        return {"client_id": self.client_id, "producer_groups": [], "consumers": [{
            "group": self.group, "consume_type": self.consume_type, "message_model": self.message_model.value,
            "consume_from_where": self.consume_from_where.value,
            "subscriptions": [s.to_dict() for _, s in sorted(self._subscriptions.items())],
            "held_queues": [held_queue_key(q.topic, q.broker_name, q.queue_id)
                            for q in self._rebalance.assignment()]}]}

    def send_heartbeats(self) -> None:
        """Heartbeat every broker serving the subscribed topics (done every ``heartbeat_interval_s``)."""
        if self._manual:
            return
        for topic in self._topics():
            if self._routes.cached(topic) is None:
                try:
                    self._routes.get(topic)
                except SparkMQError:
                    continue
        body = self.heartbeat_body()
        for addr in self._broker_addrs():
            try:
                answer = self._brokers.get(addr).heartbeat(body)
                version = ((answer.get("groups") or {}).get(self.group) or {}).get("version")
                if isinstance(version, int) and addr not in self._versions:
                    self._versions[addr] = version
            except SparkMQError as exc:
                log.debug("heartbeat of %s to %s failed: %s", self.client_id, addr, exc)
        self._sync_watchers()

    def running_info(self) -> bytes:
        """This consumer's GET_CONSUMER_RUNNING_INFO answer (RocketMQ's ConsumerRunningInfo JSON): its settings,
        subscriptions and each held queue's state, as ``mqadmin consumerStatus`` shows them."""
        now_ms = int(time.time() * 1000)
        mono = time.monotonic()
        props = {p.PROP_NAMESERVER_ADDR: ";".join(self.config.namesrv_addrs),
                 p.PROP_CONSUME_TYPE: p.CONSUME_TYPE_NAMES[str(self.consume_type)],
                 p.PROP_CONSUME_ORDERLY: str(getattr(self, "_orderly_listener", None) is not None).lower(),
                 p.PROP_CLIENT_VERSION: str(p.CLIENT_VERSION), "messageModel": self.message_model.value,
                 "consumeFromWhere": self.consume_from_where.value, "consumerGroup": self.group}
        subs = [p.SubscriptionDataBody(s.topic, s.expression, expressionType=s.filter_type or "TAG")
                for _, s in sorted(self._subscriptions.items())]
        queues = []
        for mq, pq in sorted(self._rebalance.process_queues().items()):
            offsets = pq.in_flight_offsets()
            queues.append((p.MessageQueueData(mq.topic, mq.broker_name, mq.queue_id), p.ProcessQueueInfo(
                pq.commit_offset(), offsets[0] if offsets else 0, offsets[-1] if offsets else 0, len(offsets),
                pq.msg_bytes // (1 << 20), droped=pq.dropped,
                lastPullTimestamp=now_ms - int((mono - pq.last_pull_time) * 1000),
                lastConsumeTimestamp=now_ms - int((mono - pq.last_consume_time) * 1000))))
        return p.consumer_running_info(props, subs, queues)

    def rebalance(self) -> bool:
        """Rebalance now (also done every ``rebalance_interval_s`` and on membership notices); whether it changed."""
        if self._state != "running":
            return False
        if self._offsets_check_due:
            self._offsets_check_due = False
            self.pickup_offset_reset()
        changed = self._rebalance.rebalance()
        if changed:
            log.info("%s of %s holds %s", self.client_id, self.group,
                     [f"{q.topic}@{q.key}" for q in self._rebalance.assignment()])
            self._scheduler.trigger("heartbeat")  # the brokers show who holds what: tell them now, not in 30 s
        return changed

    def pickup_offset_reset(self) -> list[MessageQueue]:
        """Restart every held queue whose committed offset on the broker is not the one this consumer committed
        last -- an admin reset it (``POST /consumers/{group}/offsets/reset``) -- at that offset, forgetting the
        in-memory progress of the queue.  Called when the group's version moves; returns the queues restarted.
        """
        if self.message_model is MessageModel.BROADCASTING or self._manual:
            return []
        moved: list[MessageQueue] = []
        for mq, pq in sorted(self._rebalance.process_queues().items()):
            if pq.dropped:
                continue
            addr = self._master_addr(mq)
            if addr is None:
                continue
            try:
                stored = self._brokers.get(addr).query_offset(self.group, mq.topic, mq.queue_id)
            except SparkMQError as exc:
                log.debug("offset of %s@%s not readable: %s", mq.topic, mq.key, exc)
                continue
            mine = self.offset_store.committed(mq)
            if stored < 0 or mine is None or stored == mine:
                continue
            log.info("%s: the offset of %s@%s was reset to %d (last committed here %d); restarting there",
                     self.group, mq.topic, mq.key, stored, mine)
            if self._restart_at(mq, stored):
                moved.append(mq)
        return moved

    def _on_pushed_reset(self, notice: OffsetReset) -> None:
        """A broker pushed an offset reset of this group: restart the held queues it names there at once."""
        if self.message_model is MessageModel.BROADCASTING:
            return  # broadcasting members keep their own offsets

        def restart() -> None:
            held = set(self._rebalance.process_queues())
            for queue_id, offset in notice.offsets.items():
                mq = MessageQueue(notice.topic, notice.broker_name, int(queue_id))
                if mq in held:
                    log.info("%s: the offset of %s@%s was reset to %d; restarting there", self.group, mq.topic,
                             mq.key, offset)
                    self._restart_at(mq, int(offset))
        self._call_on_loop(restart)

    def _restart_at(self, mq: MessageQueue, offset: int) -> bool:
        """Restart the held queue ``mq`` at a reset ``offset``, forgetting its in-memory progress; whether it was
        still held (a rebalance may have taken it meanwhile)."""
        try:
            self._rebalance.replace(mq, offset)
        except SparkMQError:  # no longer ours: its next owner reads the reset offset
            return False
        self.offset_store.mark_committed(mq, offset)
        self._on_reset(mq)
        return True

    def _on_reset(self, mq: MessageQueue) -> None:  # noqa: B027 - optional hook
        """Subclass hook: ``mq`` was restarted at a reset offset."""

    def commit_offsets(self, *, raise_errors: bool = False) -> dict[MessageQueue, int]:
        """Commit the smallest unfinished offset of every held queue now; the offsets committed (all held)."""
        pqs = self._rebalance.process_queues()
        offsets = {}
        for mq, pq in pqs.items():
            if not pq.dropped:
                offsets[mq] = pq.commit_offset()
                self.offset_store.update(mq, offsets[mq])
        self.offset_store.persist_all(list(offsets), raise_errors=raise_errors)
        return offsets

    def _commit_quietly(self) -> None:
        self.commit_offsets(raise_errors=False)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until the scheduler has no pending work (a triggered rebalance done); for tests and scripts."""
        return self._scheduler.wait_idle(timeout_s)

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The read queues of ``topic`` (fetching its route if needed), sorted."""
        return list(self._routes.get(topic).read_queues)

    def _held(self, mqs: Sequence[MessageQueue]) -> None:
        held = set(self._rebalance.assignment())
        missing = [f"{q.topic}@{q.key}" for q in mqs if q not in held]
        if missing:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"not assigned to this consumer: {missing}")
