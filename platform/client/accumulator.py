"""Producer-side batching (Kafka's ``linger.ms`` / ``batch.size``): per-message async sends go out as batches.

``Producer.send_async`` hands each message to the :class:`Accumulator`; whenever a send slot is free a
worker takes what waits for a topic (up to ``max_messages`` or ``max_bytes``) and sends it as one
batch, so the simple API is fast.  There is no fixed delay by default: when nothing is in flight a
message leaves at once; while batches are in flight, new messages gather until they are at least as
many as the messages in flight (or a full batch), and at the latest leave when those are answered (a
``linger_s`` > 0 makes the sender wait that long for a batch to fill first).

Why "as many as in flight": a caller that keeps a window of N sends open refills it a few messages at a
time as answers come in.  Sending each refill as soon as a slot is free gives batches of one beside one
batch of N - 3 (each small batch costs a request, and under SYNC_FLUSH a disk sync, like a big one); with
the rule, batches double until two halves of the window alternate, so one half is stored and synced while
the other travels, and a lone message (nothing in flight) still leaves at once.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING

from ...storage_native import gc_track, gc_untrack
from ..common.errors import ErrorCode, SparkMQError
from ..common.message import Message, SendResult

__all__ = ["Accumulator", "BatchSender", "BatchedFuture"]

log = logging.getLogger("sparkmq.client")

#: ``sender(messages) -> results`` (one per message, in order): sends one batch of one topic, with retries.
BatchSender = Callable[[Sequence[Message]], Sequence[SendResult]]


class BatchedFuture(concurrent.futures.Future[SendResult]):
    """A ``concurrent.futures.Future`` of one batched message, cheap enough to make per message.

    A plain Future builds its own Condition (most of the cost of ``send_async`` at 100,000s of messages
    per second) and two lists.  These share their accumulator's condition, are completed a whole batch
    at a time under one lock hold, and build their :class:`SendResult` from the batch's packed
    answer only when asked.  They have slots and make their waiter and callback lists on first use, so a
    kept future is one object for the garbage collector, not four (in ``messaging.produce_async`` Python's
    full collections took 28 % of the client's CPU before).  They work with
    ``concurrent.futures.wait``/``as_completed``, callbacks and ``result``/``exception`` like any Future
    (waits loop, since the condition is shared).
    """

    __slots__ = ("_condition", "message", "size", "_state", "_result", "_exception", "_batch", "_index",
                 "_waiter_list", "_done_callbacks")

    def __init__(self, condition: threading.Condition, message: Message | None = None) -> None:  # noqa: D107
        # No super().__init__(): that would build a Condition and two lists per future.
        self._condition = condition
        #: While queued: the message and its body size (the accumulator's bookkeeping).
        self.message = message
        self.size = len(message.body) if message is not None else 0
        self._state = PENDING
        self._result: SendResult | None = None
        self._exception: BaseException | None = None
        self._batch: Sequence[SendResult] | None = None
        self._index = 0
        self._waiter_list: list | None = None
        self._done_callbacks: list | tuple = ()
        if message is not None:
            # Queued and in flight, the future and its message are held by the accumulator, so the collector
            # could not free them anyway; out of its lists, they are not walked and promoted by every
            # collection meanwhile (with them in, full collections took 1.9 s in a produce_async
            # benchmark process whose send loop ran 8 s).
            # complete_batch puts both back before letting go, and so does anything that could tie the
            # future into a cycle (a waiter, a callback) when it is attached.
            gc_untrack(self)
            gc_untrack(message)

    @property
    def _waiters(self) -> list:  # type: ignore[override]  # Future's plain attribute, made lazy here
        # concurrent.futures.wait/as_completed append their waiters here (under the condition).
        if self._waiter_list is None:
            gc_track(self)
            self._waiter_list = []
        return self._waiter_list

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[SendResult]], object]) -> None:
        """Call ``fn(future)`` when the future finishes (at once if it has)."""
        with self._condition:
            if self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                if not self._done_callbacks:
                    gc_track(self)
                    self._done_callbacks = []
                self._done_callbacks.append(fn)  # type: ignore[union-attr]
                return
        try:
            fn(self)
        except Exception:  # as Future.add_done_callback: a failing callback is logged, not raised
            log.exception("exception calling callback for %r", self)

    def _wait_finished(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._state not in (FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError()
            self._condition.wait(left)
        if self._state != FINISHED:
            raise concurrent.futures.CancelledError()

    def done(self) -> bool:
        """Whether the send finished (or was cancelled)."""
        # No lock: a state is one attribute, and it is set last when a batch completes.
        return self._state in (FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED)

    def result(self, timeout: float | None = None) -> SendResult:
        """The message's :class:`SendResult` (raises the batch's error)."""
        if self._state != FINISHED:
            with self._condition:
                self._wait_finished(timeout)
        if self._exception is not None:
            raise self._exception
        if self._result is None and self._batch is not None:
            self._result = self._batch[self._index]
        return self._result  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The batch's error, or None when the message was stored."""
        if self._state != FINISHED:
            with self._condition:
                self._wait_finished(timeout)
        return self._exception

    def outcome(self) -> tuple[SendResult | None, BaseException | None] | None:
        """``(result, None)`` or ``(None, error)`` of a finished future without taking the shared lock (for its
        done callbacks, which run after the batch was completed); None if it is not finished (cancelled)."""
        if self._state != FINISHED:
            return None
        if self._exception is not None:
            return None, self._exception
        if self._result is None and self._batch is not None:
            self._result = self._batch[self._index]
        return self._result, None


