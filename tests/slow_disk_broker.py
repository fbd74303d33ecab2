"""Child of the overload tests: a broker whose disk syncs take as long as a slow disk's would.

    python -m slow_disk_broker BROKER-ARGS...      (tests/ on PYTHONPATH; the same arguments as broker_main)

``SLOW_DISK_BYTES_PER_S`` (required) is the disk's write bandwidth and ``SLOW_DISK_LATENCY_S`` (default 2 ms)
its latency per sync: every sync of the commit log (the log-only one group commit waits for, and the periodic
full one) first sleeps ``latency + bytes not written yet / bandwidth``, again for the bytes appended meanwhile
(three rounds at most), then syncs for real.  Appends are not
slowed (they land in the page cache as on any disk): a producer faster than the bandwidth gets sends that wait
seconds for their sync under SYNC_FLUSH, unless the broker refuses them first (platform/broker/overload.py).
"""
from __future__ import annotations

import os
import sys
import threading
import time

from sparkmq.api import broker_main
from sparkmq.platform.store import message_store

BANDWIDTH = float(os.environ["SLOW_DISK_BYTES_PER_S"])
LATENCY_S = float(os.environ.get("SLOW_DISK_LATENCY_S", "0.002"))
_disk = threading.Lock()  # one disk: syncs queue behind each other
#: The log offset the disk has written up to (None until the first sync: what was there at start is written).
_written: int | None = None
#: A sync writes what was dirty when it began, then what was dirtied meanwhile, at most this many rounds.
_ROUNDS = 3


class SlowDiskLog(message_store.CommitLog):  # type: ignore[misc, valid-type]
    """The commit log on a disk of ``BANDWIDTH`` bytes per second (its Python ``flush_log`` also keeps the
    group-commit syncs on the store's Python flush thread, where they can be slowed)."""

    def _write_back(self) -> None:
        global _written
        with _disk:
            if _written is None:
                _written = self.log_flushed_offset
            for _ in range(_ROUNDS):
                end = self.max_offset
                if end <= _written:
                    break
                time.sleep(LATENCY_S + (end - _written) / BANDWIDTH)
                _written = end

    def flush_log(self) -> int:
        self._write_back()
        return super().flush_log()

    def flush(self) -> int:
        self._write_back()
        return super().flush()


message_store.CommitLog = SlowDiskLog

if __name__ == "__main__":
    sys.exit(broker_main.main(sys.argv[1:]))
