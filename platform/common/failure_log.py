"""Quiet failure logging: a failing subsystem logs its first failure in full, then one summary per interval.

A subsystem that retries on its own (trace writing, replication, a periodic service, the flush thread) must
not write a line per failed batch: a full disk or a dead peer would bury everything else in the log.  A
:class:`FailureLog` per subsystem (or per peer) says what failed the first time (with the stack trace when
asked), counts the failures that follow, and writes one line per ``interval_s`` while they go on::

    storing trace events failed: DISK_FULL: ... (further failures are summarized every 60 s)
    storing trace events: 118 more failures in the last 60 s, last: DISK_FULL: ...
    storing trace events: 3 more failures in the last 75 s before it worked again, last: DISK_FULL: ...

so a subsystem that fails without pause writes one line per interval (and the stack trace, when given, only
the first time), and one that fails and recovers in turns at most three.  Counters (``failures``,
``last_error``) stay readable for ``/health``.

Example::

    failures = FailureLog(log, "storing trace events")
    try:
        put(message)
    except SparkMQError as exc:
        failures.failure("%s", exc)
    else:
        failures.success()
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .validation import Seconds, check

__all__ = ["FailureLog", "DEFAULT_SUMMARY_INTERVAL_S", "set_summary_interval"]

#: How often a subsystem that keeps failing writes its summary line, unless the process sets another.
DEFAULT_SUMMARY_INTERVAL_S = 60.0

#: The process's interval, for FailureLogs built without one (like the log level: one per process).
_interval_s = DEFAULT_SUMMARY_INTERVAL_S


def set_summary_interval(interval_s: float) -> None:
    """Set the summary interval of the FailureLogs built from now on without one (a broker applies its
    ``log_summary_interval_s``); ValueError unless > 0."""
    global _interval_s
    check("the summary interval", interval_s, Seconds, ValueError)
    _interval_s = float(interval_s)


class FailureLog:
    """The failures of one subsystem, logged quietly (see the module docstring).  Thread-safe.

    ``what`` names the work that fails, as the start of a sentence ("storing trace events",
    "replication from 127.0.0.1:10912"); ``interval_s`` defaults to the process's (:func:`set_summary_interval`,
    60 s unless set); ``level`` is the level of failure lines (recoveries are INFO); ``clock`` is injectable
    for tests.
    """

    def __init__(self, logger: logging.Logger, what: str, *, interval_s: float | None = None,
                 level: int = logging.WARNING, clock: Callable[[], float] = time.monotonic) -> None:
        interval_s = _interval_s if interval_s is None else interval_s
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.logger = logger
        self.what = what
        self.interval_s = interval_s
        self.level = level
        self._clock = clock
        self._lock = threading.Lock()
        #: Failures since the last line written (not yet reported).
        self._pending = 0
        #: When the last line was written (None: never).
        self._last_line: float | None = None
        self._failing = False
        #: Every failure counted, reported or not.
        self.failures = 0
        #: The text of the latest failure (kept after a recovery, for ``/health``).
        self.last_error: str | None = None

    @property
    def failing(self) -> bool:
        """Whether the latest outcome was a failure."""
        return self._failing

    def failure(self, message: str, *args: object, exc_info: Any = None) -> None:
        """Count one failure; ``message % args`` says what went wrong.  Written in full (with ``exc_info``)
        when nothing was written for ``interval_s``, else counted into the next summary."""
        text = message % args if args else message
        with self._lock:
            now = self._clock()
            self.failures += 1
            was_failing, self._failing = self._failing, True
            quiet = self._last_line is None or now - self._last_line >= self.interval_s
            if not quiet or was_failing:  # within the interval, or the same run of failures: counted
                self.last_error = text
                self._pending += 1
                if quiet:
                    self._summary(now, "")
                return
            if self._pending:  # failures of an earlier run, not reported yet
                self._summary(now, "")
            self.last_error = text
            self._last_line = now
            self.logger.log(self.level, "%s failed: %s (further failures are summarized every %g s)",
                            self.what, text, self.interval_s, exc_info=exc_info)

    def success(self) -> None:
        """The work succeeded: after failures, say so once (with the failures not reported yet, when an
        interval has passed since the last line; else they wait for the next line)."""
        if not self._failing:  # the common case costs one attribute read
            return
        with self._lock:
            if not self._failing:
                return
            self._failing = False
            now = self._clock()
            if not self._pending:
                self._last_line = now
                self.logger.info("%s works again", self.what)
            elif self._last_line is None or now - self._last_line >= self.interval_s:
                self._summary(now, " before it worked again")

    def flush(self) -> None:
        """Write the summary of the failures not reported yet now (e.g. when the subsystem stops)."""
        with self._lock:
            if self._pending:
                self._summary(self._clock(), "")

    def status(self) -> dict[str, Any]:
        """``{"failing", "failures", "last_error"}`` for a health report."""
        return {"failing": self._failing, "failures": self.failures, "last_error": self.last_error}

    def _summary(self, now: float, suffix: str) -> None:
        """Write the pending failures as one line (the lock is held)."""
        since = now - self._last_line if self._last_line is not None else 0.0
        count, self._pending, self._last_line = self._pending, 0, now
        self.logger.log(self.level, "%s: %d more failure%s in the last %.0f s%s, last: %s", self.what, count,
                        "" if count == 1 else "s", since, suffix, self.last_error)
