"""SYNC_FLUSH group commit without a thread per waiter: ``MessageStore.wait_durable`` and ``FlushService``.

What is checked: a future resolves only once the log's flushed offset covers it; concurrent waiters
share few syncs and each loop gets one callback per sync; ASYNC_FLUSH answers at once; a stuck sync
times waiters out (FLUSH_DISK_TIMEOUT, message kept) and later ones still work; shutdown answers every
waiter; the blocking put path shares the same syncs; group commit syncs the log alone while the full
flush keeps its pace and is the only offset the checkpoint gets.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

import pytest

from conftest import need_module
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message
from sparkmq.platform.store import FlushMode, MessageStore, PutStatus, StoreConfig
from sparkmq.platform.store.checkpoint import read_checkpoint
from sparkmq.platform.store.flush import FlushService
from sparkmq.storage_native import encode_batch

pytestmark = pytest.mark.timeout(60)

PREFIX = "7F00000112349ABCDEF0"
MONTH = 1_698_796_800_000  # 2023-11-01T00:00Z
TS = 1_700_000_000_000
#: Small segments (and limits that fit them) keep the temp dirs small.
SMALL = {"segment_size": 4 << 20, "max_message_size": 64 * 1024, "max_properties_size": 8000}


def packed(n: int = 1, body: bytes = b"x" * 100) -> bytes:
    """A packed batch of ``n`` messages for topic T, as a producer encodes it."""
    data, _ids, _next = encode_batch([Message("T", body, tags="t")] * n, PREFIX, MONTH, 0, TS)
    return data


class Gate:
    """Holds every flush (full or log-only) while closed; counts the flushes that completed."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self.completed = 0


def gated_log_class(impl, gate: Gate) -> type:
    """A commit-log class whose ``flush`` and ``flush_log`` wait for ``gate`` (a stuck disk)."""

    class GatedLog(impl.CommitLog):
        def _gated(self, sync: Callable[[], int]) -> int:
            gate.entered.set()
            gate.open.wait()
            flushed = sync()
            gate.completed += 1
            return flushed

        def flush(self) -> int:
            return self._gated(super().flush)

        def flush_log(self) -> int:
            return self._gated(super().flush_log)

    return GatedLog


class FakeLog:
    """A stand-in commit log whose syncs, full and log-only, never get past ``offset``."""

    def __init__(self, offset: int) -> None:
        self.flushed_offset = self.log_flushed_offset = 0
        self._offset = offset

    def flush(self) -> int:
        return self._offset

    def flush_log(self) -> int:
        return self._offset


@pytest.fixture
def make_store(tmp_path):
    """Started stores under tmp_path (SYNC_FLUSH by default); shut down after the test."""
    opened: list[MessageStore] = []

    def make(name: str = "store", commit_log_class: type | None = None, **overrides) -> MessageStore:
        cfg = StoreConfig(root=tmp_path / name, **{**SMALL, "flush_mode": FlushMode.SYNC_FLUSH, **overrides})
        store = MessageStore(cfg, commit_log_class=commit_log_class).start()
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.shutdown()


