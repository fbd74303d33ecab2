"""The two consumers of the cold-read test (``test_cold_reads.py``), each in its own process.

``hot``: a producer sending ``--rate`` messages a second to ``--topic`` (paced in 1 ms ticks) and a
PushConsumer of the same topic in this process; every message received appends ``receive_unix_s latency_ms``
to ``--out`` (the latency measured on one clock, send to listener).  Runs until SIGTERM.

``cold``: a PushConsumer reading ``--topic`` from its first offset until ``--messages`` were received; writes
``start <unix_s>`` at its first message, ``progress <unix_s> <messages> <bytes>`` every second and
``done <unix_s> <messages> <bytes>`` at the end to ``--out``.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from sparkmq.platform.client import ClientConfig, ConsumeStatus, Message, Producer, PushConsumer


def config(namesrv: str) -> ClientConfig:
    return ClientConfig(namesrv_addrs=namesrv, rebalance_interval_s=1.0, heartbeat_interval_s=1.0,
                        trace_enabled=False)


def run_hot(args: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(args.out, "a", buffering=1 << 16)  # noqa: SIM115 (lives as long as the process)
    sent_at: dict[bytes, float] = {}
    lock = threading.Lock()
    body = b"h" * (args.body - 16)

    def listener(batch) -> ConsumeStatus:  # type: ignore[no-untyped-def]
        now = time.perf_counter()
        wall = time.time()
        lines = []
        with lock:  # listener threads run in parallel: one writer at a time
            for m in batch:
                t = sent_at.pop(m.body[:16], None)
                if t is not None:
                    lines.append(f"{wall:.4f} {(now - t) * 1000:.3f}\n")
            out.write("".join(lines))
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer("hot-producer", config(args.namesrv)) as producer:
        producer.send(Message(args.topic, b"warm-up"))
        consumer = PushConsumer("hot-consumer", config(args.namesrv))
        consumer.subscribe(args.topic)
        consumer.register_listener(listener)
        consumer.start()
        try:
            deadline = time.monotonic() + 30
            while len(consumer.assignment()) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            print("hot ready", flush=True)
            per_tick = max(1, args.rate // 1000)
            tick = per_tick / args.rate
            started = time.perf_counter()
            sent = 0
            while not stop.is_set():
                due = started + (sent // per_tick) * tick
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                for _ in range(per_tick):
                    key = f"{sent:016d}".encode()
                    with lock:
                        sent_at[key] = time.perf_counter()
                    producer.send_async(Message(args.topic, key + body))
                    sent += 1
            time.sleep(1)  # the last ones arrive
        finally:
            consumer.shutdown()
            with lock:
                out.flush()
    return 0


def run_cold(args: argparse.Namespace) -> int:
    out = open(args.out, "a", buffering=1)  # noqa: SIM115
    done = threading.Event()
    lock = threading.Lock()
    counts = {"messages": 0, "bytes": 0}

    def listener(batch) -> ConsumeStatus:  # type: ignore[no-untyped-def]
        with lock:
            if counts["messages"] == 0:
                out.write(f"start {time.time():.4f}\n")
            counts["messages"] += len(batch)
            counts["bytes"] += sum(len(m.body) for m in batch)
            if counts["messages"] >= args.messages:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(args.group, config(args.namesrv), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(args.topic)
    consumer.register_listener(listener)
    consumer.start()
    try:
        while not done.wait(1.0):
            with lock:
                out.write(f"progress {time.time():.4f} {counts['messages']} {counts['bytes']}\n")
        out.write(f"done {time.time():.4f} {counts['messages']} {counts['bytes']}\n")
    finally:
        consumer.shutdown()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["hot", "cold"])
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument("--messages", type=int, default=0)
    parser.add_argument("--group", default="cold-consumer", help="the cold reader's consumer group")
    args = parser.parse_args()
    return run_hot(args) if args.mode == "hot" else run_cold(args)


if __name__ == "__main__":
    sys.exit(main())