def complete_batch(futures: Sequence[BatchedFuture], condition: threading.Condition,
                   results: Sequence[SendResult] | None, error: BaseException | None) -> None:
    """Finish every future of a batch under one hold of their shared condition, then run callbacks."""
    with condition:
        for i, future in enumerate(futures):
            gc_track(future)  # back in the collector's lists before the accumulator lets go (see __init__)
            if future.message is not None:
                gc_track(future.message)
            future.message = None  # sent: the future no longer keeps the body alive
            if future._state != PENDING:  # cancelled by its caller meanwhile
                continue
            if error is not None:
                future._exception = error
            else:
                future._batch = results
                future._index = i
            future._state = FINISHED
            for waiter in future._waiter_list or ():
                if error is not None:
                    waiter.add_exception(future)
                else:
                    waiter.add_result(future)
        condition.notify_all()
    for future in futures:
        if future._done_callbacks:
            future._invoke_callbacks()  # type: ignore[attr-defined]  # Future's private helper, not in typeshed


#: A queued message is its future (which holds it until sent).
_Pending = BatchedFuture


#: ``starter(messages) -> future of results``: a batch's first try without blocking, or None (then the
#: blocking :data:`BatchSender` sends it on the executor).
BatchStarter = Callable[[list[Message]], "concurrent.futures.Future[Sequence[SendResult]] | None"]