def count_threadsafe_calls(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count the loop's ``call_soon_threadsafe`` calls (the flush thread's hand-outs); returns the counter."""
    calls = [0]
    original = loop.call_soon_threadsafe

    def counting(callback: Callable[..., object], *args: object, **kwargs: object) -> asyncio.Handle:
        calls[0] += 1
        return original(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    return calls


# -- resolution -------------------------------------------------------------------------------------
def test_future_resolves_only_once_the_flushed_offset_covers_it(make_store, impl):
    gate = Gate()
    store = make_store(commit_log_class=gated_log_class(impl, gate))
    seen: list[tuple[int, int, int]] = []

    async def main() -> None:
        gate.open.clear()
        results = [store.put_packed("T", 0, packed(), 1, wait=False) for _ in range(5)]
        futures = [store.wait_durable(r.end_offset) for r in results]
        for r, fut in zip(results, futures, strict=True):
            fut.add_done_callback(lambda _f, end=r.end_offset: seen.append(
                (end, store.commit_log.log_flushed_offset, store._flusher.log_flushed_offset)))
        await asyncio.sleep(0.1)
        assert not any(f.done() for f in futures)  # no sync got through: nobody answered
        gate.open.set()
        assert await asyncio.gather(*futures) == [PutStatus.PUT_OK] * 5

    asyncio.run(main())
    assert len(seen) == 5
    for end, log_flushed, service_flushed in seen:
        assert log_flushed >= end and service_flushed >= end


def test_many_waiters_share_few_syncs_and_one_callback_per_sync(make_store, impl):
    gate = Gate()
    store = make_store(commit_log_class=gated_log_class(impl, gate))
    flusher = store._flusher
    waiters = 200

    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls = count_threadsafe_calls(loop)
        gate.open.clear()
        gate.entered.clear()
        first = store.put_packed("T", 0, packed(), 1, wait=False)
        futures = [store.wait_durable(first.end_offset)]
        assert await asyncio.to_thread(gate.entered.wait, 5)  # the flush thread is inside a sync
        before = flusher.flush_count
        calls[0] = 0  # to_thread answered through call_soon_threadsafe too
        for i in range(waiters - 1):
            r = store.put_packed("T", i % 4, packed(), 1, wait=False)
            futures.append(store.wait_durable(r.end_offset))
        gate.open.set()
        statuses = await asyncio.gather(*futures)
        assert statuses == [PutStatus.PUT_OK] * waiters
        # the stuck sync and one more answer everybody (a periodic sync may slip in)
        rounds = flusher.flush_count - before
        assert 1 <= rounds <= 3
        assert calls[0] <= rounds  # one hand-out per sync on this loop, not one per waiter

    asyncio.run(main())


def test_concurrent_sends_group_commit_on_a_real_store(make_store, impl):
    store = make_store()
    flusher = store._flusher
    per_task, tasks = 20, 32
    before = flusher.flush_count

    async def main() -> list[PutStatus]:
        data = packed()

        async def sender(q: int) -> list[PutStatus]:
            out = []
            for _ in range(per_task):
                r = store.put_packed("T", q % 8, data, 1, wait=False)
                out.append(await store.wait_durable(r.end_offset))
            return out

        return [s for chunk in await asyncio.gather(*(sender(q) for q in range(tasks))) for s in chunk]

    statuses = asyncio.run(main())
    assert statuses == [PutStatus.PUT_OK] * (per_task * tasks)
    # many sends per fdatasync (the native syncer starts a sync the moment one is asked for while it is idle,
    # so one sync with a single send can alternate with one covering the rest: 3-4 sends per sync seen)
    assert flusher.flush_count - before < per_task * tasks / 2


def test_sixty_four_coroutines_put_packed_and_await(make_store):
    store = make_store(segment_size=16 << 20)
    data = packed(1, b"y" * 1024)
    ends: list[int] = []

    async def main() -> list[PutStatus]:
        loop = asyncio.get_running_loop()

        async def sender(q: int) -> list[PutStatus]:
            out = []
            for _ in range(25):
                r = store.put_packed("T", q % 4, data, 1, wait=False)
                ends.append(r.end_offset)
                out.append(await store.wait_durable(r.end_offset, loop))
            return out

        chunks = await asyncio.gather(*(sender(q) for q in range(64)))
        return [s for chunk in chunks for s in chunk]

    statuses = asyncio.run(main())
    assert statuses == [PutStatus.PUT_OK] * 64 * 25
    assert store.commit_log.log_flushed_offset >= max(ends)
    assert sum(store.max_offset("T", q) for q in range(4)) == 64 * 25


def test_async_flush_and_already_flushed_resolve_at_once(make_store):
    fast = make_store("async", flush_mode=FlushMode.ASYNC_FLUSH)
    sync = make_store("sync")

    async def main() -> None:
        r = fast.put_packed("T", 0, packed(), 1, wait=False)
        fut = fast.wait_durable(r.end_offset)
        assert fut.done() and fut.result() is PutStatus.PUT_OK
        r = sync.put_packed("T", 0, packed(), 1, wait=False)
        assert await sync.wait_durable(r.end_offset) is PutStatus.PUT_OK
        again = sync.wait_durable(r.end_offset)  # the flushed offset covers it already
        assert again.done() and again.result() is PutStatus.PUT_OK

    asyncio.run(main())


def test_without_the_flush_thread_the_wait_syncs_inline(make_store):
    store = make_store(background_services=False)

    async def main() -> None:
        r = store.put_packed("T", 0, packed(), 1, wait=False)
        fut = store.wait_durable(r.end_offset)
        assert fut.done() and fut.result() is PutStatus.PUT_OK
        assert store.commit_log.log_flushed_offset >= r.end_offset

    asyncio.run(main())


def test_an_offset_past_the_end_is_refused(make_store):
    store = make_store()

    async def main() -> None:
        end = store.put_packed("T", 0, packed(), 1, wait=False).end_offset
        with pytest.raises(SparkMQError) as info:
            store.wait_durable(end + 1_000_000)
        assert info.value.code is ErrorCode.OFFSET_ILLEGAL

    asyncio.run(main())


def test_a_cancelled_waiter_does_not_disturb_the_others(make_store, impl):
    gate = Gate()
    store = make_store(commit_log_class=gated_log_class(impl, gate))

    async def main() -> None:
        gate.open.clear()
        a = store.wait_durable(store.put_packed("T", 0, packed(), 1, wait=False).end_offset)
        b = store.wait_durable(store.put_packed("T", 0, packed(), 1, wait=False).end_offset)
        a.cancel()
        gate.open.set()
        assert await b is PutStatus.PUT_OK
        assert a.cancelled()

    asyncio.run(main())


# -- timeouts -------------------------------------------------------------------------------------------
def test_a_stuck_sync_times_waiters_out_and_later_ones_still_work(make_store, impl):
    gate = Gate()
    store = make_store(commit_log_class=gated_log_class(impl, gate), sync_flush_timeout_ms=200)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        timers = [0]
        call_at = loop.call_at

        def counting_call_at(*args, **kwargs):
            timers[0] += 1
            return call_at(*args, **kwargs)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        gate.open.clear()
        results = [store.put_packed("T", 0, packed(), 1, wait=False) for _ in range(50)]
        start = time.monotonic()
        statuses = await asyncio.gather(*(store.wait_durable(r.end_offset) for r in results))
        waited = time.monotonic() - start
        assert statuses == [PutStatus.FLUSH_DISK_TIMEOUT] * 50
        assert 0.15 <= waited < 3
        assert timers[0] <= 3  # one timer per loop, not one per waiter
        # timed out, but stored all the same
        assert len(store.get_messages("T", 0, 0, 64).messages) == 50
        # a thread waiting meanwhile times out too
        got = await asyncio.to_thread(store.put, Message("T", b"blocking"), 1)
        assert got.status is PutStatus.FLUSH_DISK_TIMEOUT
        gate.open.set()
        r = store.put_packed("T", 0, packed(), 1, wait=False)
        assert await store.wait_durable(r.end_offset) is PutStatus.PUT_OK
        assert store.put(Message("T", b"after"), 1).status is PutStatus.PUT_OK

    asyncio.run(main())


def test_a_synced_waiter_whose_hand_out_is_late_is_not_failed_at_its_deadline():
    service = FlushService(FakeLog(0), 10_000, lambda _o: None, group_commit=True)
    service.start()
    try:
        async def main() -> PutStatus:
            loop = asyncio.get_running_loop()
            fut = service.wait_async(100, loop, 0.3)
            await asyncio.sleep(0.1)  # the flush thread synced (to 0) and went idle
            assert not fut.done()
            service._log_flushed = 100  # as if a sync covered it and its hand-out were still on the way
            return await fut

        assert asyncio.run(main()) is PutStatus.PUT_OK
    finally:
        service.stop()


def test_a_loop_is_forgotten_once_it_has_had_no_waiter_for_a_timeout():
    service = FlushService(FakeLog(1_000), 10_000, lambda _o: None, group_commit=True)
    service.start()
    try:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            assert await service.wait_async(10, loop, 0.1) is PutStatus.PUT_OK
            assert loop in service._loops  # its timer is still armed
            await asyncio.sleep(0.2)
            assert loop not in service._loops  # nothing keeps a finished loop alive

        asyncio.run(main())
    finally:
        service.stop()


# -- shutdown -----------------------------------------------------------------------------------------------
def test_shutdown_answers_every_outstanding_waiter(tmp_path, impl):
    gate = Gate()
    cfg = StoreConfig(root=tmp_path / "s", flush_mode=FlushMode.SYNC_FLUSH, **SMALL)
    store = MessageStore(cfg, commit_log_class=gated_log_class(impl, gate)).start()

    async def main() -> list[PutStatus]:
        gate.open.clear()
        futures = [store.wait_durable(store.put_packed("T", 0, packed(), 1, wait=False).end_offset)
                   for _ in range(20)]
        blocked = asyncio.create_task(asyncio.to_thread(store.put, Message("T", b"thread"), 1))
        await asyncio.sleep(0.05)
        stopping = asyncio.create_task(asyncio.to_thread(store.shutdown))
        await asyncio.sleep(0.05)
        gate.open.set()  # the stuck sync ends; the shutdown syncs once more
        await stopping
        assert (await blocked).status is PutStatus.PUT_OK
        return await asyncio.gather(*futures)

    assert asyncio.run(main()) == [PutStatus.PUT_OK] * 20


def test_stop_fails_what_the_last_sync_did_not_cover_and_later_waits_answer_at_once():
    service = FlushService(FakeLog(50), 10_000, lambda _o: None, group_commit=True)  # never past 50
    service.start()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        covered = service.wait_async(40, loop, 30.0)
        beyond = service.wait_async(60, loop, 30.0)
        assert await covered is PutStatus.PUT_OK
        await asyncio.sleep(0.05)
        assert not beyond.done()
        await asyncio.to_thread(service.stop)
        assert await asyncio.wait_for(beyond, 5) is PutStatus.FLUSH_DISK_TIMEOUT
        late = service.wait_async(70, loop, 30.0)
        assert late.done() and late.result() is PutStatus.FLUSH_DISK_TIMEOUT
        assert service.wait_async(10, loop, 30.0).result() is PutStatus.PUT_OK
        assert service.wait_flushed(70, 30.0) is False

    asyncio.run(main())


def test_stop_with_a_closed_loop_does_not_hang_or_raise():
    service = FlushService(FakeLog(0), 10_000, lambda _o: None, group_commit=True)
    service.start()
    loop = asyncio.new_event_loop()
    fut = service.wait_async(10, loop, 30.0)
    loop.close()
    service.stop()
    assert not fut.done()  # nobody is left on that loop to answer


# -- the blocking path shares the syncs ------------------------------------------------------------------------
def test_threads_and_coroutines_share_the_syncs(make_store):
    store = make_store()
    flusher = store._flusher
    before = flusher.flush_count
    thread_results: list[PutStatus] = []
    lock = threading.Lock()

    def writer(q: int) -> None:
        for i in range(20):
            status = store.put(Message("T", b"t%d" % i), q).status
            with lock:
                thread_results.append(status)

    async def main() -> list[PutStatus]:
        data = packed()

        async def sender(q: int) -> list[PutStatus]:
            out = []
            for _ in range(20):
                r = store.put_packed("T", q % 4, data, 1, wait=False)
                out.append(await store.wait_durable(r.end_offset))
            return out

        threads = [threading.Thread(target=writer, args=(4 + t,)) for t in range(8)]
        for t in threads:
            t.start()
        chunks = await asyncio.gather(*(sender(q) for q in range(32)))
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        return [s for chunk in chunks for s in chunk]

    statuses = asyncio.run(main())
    assert statuses == [PutStatus.PUT_OK] * 640
    assert thread_results == [PutStatus.PUT_OK] * 160
    assert flusher.flush_count - before < 800 / 2


# -- log-only group commit, full flush on a timer, checkpoint ------------------------------------------------------
def counting_log_class(impl, calls: dict[str, int]) -> type:
    """A commit-log class that counts its ``flush`` and ``flush_log`` calls."""

    class CountingLog(impl.CommitLog):
        def flush(self) -> int:
            calls["flush"] += 1
            return super().flush()

        def flush_log(self) -> int:
            calls["flush_log"] += 1
            return super().flush_log()

    return CountingLog


def test_group_commit_syncs_the_log_alone_and_leaves_the_checkpoint(make_store, impl):
    calls = {"flush": 0, "flush_log": 0}
    # no full flush during the test: the interval is far away
    store = make_store(commit_log_class=counting_log_class(impl, calls), flush_interval_ms=600_000,
                       checkpoint_interval_ms=1)
    log = store.commit_log
    start_flushed = log.flushed_offset
    checkpoint_before = read_checkpoint(store.paths.checkpoint)

    async def main() -> list[PutStatus]:
        results = [store.put_packed("T", q % 4, packed(), 1, wait=False) for q in range(40)]
        return await asyncio.gather(*(store.wait_durable(r.end_offset) for r in results))

    assert asyncio.run(main()) == [PutStatus.PUT_OK] * 40
    assert store.put(Message("T", b"blocking"), 1).status is PutStatus.PUT_OK
    end = log.max_offset
    assert log.log_flushed_offset == store._flusher.log_flushed_offset == end
    assert log.flushed_offset == store._flusher.flushed_offset == start_flushed < end  # the queues wait
    assert calls["flush_log"] >= 1 and calls["flush"] == 0
    assert store._flusher.full_flush_count == 0
    # the checkpoint never got an offset only the log was synced to
    assert read_checkpoint(store.paths.checkpoint) == checkpoint_before
    assert store.flush() == end  # a full flush moves both, and the checkpoint
    assert read_checkpoint(store.paths.checkpoint).flushed_offset == log.flushed_offset == end


def test_the_full_flush_keeps_its_pace_under_a_steady_stream_of_waiters(make_store):
    store = make_store(flush_interval_ms=40, checkpoint_interval_ms=40)
    flusher = store._flusher
    log = store.commit_log
    checkpoints: list[int] = []

    async def main() -> None:
        data = packed()
        stop = time.monotonic() + 0.6

        async def sender(q: int) -> None:
            while time.monotonic() < stop:
                r = store.put_packed("T", q % 4, data, 1, wait=False)
                assert await store.wait_durable(r.end_offset) is PutStatus.PUT_OK
                cp = read_checkpoint(store.paths.checkpoint)
                # whatever the checkpoint says, the queues were durable there when it was written
                assert cp is not None and cp.flushed_offset <= log.flushed_offset <= log.log_flushed_offset
                checkpoints.append(cp.flushed_offset)

        await asyncio.gather(*(sender(q) for q in range(16)))

    asyncio.run(main())
    # ~15 intervals went by with waiters at every moment: the full flush still ran (loose bound, shared CPU)
    assert flusher.full_flush_count >= 3
    assert flusher.flush_count > flusher.full_flush_count  # the rest were log-only group commits
    assert checkpoints == sorted(checkpoints) and checkpoints[-1] > checkpoints[0]


def test_the_checkpoint_hook_gets_only_full_flush_offsets():
    class Log(FakeLog):
        """Every sync covers 100 more bytes; the full ones note what they returned."""

        def __init__(self) -> None:
            super().__init__(0)
            self.end = 0  # what the syncs below report instead
            self.full_results: list[int] = []

        def flush(self) -> int:
            self.end += 100
            self.full_results.append(self.end)
            return self.end

        def flush_log(self) -> int:
            self.end += 100
            return self.end

    log_ = Log()
    hooked: list[int] = []
    service = FlushService(log_, 20, hooked.append, group_commit=True)
    service.start()
    try:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:  # a waiter at every moment, each wanting one more sync
            assert service.wait_flushed(service.log_flushed_offset + 1, 5.0)
    finally:
        service.stop()
    assert len(log_.full_results) >= 3  # periodic full flushes ran between the group commits...
    assert hooked == log_.full_results  # ...and only their offsets reached the hook
    assert service.flush_count > 2 * service.full_flush_count
    assert service.full_flush_count == len(hooked) and service.flushed_offset == hooked[-1]


# -- the native group-commit thread ----------------------------------------------------------------------------
def native_log(path) -> object:
    """A fresh native commit log with one record not synced yet, and that record's end offset."""
    native = need_module("sparkmq.storage_native._commitlog")
    log = native.CommitLog(str(path), segment_size=4 << 20)
    log.append("T", 0, b"x" * 100)
    return log, log.max_offset


