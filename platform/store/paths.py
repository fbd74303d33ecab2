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
