"""Child process of the crash tests: appends forever and reports every acknowledged put.

    python crash_writer.py ROOT FLUSH_MODE IMPL SEED THREADS

Prints ``READY``, then ``ACK offset queue_id queue_offset size seed n`` after each put
returned PUT_OK, and (ASYNC_FLUSH) ``FLUSHED offset`` whenever the flushed offset
moves.  The parent kills it with SIGKILL at a random moment.
"""
from __future__ import annotations

import hashlib
import sys
import threading

from sparkmq.platform.common.message import Message
from sparkmq.platform.store import FlushMode, MessageStore, PutStatus, StoreConfig
from sparkmq.storage_native import implementations

TOPIC = "CrashTopic"
QUEUES = 4


def expected_body(seed: int, n: int) -> bytes:
    """The body the writer sends as message ``n`` of run ``seed`` (the parent recomputes it)."""
    digest = hashlib.blake2b(f"{seed}:{n}".encode()).digest()
    length = 16 + (n * 7919) % 4000
    return (digest * (length // len(digest) + 1))[:length]


def config(root: str, flush_mode: str) -> StoreConfig:
    """The store settings both the writer and the checking parent use."""
    return StoreConfig(root=root, segment_size=256 * 1024, cq_units_per_file=512, flush_mode=FlushMode(flush_mode),
                       flush_interval_ms=20, checkpoint_interval_ms=20, max_message_size=16 * 1024,
                       max_properties_size=4096)


def main() -> None:
    root, flush_mode, impl, seed, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    store = MessageStore(config(root, flush_mode), commit_log_class=implementations()[impl].CommitLog).start()
    out_lock = threading.Lock()

    def emit(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    emit("READY")

    def writer(t: int) -> None:
        n = t * 1_000_000
        while True:
            msg = Message(TOPIC, expected_body(seed, n), tags=f"t{n % 3}", keys=(f"s{seed}n{n}",))
            res = store.put(msg, n % QUEUES)
            if res.status is PutStatus.PUT_OK:
                emit(f"ACK {res.commitlog_offset} {res.queue_id} {res.queue_offset} {res.store_size} {seed} {n}")
            n += 1

    for t in range(threads):
        threading.Thread(target=writer, args=(t,), daemon=True).start()
    last = -1
    while True:
        flushed = store.commit_log.flushed_offset
        if flushed != last:
            emit(f"FLUSHED {flushed}")
            last = flushed
        threading.Event().wait(0.005)


if __name__ == "__main__":
    main()
