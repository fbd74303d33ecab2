"""Retention: delete commit-log segments by age and by disk use (RocketMQ's CleanCommitLogService).

- Expired segments (last write older than ``file_reserved_hours``) are deleted at
  the configured hours of the day, or at any hour once disk use passes
  ``disk_max_used_ratio``.
- Past ``disk_force_clean_ratio`` the oldest segments go even if not expired.
- The newest segment is never deleted.  Consume queues are trimmed to match by the
  native core, so reads below the new minimum answer OFFSET_TOO_SMALL.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from .config import StoreConfig

__all__ = ["RetentionDecision", "RetentionPolicy"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionDecision:
    """What one retention pass decided: delete every segment ending at or before ``delete_before``."""

    delete_before: int
    segments: int
    disk_used_ratio: float
    reason: str


class RetentionPolicy:
    """Decides which segments to delete; the caller deletes them through the log."""

    def __init__(self, config: StoreConfig, disk_usage: Callable[[str], float] | None = None) -> None:
        self._config = config
        self._disk_usage = disk_usage or _disk_used_ratio

    def decide(self, segments: list[tuple[int, str]], segment_size: int,
               now_ms: int | None = None) -> RetentionDecision:
        """Look at the segments (oldest first, as ``CommitLog.segments()``) and decide."""
        cfg = self._config
        now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        used = self._disk_usage(str(cfg.root))
        if used >= cfg.disk_warning_ratio:
            log.warning("disk use %.0f%% is above the warning level %.0f%%", used * 100,
                        cfg.disk_warning_ratio * 100)
        candidates = segments[:-1][: cfg.delete_segments_per_run]  # never the newest
        if not candidates:
            return RetentionDecision(0, 0, used, "nothing to delete")
        force = used >= cfg.disk_force_clean_ratio
        hour_ok = (not cfg.delete_when_hours
                   or datetime.fromtimestamp(now_ms / 1000).hour in cfg.delete_when_hours
                   or used >= cfg.disk_max_used_ratio)
        expiry_ms = cfg.file_reserved_hours * 3_600_000
        count = 0
        for _start, path in candidates:
            try:
                mtime_ms = os.stat(path).st_mtime_ns // 1_000_000
            except FileNotFoundError:
                break
            expired = now_ms - mtime_ms >= expiry_ms
            if force or (expired and hour_ok):
                count += 1
            else:
                break  # segments go strictly oldest first
        if not count:
            return RetentionDecision(0, 0, used, "no segment expired")
        delete_before = candidates[count - 1][0] + segment_size
        reason = "disk use above the force-clean ratio" if force else "expired"
        return RetentionDecision(delete_before, count, used, reason)


def _disk_used_ratio(path: str) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0
