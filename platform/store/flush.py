"""Flush services: the background sync of ASYNC_FLUSH and the group commit of SYNC_FLUSH.

Both call ``CommitLog.flush()``, which syncs everything appended so far without
blocking appends.  Group commit: a writer registers the end offset of its record
and waits; the flush thread syncs once for every writer that arrived meanwhile,
so N concurrent sends cost one fdatasync, not N.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Flushable", "FlushService"]

log = logging.getLogger(__name__)


class Flushable(Protocol):
    """What the flush service needs of a commit log."""

    @property
    def flushed_offset(self) -> int: ...

    def flush(self) -> int: ...


class FlushService:
    """One thread that flushes on a timer (ASYNC_FLUSH) or on demand (SYNC_FLUSH)."""

    def __init__(self, log_: Flushable, interval_ms: int, on_flushed: Callable[[int], None],
                 group_commit: bool) -> None:
        self._log = log_
        self._interval = interval_ms / 1000.0
        self._on_flushed = on_flushed
        self._group_commit = group_commit
        self._cond = threading.Condition()
        self._requested = 0
        self._flushed = log_.flushed_offset
        self._running = False
        self._thread: threading.Thread | None = None
        self.flush_count = 0
        self.last_error: BaseException | None = None

    @property
    def flushed_offset(self) -> int:
        """Highest offset a completed flush covered."""
        return self._flushed

    def start(self) -> None:
        """Start the flush thread."""
        self._running = True
        self._thread = threading.Thread(target=self._run, name="sparkmq-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread after a last flush."""
        with self._cond:
            self._running = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Group commit: block until a flush covers ``offset``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._flushed >= offset:
                return True
            if offset > self._requested:
                self._requested = offset
                self._cond.notify_all()
            while self._flushed < offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._running:
                    return self._flushed >= offset
                self._cond.wait(remaining)
            return True

    def _flush_once(self) -> None:
        try:
            flushed = self._log.flush()
        except BaseException as exc:  # keep the thread alive; writers time out and report it
            self.last_error = exc
            log.exception("flush failed")
            time.sleep(min(self._interval, 0.1))
            return
        self.flush_count += 1
        with self._cond:
            self._flushed = max(self._flushed, flushed)
            self._cond.notify_all()
        self._on_flushed(flushed)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._group_commit:
                    # sleep until a writer asks (or the interval passes, to keep the checkpoint moving)
                    if self._requested <= self._flushed and self._running:
                        self._cond.wait(self._interval)
                elif self._running:
                    self._cond.wait(self._interval)
                running = self._running
            self._flush_once()
            if not running:
                return
