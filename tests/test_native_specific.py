"""Behaviour only the C core has (the twin copies, holds the GIL and keeps no RSS budget).

- RSS stays bounded while a log much larger than the budget is written and read;
- a read_view keeps its segment mapped after the file is deleted and the log closed;
- the GIL is released during long operations, so other threads progress;
- flush does not hold the log lock while syncing (appends go on: group commit), shown with sync calls
  that block until the test releases them;
- concurrent appenders and flushers leave a consistent log;
- the CRC equals zlib.crc32.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import zlib

import pytest

from conftest import need_module
from procs import child_env

native = need_module("sparkmq.storage_native._commitlog")
CommitLog = native.CommitLog

MiB = 1 << 20


def rss_mib() -> float:
    """File-backed resident set (the mapped segments and queue files): what the
    store controls, unaffected by the allocator (or a sanitizer's quarantine)."""
    kib = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssFile:", "RssShmem:")):
                kib += int(line.split()[1])
    return kib / 1024


def test_crc_matches_zlib():
    rnd = random.Random(7)
    for n in list(range(0, 200)) + [rnd.randrange(200, 70000) for _ in range(50)]:
        data = rnd.randbytes(n)
        start = rnd.randrange(1 << 32)
        assert native._crc32(data) == zlib.crc32(data)
        assert native._crc32(data, start) == zlib.crc32(data, start)
        assert native._crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_rss_stays_bounded(tmp_path):
    """1 GiB through 64 MiB segments: without trimming, RSS would grow by ~1 GiB
    on write and again on read; the core drops cold page-table entries."""
    total = 1 << 30
    log = CommitLog(str(tmp_path / "s"), segment_size=64 * MiB)
    body = os.urandom(4096)
    batch = [(body, b"", 0, 0, 0, 0, None, 0, 0)] * 64
    base = peak = rss_mib()
    i = 0
    while log.max_offset < total:
        log.append_batch("rss", i & 3, batch)
        i += 1
        if i % 64 == 0:
            peak = max(peak, rss_mib())
    off = 0
    while True:
        off, recs = log.scan(off, 512)
        if not recs:
            break
        peak = max(peak, rss_mib())
    for q in range(4):
        qo = 0
        while True:
            qo, recs = log.get("rss", q, qo, 512)
            if not recs:
                break
            peak = max(peak, rss_mib())
    log.close()
    assert peak - base < 320, f"RSS grew by {peak - base:.0f} MiB"


def test_read_view_outlives_delete_and_close(tmp_path):
    log = CommitLog(str(tmp_path / "s"), segment_size=4096)
    offsets = [log.append("t", 0, bytes([i]) * 1500, store_timestamp=1)[0] for i in range(12)]
    first_segment = log.segments()[0][1]
    view = log.read_view(offsets[0])
    copy = log.read(offsets[0])
    assert view.readonly and bytes(view) == copy
    with pytest.raises(TypeError):
        view[0] = 1
    assert log.delete_segments_before(log.segments()[-1][0]) >= 1
    assert not os.path.exists(first_segment)
    assert bytes(view) == copy  # the mapping is still there
    log.close()
    assert bytes(view) == copy
    assert native.decode_record(view, verify_crc=True)[14] == bytes([0]) * 1500
    view.release()


def test_views_survive_the_log_object(tmp_path):
    log = CommitLog(str(tmp_path / "s"), segment_size=8192)
    off = log.append("t", 0, b"payload", store_timestamp=3)[0]
    view = log.read_view(off)
    del log  # dealloc flushes and drops the log's references
    assert native.decode_record(view)[14] == b"payload"


def _progress_during(call, *args):
    """How many times another Python thread looped while `call` ran."""
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)  # let the spinner get going
    before = counter[0]
    start = time.perf_counter()
    call(*args)
    elapsed = time.perf_counter() - start
    during = counter[0] - before
    stop.set()
    t.join()
    return during, elapsed


def test_gil_released_during_big_append(tmp_path):
    log = CommitLog(str(tmp_path / "s"), segment_size=1 << 30)
    body = os.urandom(16 * MiB)
    batch = [(body, b"", 0, 0, 0, 0, None, 0, 0)] * 16  # 256 MiB: copies + CRC take a while
    during, elapsed = _progress_during(log.append_batch, "gil", 0, batch)
    log.close()
    # A thread holding the GIL in C for `elapsed` seconds would let the spinner
    # run only at the edges of the call.
    assert elapsed > 0.02
    assert during > 1000, (during, elapsed)


#: An LD_PRELOAD shim whose msync, fdatasync and fsync (what a flush syncs with; the C core's ``mf_sync`` is
#: msync) block, once armed, until released: a flush as slow as the test wants, on any disk (tmpfs included).
_SLOW_SYNC_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <unistd.h>

