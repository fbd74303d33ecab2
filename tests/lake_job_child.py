"""Child process of the lake crash tests: one Spark driver running a lake job, killable at a chosen commit.

    python lake_job_child.py SPEC_JSON

``SPEC_JSON`` keys:

* ``job``: ``"dispatch"`` (the streaming dispatch job over ``brokers``) or ``"report"`` (one
  :func:`~sparkmq.pipelines.reports.run_report` pass at ``now_ms`` with the offsets in ``samples``);
* ``lake``, ``checkpoint``, ``brokers`` (``{"broker-a": "host:port"}``), ``max_per_trigger``;
* ``kill_after`` (optional): a table name; right after this process's append to it commits -- for
  dispatch in a batch with at least one row, from ``kill_batch`` on -- the process SIGKILLs itself,
  between the commits of one micro-batch (or report run).  It prints ``KILLING <table> <batch>`` first;
* ``until_rows`` (dispatch): stop cleanly once ``consume_queue`` holds this many rows.

Prints ``STARTED`` when the job runs and ``DONE`` when it stopped by itself.  A SIGKILLed Python
driver takes its JVM with it: the JVM exits when the gateway's pipe closes.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
from typing import Any

from deltalake import DeltaTable

from sparkmq.pipelines import dispatch, reports, tables
from sparkmq.pipelines.reports import QueueSample
from sparkmq.pipelines.session import get_spark


def _kill_after(module: Any, name: str, table: str, first_batch: int, non_empty: Any) -> None:
    """Wrap ``module.<name>`` (an append) so the process dies right after the append to ``table`` commits."""
    real = getattr(module, name)

    def append(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        table_name, version = args[2], args[-1]
        if table_name == table and version >= first_batch and non_empty(args[0]):
            print(f"KILLING {table} {version}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(module, name, append)


def _rows(lake: str, table: str) -> int:
    try:
        return DeltaTable(tables.table_path(lake, table)).to_pyarrow_table(columns=["queue_offset"]).num_rows
    except Exception:  # noqa: BLE001 -- not created yet
        return 0


def run_dispatch(spec: dict[str, Any]) -> None:
    """The dispatch job until ``until_rows`` are in consume_queue (or until killed)."""
    spark = get_spark({"spark.master": "local[1]"}, app_name="lake-crash-child", log_level="ERROR")
    if spec.get("kill_after"):
        _kill_after(dispatch, "append_once", spec["kill_after"], int(spec.get("kill_batch", 0)),
                    lambda frame: not frame.isEmpty())
    query = dispatch.start_dispatch(spark, spec["brokers"], spec["lake"], spec["checkpoint"],
                                    {"processingTime": "200 milliseconds"},
                                    max_messages_per_trigger=int(spec["max_per_trigger"]))
    print("STARTED", flush=True)
    until = spec.get("until_rows")
    while query.isActive and (until is None or _rows(spec["lake"], tables.CONSUME_QUEUE) < until):
        time.sleep(0.2)
    error = query.exception()
    query.stop()
    if error is not None:
        sys.exit(f"the query failed: {error}")
    print("DONE", flush=True)


class _Samples:
    """The offsets a report run samples: fixed by the test."""

    def __init__(self, samples: list[list[Any]]) -> None:
        self._samples = [QueueSample(*s) for s in samples]

    def sample(self, known_groups: Any) -> list[QueueSample]:
        return list(self._samples)


def run_report(spec: dict[str, Any]) -> None:
    """One report pass at ``now_ms`` (the kill, if any, between its two appends)."""
    spark = get_spark({"spark.master": "local[1]"}, app_name="lake-crash-child", log_level="ERROR")
    if spec.get("kill_after"):
        _kill_after(reports, "_append", spec["kill_after"], 0, lambda rows: True)
    print("STARTED", flush=True)
    now = dt.datetime.fromtimestamp(spec["now_ms"] / 1000, dt.UTC)
    reports.run_report(spark, spec["lake"], now, _Samples(spec["samples"]), backfill_minutes=spec["backfill"])
    print("DONE", flush=True)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    {"dispatch": run_dispatch, "report": run_report}[spec["job"]](spec)
