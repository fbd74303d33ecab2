"""Message-feature benchmarks (issue 4): one line of figures per benchmark, ``name key=value …``.

    python benchmarks/bench_features.py [--quick] [--dir DIR] [--only NAME]

Every benchmark drives an in-process :class:`~sparkmq.platform.broker.Broker` (no HTTP):
the figures are the broker's own paths -- filtering in ``Broker.pull_once``, parking and
re-putting in the schedule/timer services, half + commit in the transaction service.
``--quick`` uses small sizes so CI can smoke-run it in seconds.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sparkmq.platform.broker.broker import Broker
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.broker.processors import OutgoingMessage
from sparkmq.platform.common.filtering import SqlFilter
from sparkmq.platform.common.protocol import PullStatus

BODY = os.urandom(100)


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


def make_broker(base: Path, name: str, **overrides: object) -> Broker:
    """A started broker (no name server) under ``base/name``, fresh."""
    path = base / name
    shutil.rmtree(path, ignore_errors=True)
    config = BrokerConfig(host="127.0.0.1", port=10911, data_dir=path, store={"segment_size": 256 << 20},
                          **overrides)  # type: ignore[arg-type]
    return Broker(config).start(register=False)


def bench_sql_filter_pull(base: Path, count: int) -> None:
    """A backlog of ``count`` messages, 10 % matching, pulled through the broker's SQL92 filter path."""
    broker = make_broker(base, "sql")
    try:
        batch_size = 1000
        for start in range(0, count, batch_size):
            batch = [OutgoingMessage(BODY, "T", properties={"region": "eu" if i % 10 == 0 else "us",
                                                            "seq": str(i), "amount": str(i % 1000)})
                     for i in range(start, min(start + batch_size, count))]
            broker.send_processor.send_batch("SqlBench", batch, queue_id=0)
        sql = SqlFilter.compile("region = 'eu' AND amount >= 0")
        offset = delivered = 0
        started = time.perf_counter()
        while True:
            result = broker.pull_processor.pull_once("SqlBench", 0, offset, 32, sql=sql)
            delivered += len(result.messages)
            offset = result.next_offset
            if result.status is PullStatus.NO_NEW_MSG or offset >= result.max_offset:
                break
        elapsed = time.perf_counter() - started
        assert delivered == (count + 9) // 10, delivered
        line("features.sql_filter_pull", messages=count, matched=delivered, seconds=elapsed,
             examined_per_s=round(count / elapsed), target_per_s=200_000, path="in-process Broker.pull_once max=32")
    finally:
        broker.shutdown()


def _drain(broker: Broker, topic: str, queues: int, offsets: list[int], on_message: Callable[[object], None]) -> int:
    n = 0
    for q in range(queues):
        result = broker.pull_processor.pull_once(topic, q, offsets[q], 1024)
        for m in result.messages:
            on_message(m)
        n += len(result.messages)
        if result.status not in (PullStatus.NO_MATCHED_QUEUE, PullStatus.OFFSET_OVERFLOW):
            offsets[q] = result.next_offset
    return n


