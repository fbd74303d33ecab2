"""Progress over a queue whose entries finish out of order (timers, transaction halves).

The tracker keeps a *watermark* (every offset below it is done) and the set of done
offsets above it.  It persists both atomically as JSON with the set as a compressed
bitmap, plus a small ``extra`` mapping the owner wants back after a restart.
"""
from __future__ import annotations

import base64
import json
import os
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DoneTracker"]


class DoneTracker:
    """Watermark + done-set over queue offsets, persisted to ``path``; thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.watermark = 0
        self._done: set[int] = set()
        self.extra: dict[str, Any] = {}
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        self.watermark = int(data["watermark"])
        bits = zlib.decompress(base64.b64decode(data["done_bitmap"]))
        self._done = {self.watermark + i * 8 + b for i, byte in enumerate(bits) for b in range(8) if byte >> b & 1}
        self.extra = dict(data.get("extra", {}))

    def is_done(self, offset: int) -> bool:
        """Whether ``offset`` finished (below the watermark, or marked)."""
        with self._lock:
            return offset < self.watermark or offset in self._done

    def mark_done(self, offset: int) -> bool:
        """Mark ``offset`` finished; False if it already was.  The watermark moves over contiguous done offsets."""
        with self._lock:
            if offset < self.watermark or offset in self._done:
                return False
            self._done.add(offset)
            while self.watermark in self._done:
                self._done.discard(self.watermark)
                self.watermark += 1
            return True

    def persist(self, extra: Mapping[str, Any] | None = None) -> None:
        """Write the state atomically (tmp file + rename); ``extra`` replaces the stored extra mapping."""
        with self._lock:
            watermark = self.watermark
            done = sorted(self._done)
            if extra is not None:
                self.extra = dict(extra)
            extra_data = dict(self.extra)
        size = (done[-1] - watermark + 1) if done else 0
        bits = bytearray((size + 7) // 8)
        for offset in done:
            i = offset - watermark
            bits[i // 8] |= 1 << (i % 8)
        data = {"watermark": watermark, "done_bitmap": base64.b64encode(zlib.compress(bytes(bits))).decode(),
                "extra": extra_data}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)