def test_the_native_syncer_syncs_the_log_on_request_and_wakes_eventfds_and_threads(tmp_path):
    from sparkmq.storage_native.errors import StoreError

    log, end = native_log(tmp_path / "s")
    try:
        log.start_syncer()
        with pytest.raises(StoreError) as info:
            log.start_syncer()
        assert info.value.code == "INVALID_ARGUMENT"  # while it runs
        fd = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            log.add_sync_notifier(fd)
            assert log.wait_log_flushed(end, 0.05) is False  # nobody asked: nothing synced
            assert log.syncer_state()[0] == 0
            log.request_sync(end)
            assert log.wait_log_flushed(end, 5.0) is True
            assert log.log_flushed_offset >= end
            assert log.flushed_offset < end  # the log alone: the queues wait for the full flush
            assert os.eventfd_read(fd) >= 1  # the loop's wake-up
            syncs, failures, error = log.syncer_state()
            assert syncs >= 1 and failures == 0 and error == ""
            log.remove_sync_notifier(fd)
            log.append("T", 0, b"y" * 100)
            log.request_sync(log.max_offset)
            assert log.wait_log_flushed(log.max_offset, 5.0) is True
            with pytest.raises(BlockingIOError):  # no write once removed
                os.eventfd_read(fd)
        finally:
            os.close(fd)
        # a thread blocked for an offset no sync reaches is let go by the stop, not by its timeout
        results: list[bool] = []
        waiter = threading.Thread(target=lambda: results.append(log.wait_log_flushed(end + 10**9, 30.0)))
        started = time.monotonic()
        waiter.start()
        time.sleep(0.1)
        log.stop_syncer()
        waiter.join(5)
        assert results == [False] and time.monotonic() - started < 5
        log.stop_syncer()  # idempotent
        log.append("T", 0, b"z")
        log.request_sync(log.max_offset)  # stopped: a no-op
        assert log.wait_log_flushed(log.max_offset, 0.05) is False
        log.start_syncer()  # a new flush service after a truncation starts it again
        log.request_sync(log.max_offset)
        assert log.wait_log_flushed(log.max_offset, 5.0) is True
    finally:
        log.close()


