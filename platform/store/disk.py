"""Disk watermarks of the store (RocketMQ's ``CleanCommitLogService`` and ``RunningFlags.DISK_FULL``).

The store measures the file system its root lives on every ``disk_check_interval_ms`` and keeps one of
four states (the ratios are of the space in use, as ``df`` shows it: used / (used + available)):

==============  ==========================  ==========================================================
state           entered at                  what the store does
==============  ==========================  ==========================================================
``OK``          below ``disk_max_used_ratio``  segments go when they expire, at ``delete_when_hours``
``CLEAN``       ``disk_max_used_ratio`` (75 %)  expired segments go at once, at any hour
``FORCE_CLEAN`` ``disk_force_clean_ratio`` (85 %)  the oldest segments go before they expire
``FULL``        ``disk_warning_ratio`` (90 %)  writes are refused with DISK_FULL; reads go on
==============  ==========================  ==========================================================

Early deletion (``CLEAN`` and ``FORCE_CLEAN``) stops at the oldest message a consumer group or a broker
service has not consumed yet (:class:`RetentionFloor`), unless ``disk_clean_unconsumed`` is set.

``FULL`` is left only when use falls below ``disk_resume_ratio`` (85 %), so a disk hovering around the
warning ratio does not flip writes on and off every check.  It is entered before the file system is full:
the space above the warning ratio stays for what must still be written while sends are refused (consumer
offsets, checkpoints, the lake's and the trace's tables).  A native append that meets a full file system
(ENOSPC) marks the state ``FULL`` at once, whatever the last measure said.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..common.errors import ErrorCode, SparkMQError
from .config import StoreConfig

__all__ = ["DiskState", "DiskUsage", "DiskGuard", "RetentionFloor", "measure_disk"]

log = logging.getLogger(__name__)


class DiskState(enum.StrEnum):
    """How full the store's file system is, by the configured ratios (see the module docstring)."""

    OK = "OK"
    #: At or above ``disk_max_used_ratio``: expired segments are deleted at any hour.
    CLEAN = "CLEAN"
    #: At or above ``disk_force_clean_ratio``: the oldest segments are deleted before they expire.
    FORCE_CLEAN = "FORCE_CLEAN"
    #: At or above ``disk_warning_ratio`` (until below ``disk_resume_ratio``): writes are refused.
    FULL = "FULL"


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """One measure of a file system."""

    path: str
    total_bytes: int
    used_bytes: int
    #: What an unprivileged writer may still use (``df``'s "Avail").
    free_bytes: int

    @property
    def used_ratio(self) -> float:
        """Used over used + available, as ``df`` computes its Use% (0.0 for an empty file system)."""
        room = self.used_bytes + self.free_bytes
        return self.used_bytes / room if room else 0.0


@dataclass(frozen=True, slots=True)
class RetentionFloor:
    """The oldest commit-log offset something still has to read: early deletion keeps the segment holding it.

    ``holder`` says who (``"group G on T/3"``, ``"delay level 2"``), for the operator the disk status names.
    """

    offset: int
    holder: str


def measure_disk(path: str | Path) -> DiskUsage:
    """The use of the file system holding ``path`` (one statvfs)."""
    usage = psutil.disk_usage(str(path))
    return DiskUsage(str(path), usage.total, usage.used, usage.free)


