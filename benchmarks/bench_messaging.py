"""Messaging benchmarks: one broker (``sparkmq dev``, no lake) in a child process, this process the client.

    python benchmarks/bench_messaging.py [--quick] [--only NAME[,NAME]]

The first line is the machine's Python speed of the day (``machine.python_echo``, from
``../shared/tools/python_echo.py`` next to the repository, or ``$SPARKMQ_PYTHON_ECHO``): the messaging targets
hold at 140,000 msgs/s and scale with it.  Then one line of figures each (1 KiB bodies, ASYNC_FLUSH unless the
name says otherwise):

* ``messaging.produce_batch`` -- batches of 256, 4 in flight: msgs/s, client CPU µs per message, and
  ``vs_store``: the rate over an in-process batched append of the same messages into a fresh store,
  measured in this run (the machine's speed varies from day to day; the ratio does not);
* ``messaging.produce_async`` -- per-message ``send_async`` (the producer's own batching): msgs/s, vs_store;
* ``messaging.produce_sync`` -- one message at a time, one caller: p50 / p99 ms;
* ``messaging.consume_backlog`` -- drain a backlog from offset 0 with one ``PullConsumer``: msgs/s,
  client µs per message, vs_store;
* ``messaging.e2e_latency`` / ``messaging.e2e_latency_20k`` -- publish -> listener at a steady
  2,000 / 20,000 msgs/s: p50 / p99 ms;
* ``messaging.e2e_latency_aio`` -- the same at 2,000 msgs/s in one asyncio application (``AsyncProducer.send``
  tasks paced by the application's loop, an ``AsyncConsumer`` iterated on that loop): p50 / p99 ms;
* ``messaging.java_produce`` / ``messaging.java_consume`` -- RocketMQ's own Java client (rocketmq-client 5.5.0,
  ``benchmarks/java/remoting``'s RemotingBench) against the same broker: ``DefaultMQProducer`` batches of 64 from
  32 threads, and a ``DefaultLitePullConsumer`` draining 1,000,000 messages (counted): msgs/s;
* ``messaging.produce_sync_flush`` -- SYNC_FLUSH broker, 64 sends in flight: msgs/s;
* ``messaging.http_send_batch`` -- the HTTP path, batches of 256: msgs/s.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sparkmq.platform.client import (
    AsyncConsumer,
    AsyncProducer,
    ClientConfig,
    ConsumeStatus,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
)

BODY = os.urandom(1024)
BATCH = 256
#: The machine's Python speed of the day, printed first by every benchmark run.
PYTHON_ECHO = Path(os.environ.get("SPARKMQ_PYTHON_ECHO")
                   or Path(__file__).resolve().parents[2] / "shared" / "tools" / "python_echo.py")


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


def python_echo() -> None:
    """Print the machine's Python speed line (``machine.python_echo ...``) first, as every benchmark run does."""
    if not PYTHON_ECHO.exists():
        line("machine.python_echo", error=repr(f"{PYTHON_ECHO} not found (set SPARKMQ_PYTHON_ECHO)"))
        return
    done = subprocess.run([sys.executable, str(PYTHON_ECHO)], capture_output=True, text=True, timeout=600)
    echoed = [x for x in done.stdout.splitlines() if x.startswith("machine.python_echo")]
    print(echoed[-1] if echoed else f"machine.python_echo error={done.stderr[-200:]!r}", flush=True)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Platform:
    """``sparkmq dev`` without the lake in a child process; its name server address."""

    def __init__(self, data_dir: str, *, sync_flush: bool = False) -> None:
        args = [sys.executable, "-m", "sparkmq.api.cli", "dev", "--no-demo", "--no-lake", "--data-dir", data_dir,
                "--namesrv-port", "0", "--broker-port", "0", "--console-port", "-1"]  # no console sampling
        if sync_flush:
            conf = Path(data_dir) / "sync.toml"
            conf.write_text(f'[broker]\ndata_dir = "{data_dir}"\n[store]\nflush_mode = "SYNC_FLUSH"\n'
                            'segment_size = 1073741824\n')
            args = [sys.executable, "-m", "sparkmq.api.cli", "dev", "--no-demo", "--no-lake", "--config", str(conf),
                    "--namesrv-port", "0", "--broker-port", "0", "--console-port", "-1"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env=dict(os.environ, COLUMNS="300"))
        banner = self.banner = self.proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"name server on http://(\S+?),", banner)
        if match is None:
            self.stop()
            raise SystemExit(f"the platform did not start: {banner!r}")
        self.namesrv = match.group(1)

    def config(self, **overrides: object) -> ClientConfig:
        return ClientConfig(namesrv_addrs=self.namesrv, rebalance_interval_s=1.0, trace_enabled=False,
                            **overrides)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def store_rate(seconds: float) -> float:
    """Messages per second of an in-process batched append (256 x 1 KiB, packed) into a fresh store."""
    from sparkmq.platform.store import MessageStore, StoreConfig
    from sparkmq.storage_native import encode_batch

    msgs = [Message("BenchStore", BODY) for _ in range(BATCH)]
    data, _ids, _ = encode_batch(msgs, "7F00000100000000ABCD", 0, 0, int(time.time() * 1000))
    with tempfile.TemporaryDirectory() as tmp, MessageStore(StoreConfig(root=Path(tmp))) as store:
        store.put_packed("BenchStore", 0, data, BATCH)  # warm-up: segment mapped
        count = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            store.put_packed("BenchStore", 0, data, BATCH)
            count += BATCH
        return count / (time.perf_counter() - started)


