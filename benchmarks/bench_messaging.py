"""Messaging benchmarks over real HTTP: one name server and one broker (``sparkmq dev``) in a child process.

    python benchmarks/bench_messaging.py [--quick]

One line of figures each:

* ``messaging.send_sync`` — one Producer, synchronous single sends: messages/s and latency p50/p99;
* ``messaging.send_async`` — the same through ``send_async`` (the producer's send threads);
* ``messaging.send_batch64`` — 64 messages per request (JSON) and per Arrow request: messages/s;
* ``messaging.end_to_end`` — send → PushConsumer listener latency (store + long poll + consume), p50/p99.

Bodies are 1 KiB.  The machine is shared: compare figures of one run.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from sparkmq.platform.client import ClientConfig, ConsumeStatus, Message, Producer, PushConsumer

BODY = os.urandom(1024)


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_sync(producer: Producer, n: int) -> None:
    latencies = []
    started = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        producer.send(Message("BenchSync", BODY))
        latencies.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - started
    line("messaging.send_sync", msgs_per_s=n / elapsed, p50_ms=pct(latencies, 0.5), p99_ms=pct(latencies, 0.99))


def bench_async(producer: Producer, n: int) -> None:
    started = time.perf_counter()
    futures = [producer.send_async(Message("BenchAsync", BODY)) for _ in range(n)]
    concurrent.futures.wait(futures)
    failed = sum(1 for f in futures if f.exception() is not None)
    line("messaging.send_async", msgs_per_s=n / (time.perf_counter() - started), failed=failed)


def bench_batch(producer: Producer, n: int) -> None:
    figures = {}
    for arrow in (False, True):
        batch = [Message("BenchBatch", BODY) for _ in range(64)]
        started = time.perf_counter()
        for _ in range(max(1, n // 64)):
            producer.send_batch(batch, arrow=arrow)
        figures["arrow_msgs_per_s" if arrow else "json_msgs_per_s"] = 64 * max(1, n // 64) / (
            time.perf_counter() - started)
    line("messaging.send_batch64", **figures)


def bench_end_to_end(config: ClientConfig, producer: Producer, n: int) -> None:
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    done = threading.Event()
    lock = threading.Lock()

    def listener(batch):
        now = time.perf_counter()
        with lock:
            for m in batch:
                t = sent_at.get(m.body[:36].decode(errors="ignore"))
                if t is not None:
                    latencies.append((now - t) * 1000)
            if len(latencies) >= n:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    producer.send(Message("BenchE2E", b"warm-up"))
    consumer = PushConsumer("bench-e2e", config)
    consumer.subscribe("BenchE2E")
    consumer.register_listener(listener)
    consumer.start()
    try:
        for i in range(n):
            key = f"{i:036d}"
            with lock:
                sent_at[key] = time.perf_counter()
            producer.send(Message("BenchE2E", key.encode() + BODY[36:]))
            time.sleep(0.002)  # a steady trickle: latency, not throughput
        done.wait(60)
    finally:
        consumer.shutdown()
    line("messaging.end_to_end", messages=len(latencies), p50_ms=statistics.median(latencies),
         p99_ms=pct(latencies, 0.99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts for a CI smoke run")
    args = parser.parse_args()
    n = 200 if args.quick else 3000
    with tempfile.TemporaryDirectory() as tmp:
        # The platform runs in its own process, as in production: the client does not share its GIL.
        platform = subprocess.Popen(
            [sys.executable, "-m", "sparkmq.api.cli", "dev", "--no-demo", "--no-lake", "--data-dir", tmp,
             "--namesrv-port", "0", "--broker-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, COLUMNS="200"))
        try:
            banner = platform.stdout.readline()  # type: ignore[union-attr]
            match = re.search(r"name server on http://(\S+?),", banner)
            if match is None:
                raise SystemExit(f"the platform did not start: {banner!r}")
            config = ClientConfig(namesrv_addrs=match.group(1), rebalance_interval_s=1.0)
            with Producer("bench", config) as producer:
                for name, run in (("messaging.send_sync", lambda: bench_sync(producer, n)),
                                  ("messaging.send_async", lambda: bench_async(producer, n)),
                                  ("messaging.send_batch64", lambda: bench_batch(producer, n * 4)),
                                  ("messaging.end_to_end", lambda: bench_end_to_end(config, producer, n // 4))):
                    try:
                        run()
                    except Exception as exc:  # one broken benchmark must not hide the others' figures
                        line(name, error=repr(str(exc)[:120]))
        finally:
            platform.terminate()
            platform.wait(30)


if __name__ == "__main__":
    main()