class Accumulator:
    """Gathers messages per topic and sends them in batches, ``max_in_flight`` at a time.

    No thread of its own: ``add`` appends to the topic's queue (one short lock hold, which also counts the
    buffer) and, when a send slot is free, dispatches a batch at once.  A batch goes out
    from the calling thread when ``starter`` can send it without blocking (remoting), else on the executor;
    when a batch finishes, its slot dispatches what gathered meanwhile.  So while slots are busy, messages
    gather into bigger batches by themselves.  A batch that went out without blocking is completed on the
    connection's I/O thread (so ``send_async`` callbacks must be quick, as Kafka's), a blocking one on the
    executor.
    """

    def __init__(self, sender: BatchSender, executor: concurrent.futures.Executor, *, max_messages: int = 256,
                 max_bytes: int = 1 << 20, linger_s: float = 0.0, max_in_flight: int = 4,
                 buffer_bytes: int = 8 << 20, max_block_s: float = 60.0,
                 starter: BatchStarter | None = None, name: str = "sparkmq-batcher") -> None:
        self._send = sender
        self._start = starter
        self._executor = executor
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.linger_s = linger_s
        self.max_in_flight = max_in_flight
        #: Body bytes added and not yet answered (queued or in flight) are bounded (Kafka's ``buffer.memory``):
        #: ``add`` waits up to ``max_block_s`` for room, so a caller faster than the broker is slowed, not
        #: left to fill memory (and the garbage collector's walks) with queued messages.
        self.buffer_bytes = buffer_bytes
        self.max_block_s = max_block_s
        self._buffered = 0
        self.name = name
        self._lock = threading.Lock()
        #: Shared by every future this accumulator hands out (see :class:`BatchedFuture`).
        self._futures_cond = threading.Condition()
        self._queues: dict[str, collections.deque[_Pending]] = {}
        #: Per topic, when its next batch began to gather (a clock read per batch, not per message): the topic
        #: waiting longest goes first, and the linger counts from there (as Kafka's counts from a batch's first
        #: record).
        self._since: dict[str, float] = {}
        self._in_flight = 0
        #: Messages in the batches in flight: a smaller group waits for more (see the module's doc).
        self._in_flight_msgs = 0
        #: flush() calls waiting: while any waits, what is queued leaves as soon as a slot is free.
        self._flushing = 0
        self._idle = threading.Condition(self._lock)
        self._linger_timer: threading.Timer | None = None

    def add(self, message: Message) -> concurrent.futures.Future[SendResult]:
        """Queue ``message`` (already validated) for the next batch of its topic; a future of its result."""
        future = BatchedFuture(self._futures_cond, message)
        with self._lock:
            if not self._fits(future.size):
                try:
                    self._wait_for_room(future.size)
                except SparkMQError:
                    gc_track(message)  # not queued: the caller's message goes back as it came
                    raise
            self._buffered += future.size
            queue = self._queues.get(message.topic)
            if queue is None:
                queue = self._queues[message.topic] = collections.deque()
            if not queue:
                self._since[message.topic] = time.monotonic()
            queue.append(future)
            free_slot = self._in_flight < self.max_in_flight
        if free_slot:
            self._dispatch()
        return future

    def _fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit in the buffer (lock held); a body larger than it fits an empty one."""
        return not self._buffered or self._buffered + size <= self.buffer_bytes

    def _wait_for_room(self, size: int) -> None:
        """Wait (lock held) until ``size`` more bytes fit in the buffer, or raise PRODUCER_BUFFER_FULL."""
        if not self._idle.wait_for(lambda: self._fits(size), self.max_block_s):
            raise SparkMQError(ErrorCode.PRODUCER_BUFFER_FULL,
                               f"{self._buffered} bytes of earlier sends stayed unanswered for {self.max_block_s} s "
                               f"(the buffer holds {self.buffer_bytes})")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message added so far was sent (or failed); False at the timeout."""
        with self._lock:
            self._flushing += 1
        try:
            self._dispatch(force=True)
            with self._idle:
                return self._idle.wait_for(lambda: self._in_flight == 0 and not self._pending(), timeout)
        finally:
            with self._lock:
                self._flushing -= 1

    def close(self, timeout: float = 60.0) -> None:
        """Send what waits and wait for it (the producer shuts down)."""
        self.flush(timeout)
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        with self._lock:  # what the flush left queued goes back in the collector's lists (see BatchedFuture)
            for queue in self._queues.values():
                for future in queue:
                    gc_track(future)
                    if future.message is not None:
                        gc_track(future.message)

    def _pending(self) -> bool:
        return any(self._queues.values())

    def _dispatch(self, force: bool = False) -> None:
        """Send batches while slots are free and messages wait (``force``: ignore the linger)."""
        while True:
            with self._lock:
                if self._in_flight >= self.max_in_flight:
                    return
                taken = self._take(force or self._flushing > 0)
                if taken is None:
                    return
                self._in_flight += 1
                self._in_flight_msgs += len(taken[0])
            self._launch(*taken)

    def _launch(self, batch: list[_Pending], size: int) -> None:
        started = None
        if self._start is not None:
            try:
                started = self._start([p.message for p in batch])  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001  # a bad batch: its futures get the error
                self._finish(batch, size, None, exc)
                return
        try:
            if started is None:
                self._executor.submit(self._send_batch, batch, size)
            else:
                # Completed where the answer arrives (the connection's loop), as Kafka's producer runs its
                # callbacks on its I/O thread: a hop to a pool thread here costs more than the callbacks.
                started.add_done_callback(lambda f: self._started_done(batch, size, f))
        except RuntimeError as exc:  # the executor is shut down: nobody will send these
            self._finish(batch, size, None, exc)

    def _take(self, force: bool) -> tuple[list[_Pending], int] | None:
        """The next batch and its body bytes (lock held): up to max_messages / max_bytes of the topic whose batch
        began gathering first; None when nothing waits, when fewer wait than are in flight (they leave with
        more, or when those are answered), or when the linger asks to wait for more."""
        topic = None
        for name, queue in self._queues.items():
            if queue and (topic is None or self._since[name] < self._since[topic]):
                topic = name
        if topic is None:
            return None
        oldest = self._queues[topic]
        if not force and len(oldest) < min(self._in_flight_msgs, self.max_messages):
            return None
        if not force and self.linger_s > 0 and len(oldest) < self.max_messages:
            wait = self._since[topic] + self.linger_s - time.monotonic()
            if wait > 0:
                self._arm_linger(wait)
                return None
        batch: list[_Pending] = []
        size = 0
        while oldest and len(batch) < self.max_messages and (not batch or size + oldest[0].size <= self.max_bytes):
            item = oldest.popleft()
            batch.append(item)
            size += item.size
        if oldest:  # the rest is the topic's next batch: behind the other topics' waiting batches
            self._since[topic] = time.monotonic()
        return batch, size

    def _arm_linger(self, wait: float) -> None:
        # One timer at a time: when it fires, what gathered goes out.
        if self._linger_timer is None or not self._linger_timer.is_alive():
            self._linger_timer = threading.Timer(wait, self._dispatch, kwargs={"force": True})
            self._linger_timer.daemon = True
            self._linger_timer.start()

    def _send_batch(self, batch: list[_Pending], size: int) -> None:
        try:
            results = self._send([p.message for p in batch])  # type: ignore[misc]
        except BaseException as exc:  # noqa: BLE001  # every waiting future gets the error
            self._finish(batch, size, None, exc)
            return
        self._finish(batch, size, results, None)

    def _started_done(self, batch: list[_Pending], size: int,
                      started: concurrent.futures.Future[Sequence[SendResult]]) -> None:
        error = started.exception()
        self._finish(batch, size, None if error is not None else started.result(), error)

    def _finish(self, batch: list[_Pending], size: int, results: Sequence[SendResult] | None,
                error: BaseException | None) -> None:
        if error is None and (results is None or len(results) != len(batch)):
            error = RuntimeError(f"a batch of {len(batch)} messages got {0 if results is None else len(results)} "
                                 "results")
        complete_batch(batch, self._futures_cond, None if error else results, error)
        with self._idle:
            self._in_flight -= 1
            self._in_flight_msgs -= len(batch)
            self._buffered -= size
            self._idle.notify_all()
        self._dispatch()