def timed_cpu(fn: Callable[[], int]) -> tuple[int, float, float]:
    """Run ``fn`` (returns a message count): (count, wall seconds, this process's CPU seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    count = fn()
    return count, time.perf_counter() - wall, time.process_time() - cpu


def bench_produce_batch(platform: Platform, seconds: float, store: float, topic: str = "BenchBatch") -> None:
    """Batches of 256 from the asyncio producer, 4 in flight (4 tasks sending back to back)."""
    batch = [Message(topic, BODY) for _ in range(BATCH)]

    async def run() -> int:
        async with AsyncProducer("bench-batch", platform.config()) as producer:
            await producer.send_batch(batch)  # warm-up: route and connection
            stop = time.perf_counter() + seconds

            async def sender() -> int:
                sent = 0
                while time.perf_counter() < stop:
                    await producer.send_batch(batch)
                    sent += BATCH
                return sent
            return sum(await asyncio.gather(*(sender() for _ in range(4))))

    count, wall, cpu = timed_cpu(lambda: asyncio.run(run()))
    rate = count / wall
    line("messaging.produce_batch", msgs_per_s=rate, client_us_per_msg=cpu / count * 1e6, vs_store=rate / store,
         store_msgs_per_s=store)


def bench_produce_async(platform: Platform, seconds: float, store: float) -> None:
    """Per-message ``send_async`` as fast as the producer takes them (its own batching), then ``flush``.

    As a caller that checks every send would: the futures are kept in order and settled as they finish
    (every 1,000 sends, the finished ones at the front), so what is kept is what is in flight."""
    with Producer("bench-async", platform.config()) as producer:
        producer.send(Message("BenchAsync", BODY))
        futures: collections.deque[concurrent.futures.Future] = collections.deque()
        sent = failed = 0

        def settle(wait: bool) -> None:
            nonlocal sent, failed
            while futures and (wait or futures[0].done()):
                if futures.popleft().exception() is not None:
                    failed += 1
                sent += 1
        started = time.perf_counter()
        stop = started + seconds
        while time.perf_counter() < stop:
            for _ in range(1000):
                futures.append(producer.send_async(Message("BenchAsync", BODY)))
            settle(False)
        producer.flush(60)
        settle(True)
        elapsed = time.perf_counter() - started
    rate = (sent - failed) / elapsed
    line("messaging.produce_async", msgs_per_s=rate, vs_store=rate / store, failed=failed)


def bench_produce_sync(platform: Platform, n: int) -> None:
    with Producer("bench-sync", platform.config()) as producer:
        for _ in range(200):
            producer.send(Message("BenchSync", BODY))
        latencies = []
        for _ in range(n):
            t = time.perf_counter()
            producer.send(Message("BenchSync", BODY))
            latencies.append((time.perf_counter() - t) * 1000)
    line("messaging.produce_sync", p50_ms=statistics.median(latencies), p99_ms=pct(latencies, 0.99),
         msgs_per_s=n / (sum(latencies) / 1000))


def bench_consume_backlog(platform: Platform, backlog: int, store: float) -> None:
    topic = "BenchBacklog"
    batch = [Message(topic, BODY) for _ in range(BATCH)]
    with Producer("bench-fill", platform.config()) as producer:
        filled = 0
        while filled < backlog:
            producer.send_batch(batch)
            filled += BATCH
    consumer = PullConsumer("bench-drain", platform.config(pull_batch_size=1024, flow_control_max_messages=20_000,
                                                           max_offset_span=100_000),
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(topic)
    consumer.start()
    try:

        def drain() -> int:
            got = 0
            deadline = time.perf_counter() + 300
            while got < filled and time.perf_counter() < deadline:
                got += len(consumer.poll(1.0))
            return got

        count, wall, cpu = timed_cpu(drain)
    finally:
        consumer.shutdown()
    rate = count / wall
    line("messaging.consume_backlog", msgs_per_s=rate, client_us_per_msg=cpu / max(count, 1) * 1e6,
         vs_store=rate / store, messages=count)


def bench_e2e(platform: Platform, name: str, rate: int, seconds: float) -> None:
    topic = f"BenchE2E{rate}"
    sent_at: dict[bytes, float] = {}
    latencies: list[float] = []
    lock = threading.Lock()
    total = int(rate * seconds)
    done = threading.Event()

    def listener(batch) -> ConsumeStatus:  # type: ignore[no-untyped-def]
        now = time.perf_counter()
        with lock:
            for m in batch:
                t = sent_at.pop(m.body[:16], None)
                if t is not None:
                    latencies.append((now - t) * 1000)
            if len(latencies) >= total:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer("bench-e2e", platform.config()) as producer:
        producer.send(Message(topic, b"warm-up"))
        consumer = PushConsumer(f"bench-e2e-{rate}", platform.config())
        consumer.subscribe(topic)
        consumer.register_listener(listener)
        consumer.start()
        try:
            deadline = time.monotonic() + 30
            while len(consumer.assignment()) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)  # the first rebalance assigns the queues
            time.sleep(0.5)  # and their pulls are held at the broker
            # A steady rate in ticks of 1 ms (2 messages a tick at 2,000/s): the pacing sleeps, never spins,
            # so the client's other threads are not kept from the GIL by the benchmark itself.
            per_tick = max(1, rate // 1000)
            tick = per_tick / rate
            started = time.perf_counter()
            sent = 0
            while sent < total:
                due = started + (sent // per_tick) * tick
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                for _ in range(min(per_tick, total - sent)):
                    key = f"{sent:016d}".encode()
                    with lock:
                        sent_at[key] = time.perf_counter()
                    producer.send_async(Message(topic, key + BODY[16:]))
                    sent += 1
            done.wait(30)
        finally:
            consumer.shutdown()
    if not latencies:
        line(name, error="'nothing delivered'")
        return
    line(name, p50_ms=statistics.median(latencies), p99_ms=pct(latencies, 0.99), delivered=len(latencies),
         sent=total)


def bench_e2e_aio(platform: Platform, name: str, rate: int, seconds: float) -> None:
    """Publish -> ``async for`` at a steady ``rate`` in ONE asyncio application: ``AsyncProducer.send`` tasks paced
    by the application's own loop and an ``AsyncConsumer`` iterated on that same loop (as ``bench_e2e`` does for
    the threaded clients: same topic shape, warm-up, ticks of 1 ms).  Latency: from the send's task being created
    to the message being yielded by the consumer."""
    topic = f"BenchE2EAio{rate}"
    total = int(rate * seconds)
    sent_at: dict[bytes, float] = {}
    latencies: list[float] = []
    failed = [0]

    async def run() -> None:
        async with AsyncProducer("bench-e2e-aio", platform.config()) as producer:
            await producer.send(Message(topic, b"warm-up"))  # the topic exists before the consumer starts
            consumer = AsyncConsumer(f"bench-e2e-aio-{rate}", platform.config())
            consumer.subscribe(topic)
            async with consumer:
                deadline = time.monotonic() + 30
                while len(consumer.assignment()) < 4 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)  # the new topic's route, then a rebalance, give it the queues
                await asyncio.sleep(0.5)  # and their pulls are held at the broker

                async def consume() -> None:
                    async for m in consumer:
                        t = sent_at.pop(bytes(m.body[:16]), None)
                        if t is not None:
                            latencies.append((time.perf_counter() - t) * 1000)
                            if len(latencies) >= total:
                                return

                async def send(msg: Message) -> None:
                    try:
                        await producer.send(msg)
                    except Exception:  # counted: a lost send shows as a missing delivery
                        failed[0] += 1

                receiver = asyncio.get_running_loop().create_task(consume())
                sends: set[asyncio.Task[None]] = set()
                per_tick = max(1, rate // 1000)
                tick = per_tick / rate
                started = time.perf_counter()
                sent = 0
                while sent < total:
                    delay = started + (sent // per_tick) * tick - time.perf_counter()
                    # Behind schedule, still one loop pass per tick: a catch-up burst must not starve the consumer
                    # and the responses of the very same loop.
                    await asyncio.sleep(max(0.0, delay))
                    for _ in range(min(per_tick, total - sent)):
                        key = f"{sent:016d}".encode()
                        sent_at[key] = time.perf_counter()
                        task = asyncio.get_running_loop().create_task(send(Message(topic, key + BODY[16:])))
                        sends.add(task)
                        task.add_done_callback(sends.discard)
                        sent += 1
                try:
                    await asyncio.wait_for(receiver, 30)
                except TimeoutError:
                    pass
                await asyncio.gather(*sends, return_exceptions=True)

    asyncio.run(run())
    if not latencies:
        line(name, error="'nothing delivered'")
        return
    line(name, p50_ms=statistics.median(latencies), p99_ms=pct(latencies, 0.99), rate=rate,
         delivered=len(latencies), sent=total, failed=failed[0])


def java_remoting_bench(args: list[str], work: Path) -> dict[str, object]:
    """Run RocketMQ's Java client (``benchmarks/java/remoting``'s RemotingBench, rocketmq-client 5.5.0, compiled
    once into the jar cache) to its end, as ``bench_peers`` does; its ``result`` JSON line."""
    import bench_peers  # noqa: PLC0415  # the JVM runner (and tests/ on sys.path): only the Java figures need it

    return bench_peers.remoting(args, work)


def bench_java_produce(platform: Platform, seconds: float, work: Path) -> None:
    """``DefaultMQProducer`` batches of 64 x 1 KiB from 32 threads against sparkmq (name server and broker speak
    RocketMQ remoting on their main ports), after a warm-up; msgs/s acknowledged SEND_OK in the window."""
    warmup = max(1.0, seconds / 4)
    r = java_remoting_bench(["produce-batch", "--namesrv", platform.namesrv, "--topic", "BenchJavaBatch",
                             "--threads", "32", "--batch", "64", "--size", str(len(BODY)),
                             "--seconds", str(seconds), "--warmup-s", str(warmup)], work)
    line("messaging.java_produce", msgs_per_s=float(r["msgs_per_s"]), sent_ok=r["sent_ok"],  # type: ignore[arg-type]
         failed=r["failed"], call_p50_ms=float(r["call_p50_ms"]), call_p99_ms=float(r["call_p99_ms"]),  # type: ignore[arg-type]
         threads=32, batch=64)


def bench_java_consume(platform: Platform, backlog: int, work: Path) -> None:
    """A ``DefaultLitePullConsumer`` (pull batches of 32, as ``peers.rocketmq_consume``) drains a backlog of
    ``backlog`` messages from the first offset; msgs/s from its first delivered batch, and what it consumed
    counted (``received``, and ``distinct`` queue offsets: ``correct`` when both are the backlog)."""
    topic = "BenchJavaDrain"
    batch = [Message(topic, BODY) for _ in range(BATCH)]
    with Producer("bench-java-fill", platform.config()) as producer:
        filled = 0
        while filled < backlog:
            producer.send_batch(batch[:min(BATCH, backlog - filled)])
            filled += min(BATCH, backlog - filled)
    r = java_remoting_bench(["drain", "--namesrv", platform.namesrv, "--topic", topic, "--group", "BenchJavaDrainGroup",
                             "--count", str(backlog), "--timeout-s", "600"], work)
    received, distinct = int(r["received"]), int(r["distinct"])  # type: ignore[call-overload]
    line("messaging.java_consume", msgs_per_s=float(r["msgs_per_s"]), received=received,  # type: ignore[arg-type]
         distinct=distinct, backlog=backlog, correct=received == distinct == backlog,
         startup_s=float(r["startup_s"]))  # type: ignore[arg-type]


def bench_sync_flush(data_dir: str, seconds: float) -> None:
    """SYNC_FLUSH broker: per-message ``send_async`` with at most 64 sends in flight (the producer batches
    what is in flight; each batch is acknowledged after a group-commit sync covers it)."""
    platform = Platform(data_dir, sync_flush=True)
    try:
        with Producer("bench-flush", platform.config()) as producer:
            producer.send(Message("BenchFlush", BODY))
            window = threading.BoundedSemaphore(64)
            failed = [0]

            def done(_result: object, error: BaseException | None) -> None:
                if error is not None:
                    failed[0] += 1
                window.release()

            count = 0
            started = time.perf_counter()
            stop = started + seconds
            while time.perf_counter() < stop:
                window.acquire()
                producer.send_async(Message("BenchFlush", BODY), done)
                count += 1
            producer.flush(30)
            elapsed = time.perf_counter() - started
        line("messaging.produce_sync_flush", msgs_per_s=(count - failed[0]) / elapsed, in_flight=64,
             failed=failed[0])
    finally:
        platform.stop()


def bench_http_batch(platform: Platform, seconds: float) -> None:
    batch = [Message("BenchHttp", BODY) for _ in range(BATCH)]
    with Producer("bench-http", platform.config(transport="http")) as producer:
        producer.send_batch(batch, arrow=True)
        count = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            producer.send_batch(batch, arrow=True)
            count += BATCH
    line("messaging.http_send_batch", msgs_per_s=count / (time.perf_counter() - started))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts for a CI smoke run")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (without 'messaging.')")
    args = parser.parse_args()
    quick = args.quick
    only = {n.strip() for n in args.only.split(",") if n.strip()}

    def wanted(name: str) -> bool:
        return not only or name in only

    python_echo()
    seconds = 2.0 if quick else 8.0
    # The store's own rate swings with the page cache and writeback (2-3x within a minute here): measure it
    # right before each ratio's benchmark and keep the higher of that and the run's first measurement, so a
    # slow moment of the store never flatters a ratio.
    first_store = store_rate(1.0 if quick else 3.0)

    def store() -> float:
        return max(first_store, store_rate(1.0 if quick else 2.0))
    with tempfile.TemporaryDirectory() as tmp:
        platform = Platform(tmp)
        java_work = Path(tmp) / "java"  # the JVMs' logs and stderr
        benches: list[tuple[str, Callable[[], object]]] = [
            ("produce_batch", lambda: bench_produce_batch(platform, seconds, store())),
            ("produce_sync", lambda: bench_produce_sync(platform, 500 if quick else 5000)),
            ("consume_backlog", lambda: bench_consume_backlog(platform, 50_000 if quick else 1_000_000, store())),
            ("e2e_latency", lambda: bench_e2e(platform, "messaging.e2e_latency", 2000, 3 if quick else 30)),
            ("e2e_latency_20k", lambda: bench_e2e(platform, "messaging.e2e_latency_20k", 20_000, 2 if quick else 10)),
            ("e2e_latency_aio", lambda: bench_e2e_aio(platform, "messaging.e2e_latency_aio", 2000, 3 if quick else 30)),
            ("java_produce", lambda: bench_java_produce(platform, seconds, java_work)),
            ("java_consume", lambda: bench_java_consume(platform, 100_000 if quick else 1_000_000, java_work)),
            ("produce_async", lambda: bench_produce_async(platform, seconds, store())),
            ("http_send_batch", lambda: bench_http_batch(platform, seconds)),
        ]
        try:
            for name, run in benches:
                if wanted(name):
                    try:
                        run()
                    except Exception as exc:  # one broken benchmark must not hide the others' figures
                        line(f"messaging.{name}", error=repr(str(exc)[:160]))
        finally:
            platform.stop()
    if wanted("produce_sync_flush"):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                bench_sync_flush(tmp, seconds)
            except Exception as exc:
                line("messaging.produce_sync_flush", error=repr(str(exc)[:160]))


if __name__ == "__main__":
    main()