def test_closing_the_log_stops_its_syncer_and_a_blocked_wait(tmp_path):
    log, end = native_log(tmp_path / "s")
    log.start_syncer()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(log.wait_log_flushed(end + 10**9, 30.0)))
    waiter.start()
    time.sleep(0.05)
    log.close()
    waiter.join(5)
    assert results == [False]


def test_a_native_store_syncs_on_the_c_thread_and_each_loop_wakes_through_its_eventfd(make_store):
    store = make_store(sync_flush_timeout_ms=1000, flush_interval_ms=600_000)  # no full flush meanwhile
    flusher = store._flusher
    log = store.commit_log
    if not flusher._native:
        pytest.skip("the native commit log is not built")
    python_syncs = flusher._py_flush_count

    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls = count_threadsafe_calls(loop)
        results = [store.put_packed("T", q % 4, packed(), 1, wait=False) for q in range(40)]
        futures = [store.wait_durable(r.end_offset) for r in results]
        group = flusher._loops[loop]
        fd = group.fd
        assert await asyncio.gather(*futures) == [PutStatus.PUT_OK] * 40
        assert fd is not None
        assert calls[0] == 0  # answered through the eventfd, not by another thread's callback
        assert log.syncer_state()[0] >= 1 and flusher._py_flush_count == python_syncs
        await asyncio.sleep(1.5)  # a whole timeout without a waiter: the loop is forgotten
        assert loop not in flusher._loops and group.fd is None
        assert loop.remove_reader(fd) is False  # its reader went with it
        r = store.put_packed("T", 0, packed(), 1, wait=False)  # and a new waiter attaches again
        assert await store.wait_durable(r.end_offset) is PutStatus.PUT_OK

    asyncio.run(main())
