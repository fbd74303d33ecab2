"""Message-trace benchmark: ``lake.trace_lookup``, one message's path by msgId over a large ``message_trace``.

    python benchmarks/bench_trace.py [--quick] [--dir DIR] [--rows N] [--commits N]

Writes ``--rows`` trace rows (1,000,000; ``--quick`` 100,000) into a fresh ``message_trace``
table with delta-spark (:func:`~sparkmq.pipelines.dispatch.append_once`, a local[2] session), in
``--commits`` appends (one per micro-batch, as the trace job does): four events per message (send, store, deliver,
consume) with producer-style msgIds, in time order.  Then looks messages up the way
``GET /trace/{msg_id}`` does (:class:`~sparkmq.platform.broker.trace.TraceLookup`, delta-rs,
table loaded afresh each time) and prints one line::

    lake.trace_lookup rows=1000000 seconds=… median_s=… events=4 files=… target_s=2

``seconds`` is the first lookup (cold), ``median_s`` the median of five lookups of other messages;
``--shuffled`` adds ``lake.trace_lookup_shuffled``, the same with msgIds interleaved across commits.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from sparkmq.pipelines import tables
from sparkmq.pipelines.dispatch import append_once
from sparkmq.platform.broker.trace import TraceLookup
from sparkmq.platform.common.ids import UniqueIdGenerator

TARGET_S = 2.0
_STEPS = [("send", "SEND_OK", "pg", None), ("store", "STORED", None, None),
          ("deliver", "DELIVERED", "cg", "127.0.0.1@1@c0ffee"), ("consume", "CONSUME_SUCCESS", "cg",
                                                                   "127.0.0.1@1@c0ffee")]


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


def batch_rows(msg_ids: list[str], first_ms: int) -> pa.Table:
    """``message_trace`` rows of four events for each of ``msg_ids`` (one message per ms from ``first_ms``)."""
    n = len(msg_ids)
    steps = len(_STEPS)
    born = first_ms + np.arange(n, dtype=np.int64)
    event_ms = (born[:, None] + np.array([0, 1, 3, 4], dtype=np.int64)[None, :]).reshape(-1)
    ids = np.repeat(np.array(msg_ids, dtype=object), steps)
    kind = np.tile(np.arange(steps), n)
    spec = tables.get_spec(tables.MESSAGE_TRACE).schema
    ts = pa.array(event_ms * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    born_ts = pa.array(np.repeat(born, steps) * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC"))

    def pick(i: int) -> pa.Array:
        return pa.array([_STEPS[k][i] for k in kind], pa.string())

    columns = {
        "trace_id": pa.array([f"{m}:{_STEPS[k][0]}" for m, k in zip(ids, kind, strict=True)], pa.string()),
        "msg_id": pa.array(ids, pa.string()), "topic": pa.array(["Orders"] * len(ids), pa.string()),
        "group": pick(2), "client_id": pick(3), "event_type": pick(0), "status": pick(1),
        "cost_ms": pa.array(np.where(kind % 2 == 0, 2, 0), pa.int64()), "event_ts": ts, "born_ts": born_ts,
        "store_ts": born_ts, "broker": pa.array(["broker-a"] * len(ids), pa.string()),
        "queue_id": pa.array(np.repeat(np.arange(n) % 8, steps), pa.int32()),
        "queue_offset": pa.array(np.repeat(np.arange(n) // 8, steps), pa.int64()),
        "reconsume_times": pa.array(np.zeros(len(ids), dtype=np.int32), pa.int32()),
        "tags": pa.array(["TagA"] * len(ids), pa.string()), "keys": pa.nulls(len(ids), pa.string()),
        "detail": pa.nulls(len(ids), pa.string()), "event_date": ts.cast(pa.date32()),
    }
    return pa.Table.from_arrays([columns[f.name] for f in spec], schema=spec)


def bench_trace_lookup(spark: Any, base: Path, rows: int, commits: int, shuffled: bool = False) -> None:
    """Write ``rows`` trace rows in ``commits`` appends, then time lookups by msgId.

    ``shuffled``: msgIds in random order across commits (many producers whose ids interleave), so
    per-file min/max statistics of ``msg_id`` cannot skip files: the worst case of the lookup.
    """
    lake = base / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    tables.ensure_table(spark, lake, tables.MESSAGE_TRACE)
    path = tables.table_path(lake, tables.MESSAGE_TRACE)
    schema = tables.spark_schema(tables.MESSAGE_TRACE)
    messages = rows // len(_STEPS)
    ids = UniqueIdGenerator()
    start_ms = int(time.time() * 1000) - messages
    all_ids = [ids.next_id(start_ms + i) for i in range(messages)]
    if shuffled:
        np.random.default_rng(7).shuffle(all_ids)
    per_commit = -(-messages // commits)
    written = time.perf_counter()
    for version, first in enumerate(range(0, messages, per_commit)):
        chunk = all_ids[first:first + per_commit]
        frame = spark.createDataFrame(batch_rows(chunk, start_ms + first), schema=schema)
        append_once(frame, lake, tables.MESSAGE_TRACE, "trace-bench", version)
    write_s = time.perf_counter() - written
    lookup = TraceLookup(lake)
    began = time.perf_counter()
    found = lookup.path(all_ids[messages // 2])
    first_s = time.perf_counter() - began
    assert [e["event_type"] for e in found] == [s[0] for s in _STEPS], found
    times = []
    for i in (1, messages // 4, messages // 3, 3 * messages // 4, messages - 2):
        began = time.perf_counter()
        assert len(lookup.path(all_ids[i])) == len(_STEPS)
        times.append(time.perf_counter() - began)
    files = len(list(Path(path).rglob("*.parquet")))
    line("lake.trace_lookup" + ("_shuffled" if shuffled else ""), rows=messages * len(_STEPS), seconds=first_s,
         median_s=statistics.median(times),
         events=len(found), commits=commits, files=files, write_s=write_s, target_s=TARGET_S)


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows instead of 1,000,000")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--commits", type=int, default=20, help="appends (micro-batches) the rows are written in")
    parser.add_argument("--shuffled", action="store_true",
                        help="also the worst case: msgIds interleaved across commits (no file skipping)")
    args = parser.parse_args()
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    base = args.dir or Path(tempfile.mkdtemp(prefix="sparkmq-bench-trace-"))
    from sparkmq.pipelines.session import get_spark, stop_spark

    spark = get_spark({"spark.master": "local[2]"}, app_name="sparkmq-bench-trace", log_level="ERROR")
    try:
        bench_trace_lookup(spark, base, rows, args.commits)
        if args.shuffled:
            bench_trace_lookup(spark, base, rows, args.commits, shuffled=True)
    finally:
        stop_spark()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
