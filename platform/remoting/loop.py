"""Event loops for the remoting transport: uvloop when importable, and one background loop thread.

Synchronous code (producers, admin tools, Spark tasks) shares :meth:`LoopThread.get`, a daemon
thread running one event loop for the whole process, so every connection it opens is served by
the same loop however many threads call in.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread", "new_event_loop"]

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop event loop, or a plain asyncio one when uvloop is not installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency here, not everywhere
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """A daemon thread running one event loop; :meth:`get` gives the process-wide one.

    ``loop`` and ``thread_id`` are set once :meth:`start` returns.
    """

    _instance: LoopThread | None = None
    _instance_lock = threading.Lock()
    #: Clients holding the process-wide thread (:meth:`acquire`); the last :meth:`release` stops it.
    _users = 0

    def __init__(self, name: str = "sparkmq-remoting") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop = new_event_loop()
        self.thread_id: int | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @classmethod
    def get(cls) -> LoopThread:
        """The process-wide loop thread, started on first use."""
        inst = cls._instance
        if inst is not None and inst.running:
            return inst
        with cls._instance_lock:
            inst = cls._instance
            if inst is None or not inst.running:
                inst = cls().start()
                cls._instance = inst
            return inst

    @classmethod
    def acquire(cls) -> LoopThread:
        """The process-wide loop thread, counted as used until :meth:`release` (clients' lifetimes)."""
        with cls._instance_lock:
            cls._users += 1
        return cls.get()

    @classmethod
    def release(cls) -> None:
        """One user less; the last one stops the process-wide thread (it starts again on the next use)."""
        with cls._instance_lock:
            cls._users = max(0, cls._users - 1)
            last = cls._users == 0
            inst = cls._instance
        if last and inst is not None and not inst.in_loop_thread:
            inst.stop()

    @property
    def running(self) -> bool:
        """True while the thread runs its loop."""
        return self._thread is not None and self._thread.is_alive() and not self.loop.is_closed()

    @property
    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread (where blocking on it would deadlock)."""
        return threading.get_ident() == self.thread_id

    def start(self) -> LoopThread:
        """Start the thread and wait until its loop runs; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
            self._ready.wait()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.thread_id = threading.get_ident()
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block for its result (for rare calls: connect, close)."""
        if self.in_loop_thread:
            coro.close()
            raise RuntimeError("LoopThread.run() from the loop's own thread would deadlock")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop from any thread."""
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the thread (tests and orderly shutdowns; the default one is a daemon)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        thread.join(timeout)
        with LoopThread._instance_lock:
            if LoopThread._instance is self:
                LoopThread._instance = None


def _forget_after_fork() -> None:
    # A forked child has the parent's LoopThread object but not its thread: start afresh on demand.
    LoopThread._instance = None
    LoopThread._instance_lock = threading.Lock()
    LoopThread._users = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