def bench_timer_lateness(base: Path, count: int, spread_s: float) -> None:
    """``count`` timers due over ``spread_s`` seconds; lateness = re-put store time - due time."""
    broker = make_broker(base, "timer")
    try:
        due: dict[str, int] = {}
        first = int(time.time() * 1000) + 2000
        step = spread_s * 1000 / count
        for i in range(count):
            at = first + int(i * step)
            r = broker.send_processor.send("TimerBench", OutgoingMessage(BODY), queue_id=i % 4, deliver_at_ms=at)
            due[r.msg_id] = at
        late: list[int] = []
        offsets = [0, 0, 0, 0]
        deadline = time.monotonic() + spread_s + 60
        while len(late) < count and time.monotonic() < deadline:
            got = _drain(broker, "TimerBench", 4, offsets,
                         lambda m: late.append(m.store_timestamp - due[m.msg_id]))  # type: ignore[attr-defined]
            if not got:
                time.sleep(0.05)
        late.sort()
        p99 = late[int(len(late) * 0.99) - 1] if late else -1
        line("features.timer_lateness", timers=count, spread_s=spread_s, delivered=len(late),
             early=sum(1 for x in late if x < 0), p50_ms=late[len(late) // 2] if late else -1, p99_ms=p99,
             max_ms=late[-1] if late else -1, target_p99_ms=1000)
    finally:
        broker.shutdown()


def bench_transactional_send(base: Path, count: int) -> None:
    """Half + commit round trips through the broker (in-process, one thread)."""
    broker = make_broker(base, "tx")
    try:
        started = time.perf_counter()
        for _ in range(count):
            half = broker.transaction_processor.send_half("TxBench", OutgoingMessage(BODY), "bench-pg", queue_id=0)
            broker.transaction_processor.end_transaction(half["transaction_id"], "bench-pg", "COMMIT")
        elapsed = time.perf_counter() - started
        assert broker.store.max_offset("TxBench", 0) == count
        line("features.transactional_send", messages=count, seconds=elapsed, msgs_per_s=round(count / elapsed),
             target_per_s=5000, path="in-process send_half + end_transaction")
    finally:
        broker.shutdown()


def _retry_run(base: Path, count: int, fail: bool) -> float:
    """Messages consumed per second; with ``fail`` every tenth fails once (send-back, level 1 = 100 ms)."""
    broker = make_broker(base, f"retry{int(fail)}", message_delay_level="100ms 200ms 300ms")
    try:
        for start in range(0, count, 1000):
            broker.send_processor.send_batch("RetryBench", [OutgoingMessage(BODY, properties={"n": str(i)})
                                             for i in range(start, min(start + 1000, count))], queue_id=0)
        done = 0
        failed: set[str] = set()
        offsets, retry_offsets = [0], [0]

        def consume(m: object) -> None:
            nonlocal done
            msg_id = m.msg_id  # type: ignore[attr-defined]
            if fail and int(m.properties["n"]) % 10 == 0 and msg_id not in failed:  # type: ignore[attr-defined]
                failed.add(msg_id)
                broker.send_processor.send_back("bench-cg", m.offset_msg_id, delay_level=1)  # type: ignore[attr-defined]
            else:
                done += 1

        started = time.perf_counter()
        deadline = time.monotonic() + 120
        while done < count and time.monotonic() < deadline:
            got = _drain(broker, "RetryBench", 1, offsets, consume)
            if broker.topics.get("%RETRY%bench-cg") is not None:
                got += _drain(broker, "%RETRY%bench-cg", 1, retry_offsets, consume)
            if not got:
                time.sleep(0.01)
        return done / (time.perf_counter() - started)
    finally:
        broker.shutdown()


def bench_retry_overhead(base: Path, count: int) -> None:
    """Consume ``count`` messages in-process; in one run 10 % fail once, in the other none."""
    clean, failing = _retry_run(base, count, False), _retry_run(base, count, True)
    line("features.retry_overhead", messages=count, clean_msgs_per_s=round(clean),
         ten_pct_fail_once_msgs_per_s=round(failing), relative=failing / clean,
         note="wall time includes the 100 ms retry delay of the last failures")


def main() -> None:
    """Run the benchmarks (all, or ``--only NAME``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the brokers' files (default: a temp dir)")
    parser.add_argument("--only", default=None,
                        help="sql_filter_pull, timer_lateness, transactional_send or retry_overhead")
    args = parser.parse_args()
    q = args.quick
    base = args.dir or Path(tempfile.mkdtemp(prefix="sparkmq-bench-features-"))
    base.mkdir(parents=True, exist_ok=True)
    benches: dict[str, Callable[[], None]] = {
        "sql_filter_pull": lambda: bench_sql_filter_pull(base, 20_000 if q else 1_000_000),
        "timer_lateness": lambda: bench_timer_lateness(base, 2_000 if q else 100_000, 3.0 if q else 60.0),
        "transactional_send": lambda: bench_transactional_send(base, 1_000 if q else 20_000),
        "retry_overhead": lambda: bench_retry_overhead(base, 2_000 if q else 50_000),
    }
    try:
        for name, bench in benches.items():
            if args.only in (None, name):
                bench()
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
