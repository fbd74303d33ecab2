"""The store's configuration: one frozen object, defaults and validation at construction."""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

from msgspec import Meta

from ..common.codec import pack_host
from ..common.validation import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_PROPERTIES_SIZE,
    NonNegative,
    Positive,
    Ratio,
    check_fields,
    check_int,
)

__all__ = ["FlushMode", "StoreConfig"]


class FlushMode(enum.StrEnum):
    """When an append counts as durable."""

    #: A background thread fdatasyncs every ``flush_interval_ms``; a send returns at once.
    ASYNC_FLUSH = "ASYNC_FLUSH"
    #: A send returns after an fdatasync covers it; concurrent sends share one sync (group commit).
    SYNC_FLUSH = "SYNC_FLUSH"


#: Commit-log segments are whole pages.
SegmentSize = Annotated[int, Meta(ge=4096, multiple_of=4096, description="a multiple of 4096 and at least 4096")]
#: The disk ratios, lowest first (the first three must rise in this order).
_RATIOS = ("disk_max_used_ratio", "disk_force_clean_ratio", "disk_warning_ratio", "disk_resume_ratio")


@dataclass(frozen=True)
class StoreConfig:
    """Every setting of a ``MessageStore``; defaults follow RocketMQ."""

    #: Directory holding commitlog/, consumequeue/, checkpoint, abort and lock.
    root: Path
    #: Bytes per commit-log segment (a multiple of 4096).
    segment_size: SegmentSize = 1 << 30
    #: 20-byte units per consume-queue file.
    cq_units_per_file: Positive = 300_000
    flush_mode: FlushMode = FlushMode.ASYNC_FLUSH
    #: ASYNC_FLUSH: how often the background thread syncs.
    flush_interval_ms: Positive = 500
    #: SYNC_FLUSH: how long a send waits for its sync before FLUSH_DISK_TIMEOUT.
    sync_flush_timeout_ms: Positive = 5000
    #: How often the checkpoint (the recovery starting point) is rewritten.
    checkpoint_interval_ms: Positive = 1000
    #: Bytes of the newest log kept in the page cache: after each full flush the durable pages further
    #: back are dropped from it, so the writer recycles pages instead of taking new ones (a new page costs
    #: it several times more on a VM that hands free memory back to its host), and a reader more than this
    #: far behind reads from the disk.  0 leaves it all to the OS.
    page_cache_keep: NonNegative = 1 << 30
    #: Segments whose last write is older than this are deleted (RocketMQ's fileReservedTime).
    file_reserved_hours: Annotated[float, Meta(gt=0)] = 72.0
    #: Hours of the day (0-23) at which expired segments are deleted; empty = any hour (deleteWhen).
    delete_when_hours: tuple[int, ...] = (4,)
    # Disk watermarks (platform/store/disk.py): ratios of the store's file system in use, as df shows them.
    #: diskMaxUsedSpaceRatio: at or above it, expired segments are deleted at once, at any hour.
    disk_max_used_ratio: Ratio = 0.75
    #: diskSpaceCleanForciblyRatio: at or above it, the oldest segments are deleted before they expire.
    disk_force_clean_ratio: Ratio = 0.85
    #: diskSpaceWarningLevelRatio: at or above it, writes are refused with DISK_FULL (reads go on), leaving the
    #: rest of the disk to offsets, checkpoints, the lake and the trace.
    disk_warning_ratio: Ratio = 0.90
    #: Refused writes are accepted again once use falls below this (hysteresis; RocketMQ resumes at the warning
    #: ratio itself, so a disk at the line flips every check).
    disk_resume_ratio: Ratio = 0.85
    #: Early deletion (at disk_max_used_ratio and above) may delete messages a consumer group or a broker
    #: service has not consumed yet.  False keeps them: writes are refused instead once the disk reaches the
    #: warning ratio, until the consumers move on (RocketMQ deletes them).
    disk_clean_unconsumed: bool = False
    #: How often the disk's use is measured (one statvfs); under CLEAN and above, retention runs this often too.
    disk_check_interval_ms: Positive = 1000
    #: How often retention runs while the disk is below disk_max_used_ratio.
    retention_interval_ms: Positive = 10_000
    #: Segments deleted per retention run at most.
    delete_segments_per_run: Positive = 10
    max_message_size: Positive = DEFAULT_MAX_MESSAGE_SIZE
    max_properties_size: Annotated[int, Meta(ge=0, le=65535)] = DEFAULT_MAX_PROPERTIES_SIZE
    #: "ip:port" written into every record and into offsetMsgIds.
    store_host: str = "127.0.0.1:10911"
    #: Start the flush and retention threads (False for tools that only read).
    background_services: bool = field(default=True)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], **overrides: Any) -> StoreConfig:
        """Build from a config file's ``[store]`` table; unknown keys are an error, not ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown store setting(s) {unknown}; known: {sorted(known)}")
        return cls(**{**values, **overrides})

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))
        object.__setattr__(self, "flush_mode", FlushMode(self.flush_mode))
        object.__setattr__(self, "delete_when_hours", tuple(self.delete_when_hours))
        check_fields(self)  # sizes, intervals, disk ratios, switches
        for hour in self.delete_when_hours:
            check_int("delete_when_hours", hour, 0, 23, ValueError)
        for low, high in zip(_RATIOS, _RATIOS[1:3], strict=False):  # max used <= force clean <= warning
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} {getattr(self, low)} must not be above {high} {getattr(self, high)}")
        if self.disk_resume_ratio > self.disk_warning_ratio:
            raise ValueError(f"disk_resume_ratio {self.disk_resume_ratio} must not be above disk_warning_ratio "
                             f"{self.disk_warning_ratio} (writes resume below it)")
        # the largest record must fit in one segment (header 120 + topic + properties)
        if self.max_message_size + self.max_properties_size + 400 > self.segment_size:
            raise ValueError(
                f"segment_size {self.segment_size} cannot hold a message of max_message_size "
                f"{self.max_message_size} with its properties; raise segment_size or lower the limits")
        pack_host(self.store_host)  # validates "ip:port"
