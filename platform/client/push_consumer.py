"""The push consumer: pulls in the background and hands messages to a listener on a thread pool.

**Concurrent consumption** (RocketMQ's ``MessageListenerConcurrently``, :meth:`PushConsumer.register_listener`):
messages of one queue may be consumed by several threads at once, so they finish out of order; the
offset committed every 5 s is the smallest one still unfinished (:mod:`.process_queue`).

**A message the listener refuses** (it returns ``RECONSUME_LATER``, returns nothing, or raises) is,
in clustering mode, sent back to the broker (:meth:`PushConsumer.send_message_back`,
``POST /consumers/{group}/send-back`` with the failure as the reason): the broker redelivers it
through ``%RETRY%<group>`` after delay level 3 + its reconsume count, and after
``max_reconsume_times`` (16) moves it to ``%DLQ%<group>``.  Every clustering consumer subscribes to
its group's retry topic by itself; a message read from it is shown to the listener with its
original topic (property ``RETRY_TOPIC``) and its reconsume count.  Only when the send-back fails
(broker unreachable) is the message **redelivered locally**: it stays unfinished in its process
queue (so the committed offset cannot pass it), its ``reconsume_times`` goes up by one, and it is
handed to the listener again after ``reconsume_delay_s`` (RocketMQ's ``submitConsumeRequestLater``).
In broadcasting mode a refused message is dropped with a warning (broadcast messages are not retried).

**Orderly consumption** (``MessageListenerOrderly``, :meth:`PushConsumer.register_listener_orderly`):
in clustering mode each queue is locked on its broker before it is taken (``POST /locks/lock``,
renewed every ``lock_interval_s`` = 20 s; a lock not renewed for ``client_lock_expiry_s`` = 30 s
counts as lost here, the broker's expires after 60 s) and a queue is only pulled while the lock is
held.  One thread at a time consumes a queue, in offset order; ``SUSPEND_CURRENT_QUEUE_A_MOMENT``
(or an exception) retries the same messages after ``suspend_current_queue_time_ms`` without moving
the offset, each suspension counting as a reconsume.  As in RocketMQ, that goes on without end
unless ``max_reconsume_times`` is given: then a clustering consumer sends a message suspended that
many times to ``%DLQ%<group>`` and the queue moves on.  A queue taken away is committed, then
unlocked, so the next owner starts where this one stopped.

Example::

    consumer = PushConsumer("cg", ClientConfig(namesrv_addrs="127.0.0.1:9876"))
    consumer.subscribe("orders", "TagA || TagB")
    consumer.register_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()
    ...
    consumer.shutdown()
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from ..common.errors import ErrorCode, SparkMQError
from ..common.system_topics import retry_topic
from ..common.trace import TraceEvent
from ..common.validation import MillisOrZero, Seconds, check, check_int
from ..common.wire import ReceivedMessage
from .allocation import DEFAULT_STRATEGY, AllocateStrategy, MessageQueue
from .config import ClientConfig
from .consumer_base import ConsumerBase
from .process_queue import ProcessQueue
from .rebalance import ConsumeFromWhere, MessageModel, Subscription
from .trace import TraceDispatcher

__all__ = ["PushConsumer", "ConsumeStatus", "ConsumeOrderlyStatus", "MessageListener", "OrderlyMessageListener",
           "DEFAULT_MAX_RECONSUME_TIMES"]

log = logging.getLogger("sparkmq.client")

#: Sends back before a message goes to the DLQ (RocketMQ's maxReconsumeTimes).
DEFAULT_MAX_RECONSUME_TIMES = 16


class ConsumeStatus(StrEnum):
    """What a listener says about the messages it was given."""

    #: Consumed: the messages are finished.
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    #: Not consumed: deliver them again later.
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(StrEnum):
    """What an orderly listener says about the messages it was given."""

    #: Consumed: move on to the next messages of the queue.
    SUCCESS = "SUCCESS"
    #: Not consumed: pause this queue a moment and hand the same messages again.
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


#: ``listener(messages) -> ConsumeStatus``; at most ``consume_batch_size`` messages of one queue per call.
MessageListener = Callable[[list[ReceivedMessage]], ConsumeStatus]
#: ``listener(messages) -> ConsumeOrderlyStatus``; messages of one queue, in offset order, one call at a time.
OrderlyMessageListener = Callable[[list[ReceivedMessage]], ConsumeOrderlyStatus]


class PushConsumer(ConsumerBase):
    """A consumer of one group that calls a listener for every message of its subscriptions.

    Args:
        group: the consumer group.
        config: client settings (name servers, intervals, pool size, flow control).
        message_model: ``"CLUSTERING"`` (default; each message to one member) or ``"BROADCASTING"``.
        allocate_strategy: ``"averagely"`` (default), ``"averagely-by-circle"``, ``"consistent-hash"``
            (any case, ``_`` or ``-``) or an :class:`AllocateStrategy`.
        consume_from_where: start of a group with no committed offset: ``CONSUME_FROM_LAST_OFFSET``
            (default), ``CONSUME_FROM_FIRST_OFFSET`` or ``CONSUME_FROM_TIMESTAMP``
            (``config.consume_timestamp_ms``, default now - 30 min).
        max_reconsume_times: send-backs of a message before the broker moves it to ``%DLQ%<group>``
            (default 16); orderly: suspensions of a message before it goes to the DLQ (default: none,
            it is retried in place without end, as RocketMQ does).
        suspend_current_queue_time_ms: orderly: pause of a queue whose listener asked to suspend (1000).
        lock_interval_s: orderly: renew the broker locks of the held queues this often (20).
        client_lock_expiry_s: orderly: a lock not renewed for this long counts as lost (30).
    """

    consume_type = "PUSH"

    def __init__(self, group: str, config: ClientConfig, message_model: str | MessageModel = MessageModel.CLUSTERING,
                 allocate_strategy: str | AllocateStrategy = DEFAULT_STRATEGY,
                 consume_from_where: str | ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, *,
                 max_reconsume_times: int | None = None, suspend_current_queue_time_ms: int = 1000,
                 lock_interval_s: float = 20.0, client_lock_expiry_s: float = 30.0) -> None:
        super().__init__(group, config, message_model=message_model, allocate_strategy=allocate_strategy,
                         consume_from_where=consume_from_where)
        if max_reconsume_times is not None:
            check_int("max_reconsume_times", max_reconsume_times, 0)
        check("suspend_current_queue_time_ms", suspend_current_queue_time_ms, MillisOrZero)
        check("lock_interval_s", lock_interval_s, Seconds)
        check("client_lock_expiry_s", client_lock_expiry_s, Seconds)
        self.max_reconsume_times = DEFAULT_MAX_RECONSUME_TIMES if max_reconsume_times is None else max_reconsume_times
        #: Orderly: suspensions before the DLQ (None: retried in place without end).
        self.orderly_max_reconsume_times = max_reconsume_times
        self.suspend_current_queue_time_ms = suspend_current_queue_time_ms
        self.lock_interval_s = lock_interval_s
        self.client_lock_expiry_s = client_lock_expiry_s
        self._listener: MessageListener | None = None
        self._orderly_listener: OrderlyMessageListener | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: Chunks waiting for a consume thread, and how many workers drain them (see :meth:`_submit`).
        self._work: collections.deque[tuple[ProcessQueue, list[ReceivedMessage]]] = collections.deque()
        self._workers = 0
        self._busy = 0
        self._workers_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._stats = {"consumed": 0, "failed": 0, "redelivered": 0, "dropped": 0, "sent_back": 0, "dlq": 0,
                       "suspended": 0}
        self._stopping = threading.Event()
        # Orderly state: queues with a consume task queued or running (one per queue at a time), and the
        # monotonic time each queue's broker lock was last obtained or renewed.
        self._orderly_guard = threading.Lock()
        self._orderly_running: set[ProcessQueue] = set()
        self._lock_times: dict[MessageQueue, float] = {}
        #: ``consume`` trace events, posted in batches to the broker each message came from.
        self._tracer = TraceDispatcher(self._brokers, f"consumer-{group}") if config.trace_enabled else None

    def register_listener(self, listener: MessageListener) -> None:
        """Set the function called with each batch of messages; it returns a :class:`ConsumeStatus`."""
        if not callable(listener):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the listener must be callable")
        self._listener = listener
        self._orderly_listener = None

    def register_listener_orderly(self, listener: OrderlyMessageListener) -> None:
        """Consume orderly: ``listener`` gets each queue's messages in offset order, one call per queue at a time,
        and returns a :class:`ConsumeOrderlyStatus` (see the module docstring)."""
        if not callable(listener):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the listener must be callable")
        self._orderly_listener = listener
        self._listener = None

    @property
    def orderly(self) -> bool:
        """Whether an orderly listener is registered."""
        return self._orderly_listener is not None

    @property
    def _needs_locks(self) -> bool:
        return self.orderly and self.message_model is MessageModel.CLUSTERING

    def start(self) -> PushConsumer:
        """Join the group, take a share of the queues and start consuming; returns self.

        The first rebalance is done before this returns, so :meth:`assignment` is already filled in
        (as far as the brokers already know the other members).
        """
        if self._listener is None and self._orderly_listener is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "register_listener() before start()")
        if not self._subscriptions:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "subscribe() to at least one topic before start()")
        if self.message_model is MessageModel.CLUSTERING and not self.orderly:
            # Failed messages come back through the group's retry topic (an orderly consumer retries in place).
            topic = retry_topic(self.group)
            self._subscriptions.setdefault(topic, Subscription(topic, "*", None))
        if self._needs_locks:
            self._rebalance.before_add = self._lock_one
            self._rebalance.after_remove = self._release_dropped
            self._scheduler.every("lock", self.lock_interval_s, self.lock_all, initial_delay_s=self.lock_interval_s)
        self._executor = concurrent.futures.ThreadPoolExecutor(self.config.consume_threads,
                                                               thread_name_prefix=f"sparkmq-consume-{self.group}")
        try:
            self._start_base()
        except BaseException:
            self._executor.shutdown(wait=False, cancel_futures=True)
            raise
        if self._tracer is not None:
            self._tracer.start()
        return self

    def shutdown(self) -> None:
        """Stop pulling, let running listener calls finish (queued ones are abandoned, not committed),
        commit offsets, release queue locks, leave the group and close connections.

        Call it from outside the listener: it waits for running listener calls to return.
        """
        self._stopping.set()

        def drain() -> None:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
            if self._tracer is not None:
                self._tracer.shutdown()  # the listeners are done: post their last events
        self._shutdown_base(before_commit=drain)

    def __enter__(self) -> PushConsumer:
        return self.start() if self._state == "created" else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages ``consumed``, listener ``failed`` messages, ``sent_back`` to the broker (of which
        ``dlq`` went to the dead-letter queue), ``redelivered`` (locally), ``dropped`` (broadcasting),
        ``suspended`` (orderly listener calls that asked to suspend)."""
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, key: str, n: int) -> None:
        with self._stats_lock:
            self._stats[key] += n

    # -- consumption -----------------------------------------------------------------------------
    def _on_pulled(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        for msg in messages:
            msg.restore_retry_origin()
        if self._orderly_listener is not None:
            self._schedule_orderly(pq)
            return
        self._submit(pq, messages)

    def _submit(self, pq: ProcessQueue, messages: list[ReceivedMessage]) -> None:
        # Chunks of ``consume_batch_size`` go to one shared work queue that up to ``consume_threads`` workers
        # drain: each chunk is its own unit (a slow message holds up only its worker, as in RocketMQ), but a
        # task is submitted only when a worker is missing, not once per message.
        if self._executor is None or pq.dropped:
            return
        size = self.config.consume_batch_size
        work = self._work
        for i in range(0, len(messages), size):
            work.append((pq, messages[i:i + size]))
        with self._workers_lock:
            # Workers busy in a listener cannot take new chunks: count them with the waiting work.
            missing = min(len(work) + self._busy, self.config.consume_threads) - self._workers
            self._workers += max(0, missing)
        for _ in range(missing):
            try:
                self._executor.submit(self._drain_work)
            except RuntimeError:  # shutting down: the messages stay unfinished and are not committed
                with self._workers_lock:
                    self._workers -= 1

    def _drain_work(self) -> None:
        work = self._work
        while True:
            try:
                pq, chunk = work.popleft()
            except IndexError:
                with self._workers_lock:
                    if not work:  # re-checked under the lock: a submit in between counted on this worker
                        self._workers -= 1
                        return
                continue
            with self._workers_lock:
                self._busy += 1
            try:
                self._consume(pq, chunk)
            finally:
                with self._workers_lock:
                    self._busy -= 1

    def _consume(self, pq: ProcessQueue, batch: list[ReceivedMessage]) -> None:
        if pq.dropped:  # the queue moved to another member, which will deliver these
            return
        assert self._listener is not None
        reason = "RECONSUME_LATER"
        began_ms, began = int(time.time() * 1000), time.monotonic()
        try:
            status = self._listener(list(batch))
        except Exception as exc:
            log.exception("listener of %s failed on %d messages of %s@%s; reconsuming later", self.group,
                          len(batch), pq.mq.topic, pq.mq.key)
            status, reason = ConsumeStatus.RECONSUME_LATER, f"{type(exc).__name__}: {exc}"
        if status != ConsumeStatus.CONSUME_SUCCESS:  # a StrEnum: its name (a str) is equal too
            if status is None:
                log.warning("listener of %s returned None; treating it as RECONSUME_LATER", self.group)
            self._trace_consume(batch, ConsumeStatus.RECONSUME_LATER.value, began_ms, began, reason)
            self._on_failure(pq, batch, reason)
            return
        self._trace_consume(batch, ConsumeStatus.CONSUME_SUCCESS.value, began_ms, began)
        pq.remove(batch)
        self._count("consumed", len(batch))

    def _trace_consume(self, batch: list[ReceivedMessage], status: str, began_ms: int, began: float,
                       detail: str | None = None) -> None:
        """One ``consume`` trace event per message: the listener's verdict, its cost and the attempt number."""
        if self._tracer is None:
            return
        cost_ms = int((time.monotonic() - began) * 1000)
        for m in batch:
            if not m.msg_id:
                continue
            addr = self._master_addr(MessageQueue(m.topic, m.broker_name, m.queue_id))
            self._tracer.record(addr, TraceEvent(
                m.msg_id, m.topic, "consume", status, began_ms, group=self.group, client_id=self.client_id,
                cost_ms=cost_ms, born_ts=m.born_timestamp or None, store_ts=m.store_timestamp or None,
                broker=m.broker_name, queue_id=m.queue_id, queue_offset=m.queue_offset,
                reconsume_times=m.reconsume_times, tags=m.tags, keys=" ".join(m.keys) or None,
                detail=None if detail is None else detail[:1000]))

    def _on_failure(self, pq: ProcessQueue, batch: list[ReceivedMessage], reason: str = "RECONSUME_LATER") -> None:
        self._count("failed", len(batch))
        if self.message_model is MessageModel.BROADCASTING:
            log.warning("broadcast consumer %s dropped %d refused messages (not retried)", self.group, len(batch))
            pq.remove(batch)
            self._count("dropped", len(batch))
            return
        sent_back = [m for m in batch if self.send_message_back(m, reason)]
        if sent_back:
            pq.remove(sent_back)
        later = [m for m in batch if m not in sent_back]
        if not later:
            return
        for msg in later:
            msg.reconsume_times += 1
        self._count("redelivered", len(later))
        self._later(self.config.reconsume_delay_s, self._submit, pq, later)

    def _later(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(loop.call_later, delay_s, self._if_on_loop, fn, *args)
        except RuntimeError:  # stopping: they stay unfinished, so the next owner gets them
            pass

    def send_message_back(self, msg: ReceivedMessage, reason: str = "RECONSUME_LATER", *,
                          to_dlq: bool = False) -> bool:
        """Hand a refused message to the broker's retry path (or with ``to_dlq`` straight to the DLQ); whether
        it took it.

        ``POST /consumers/{group}/send-back`` on the master of the message's broker, with delay level 0
        (the broker's schedule: level 3 + reconsume count; -1 with ``to_dlq``) and this consumer's
        ``max_reconsume_times``; the broker answers RETRY (back through ``%RETRY%<group>``) or DLQ.
        False when the broker cannot be reached or refuses, so the caller redelivers locally instead.
        Subclasses may override it.
        """
        addr = self._master_addr(MessageQueue(msg.topic, msg.broker_name, msg.queue_id))
        if addr is None:
            return False
        try:
            answer = self._brokers.get(addr).send_back(self.group, msg.offset_msg_id, delay_level=-1 if to_dlq else 0,
                                                       reason=reason[:1000],
                                                       max_reconsume_times=self.max_reconsume_times,
                                                       msg_id=msg.msg_id or None, origin_topic=msg.topic)
        except SparkMQError as exc:
            log.warning("send-back of %s to %s failed (%s); redelivering locally", msg.msg_id, addr, exc)
            return False
        self._count("sent_back", 1)
        if answer.get("status") == "DLQ":
            self._count("dlq", 1)
            log.warning("message %s of %s reached its max reconsume times; the broker moved it to the DLQ",
                        msg.msg_id, self.group)
        return True

    # -- orderly consumption -----------------------------------------------------------------------
    def _schedule_orderly(self, pq: ProcessQueue) -> None:
        if self._executor is None or pq.dropped or self._stopping.is_set():
            return
        with self._orderly_guard:
            if pq in self._orderly_running:
                return  # the running task picks the new messages up
            self._orderly_running.add(pq)
        try:
            self._executor.submit(self._consume_orderly, pq)
        except RuntimeError:  # shutting down
            with self._orderly_guard:
                self._orderly_running.discard(pq)

    def _consume_orderly(self, pq: ProcessQueue) -> None:
        assert self._orderly_listener is not None
        retry_in = 0.0
        try:
            while not pq.dropped and not self._stopping.is_set():
                if self._needs_locks and not self.lock_held(pq.mq):
                    retry_in = 0.1  # the lock job (or the next rebalance) renews it
                    return
                batch = pq.head(self.config.consume_batch_size)
                if not batch:
                    return
                began_ms, began = int(time.time() * 1000), time.monotonic()
                try:
                    status = self._orderly_listener(list(batch))
                except Exception:
                    log.exception("orderly listener of %s failed on %s@%s; suspending the queue", self.group,
                                  pq.mq.topic, pq.mq.key)
                    status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                self._trace_consume(batch, ConsumeOrderlyStatus.SUCCESS.value
                                    if status == ConsumeOrderlyStatus.SUCCESS.value
                                    else ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT.value, began_ms, began)
                if status == ConsumeOrderlyStatus.SUCCESS.value:
                    pq.remove(batch)
                    self._count("consumed", len(batch))
                    continue
                self._count("suspended", 1)
                if self._orderly_dead_letters(batch):
                    pq.remove(batch)  # every message of the batch is in the DLQ: the queue moves on
                    continue
                # Same messages again after the pause; the offset does not move meanwhile.
                self._stopping.wait(self.suspend_current_queue_time_ms / 1000)
        finally:
            with self._orderly_guard:
                self._orderly_running.discard(pq)
            if not pq.dropped and not self._stopping.is_set() and pq.msg_count:
                if retry_in:
                    self._later(retry_in, self._schedule_orderly, pq)
                else:
                    self._schedule_orderly(pq)

    def _orderly_dead_letters(self, batch: list[ReceivedMessage]) -> bool:
        """After a suspension: each message suspended ``max_reconsume_times`` times goes to the DLQ, the
        others count one more reconsume.  Whether none is left to retry (RocketMQ's checkReconsumeTimes)."""
        limit = self.orderly_max_reconsume_times
        retry = False
        for msg in batch:
            if limit is not None and msg.reconsume_times >= limit and self.message_model is MessageModel.CLUSTERING \
                    and self.send_message_back(msg, f"suspended {msg.reconsume_times + 1} times (orderly)",
                                               to_dlq=True):
                continue
            msg.reconsume_times += 1
            retry = True
        return not retry

    def lock_held(self, mq: MessageQueue) -> bool:
        """Orderly: whether this consumer holds ``mq``'s broker lock (renewed within ``client_lock_expiry_s``)."""
        t = self._lock_times.get(mq)
        return t is not None and time.monotonic() - t < self.client_lock_expiry_s

    def _extra_flow_control(self, pq: ProcessQueue) -> str | None:
        # Orderly clustering: never pull a queue the broker has not locked for us.
        if self._needs_locks and not self.lock_held(pq.mq):
            return "not locked"
        return None

    def _lock_one(self, mq: MessageQueue) -> bool:
        addr = self._master_addr(mq)
        if addr is None:
            return False
        begin = time.monotonic()
        try:
            locked = self._brokers.get(addr).lock_queues(self.group, self.client_id, [(mq.topic, mq.queue_id)],
                                                         mq.broker_name)
        except SparkMQError as exc:
            log.info("locking %s@%s failed: %s", mq.topic, mq.key, exc)
            return False
        if (mq.topic, mq.queue_id) in locked:
            self._lock_times[mq] = begin
            return True
        self._lock_times.pop(mq, None)
        return False

    def lock_all(self) -> None:
        """Orderly: lock (renew) every held queue on its broker, one request per broker (every ``lock_interval_s``)."""
        by_addr: dict[str, list[MessageQueue]] = {}
        for mq in self._rebalance.assignment():
            addr = self._master_addr(mq)
            if addr is not None:
                by_addr.setdefault(addr, []).append(mq)
        for addr, mqs in by_addr.items():
            begin = time.monotonic()
            try:
                locked = self._brokers.get(addr).lock_queues(self.group, self.client_id,
                                                             [(q.topic, q.queue_id) for q in mqs], mqs[0].broker_name)
            except SparkMQError as exc:
                log.info("renewing the locks on %s failed: %s", addr, exc)
                continue
            for mq in mqs:
                if (mq.topic, mq.queue_id) in locked:
                    self._lock_times[mq] = begin
                elif self._lock_times.pop(mq, None) is not None:
                    log.warning("%s lost the lock of %s@%s", self.client_id, mq.topic, mq.key)

    def _release_dropped(self, pq: ProcessQueue) -> None:
        """A queue was taken away: let its running listener call finish, commit again, then unlock it."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            with self._orderly_guard:
                if pq not in self._orderly_running:
                    break
            time.sleep(0.01)
        mq = pq.mq
        self.offset_store.update(mq, pq.commit_offset())
        try:
            self.offset_store.persist(mq)
        except SparkMQError as exc:
            log.warning("committing dropped %s@%s failed: %s", mq.topic, mq.key, exc)
        self.offset_store.remove(mq)
        self._unlock([mq])

    def _unlock(self, mqs: list[MessageQueue]) -> None:
        by_addr: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            self._lock_times.pop(mq, None)
            addr = self._master_addr(mq)
            if addr is not None:
                by_addr.setdefault(addr, []).append(mq)
        for addr, group in by_addr.items():
            try:
                self._brokers.get(addr).unlock_queues(self.group, self.client_id,
                                                      [(q.topic, q.queue_id) for q in group], group[0].broker_name)
            except SparkMQError as exc:
                log.info("unlocking on %s failed (the lock expires by itself): %s", addr, exc)

    def _before_leave(self) -> None:
        if self._needs_locks:
            self._unlock(self._rebalance.assignment())
