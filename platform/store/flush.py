"""Flush services: the background sync of ASYNC_FLUSH and the group commit of SYNC_FLUSH.

Two kinds of sync, both without blocking appends (the native core runs the
fdatasync with the GIL released):

* the full flush, ``CommitLog.flush()``: the log and every consume-queue file
  written since; it runs every ``interval_ms`` in both modes, and only its offset
  (``flushed_offset``) goes to the checkpoint hook, so a checkpoint never names an
  offset whose queue units might not be on disk;
* the log-only flush, ``CommitLog.flush_log()``: the commit-log segment alone, what
  a waiter needs (as RocketMQ's GroupCommitService, which syncs only the commit
  log): recovery scans the log from the checkpoint and rewrites the units of every
  record it finds, so an acknowledged record gets its unit back after a crash.

Group commit: a writer registers the end offset of its record and waits; the
flush thread syncs the log again and again while anyone waits, each sync covering
every record appended before it started, so N concurrent sends cost one
fdatasync, not N.  Waiters are answered on ``log_flushed_offset``.  Two kinds of
waiter share that machinery:

* a thread blocks in :meth:`FlushService.wait_flushed` (the classic put path);
* an event loop gets an ``asyncio.Future`` from :meth:`FlushService.wait_async`,
  with no thread per waiter: after each sync the flush thread hands every future it
  covered on a loop to that loop in ONE ``call_soon_threadsafe`` callback, and each
  loop times its waiters out with ONE timer, armed for the earliest deadline.

With the native commit log the log-only syncs run on its C group-commit thread
(``CommitLog.start_syncer``) instead: a sync starts the moment a send asks for it,
without waiting for the GIL the event loop holds, and it wakes each loop through an
eventfd the loop reads (one callback per sync again) and blocked threads inside C.
The Python thread then keeps only the periodic full flush and the checkpoint.  (Under
load the GIL hand-over to the Python flush thread took about as long as the sync.)
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import types
from collections.abc import Callable
from typing import Protocol

from ..common.failure_log import FailureLog
from .status import PutStatus

__all__ = ["Flushable", "FlushService"]

log = logging.getLogger(__name__)

#: A timer that fires this early (loop clock resolution) still expires the waiters it was armed for.
_TIMER_SLACK_S = 0.001


class Flushable(Protocol):
    """What the flush service needs of a commit log."""

    @property
    def flushed_offset(self) -> int:
        """Log and consume queues durable below it."""

    @property
    def log_flushed_offset(self) -> int:
        """The log durable below it (>= ``flushed_offset``)."""

    def flush(self) -> int:
        """Full flush; returns ``flushed_offset``."""

    def flush_log(self) -> int:
        """Log-only flush; returns ``log_flushed_offset``."""


class _LoopWaiters:
    """The futures one event loop waits on: resolved a batch at a time, timed out by one timer."""

    __slots__ = ("fd", "loop", "pending", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: (end offset, deadline on ``loop.time()``, future), in registration order.
        self.pending: list[tuple[int, float, asyncio.Future[PutStatus]]] = []
        self.timer: asyncio.TimerHandle | None = None
        #: The eventfd the native syncer writes after each sync (the loop reads it); None otherwise.
        self.fd: int | None = None


def _native_syncer(log_: Flushable) -> bool:
    """Whether ``log_`` can run the log-only syncs on its own C thread: the native commit log with its own
    ``flush_log`` (a subclass wrapping ``flush_log`` in Python, a test's stuck disk, keeps the Python thread)."""
    return (hasattr(os, "eventfd") and hasattr(log_, "start_syncer")
            and isinstance(getattr(type(log_), "flush_log", None), types.MethodDescriptorType))


def _settle(futures: list[asyncio.Future[PutStatus]], status: PutStatus) -> None:
    """Resolve ``futures`` (on their loop); a future its owner cancelled is skipped."""
    for fut in futures:
        if not fut.done():
            fut.set_result(status)


class FlushService:
    """One thread that fully syncs on a timer (both modes), and syncs the log back to back while anyone waits.

    ``flush_count`` counts completed syncs of either kind, ``full_flush_count`` the full ones,
    ``waiters_resolved`` the async waits they satisfied (waits per sync is the group-commit factor).
    """

    def __init__(self, log_: Flushable, interval_ms: int, on_flushed: Callable[[int], None],
                 group_commit: bool) -> None:
        """``interval_ms``: the period of the full flush (and the checkpoint's pace); ``on_flushed(offset)``
        runs on the flush thread after each full flush with its ``flushed_offset`` (never after a log-only
        one); ``group_commit``: the store runs SYNC_FLUSH (a waiter gets its sync at once in either mode)."""
        self._log = log_
        self._interval = interval_ms / 1000.0
        self._on_flushed = on_flushed
        self._group_commit = group_commit
        # A failing disk fails every sync (twice a second): the first in full, then a summary a minute.
        self._flush_failures = FailureLog(log, "flushing the commit log")
        self._hook_failures = FailureLog(log, "the after-flush hook (checkpoint)")
        self._lock = threading.Lock()
        #: The idle flush thread sleeps here; a new waiter wakes it.
        self._work = threading.Condition(self._lock)
        #: Blocked writer threads sleep here; each sync wakes them.
        self._done = threading.Condition(self._lock)
        #: Highest offset a completed full flush covered (log and queues).
        self._flushed = log_.flushed_offset
        #: Highest offset a completed sync of either kind covered in the log: what waiters get.
        self._log_flushed = max(self._flushed, log_.log_flushed_offset)
        #: The highest offset anyone waits for, and the highest one a started sync is sure to cover
        #: (a sync snapshots the log's end after it began): a sync is wanted while the first is ahead.
        self._requested = self._log_flushed
        self._covering = self._log_flushed
        #: When the next full flush is due (time.monotonic()), whether anyone waits or not.
        self._full_due = time.monotonic() + self._interval
        self._running = False
        #: True from start() until the last sync has been handed out: waits are accepted.
        self._serving = False
        self._idle = False
        self._blocked = 0
        self._loops: dict[asyncio.AbstractEventLoop, _LoopWaiters] = {}
        self._thread: threading.Thread | None = None
        #: The log-only syncs run on the log's C thread (see the module's docstring); under ASYNC_FLUSH
        #: nobody waits for them, so no thread is started for them.
        self._native = group_commit and _native_syncer(log_)
        self._py_flush_count = 0
        self.full_flush_count = 0
        self.waiters_resolved = 0
        self.last_error: BaseException | None = None

    @property
    def flushed_offset(self) -> int:
        """Highest offset a completed full flush covered (the log and the consume queues)."""
        return self._flushed

    @property
    def log_flushed_offset(self) -> int:
        """Highest offset a completed sync covered in the log: waiters at or below it are answered."""
        if self._native and self._serving:  # the C thread's syncs; a stopped service keeps its last view
            return self._log.log_flushed_offset
        return self._log_flushed

    @property
    def flush_count(self) -> int:
        """Completed syncs of either kind (the C thread's included)."""
        native = self._log.syncer_state()[0] if self._native else 0  # type: ignore[attr-defined]
        return self._py_flush_count + native

    @property
    def group_commit(self) -> bool:
        """Whether the store runs SYNC_FLUSH (sends wait for their sync)."""
        return self._group_commit

    def start(self) -> None:
        """Start the flush thread."""
        if self._native:
            self._log.start_syncer()  # type: ignore[attr-defined]
        with self._lock:
            self._running = True
            self._serving = True
        self._thread = threading.Thread(target=self._run, name="sparkmq-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then fully sync a last time on the calling thread.

        Every outstanding waiter is answered: PUT_OK if that last sync covered it, else
        FLUSH_DISK_TIMEOUT (futures through their loop; a closed loop's futures are dropped).
        """
        with self._lock:
            if not self._running:
                return
            self._running = False
            self._work.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._flush_once(full=True)
        with self._lock:
            if self._native:
                self._log_flushed = max(self._log_flushed, self._log.log_flushed_offset)
            self._serving = False
        if self._native:
            self._log.stop_syncer()  # type: ignore[attr-defined]  # its blocked waiters see the last sync
        self._hand_out(final=True)

    # -- waiting ----------------------------------------------------------------
    def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Group commit for a thread: block until a sync covers ``offset`` in the log; False on timeout or stop."""
        if self.log_flushed_offset >= offset:
            return True
        if self._native:
            if not self._serving:
                return False
            self._log.request_sync(offset)  # type: ignore[attr-defined]
            return self._log.wait_log_flushed(offset, timeout_s)  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if not self._serving:
                return self._log_flushed >= offset
            self._request(offset)
            self._blocked += 1
            try:
                while self._log_flushed < offset and self._serving:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._done.wait(remaining)
                return self._log_flushed >= offset
            finally:
                self._blocked -= 1

    def wait_async(self, offset: int, loop: asyncio.AbstractEventLoop,
                   timeout_s: float) -> asyncio.Future[PutStatus]:
        """Group commit for an event loop: a future resolved with PUT_OK once a sync covers ``offset`` in the log.

        FLUSH_DISK_TIMEOUT when no flush did within ``timeout_s`` (or the service stopped first).
        Must be called on ``loop``'s thread; no thread and no timer per waiter.
        """
        fut: asyncio.Future[PutStatus] = loop.create_future()
        if self.log_flushed_offset >= offset:
            fut.set_result(PutStatus.PUT_OK)
            return fut
        deadline = loop.time() + timeout_s
        with self._lock:
            flushed = self.log_flushed_offset
            if flushed >= offset or not self._serving:
                fut.set_result(PutStatus.PUT_OK if flushed >= offset else PutStatus.FLUSH_DISK_TIMEOUT)
                return fut
            group = self._loops.get(loop)
            attached = False
            if group is None:
                group = self._loops[loop] = _LoopWaiters(loop)
                if self._native:
                    self._attach(group)
                    attached = True
            group.pending.append((offset, deadline, fut))
            timer = group.timer
            # one timer per loop, armed for the earliest deadline (with one timeout for all, the oldest waiter)
            if timer is None or deadline < timer.when():
                if timer is not None:
                    timer.cancel()
                group.timer = loop.call_at(deadline, self._expire, group)
            self._request(offset)
        if attached and self._log.log_flushed_offset >= offset:
            # a sync that ended before this loop's eventfd was registered wrote no wake-up for it
            self._settle_covered(group)
        return fut

    def _request(self, offset: int) -> None:
        """Ask for a sync covering ``offset`` (lock held): wake the idle thread unless a started sync covers it."""
        if self._native:
            self._log.request_sync(offset)  # type: ignore[attr-defined]
            return
        if offset > self._requested:
            self._requested = offset
        if offset > self._covering and self._idle:
            self._work.notify()

    def _expire(self, group: _LoopWaiters) -> None:
        """On the loop: time out the waiters whose deadline passed, and re-arm for the earliest one left."""
        loop = group.loop
        now = loop.time() + _TIMER_SLACK_S
        expired: list[asyncio.Future[PutStatus]] = []
        durable: list[asyncio.Future[PutStatus]] = []
        with self._lock:
            group.timer = None
            flushed = self.log_flushed_offset
            keep = []
            earliest = float("inf")
            for item in group.pending:
                if item[1] > now:
                    keep.append(item)
                    earliest = min(earliest, item[1])
                elif item[0] <= flushed:  # synced, its hand-out not yet here: no reason to fail it
                    durable.append(item[2])
                else:
                    expired.append(item[2])
            group.pending = keep
            if keep:
                group.timer = loop.call_at(earliest, self._expire, group)
            elif self._loops.get(loop) is group:
                del self._loops[loop]  # idle for a whole timeout: forget the loop (it may be gone soon)
                self._detach(group)
        _settle(durable, PutStatus.PUT_OK)
        if expired:
            log.warning("%d sync flush wait(s) timed out (flushed offset %d)", len(expired), flushed)
            _settle(expired, PutStatus.FLUSH_DISK_TIMEOUT)

    # -- the native syncer's wake-ups (on each loop) ---------------------------------
    def _attach(self, group: _LoopWaiters) -> None:
        """On the group's loop, lock held: an eventfd the C syncer writes after each sync, read by the loop."""
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            group.loop.add_reader(fd, self._on_synced, group)
            self._log.add_sync_notifier(fd)  # type: ignore[attr-defined]
        except BaseException:
            group.loop.remove_reader(fd)
            os.close(fd)
            raise
        group.fd = fd

    def _detach(self, group: _LoopWaiters) -> None:
        """No more wake-ups for the group: the syncer forgets its eventfd, which is closed on its loop."""
        fd, group.fd = group.fd, None
        if fd is None:
            return
        self._log.remove_sync_notifier(fd)  # type: ignore[attr-defined]  # no write to fd after this
        loop = group.loop

        def close() -> None:
            try:
                loop.remove_reader(fd)
            finally:
                os.close(fd)

        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            close()
            return
        try:
            loop.call_soon_threadsafe(close)
        except RuntimeError:  # the loop is closed, and its selector with it
            os.close(fd)

    def _on_synced(self, group: _LoopWaiters) -> None:
        try:
            os.eventfd_read(group.fd)  # type: ignore[arg-type]
        except (BlockingIOError, TypeError):  # read already, or detached meanwhile
            pass
        self._settle_covered(group)

    def _settle_covered(self, group: _LoopWaiters) -> None:
        """On the group's loop: answer its waiters the log's synced offset covers."""
        with self._lock:
            flushed = self.log_flushed_offset
            covered = [item[2] for item in group.pending if item[0] <= flushed]
            if not covered:
                return
            group.pending = [item for item in group.pending if item[0] > flushed]
            self.waiters_resolved += len(covered)
        _settle(covered, PutStatus.PUT_OK)

    # -- the flush thread ---------------------------------------------------------
    def _hand_out(self, final: bool) -> None:
        """Answer the waiters the log's flushed offset covers (all of them when ``final``): one callback per loop."""
        batches: list[tuple[_LoopWaiters, list[asyncio.Future[PutStatus]], PutStatus]] = []
        with self._lock:
            flushed = self.log_flushed_offset
            for group in self._loops.values():
                if not group.pending:
                    continue
                covered: list[asyncio.Future[PutStatus]] = []
                late: list[asyncio.Future[PutStatus]] = []
                keep = []
                for item in group.pending:
                    if item[0] <= flushed:
                        covered.append(item[2])
                    elif final:
                        late.append(item[2])
                    else:
                        keep.append(item)
                group.pending = keep
                if covered:
                    batches.append((group, covered, PutStatus.PUT_OK))
                if late:
                    batches.append((group, late, PutStatus.FLUSH_DISK_TIMEOUT))
                self.waiters_resolved += len(covered)
            if self._blocked:
                self._done.notify_all()
        closed = []
        for group, futures, status in batches:
            try:
                group.loop.call_soon_threadsafe(_settle, futures, status)
            except RuntimeError:  # the loop was closed: nobody is left to answer
                closed.append(group.loop)
        if closed or final:
            with self._lock:
                for loop in closed:
                    gone = self._loops.pop(loop, None)
                    if gone is not None:
                        self._detach(gone)
                if final:
                    for group in self._loops.values():
                        self._detach(group)
                        if group.timer is not None:
                            # TimerHandle.cancel is not thread-safe: cancel it on its loop
                            try:
                                group.loop.call_soon_threadsafe(group.timer.cancel)
                            except RuntimeError:
                                pass
                            group.timer = None
                    self._loops.clear()

    def _flush_once(self, full: bool) -> bool:
        """One sync, full or log-only; answers the waiters it covered, and runs the hook after a full one."""
        try:
            flushed = self._log.flush() if full else self._log.flush_log()
        except BaseException as exc:  # keep the thread alive; waiters time out and report it
            self.last_error = exc
            self._flush_failures.failure("%s: %s", type(exc).__name__, exc, exc_info=True)
            with self._lock:
                self._covering = self._log_flushed  # what this sync was to cover is wanted again
            return False
        self._flush_failures.success()
        with self._lock:
            self._py_flush_count += 1
            if full:
                self.full_flush_count += 1
                if flushed > self._flushed:
                    self._flushed = flushed
            # a full flush covers the log too
            if flushed > self._log_flushed:
                self._log_flushed = flushed
            # the sync covered everything appended before it started, requested meanwhile or not: a waiter
            # it covered must not start another sync (those that asked during it would cost one more each)
            if flushed > self._covering:
                self._covering = flushed
        self._hand_out(final=False)
        if full:
            try:
                self._on_flushed(flushed)  # the checkpoint: only an offset the queues are durable below
            except Exception as exc:  # a failed checkpoint write must not stop the syncs
                self._hook_failures.failure("%s: %s", type(exc).__name__, exc, exc_info=True)
            else:
                self._hook_failures.success()
        return True

    def _run(self) -> None:
        lock = self._lock
        while True:
            with lock:
                # nobody waits for more than the last sync covered: sleep until someone does, or the
                # full flush is due (ASYNC_FLUSH, and the checkpoint); while anyone waits, sync back to back
                while self._running and self._requested <= self._covering:
                    wait_s = self._full_due - time.monotonic()
                    if wait_s <= 0:
                        break
                    self._idle = True
                    self._work.wait(wait_s)
                    self._idle = False
                if not self._running:
                    return
                # every waiter registered so far appended before this sync snapshots the log's end,
                # so the sync covers them all: later waiters with higher offsets want the next one
                self._covering = max(self._covering, self._requested)
                # the full flush keeps its pace under a steady stream of waiters too (it answers them
                # as well), so the checkpoint moves and recovery never scans more than ~2 intervals
                now = time.monotonic()
                full = now >= self._full_due
                if full:
                    self._full_due = now + self._interval
            if not self._flush_once(full):
                time.sleep(min(self._interval, 0.1))  # a failing disk: do not spin
