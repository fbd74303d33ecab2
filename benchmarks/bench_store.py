"""Store benchmarks: one line of figures per benchmark, ``name key=value …``.

    python benchmarks/bench_store.py [--quick] [--dir DIR] [--only NAME]

Comparisons are ratios measured in the same run (the machine is shared and noisy).
``--quick`` uses small sizes so CI can smoke-run it in seconds.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from sparkmq.platform.common.message import Message
from sparkmq.platform.store import FlushMode, MessageStore, StoreConfig
from sparkmq.storage_native import encode_batch, implementations

IMPLS = implementations()
NATIVE = IMPLS.get("native")
BODY = os.urandom(1024)
PROPS = b"UNIQ_KEY\x017F0000010BE341B5534B695352E90001\x02TAGS\x01bench\x02"
TS = 1_700_000_000_000


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


def fresh(base: Path, name: str) -> Path:
    path = base / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def raw_sequential_write(path: Path, chunk: bytes, total: int) -> float:
    """MB/s of a plain write loop of ``total`` bytes in ``chunk``-sized writes, plus a final fsync."""
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        written = 0
        while written < total:
            f.write(chunk)
            written += len(chunk)
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return total / elapsed / 1e6


def bench_append_batch(base: Path, impl, total_bytes: int, segment: int) -> tuple[float, float]:
    """(msgs/s, MB/s) of 64-message batches of 1 KiB bodies, ending with a flush."""
    item = (BODY, PROPS, 7, 0, 0, TS, None, 0, 0)
    batch = [item] * 64
    root = fresh(base, "batch")
    with impl.CommitLog(str(root), segment_size=segment) as log:
        n = 0
        start = time.perf_counter()
        while log.max_offset < total_bytes:
            log.append_batch("Bench", n % 8, batch, TS)
            n += 64
        log.flush()
        elapsed = time.perf_counter() - start
        size = log.max_offset
    shutil.rmtree(root)
    return n / elapsed, size / elapsed / 1e6


def bench_append_single(base: Path, impl, count: int, segment: int) -> float:
    root = fresh(base, "single")
    with impl.CommitLog(str(root), segment_size=segment) as log:
        append = log.append
        start = time.perf_counter()
        for i in range(count):
            append("Bench", i & 7, BODY, PROPS, 7, 0, 0, TS, None, TS)
        log.flush()
        elapsed = time.perf_counter() - start
    shutil.rmtree(root)
    return count / elapsed


def bench_sync_group(base: Path, threads: int, per_thread: int) -> tuple[float, float, float, int]:
    """SYNC_FLUSH through MessageStore with many writer threads: msgs/s, p50/p99 ms, fsyncs."""
    root = fresh(base, "sync")
    cfg = StoreConfig(root=root, segment_size=256 << 20, flush_mode=FlushMode.SYNC_FLUSH)
    latencies: list[float] = []
    lock = threading.Lock()
    with MessageStore(cfg) as store:
        barrier = threading.Barrier(threads + 1)

        def writer(t: int) -> None:
            mine = []
            msg = Message("Bench", BODY)
            barrier.wait()
            for _ in range(per_thread):
                t0 = time.perf_counter()
                store.put(msg, t % 8)
                mine.append(time.perf_counter() - t0)
            with lock:
                latencies.extend(mine)

        workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        barrier.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        syncs = store._flusher.flush_count if store._flusher else 0
    shutil.rmtree(root)
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return len(latencies) / elapsed, p(0.50), p(0.99), syncs


def bench_sync_async(base: Path, in_flight: int, per_task: int,
                     queues: int) -> tuple[float, float, float, int, int]:
    """SYNC_FLUSH from one event loop: ``in_flight`` coroutines each append one message at a time
    (``put_packed(count=1, wait=False)``) to one of ``queues`` queues and await ``wait_durable``;
    msgs/s, p50/p99 ms, sync rounds (group commits syncing the log segment alone, plus the full
    flushes) and of those the full flushes (log and every dirty consume-queue file, every
    flush_interval_ms)."""
    root = fresh(base, "sync_async")
    cfg = StoreConfig(root=root, segment_size=256 << 20, flush_mode=FlushMode.SYNC_FLUSH)
    data, _ids, _next = encode_batch([Message("Bench", BODY, tags="bench")], "7F0000010BE341B5534B", TS, 0, TS)
    latencies: list[float] = []

    async def run(store: MessageStore) -> float:
        loop = asyncio.get_running_loop()
        clock = time.perf_counter

        async def sender(q: int) -> None:
            mine = []
            for _ in range(per_task):
                t0 = clock()
                result = store.put_packed("Bench", q, data, 1, wait=False)
                await store.wait_durable(result.end_offset, loop)
                mine.append(clock() - t0)
            latencies.extend(mine)

        start = clock()
        await asyncio.gather(*(sender(t % queues) for t in range(in_flight)))
        return clock() - start

    with MessageStore(cfg) as store:
        flusher = store._flusher
        assert flusher is not None
        syncs_before, full_before = flusher.flush_count, flusher.full_flush_count
        elapsed = asyncio.run(run(store))
        syncs, full = flusher.flush_count - syncs_before, flusher.full_flush_count - full_before
    shutil.rmtree(root)
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return len(latencies) / elapsed, p(0.50), p(0.99), syncs, full


def bench_read_sequential(base: Path, impl, count: int) -> tuple[float, float]:
    """(raw msgs/s through the consume queue, decoded msgs/s through MessageStore.get_messages)."""
    root = fresh(base, "read")
    cfg = StoreConfig(root=root, segment_size=256 << 20, background_services=False)
    with MessageStore(cfg, commit_log_class=impl.CommitLog) as store:
        batch = [Message("Bench", BODY, tags="bench")] * 64
        for _i in range(count // 64):
            store.put_batch("Bench", 0, batch)
        log = store.commit_log
        offset, n = 0, 0
        start = time.perf_counter()
        while True:
            offset, records = log.get("Bench", 0, offset, 32)
            if not records:
                break
            n += len(records)
        raw_rate = n / (time.perf_counter() - start)
        offset, m = 0, 0
        start = time.perf_counter()
        while m < n:
            got = store.get_messages("Bench", 0, offset, 32)
            m += len(got.messages)
            offset = got.next_offset
        decoded_rate = m / (time.perf_counter() - start)
    shutil.rmtree(root)
    return raw_rate, decoded_rate


_KILL_CHILD = r"""
import sys, os
from sparkmq.storage_native import implementations
log = implementations()["native"].CommitLog(sys.argv[1], segment_size=int(sys.argv[3]))
body = os.urandom(1024); batch = [(body, b"k\x01v\x02", 1, 0, 0, 0, None, 0, 0)] * 64
target = int(sys.argv[2]); n = 0
while log.max_offset < target:
    log.append_batch("Bench", n % 8, batch); n += 1
