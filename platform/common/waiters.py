"""Asyncio waiters woken from any thread.

:class:`WaiterRegistry` holds asyncio futures by key.  A coroutine waits on a key
(with a timeout); any thread -- the one that just stored a message, the client
expiry scan -- calls :meth:`WaiterRegistry.notify` and every waiter of that key wakes
(via ``loop.call_soon_threadsafe`` from another thread).  Lost wake-ups are impossible: a
waiter registers *first* and then re-checks its condition (``ready``), while a notifier
changes the state first and then looks for waiters.  When nobody waits, a notify is one
dictionary truth test.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["WaiterRegistry"]

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
