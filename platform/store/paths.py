"""Every on-disk path of a store, named in one place."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["StorePaths"]


@dataclass(frozen=True)
class StorePaths:
    """The files and folders below a store's root."""

    root: Path

    @property
    def commitlog(self) -> Path:
        """Folder of the commit-log segments (written by the native core)."""
        return self.root / "commitlog"

    @property
    def consumequeue(self) -> Path:
        """Folder of the consume queues: consumequeue/<topic>/<queue_id>/."""
        return self.root / "consumequeue"

    def segment(self, start: int) -> Path:
        """The commit-log segment starting at log offset ``start`` (named by it, 20 digits)."""
        return self.commitlog / f"{start:020d}"

    def consume_queue_file(self, topic: str, queue_id: int, file_start: int) -> Path:
        """The consume-queue file of (topic, queue_id) starting at byte ``file_start`` of the queue's units
        (``unit index // units_per_file * units_per_file * 20``, 20 digits)."""
        return self.consumequeue / topic / str(queue_id) / f"{file_start:020d}"

    @property
    def checkpoint(self) -> Path:
        """Where recovery starts: the last offset known flushed."""
        return self.root / "checkpoint"

    @property
    def abort(self) -> Path:
        """Exists while the store is open; found at start it means an unclean stop."""
        return self.root / "abort"

    @property
    def lock(self) -> Path:
        """flock'ed by the process that has the store open."""
        return self.root / "lock"