print("WRITTEN", log.max_offset, flush=True)
sys.stdin.read()
"""


def bench_recover_after_kill(base: Path, size: int, segment: int) -> tuple[float, float, int]:
    """Write ``size`` bytes in a child, SIGKILL it, then time recovery opens: (full scan s, checkpoint s, records)."""
    root = fresh(base, "recover")
    child = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(root), str(size), str(segment)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait()
    start = time.perf_counter()
    log = NATIVE.CommitLog(str(root), segment_size=segment, check_from=0)  # no checkpoint: scan it all
    full = time.perf_counter() - start
    records, end = log.recovery["records_checked"], log.max_offset
    log.close()
    start = time.perf_counter()
    log = NATIVE.CommitLog(str(root), segment_size=segment, check_from=end)  # with a fresh checkpoint
    quick = time.perf_counter() - start
    log.close()
    shutil.rmtree(root)
    return full, quick, records


_RSS_CHILD = r"""
import sys, os
from sparkmq.storage_native import implementations
log = implementations()["native"].CommitLog(sys.argv[1], segment_size=int(sys.argv[3]))
body = os.urandom(1024); batch = [(body, b"", 1, 0, 0, 0, None, 0, 0)] * 64
target = int(sys.argv[2]); n = 0
while log.max_offset < target:
    log.append_batch("Bench", 0, batch); n += 64
    if n % (64 * 256) == 0: log.flush()
log.flush()
print("WRITTEN", flush=True)
offset = 0; read = 0
while True:
    offset, recs = log.get("Bench", 0, offset, 32)
    if not recs: break
    read += len(recs)
