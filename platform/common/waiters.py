"""Asyncio waiters woken from any thread.

:class:`WaiterRegistry` holds asyncio futures by key.  A coroutine waits on a key
(with a timeout); any thread -- the one that just stored a message, the client
expiry scan -- calls :meth:`WaiterRegistry.notify` and every waiter of that key wakes
(via ``loop.call_soon_threadsafe`` from another thread).  Lost wake-ups are impossible: a
waiter registers *first* and then re-checks its condition (``ready``), while a notifier
changes the state first and then looks for waiters.  When nobody waits, a notify is one
dictionary truth test.

:class:`OffsetWaiters` holds callers waiting for a log offset to be acknowledged (by a slave, by a
Raft majority), each answered once with a status.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["OffsetWaiters", "WaiterRegistry"]

K = TypeVar("K", bound=Hashable)
#: A waiting coroutine: its loop, the thread running that loop, and the future it awaits.
_Waiter = tuple[asyncio.AbstractEventLoop, int, "asyncio.Future[bool]"]


def _resolve(fut: asyncio.Future[bool], value: bool = True) -> None:
    if not fut.done():
        fut.set_result(value)


class WaiterRegistry(Generic[K]):
    """Asyncio waiters by key, notified from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[K, set[_Waiter]] = {}
        self._closed = False

    def waiting(self, key: K | None = None) -> int:
        """How many coroutines wait (on ``key``, or on any key)."""
        with self._lock:
            if key is not None:
                return len(self._waiters.get(key, ()))
            return sum(len(s) for s in self._waiters.values())

    async def wait(self, key: K, timeout_s: float, ready: Callable[[], bool] | None = None) -> bool:
        """Wait until ``key`` is notified or ``timeout_s`` passes; True when notified (or already ``ready``).

        ``ready()`` is checked after registering, so a notify racing with the caller's
        own check is never lost.  After :meth:`close`, returns at once.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        waiter: _Waiter = (loop, threading.get_ident(), fut)
        with self._lock:
            if self._closed:
                return bool(ready and ready())
            self._waiters.setdefault(key, set()).add(waiter)
        try:
            if ready is not None and ready():
                return True
            if timeout_s <= 0:
                return False
            # A timer resolving the future, not asyncio.wait_for: no task and no cancellation per held pull.
            timer = loop.call_later(timeout_s, _resolve, fut, False)
            try:
                return await fut
            finally:
                timer.cancel()
        finally:
            with self._lock:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[key]

    def notify(self, key: K) -> int:
        """Wake every waiter of ``key`` (callable from any thread); returns how many were woken."""
        # Lock-free fast path: the common case is that nobody waits at all.
        if not self._waiters:
            return 0
        with self._lock:
            waiters = self._waiters.pop(key, None)
        return self._wake(waiters or ())

    def notify_all(self) -> int:
        """Wake every waiter of every key."""
        with self._lock:
            all_waiters = [w for s in self._waiters.values() for w in s]
            self._waiters.clear()
        return self._wake(all_waiters)

    def close(self) -> None:
        """Wake everyone and make later waits return at once (shutdown)."""
        with self._lock:
            self._closed = True
        self.notify_all()

    @staticmethod
    def _wake(waiters: object) -> int:
        woken = 0
        me = threading.get_ident()
        for loop, thread, fut in waiters:  # type: ignore[attr-defined]
            if thread == me:
                # Notified on the waiter's own loop (a send on the serving loop): resolve in place; the
                # thread-safe path would write the loop's wake-up pipe and cost a loop pass.
                _resolve(fut)
                woken += 1
                continue
            try:
                loop.call_soon_threadsafe(_resolve, fut)
                woken += 1
            except RuntimeError:  # that loop is closed: its waiter is gone with it
                pass
        return woken


V = TypeVar("V")


class _OffsetWaiter(Generic[V]):
    """One caller waiting for an offset: resolved once, on whatever thread resolves it."""

    __slots__ = ("resolve", "done")

    def __init__(self, resolve: Callable[[V], None]) -> None:
        self.resolve = resolve
        self.done = False


class OffsetWaiters(Generic[V]):
    """Callers waiting until a log offset is reached (a slave holds it, a Raft majority committed it).

    ``reached()`` says how far the log is acknowledged (None: nobody can acknowledge now).  A waiter gets
    ``ok`` once :meth:`release` passes its offset, ``timed_out`` after ``timeout_s``, ``unavailable`` at
    once when ``reached()`` is None, or what :meth:`fail_all` says.  Waits are a loop future
    (:meth:`wait`: no thread per waiter) or a blocking call (:meth:`await_offset`); thread-safe.
    """

    def __init__(self, reached: Callable[[], int | None], timeout_s: float, *, ok: V, timed_out: V,
                 unavailable: V) -> None:
        self._reached = reached
        self.timeout_s = timeout_s
        self._ok, self._timed_out, self._unavailable = ok, timed_out, unavailable
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, _OffsetWaiter[V]]] = []  # (offset, serial, waiter)
        self._serial = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def wait(self, offset: int, loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future[V]:
        """A loop future of the outcome for ``offset``."""
        loop = loop if loop is not None else asyncio.get_running_loop()
        fut: asyncio.Future[V] = loop.create_future()
        loop_thread = threading.get_ident()

        def resolve(value: V) -> None:
            if threading.get_ident() == loop_thread:
                if not fut.done():
                    fut.set_result(value)
            else:
                loop.call_soon_threadsafe(resolve, value)  # run on the loop thread: the branch above

        self._add(offset, resolve, lambda w: loop.call_later(self.timeout_s, self._expire, w))
        return fut

    def await_offset(self, offset: int) -> V:
        """:meth:`wait` for a thread: blocks up to ``timeout_s``."""
        future: concurrent.futures.Future[V] = concurrent.futures.Future()

        def resolve(value: V) -> None:
            if not future.done():
                future.set_result(value)

        waiter = self._add(offset, resolve, None)
        try:
            return future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            self._expire(waiter)
            return future.result(1.0)

    def _add(self, offset: int, resolve: Callable[[V], None],
             arm: Callable[[_OffsetWaiter[V]], object] | None) -> _OffsetWaiter[V]:
        waiter = _OffsetWaiter(resolve)
        reached = self._reached()
        if reached is None or reached >= offset:
            waiter.done = True
            resolve(self._unavailable if reached is None else self._ok)
            return waiter
        with self._lock:
            heapq.heappush(self._heap, (offset, next(self._serial), waiter))
        if arm is not None:
            arm(waiter)
        self.release(self._reached())  # the offset may have been reached between the check and the push
        return waiter

    def _expire(self, waiter: _OffsetWaiter[V]) -> None:
        with self._lock:
            if waiter.done:
                return
            waiter.done = True
        waiter.resolve(self._timed_out)

    def release(self, reached: int | None) -> None:
        """Answer every waiter at or below ``reached``; every waiter ``unavailable`` when it is None."""
        if not self._heap:
            return
        ready: list[_OffsetWaiter[V]] = []
        with self._lock:
            heap = self._heap
            while heap and (reached is None or heap[0][0] <= reached):
                waiter = heapq.heappop(heap)[2]
                if not waiter.done:
                    waiter.done = True
                    ready.append(waiter)
        value = self._ok if reached is not None else self._unavailable
        for waiter in ready:
            waiter.resolve(value)

    def fail_all(self, value: V) -> None:
        """Answer every waiter with ``value`` (the acknowledger went away)."""
        with self._lock:
            waiters, self._heap = self._heap, []
        for _, _, waiter in waiters:
            if not waiter.done:
                waiter.done = True
                waiter.resolve(value)
