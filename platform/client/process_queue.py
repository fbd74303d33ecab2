"""The client-side state of one assigned queue (RocketMQ's ``ProcessQueue``).

Messages enter when a pull brings them and leave when the listener has consumed them (a
push consumer) or when ``poll()`` has handed them out (a pull consumer).  Consumption
runs on many threads, so messages finish out of order; the offset that may be committed
is therefore the **smallest offset still in flight** -- or, with nothing in flight, the
offset the next pull starts at (everything before it was consumed or filtered out).
Committing anything larger could lose a message that is still being processed when the
consumer dies; committing this can only cause re-delivery.

The counts feed flow control: a queue stops being pulled while it holds more than
``max_messages`` messages or ``max_bytes`` body bytes, or while its smallest and largest
in-flight offsets are more than ``max_span`` apart (one stuck message must not let the
queue run ahead without bound, since the committed offset cannot pass it).

A pull loop held back by flow control waits on :meth:`ProcessQueue.wait_for_room`: consumption that brings
the queue back under its limits wakes it at once (from any thread), rather than after a fixed back-off.  With
a pull batch close to ``max_messages`` every pull leaves the queue over the limit, so a fixed 50 ms back-off
per pull used to bound the drain rate (``pull_batch_size=1024`` drained three times slower than 256).

``dropped`` is set when a rebalance takes the queue away: its pull loop stops and
pending consumption of its messages is skipped (another member now owns them).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Sequence

from ..common.wire import ReceivedMessage
from .allocation import MessageQueue

__all__ = ["ProcessQueue"]


class ProcessQueue:
    """In-flight messages of one queue ordered by offset, with the offset to commit and flow-control state.

    Thread-safe.  Example (three messages, the middle one finishes first)::

        >>> from sparkmq.platform.common.wire import ReceivedMessage
        >>> mq = MessageQueue("t", "broker-a", 0)
        >>> pq = ProcessQueue(mq, next_offset=10)
        >>> msgs = [ReceivedMessage("t", "broker-a", 0, o, f"id{o}", "", b"x") for o in (10, 11, 12)]
        >>> pq.on_pulled(msgs, next_offset=13)
        >>> pq.remove([msgs[1]])       # 11 done, 10 still in flight
        10
        >>> pq.remove([msgs[0]])       # 10 done, 12 in flight
        12
        >>> pq.remove([msgs[2]])       # all done: the next pull's offset
        13
    """

    def __init__(self, mq: MessageQueue, next_offset: int, *, max_messages: int = 1000,
                 max_bytes: int = 100 * 1024 * 1024, max_span: int = 2000) -> None:
        self.mq = mq
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_span = max_span
        self._lock = threading.Lock()
        # Insertion order is offset order: pulls of one queue arrive in increasing offsets,
        # so the first key is the smallest in flight and the last the largest, both O(1).
        self._msgs: dict[int, ReceivedMessage] = {}
        self._bytes = 0
        self._next_offset = next_offset
        self._dropped = False
        self.last_pull_time = time.monotonic()
        self.last_consume_time = time.monotonic()
        #: How many times a pull of this queue was held back by flow control (RocketMQ's queueFlowControlTimes).
        self.flow_control_times = 0
        #: The pull loop waiting for room (its loop, that loop's thread, its future), or None.
        self._room: tuple[asyncio.AbstractEventLoop, int, asyncio.Future[None]] | None = None

    # -- state ------------------------------------------------------------------------------
    @property
    def next_offset(self) -> int:
        """Where the next pull of this queue starts."""
        with self._lock:
            return self._next_offset

    @property
    def dropped(self) -> bool:
        """Whether the queue was taken away (or the consumer is stopping)."""
        return self._dropped

    def drop(self) -> None:
        """Mark the queue dropped: no more pulls, pending consumption skipped."""
        self._dropped = True
        with self._lock:
            room, self._room = self._room, None
        _wake(room)  # a pull loop waiting for room sees the drop now

    @property
    def msg_count(self) -> int:
        """Messages in flight."""
        with self._lock:
            return len(self._msgs)

    @property
    def msg_bytes(self) -> int:
        """Body bytes in flight."""
        with self._lock:
            return self._bytes

    def offset_span(self) -> int:
        """Largest minus smallest in-flight offset (0 with fewer than two)."""
        with self._lock:
            return self._span_locked()

    def _span_locked(self) -> int:
        if len(self._msgs) < 2:
            return 0
        return next(reversed(self._msgs)) - next(iter(self._msgs))

    def head(self, n: int) -> list[ReceivedMessage]:
        """The ``n`` in-flight messages of smallest offset, ascending (an orderly consumer's next batch)."""
        with self._lock:
            out: list[ReceivedMessage] = []
            for msg in self._msgs.values():
                if len(out) >= n:
                    break
                out.append(msg)
            return out

    def in_flight_offsets(self) -> list[int]:
        """The in-flight offsets, ascending."""
        with self._lock:
            return list(self._msgs)

    # -- transitions ------------------------------------------------------------------------
    def on_pulled(self, messages: Sequence[ReceivedMessage], next_offset: int) -> None:
        """Add a pull's messages (those not filtered out) and move the next pull to ``next_offset``.

        Both happen under one lock, so a concurrent :meth:`commit_offset` never sees the new
        ``next_offset`` without the messages before it.
        """
        with self._lock:
            for msg in messages:
                if msg.queue_offset in self._msgs:
                    continue
                if self._msgs and msg.queue_offset < next(reversed(self._msgs)):
                    # Out-of-order arrival (only after a reset): keep the dict sorted.
                    self._msgs[msg.queue_offset] = msg
                    self._msgs = dict(sorted(self._msgs.items()))
                else:
                    self._msgs[msg.queue_offset] = msg
                self._bytes += len(msg.body)
            self._next_offset = next_offset
            self.last_pull_time = time.monotonic()

    def reset(self, next_offset: int) -> None:
        """Start pulling at ``next_offset`` again (after OFFSET_TOO_SMALL / OVERFLOW); forgets in-flight messages."""
        with self._lock:
            self._msgs.clear()
            self._bytes = 0
            self._next_offset = next_offset
            room, self._room = self._room, None
        _wake(room)

    def remove(self, messages: Iterable[ReceivedMessage]) -> int:
        """Mark ``messages`` finished; returns the offset to commit now (see :meth:`commit_offset`)."""
        room = None
        with self._lock:
            for msg in messages:
                gone = self._msgs.pop(msg.queue_offset, None)
                if gone is not None:
                    self._bytes -= len(gone.body)
            self.last_consume_time = time.monotonic()
            if self._room is not None and self._reason_locked() is None:
                room, self._room = self._room, None
            offset = self._commit_offset_locked()
        _wake(room)  # outside the lock: the loop's wake-up write need not hold it
        return offset

    def commit_offset(self) -> int:
        """The smallest in-flight offset, or the next pull's offset when nothing is in flight."""
        with self._lock:
            return self._commit_offset_locked()

    def _commit_offset_locked(self) -> int:
        return next(iter(self._msgs)) if self._msgs else self._next_offset

    # -- flow control -----------------------------------------------------------------------
    def flow_control_reason(self) -> str | None:
        """Why the queue must not be pulled now (``"count"``, ``"size"``, ``"span"``) or None."""
        with self._lock:
            return self._reason_locked()

    def _reason_locked(self) -> str | None:
        if len(self._msgs) > self.max_messages:
            return "count"
        if self._bytes > self.max_bytes:
            return "size"
        if self._span_locked() > self.max_span:
            return "span"
        return None

    async def wait_for_room(self, timeout_s: float) -> bool:
        """On the pulling loop: wait until consumption brings the queue under its flow-control limits (or it is
        dropped or reset), at most ``timeout_s``; True when there is room (at once if there already is), False when
        there is none yet or the queue was dropped.

        One waiter per queue (its pull loop); :meth:`remove` wakes it from whichever thread consumed.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._dropped:
                return False
            if self._reason_locked() is None:
                return True
            self._room = (loop, threading.get_ident(), fut)
        # A timer resolving the future, not asyncio.wait_for: that one swallows a cancellation arriving together
        # with the wake-up (Python 3.11), and a pull loop cancelled at shutdown must stop.
        timer = loop.call_later(timeout_s, _set_once, fut)
        try:
            await fut
        finally:
            timer.cancel()
            with self._lock:
                if self._room is not None and self._room[2] is fut:
                    self._room = None
        return self.flow_control_reason() is None

    def __repr__(self) -> str:
        return (f"ProcessQueue({self.mq.topic}@{self.mq.key}, next={self._next_offset}, "
                f"in_flight={len(self._msgs)}, dropped={self._dropped})")


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _wake(room: tuple[asyncio.AbstractEventLoop, int, asyncio.Future[None]] | None) -> None:
    """Resolve a room waiter: in place on its own loop's thread, else through that loop."""
    if room is None:
        return
    loop, thread, fut = room
    if threading.get_ident() == thread:
        _set_once(fut)
        return
    try:
        loop.call_soon_threadsafe(_set_once, fut)
    except RuntimeError:  # that loop is closed: its pull loop is gone with it
        pass
