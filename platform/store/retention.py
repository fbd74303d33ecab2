"""Retention: delete commit-log segments by age and by disk use (RocketMQ's CleanCommitLogService).

- Expired segments (last write older than ``file_reserved_hours``) are deleted at the configured hours
  of the day: the retention every consumer has agreed to.
- Early, once disk use reaches ``disk_max_used_ratio``: expired segments at any hour; from
  ``disk_force_clean_ratio`` on the oldest segments even if not expired.  Early deletion stops at the
  segment holding the oldest message a consumer still needs (the :class:`~.disk.RetentionFloor` the
  broker reports), unless ``disk_clean_unconsumed`` is set: the store refuses writes at the warning
  ratio rather than lose what a group has not read.
- Segments go strictly oldest first, at most ``delete_segments_per_run`` per pass, and the newest
  segment never.  Consume queues are trimmed to match by the native core, so reads below the new
  minimum answer OFFSET_TOO_SMALL.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime

from .config import StoreConfig
from .disk import RetentionFloor

__all__ = ["RetentionDecision", "RetentionPolicy"]


@dataclass(frozen=True)
class RetentionDecision:
    """What one retention pass decided: delete every segment ending at or before ``delete_before``."""

    delete_before: int
    segments: int
    disk_used_ratio: float
    reason: str
    #: What stopped early deletion before a segment the disk's use asked to delete (None: nothing did).
    held_by: str | None = None


class RetentionPolicy:
    """Decides which segments to delete; the caller deletes them through the log."""

    def __init__(self, config: StoreConfig) -> None:
        self._config = config

    def decide(self, segments: list[tuple[int, str]], segment_size: int, used_ratio: float,
               floor: RetentionFloor | None = None, now_ms: int | None = None) -> RetentionDecision:
        """Look at the segments (oldest first, as ``CommitLog.segments()``) with the disk ``used_ratio`` and the
        oldest offset a consumer still needs (``floor``, None: nobody), and decide."""
        cfg = self._config
        now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        candidates = segments[:-1][: cfg.delete_segments_per_run]  # never the newest
        if not candidates:
            return RetentionDecision(0, 0, used_ratio, "nothing to delete")
        force = used_ratio >= cfg.disk_force_clean_ratio
        early = used_ratio >= cfg.disk_max_used_ratio
        on_time = not cfg.delete_when_hours or datetime.fromtimestamp(now_ms / 1000).hour in cfg.delete_when_hours
        expiry_ms = cfg.file_reserved_hours * 3_600_000
        count = 0
        held_by = None
        forced = early_expired = False
        for index, (_start, path) in enumerate(candidates):
            try:
                mtime_ms = os.stat(path).st_mtime_ns // 1_000_000
            except FileNotFoundError:
                break
            expired = now_ms - mtime_ms >= expiry_ms
            if expired and on_time:
                count += 1  # the configured retention: due whatever the consumers
                continue
            if not (force or (expired and early)):
                break
            end = segments[index + 1][0]  # where this segment's records end: the next one's start
            if floor is not None and not cfg.disk_clean_unconsumed and end > floor.offset:
                held_by = floor.holder  # deleting early would lose what a consumer has not read
                break
            forced = forced or not expired
            early_expired = early_expired or expired
            count += 1
        if not count:
            return RetentionDecision(0, 0, used_ratio, "no segment expired" if held_by is None
                                     else f"held by {held_by}", held_by)
        delete_before = candidates[count - 1][0] + segment_size
        if forced:
            reason = "disk use above the force-clean ratio"
        elif early_expired:
            reason = "expired, deleted early: disk use above the max-used ratio"
        else:
            reason = "expired"
        return RetentionDecision(delete_before, count, used_ratio, reason, held_by)