class DiskGuard:
    """The store's disk state: measured by :meth:`check`, asked on every write by :attr:`full`.  Thread-safe.

    ``measure`` is injectable (tests fake a disk's use).
    """

    def __init__(self, config: StoreConfig, measure: Callable[[Path], DiskUsage] = measure_disk) -> None:
        self._config = config
        self._measure = measure
        self._lock = threading.Lock()
        self._usage: DiskUsage | None = None
        self._state = DiskState.OK
        #: Read without the lock on every write: a plain bool flips atomically.
        self.full = False
        self._full_since: float | None = None
        #: Writes refused since the store started.
        self.refused = 0
        #: Why early deletion stopped at the last retention pass (None when nothing held it back).
        self.held_by: str | None = None

    @property
    def state(self) -> DiskState:
        """The state after the last check."""
        return self._state

    @property
    def usage(self) -> DiskUsage | None:
        """The last measure (None before the first check)."""
        return self._usage

    def check(self) -> DiskUsage:
        """Measure the disk now and move the state (logging each change); returns the measure."""
        cfg = self._config
        usage = self._measure(cfg.root)
        ratio = usage.used_ratio
        with self._lock:
            self._usage = usage
            was_full = self.full
            # hysteresis: FULL is entered at the warning ratio and left only below the resume ratio
            full = ratio >= cfg.disk_warning_ratio or (was_full and ratio >= cfg.disk_resume_ratio)
            if full:
                state = DiskState.FULL
            elif ratio >= cfg.disk_force_clean_ratio:
                state = DiskState.FORCE_CLEAN
            elif ratio >= cfg.disk_max_used_ratio:
                state = DiskState.CLEAN
            else:
                state = DiskState.OK
            previous, self._state = self._state, state
            self._set_full(full, ratio)
        if state is not previous and not (full or was_full):  # FULL's changes are logged by _set_full
            # the retention pass says what each state deleted; a disk hovering at a ratio must not flood the log
            log.debug("store %s: disk %.1f%% used: %s (was %s)", cfg.root, ratio * 100, state, previous)
        return usage

    def mark_full(self, reason: str) -> None:
        """The file system refused a write (ENOSPC): refuse writes now, until a check finds room again."""
        with self._lock:
            self._state = DiskState.FULL
            if not self.full:
                log.error("store %s: %s: writes are refused with DISK_FULL until the disk's use falls below "
                          "%.0f%%", self._config.root, reason, self._config.disk_resume_ratio * 100)
            self.full = True
            self._full_since = self._full_since or time.monotonic()

    def _set_full(self, full: bool, ratio: float) -> None:
        """Flip the writable flag, logging the change (the lock is held)."""
        cfg = self._config
        if full and not self.full:
            self._full_since = time.monotonic()
            log.error("store %s: disk %.1f%% used, at or above disk_warning_ratio %.0f%%: writes are refused with "
                      "DISK_FULL until it falls below disk_resume_ratio %.0f%% (reads go on)", cfg.root, ratio * 100,
                      cfg.disk_warning_ratio * 100, cfg.disk_resume_ratio * 100)
        elif not full and self.full:
            seconds = time.monotonic() - (self._full_since or time.monotonic())
            log.warning("store %s: disk %.1f%% used, below disk_resume_ratio %.0f%%: writes accepted again after "
                        "%.0f s (%d refused)", cfg.root, ratio * 100, cfg.disk_resume_ratio * 100, seconds,
                        self.refused)
            self._full_since = None
        self.full = full

    def refusal(self) -> SparkMQError:
        """The DISK_FULL error a refused write raises (and counts it)."""
        self.refused += 1  # a lost increment under a race only blurs a statistic
        cfg = self._config
        usage = self._usage
        used = f"{usage.used_ratio * 100:.1f}% used" if usage is not None else "full"
        return SparkMQError(ErrorCode.DISK_FULL,
                            f"the store's disk ({cfg.root}) is {used}, past disk_warning_ratio "
                            f"{cfg.disk_warning_ratio:.0%}: writes are refused until it falls below "
                            f"{cfg.disk_resume_ratio:.0%} (reads go on)")

    def status(self) -> dict[str, Any]:
        """The state for ``/health``, ``GET /broker`` and the console: the measure, the state, the ratios."""
        cfg = self._config
        usage = self._usage
        out: dict[str, Any] = {"path": str(cfg.root), "state": str(self._state), "writable": not self.full,
                               "refused_writes": self.refused, "held_by": self.held_by,
                               "max_used_ratio": cfg.disk_max_used_ratio,
                               "force_clean_ratio": cfg.disk_force_clean_ratio,
                               "warning_ratio": cfg.disk_warning_ratio, "resume_ratio": cfg.disk_resume_ratio}
        if usage is not None:
            out.update(total_bytes=usage.total_bytes, used_bytes=usage.used_bytes, free_bytes=usage.free_bytes,
                       used_ratio=round(usage.used_ratio, 4))
        if self._full_since is not None:
            out["full_for_s"] = round(time.monotonic() - self._full_since, 1)
        return out