print("READ", read, flush=True)
sys.stdin.read()
"""


def bench_rss(base: Path, size: int, segment: int) -> tuple[float, float]:
    """Peak RSS (MB) of a process writing then reading back ``size`` bytes; returns (write peak, read peak)."""
    root = fresh(base, "rss")
    child = subprocess.Popen([sys.executable, "-c", _RSS_CHILD, str(root), str(size), str(segment)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc = psutil.Process(child.pid)
    peaks = {"WRITTEN": 0.0, "READ": 0.0}
    phase = ["WRITTEN"]

    def watch() -> None:
        while child.poll() is None:
            try:
                rss = proc.memory_info().rss / 1e6
            except psutil.Error:
                return
            peaks[phase[0]] = max(peaks[phase[0]], rss)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert child.stdout is not None
    child.stdout.readline()
    phase[0] = "READ"
    child.stdout.readline()
    child.stdin.close()  # type: ignore[union-attr]
    child.wait()
    watcher.join()
    shutil.rmtree(root)
    return peaks["WRITTEN"], peaks["READ"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--only", default=None, help="run only benchmarks whose name contains this")
    args = parser.parse_args()
    if NATIVE is None:
        sys.exit("the C extension is not built: run `python3 build.py setup`")
    base = args.dir or Path(tempfile.mkdtemp(prefix="sparkmq-bench-", dir=os.environ.get("SPARKMQ_BENCH_DIR")))
    base.mkdir(parents=True, exist_ok=True)
    q = args.quick
    segment = (64 << 20) if q else (1 << 30)
    want = lambda name: args.only is None or args.only in name  # noqa: E731
    try:
        if want("append_async_batch64"):
            # Alternate the plain loop and the log twice and keep each one's best, so both
            # see the same page-cache and writeback conditions.
            total = (64 << 20) if q else (1 << 30)
            runs, raws = [], []
            for _ in range(2):
                raws.append(raw_sequential_write(base / "raw.bin", BODY * 64, total))
                runs.append(bench_append_batch(base, NATIVE, total, segment))
            msgs, mbs = max(runs)
            raw = max(raws)
            line("store.append_async_batch64", msgs_per_s=round(msgs), mb_per_s=mbs, raw_write_mb_per_s=raw,
                 ratio=mbs / raw, target_ratio=0.7, target_msgs_per_s=500000)
        if want("append_async_single"):
            rate = bench_append_single(base, NATIVE, 50_000 if q else 1_000_000, segment)
            line("store.append_async_single", msgs_per_s=round(rate), target_msgs_per_s=300000)
        if want("append_sync_group"):
            rate, p50, p99, syncs = bench_sync_group(base, 32, 100 if q else 2000)
            line("store.append_sync_group", threads=32, msgs_per_s=round(rate), p50_ms=p50, p99_ms=p99,
                 fdatasyncs=syncs, target_msgs_per_s=50000)
        if want("append_sync_async64"):
            # the event loop's path: no thread per waiter, one hand-out per fdatasync; a group commit
            # syncs the log segment alone, so the figure should hardly depend on the number of queues
            # (the consume-queue files are synced by the full flush every flush_interval_ms)
            per_task = 100 if q else 2000
            for queues in (1, 4, 8):
                rate, p50, p99, syncs, full = bench_sync_async(base, 64, per_task, queues)
                line("store.append_sync_async64", in_flight=64, queues=queues, msgs_per_s=round(rate),
                     p50_ms=p50, p99_ms=p99, sync_rounds=syncs, full_flushes=full,
                     msgs_per_round=64 * per_task / max(syncs, 1), target_msgs_per_s=50000)
        if want("read_sequential"):
            raw_rate, decoded = bench_read_sequential(base, NATIVE, 64_000 if q else 1_024_000)
            line("store.read_sequential", batch=32, msgs_per_s=round(raw_rate), decoded_msgs_per_s=round(decoded),
                 target_msgs_per_s=1000000)
        if want("native_vs_python"):
            n = 5_000 if q else 50_000
            # interleaved, best of two each: the disk's writeback must not favour either side
            singles = {"native": [], "python": []}
            batches = {"native": [], "python": []}
            for _ in range(2):
                for name in ("native", "python"):
                    singles[name].append(bench_append_single(base, IMPLS[name], n, 64 << 20))
                    batches[name].append(bench_append_batch(base, IMPLS[name], n * 1200, 64 << 20)[0])
            native_single, python_single = max(singles["native"]), max(singles["python"])
            native_batch, python_batch = max(batches["native"]), max(batches["python"])
            line("store.native_vs_python", single_speedup=native_single / python_single,
                 batch64_speedup=native_batch / python_batch, target_speedup=10)
        if want("recover_after_kill"):
            size = (64 << 20) if q else (1 << 30)
            full, quick, records = bench_recover_after_kill(base, size, segment)
            line("store.recover_after_kill", log_mb=size >> 20, records=records, full_scan_s=full,
                 from_checkpoint_s=quick, target_s=5)
        if want("rss"):
            size = (512 << 20) if q else (10 << 30)
            write_peak, read_peak = bench_rss(base, size, segment)
            line("store.rss_10gib" if not q else "store.rss_quick", log_mb=size >> 20, write_peak_rss_mb=write_peak,
                 read_peak_rss_mb=read_peak, target_mb=500)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