int sparkmq_sync_armed, sparkmq_sync_entered, sparkmq_sync_released;

static void hold(void)
{
    if (__atomic_load_n(&sparkmq_sync_armed, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&sparkmq_sync_entered, 1, __ATOMIC_SEQ_CST);
        while (!__atomic_load_n(&sparkmq_sync_released, __ATOMIC_SEQ_CST))
            usleep(1000);
    }
}

int msync(void *addr, size_t len, int flags)
{
    static int (*real)(void *, size_t, int);
    if (!real)
        real = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "msync");
    hold();
    return real(addr, len, flags);
}

int fdatasync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    hold();
    return real(fd);
}

int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    hold();
    return real(fd);
}
"""

#: Runs in a child started with the shim preloaded; prints one JSON line.
_FLUSH_CHILD = r"""
import ctypes, json, os, sys, threading, time
from sparkmq.storage_native._commitlog import CommitLog

shim = ctypes.CDLL(None)  # the preloaded shim's globals
armed, entered, released = (ctypes.c_int.in_dll(shim, f"sparkmq_sync_{n}") for n in ("armed", "entered", "released"))
log = CommitLog(sys.argv[1], segment_size=8 << 20)
body = os.urandom(4096)
for i in range(256):
    log.append("f", i & 1, body)  # dirty pages in the segment and in both queues' files
before = log.max_offset
armed.value = 1
flusher = threading.Thread(target=log.flush)
flusher.start()
deadline = time.monotonic() + 20
while entered.value == 0 and time.monotonic() < deadline:
    time.sleep(0.001)
in_sync = entered.value > 0 and flusher.is_alive()
appender = threading.Thread(target=log.append, args=("f", 1, b"during flush"))
appender.start()
appender.join(10)
appended = not appender.is_alive()
flushing = flusher.is_alive()
released.value = 1
flusher.join(30)
appender.join(30)
print(json.dumps({"in_sync": in_sync, "appended": appended, "flushing": flushing, "done": not flusher.is_alive(),
                  "covered": log.flushed_offset >= before}))
log.close()
"""


@pytest.mark.cluster  # a child process: the shim has to be preloaded
def test_flush_does_not_block_appends(tmp_path):
    """An append completes while a flush is stuck syncing (the shim holds it in msync until released)."""
    compiler = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the sync shim")
    (tmp_path / "slow_sync.c").write_text(_SLOW_SYNC_C)
    shim = tmp_path / "slow_sync.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(shim), str(tmp_path / "slow_sync.c"), "-ldl"],
                   check=True, capture_output=True, timeout=60)
    env = child_env(LD_PRELOAD=" ".join(filter(None, [str(shim), os.environ.get("LD_PRELOAD")])))
    run = subprocess.run([sys.executable, "-c", _FLUSH_CHILD, str(tmp_path / "s")], capture_output=True, text=True,
                         env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["in_sync"], f"the flush never reached a sync call (is the shim preloaded?): {result}"
    assert result["appended"] and result["flushing"], f"the append waited for the whole flush: {result}"
    assert result["done"] and result["covered"], result


def test_concurrent_appenders_and_flusher(tmp_path):
    log = CommitLog(str(tmp_path / "s"), segment_size=64 * 1024, cq_units_per_file=100)
    results: dict[int, list[tuple[int, int]]] = {}
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(n: int) -> None:
        try:
            out = []
            for i in range(1500):
                if i % 10 == 0:
                    _, _, offs = log.append_batch(f"t{n}", 0, [(b"%d-%d" % (n, i), b"", n, 0, 0, 0, None, 0, 0)] * 3)
                    out.extend((o, n) for o in offs)
                else:
                    off, _, _ = log.append(f"t{n}", 0, b"%d-%d" % (n, i), tag_hash=n)
                    out.append((off, n))
            results[n] = out
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def flusher() -> None:
        while not stop.is_set():
            log.flush()
            log.get("t0", 0, 0, 32)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    f = threading.Thread(target=flusher)
    f.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    f.join()
    assert not errors
    assert log.flush() == log.max_offset
    for n, offs in results.items():
        cq = log.consume_queue(f"t{n}", 0)
        assert cq.max_offset == len(offs)
        units = cq.units(0, len(offs))
        assert [u[0] for u in units] == sorted(o for o, _ in offs)
        for qo, (clo, size, tag) in enumerate(units):
            rec = native.decode_record(log.read(clo), verify_crc=True)
            assert (rec[4], rec[13], rec[0]) == (qo, n, size) and tag == n
    log.close()
    reopened = CommitLog(str(tmp_path / "s"), segment_size=64 * 1024, cq_units_per_file=100)
    assert reopened.recovery["cq_units_redone"] == 0 and reopened.recovery["torn"] == 0
    reopened.close()
