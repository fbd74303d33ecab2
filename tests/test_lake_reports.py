"""pipelines.reports and pipelines.alerts: per-minute topic_stats / group_stats, alert rules, webhook, /alerts.

The load is written straight into ``consume_queue`` (the dispatch job's table) with delta-spark, so every
count is known exactly; committed offsets come from an injected source, and once from a real broker
process (``POST /consumers/{group}/offsets``).  The reports are read back with delta-rs, as the broker's
``GET /reports`` and ``GET /alerts`` read them.
"""
from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lake_rows import append_rows
from procs import ProcessHarness, wait_until
from sparkmq.pipelines import tables
from sparkmq.pipelines.alerts import AlertConfig, AlertEngine, AlertRule, open_alerts
from sparkmq.pipelines.reports import QueueSample, Reporter, offsets_source, report_app_id, run_report
from sparkmq.platform.client import BrokerClient

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

UTC = dt.UTC
MIN = dt.timedelta(minutes=1)
#: A fixed past minute: every test's windows are T, T+1, ...
T = dt.datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def at(minute: int, second: float = 0.0) -> dt.datetime:
    """T + ``minute`` minutes + ``second`` seconds."""
    return T + minute * MIN + dt.timedelta(seconds=second)


def run_time(window: int) -> dt.datetime:
    """When a run reports window ``T + window`` as the newest closed one (20 s after it ended)."""
    return at(window + 1, 20)


_batch = iter(range(1, 1_000_000))


def store(spark: Any, lake: Path, topic: str, broker: str, queue_id: int, offsets: Iterable[int],
          ts: Iterable[dt.datetime], size: Any = 100) -> int:
    """Append consume_queue rows (one dispatch-like batch); ``size``: an int or a function of the offset."""
    offsets, ts = list(offsets), list(ts)
    sizes = [size(o) if callable(size) else size for o in offsets]
    data = pa.Table.from_pydict({
        "topic": [topic] * len(offsets), "broker": [broker] * len(offsets), "queue_id": [queue_id] * len(offsets),
        "queue_offset": offsets, "commitlog_offset": [o * 1000 for o in offsets], "size": sizes,
        "tag_hash": [0] * len(offsets), "store_ts": ts}, schema=tables.get_spec(tables.CONSUME_QUEUE).schema)
    append_rows(spark, lake, tables.CONSUME_QUEUE, data, next(_batch), app_id="test-load")
    return sum(sizes)


def spread(minute: int, n: int) -> list[dt.datetime]:
    """``n`` store times spread evenly over window ``T + minute`` (first at :00.000000, none past :59.99)."""
    return [at(minute, 60.0 * i / n) for i in range(n)]


def read_rows(lake: Path, name: str) -> list[dict[str, Any]]:
    """Every row of a table, sorted by its key columns."""
    rows = DeltaTable(tables.table_path(lake, name)).to_pyarrow_table().to_pylist()
    keys = [c for c in ("window_start", "group", "topic", "broker", "queue_id", "alert_id", "raised_at")
            if rows and c in rows[0]]
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


def version(lake: Path, name: str) -> int:
    """A table's current Delta version."""
    return DeltaTable(tables.table_path(lake, name)).version()


class FakeOffsets:
    """An offsets source the test sets by hand: ``set(group, topic, broker, queue, committed, max)``."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str, str, int], tuple[int | None, int]] = {}
        self.asked: list[list[str]] = []

    def set(self, group: str, topic: str, broker: str, queue_id: int, committed: int | None, max_offset: int) -> None:
        self.queues[(group, topic, broker, queue_id)] = (committed, max_offset)

    def sample(self, known_groups: Iterable[str]) -> list[QueueSample]:
        self.asked.append(list(known_groups))
        return [QueueSample(g, t, b, q, c, m, max(0, m - (c or 0))) for (g, t, b, q), (c, m) in self.queues.items()]


# -- topic_stats from a known load --------------------------------------------------------------------

def test_topic_stats_match_a_known_load(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    b_a0 = store(spark, lake, "orders", "broker-a", 0, range(50), spread(0, 50), size=100)
    b_a1 = store(spark, lake, "orders", "broker-a", 1, range(70), spread(0, 70), size=lambda o: 200 + o)
    b_b0 = store(spark, lake, "orders", "broker-b", 0, range(30), spread(0, 30), size=150)
    # Window edges: the last microsecond of T+0 and the first of T+1.
    store(spark, lake, "audit", "broker-a", 0, [0, 1], [at(0, 59.999999), at(1)], size=999)
    b_1 = store(spark, lake, "orders", "broker-a", 0, range(50, 650), spread(1, 600), size=lambda o: o % 17 + 1)
    # T+2 is empty; T+3 is still open when the run happens (20 s past T+2's end + the 15 s grace).
    store(spark, lake, "orders", "broker-a", 0, range(650, 655), spread(3, 5))

    result = run_report(spark, lake, at(3, 30), None, backfill_minutes=5)
    assert result.wrote and result.windows == [at(-2), at(-1), at(0), at(1), at(2)]
    expected = [
        (at(0), "audit", "broker-a", 1, 999), (at(0), "orders", "broker-a", 120, b_a0 + b_a1),
        (at(0), "orders", "broker-b", 30, b_b0), (at(1), "audit", "broker-a", 1, 999),
        (at(1), "orders", "broker-a", 600, b_1),
    ]
    rows = read_rows(lake, tables.TOPIC_STATS)
    assert [(r["window_start"], r["topic"], r["broker"], r["messages_in"], r["bytes_in"]) for r in rows] == expected
    for r in rows:   # exact by construction; the requirement is 5 %
        assert r["tps_in"] == pytest.approx(r["messages_in"] / 60, rel=0.05)
        assert (r["messages_out"], r["bytes_out"], r["tps_out"]) == (0, 0, 0.0)
    from chispa import assert_df_equality

    want = spark.createDataFrame([(*e[:4], e[4], 0, 0, e[3] / 60, 0.0) for e in expected],
                                 tables.spark_schema(tables.TOPIC_STATS))
    tables.register_tables(spark, lake, [tables.TOPIC_STATS])
    assert_df_equality(spark.table("sparkmq.topic_stats"), want, ignore_row_order=True, ignore_nullable=True)

    # The same windows again: nothing written, not even an empty commit.
    v = version(lake, tables.TOPIC_STATS)
    again = run_report(spark, lake, at(3, 30), None, backfill_minutes=5)
    assert not again.wrote and again.windows == [] and version(lake, tables.TOPIC_STATS) == v
    # The next minute closes T+3 only.
    later = run_report(spark, lake, at(4, 30), None, backfill_minutes=5)
    assert later.windows == [at(3)]
    assert [(r["messages_in"], r["bytes_in"]) for r in read_rows(lake, tables.TOPIC_STATS)
            if r["window_start"] == at(3)] == [(5, 500)]
    assert DeltaTable(tables.table_path(lake, tables.TOPIC_STATS)).transaction_version(
        report_app_id("cluster")) == int(at(3).timestamp()) // 60


# -- group_stats from offsets the test controls ------------------------------------------------------

def test_group_stats_consumed_and_lag_exact_across_a_restart(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"

    def size(o: int) -> int:
        return 10 + o

    store(spark, lake, "orders", "broker-a", 0, range(100), spread(0, 100), size=size)
    store(spark, lake, "orders", "broker-a", 0, range(100, 150), spread(1, 50), size=size)
    src = FakeOffsets()
    src.set("g1", "orders", "broker-a", 0, 40, 100)
    src.set("g2", "orders", "broker-a", 0, None, 100)     # never committed: lag counts from offset 0
    reporter = Reporter(lake, src, spark=spark, backfill_minutes=2)
    first = reporter.run(run_time(0))
    assert first.sampled and first.group_rows == 2 and first.last_window == at(0)

    src.set("g1", "orders", "broker-a", 0, 130, 150)
    src.set("g2", "orders", "broker-a", 0, 30, 150)
    reporter.run(run_time(1))

    # A new Reporter (a restart): the previous sample comes from group_stats itself.
    src.set("g1", "orders", "broker-a", 0, 150, 150)
    src.set("g2", "orders", "broker-a", 0, 30, 150)
    Reporter(lake, src, spark=spark).run(run_time(2))
    assert src.asked[-1] == ["g1", "g2"]     # groups seen before are sampled even without members

    got = [(r["window_start"], r["group"], r["messages_in"], r["messages_out"], r["bytes_out"],
            r["committed_offset"], r["max_offset"], r["lag"]) for r in read_rows(lake, tables.GROUP_STATS)]
    assert got == [
        (at(0), "g1", 100, 0, 0, 40, 100, 60),             # the first sample has no baseline
        (at(0), "g2", 100, 0, 0, None, 100, 100),
        (at(1), "g1", 50, 90, sum(map(size, range(40, 130))), 130, 150, 20),
        (at(1), "g2", 50, 30, sum(map(size, range(0, 30))), 30, 150, 120),
        (at(2), "g1", 0, 20, sum(map(size, range(130, 150))), 150, 150, 0),
        (at(2), "g2", 0, 0, 0, 30, 150, 120),
    ]
    group_rows = read_rows(lake, tables.GROUP_STATS)
    assert [r["tps_out"] for r in group_rows] == pytest.approx([0, 0, 1.5, 0.5, 20 / 60, 0])
    # topic_stats "out" is what the groups consumed; "in" is what was stored.
    topic = {r["window_start"]: r for r in read_rows(lake, tables.TOPIC_STATS)}
    assert (topic[at(1)]["messages_in"], topic[at(1)]["messages_out"]) == (50, 120)
    assert topic[at(1)]["bytes_out"] == sum(map(size, range(40, 130))) + sum(map(size, range(30)))
    assert topic[at(1)]["tps_out"] == pytest.approx(2.0, rel=0.05)
    assert topic[at(2)]["messages_out"] == 20


def test_catching_up_samples_only_the_newest_window(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    store(spark, lake, "orders", "broker-a", 0, range(10), spread(0, 10))
    src = FakeOffsets()
    src.set("g1", "orders", "broker-a", 0, 0, 10)
    run_report(spark, lake, run_time(0), src, backfill_minutes=1)
    src.set("g1", "orders", "broker-a", 0, 9, 10)
    # Down for three minutes: T+1..T+3 reported in one commit; the sample goes to T+3 and its rate spans 3 minutes.
    result = run_report(spark, lake, run_time(3), src)
    assert result.windows == [at(1), at(2), at(3)] and result.group_rows == 1
    row = read_rows(lake, tables.GROUP_STATS)[-1]
    assert (row["window_start"], row["messages_out"], row["tps_out"]) == (at(3), 9, pytest.approx(9 / 180))


# -- the real-broker path --------------------------------------------------------------------------------

@pytest.mark.cluster
def test_group_stats_from_a_real_broker(spark: Any, tmp_path: Path, procs: ProcessHarness) -> None:
    namesrv, broker = procs.start_platform(tmp_path / "broker", "--broker-name", "broker-a")
    client = BrokerClient(broker.addr, 5.0)
    try:
        client.create_topic({"topic": "rt", "read_queue_nums": 1, "write_queue_nums": 1})
        offsets = [int(client.send("rt", {"body": f"m{i}", "queue_id": 0})["queue_offset"]) for i in range(20)]
        assert offsets == list(range(20))
        lake = tmp_path / "lake"
        store(spark, lake, "rt", "broker-a", 0, offsets, spread(0, 20), size=lambda o: 300 + o)
        # "live" has a member (listed by GET /consumers); "orphan" only has committed offsets.
        client.heartbeat({"client_id": "127.0.0.1@1@test", "consumers": [
            {"group": "live", "subscriptions": [{"topic": "rt", "expression": "*"}]}]})
        client.commit_offsets("live", [{"topic": "rt", "queue_id": 0, "offset": 5}])
        client.commit_offsets("orphan", [{"topic": "rt", "queue_id": 0, "offset": 2}])

        # First through the name server (a standalone ``sparkmq lake``), then through the broker named
        # directly (the embedded lake); both ask the same endpoints.
        via_namesrv = offsets_source(namesrv.addr)
        try:
            wait_until(lambda: "broker-a" in via_namesrv.masters(), 20, "broker-a registered", interval=0.1)
            Reporter(lake, via_namesrv, spark=spark, extra_groups=["orphan"], backfill_minutes=1).run(run_time(0))
        finally:
            via_namesrv.close()
        client.commit_offsets("live", [{"topic": "rt", "queue_id": 0, "offset": 18}])
        direct = offsets_source({"broker-a": broker.addr})
        try:
            # Restarted without extra_groups: "orphan" is still sampled because group_stats knows it.
            Reporter(lake, direct, spark=spark).run(run_time(1))
        finally:
            direct.close()
    finally:
        client.close()
    got = [(r["window_start"], r["group"], r["messages_in"], r["messages_out"], r["bytes_out"],
            r["committed_offset"], r["max_offset"], r["lag"]) for r in read_rows(lake, tables.GROUP_STATS)]
    assert got == [
        (at(0), "live", 20, 0, 0, 5, 20, 15), (at(0), "orphan", 20, 0, 0, 2, 20, 18),
        (at(1), "live", 0, 13, sum(300 + o for o in range(5, 18)), 18, 20, 2), (at(1), "orphan", 0, 0, 0, 2, 20, 18),
    ]


# -- alerts ----------------------------------------------------------------------------------------------

class Webhook:
    """A tiny HTTP server on 127.0.0.1:0 recording POSTed JSON; answers 500 ``fail`` times first."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.fail = 0
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if hook.fail > 0:
                    hook.fail -= 1
                    self.send_response(500)
                else:
                    hook.received.append(body)
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


def test_stuck_group_raises_once_calls_the_webhook_and_resolves(spark: Any, tmp_path: Path, webhook: Webhook) -> None:
    lake = tmp_path / "lake"
    store(spark, lake, "orders", "broker-a", 0, range(60), spread(0, 60))
    src = FakeOffsets()
    src.set("stuck", "orders", "broker-a", 0, 5, 60)
    src.set("fine", "orders", "broker-a", 0, 60, 60)
    conf = {"alerts": {"webhook_url": webhook.url, "rules": [
        {"name": "lag", "kind": "lag", "threshold": 10, "for_minutes": 2, "severity": "critical"},
        {"name": "idle", "kind": "idle_group", "threshold": 0, "for_minutes": 2},
        {"name": "other", "kind": "lag", "threshold": 0, "group": "nobody-*"},
    ]}}
    reporter = Reporter(lake, src, spark=spark, alerts=conf, backfill_minutes=1)

    assert reporter.run(run_time(0)).alerts.raised == []           # lag above 10 for 1 minute only
    webhook.fail = 1                                                # the first POST fails ...
    second = reporter.run(run_time(1)).alerts
    assert [a["alert_id"] for a in second.raised] == ["lag:group=stuck topic=orders"]
    assert (second.notified, second.notify_failures, second.pending) == (0, 1, 1)
    assert [a["alert_id"] for a in open_alerts(lake)] == ["lag:group=stuck topic=orders"]
    assert webhook.received == []

    rerun = reporter.run(run_time(1)).alerts                         # ... and is retried by the next run,
    assert rerun.raised == [] and (rerun.notified, rerun.pending) == (1, 0)   # which raises nothing again
    hooked = webhook.received[0]
    assert (hooked["event"], hooked["alert_id"], hooked["severity"], hooked["value"], hooked["threshold"]) == (
        "raised", "lag:group=stuck topic=orders", "critical", 55.0, 10.0)
    assert hooked["resolved_at"] is None

    third = reporter.run(run_time(2)).alerts                         # idle for 2 minutes after a baseline window
    assert [a["alert_id"] for a in third.raised] == ["idle:group=stuck"]
    assert len(read_rows(lake, tables.ALERTS)) == 2
    assert sorted(a["alert_id"] for a in open_alerts(lake)) == ["idle:group=stuck", "lag:group=stuck topic=orders"]

    src.set("stuck", "orders", "broker-a", 0, 60, 60)                # it catches up
    fourth = reporter.run(run_time(3)).alerts
    assert sorted(a["alert_id"] for a in fourth.resolved) == ["idle:group=stuck", "lag:group=stuck topic=orders"]
    assert open_alerts(lake) == []
    rows = read_rows(lake, tables.ALERTS)
    assert len(rows) == 2 and all(r["resolved_at"] == run_time(3) for r in rows)
    protocol = DeltaTable(tables.table_path(lake, tables.ALERTS)).protocol()     # the MERGE added no feature
    assert (protocol.min_reader_version, protocol.min_writer_version, protocol.writer_features) == (1, 2, None)
    assert [(h["event"], h["alert_id"]) for h in webhook.received] == [
        ("raised", "lag:group=stuck topic=orders"), ("raised", "idle:group=stuck"),
        ("resolved", "lag:group=stuck topic=orders"), ("resolved", "idle:group=stuck")]   # in rule order
    assert reporter.run(run_time(3)).alerts.resolved == []          # resolved once

    # The same subject stuck again later: a new occurrence under the same stable id; the old row keeps its times.
    src.set("stuck", "orders", "broker-a", 0, 60, 100)
    reporter.run(run_time(4))
    reporter.run(run_time(5))
    rows = read_rows(lake, tables.ALERTS)
    lag_rows = [r for r in rows if r["alert_id"] == "lag:group=stuck topic=orders"]
    assert [(r["raised_at"], r["resolved_at"]) for r in lag_rows] == [(run_time(1), run_time(3)), (run_time(5), None)]


def test_dlq_growth_fires_on_dlq_messages_in(spark: Any, tmp_path: Path, webhook: Webhook) -> None:
    lake = tmp_path / "lake"
    store(spark, lake, "%DLQ%g1", "broker-a", 0, range(5), spread(0, 5))
    store(spark, lake, "%DLQ%g1", "broker-b", 0, range(2), spread(0, 2))
    store(spark, lake, "orders", "broker-a", 0, range(50), spread(0, 50))      # not a DLQ: never fires
    store(spark, lake, "%DLQ%g2", "broker-a", 0, range(3), spread(0, 3))       # at the threshold: not above
    config = AlertConfig(rules=(AlertRule("dlq", "dlq_growth", threshold=3),), webhook_url=webhook.url)
    engine = AlertEngine(spark, lake, config)

    run_report(spark, lake, run_time(0), None, backfill_minutes=1)
    raised = engine.evaluate(at(0), run_time(0)).raised
    assert [(a["alert_id"], a["value"]) for a in raised] == [("dlq:topic=%DLQ%g1", 7.0)]
    assert [a["subject"] for a in open_alerts(lake)] == ["topic=%DLQ%g1"]
    assert webhook.received[0]["subject"] == "topic=%DLQ%g1"

    run_report(spark, lake, run_time(1), None)                           # nothing new in the DLQ
    assert [a["alert_id"] for a in engine.evaluate(at(1), run_time(1)).resolved] == ["dlq:topic=%DLQ%g1"]
    assert open_alerts(lake) == []


def test_alert_config_is_validated() -> None:
    assert AlertConfig.from_mapping({"rules": [{"name": "a", "kind": "lag", "threshold": 5}]}).rules[0].for_minutes == 1
    for bad in ({"name": "a", "kind": "nope"}, {"name": "a", "kind": "lag", "threshold": -1},
                {"name": "a", "kind": "lag", "for_minutes": 0}, {"name": "a", "kind": "lag", "treshold": 5},
                {"name": "a", "kind": "lag", "severity": "loud"}):
        with pytest.raises(ValueError):
            AlertConfig.from_mapping({"alerts": {"rules": [bad]}})
    with pytest.raises(ValueError, match="unique"):
        AlertConfig.from_mapping({"rules": [{"name": "a", "kind": "lag"}, {"name": "a", "kind": "idle_group"}]})
    assert open_alerts("/nonexistent/lake") == []


def test_a_crash_between_the_two_appends_is_repaired(spark: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkmq.pipelines import reports

    lake = tmp_path / "lake"
    store(spark, lake, "orders", "broker-a", 0, range(10), spread(0, 10))
    src = FakeOffsets()
    src.set("g1", "orders", "broker-a", 0, 0, 10)
    run_report(spark, lake, run_time(0), src, backfill_minutes=1)
    src.set("g1", "orders", "broker-a", 0, 7, 10)
    real = reports._append

    def crash_on_topic_stats(spark_: Any, lake_root: str, name: str, *args: Any) -> None:
        if name == tables.TOPIC_STATS:
            raise RuntimeError("killed")
        real(spark_, lake_root, name, *args)

    monkeypatch.setattr(reports, "_append", crash_on_topic_stats)
    with pytest.raises(RuntimeError):
        run_report(spark, lake, run_time(1), src)
    monkeypatch.undo()
    src.set("g1", "orders", "broker-a", 0, 9, 10)     # moved on meanwhile: the written sample must win
    again = run_report(spark, lake, run_time(1), src)
    assert again.windows == [at(1)] and not again.sampled
    assert [r["messages_out"] for r in read_rows(lake, tables.GROUP_STATS)] == [0, 7]
    assert [r["messages_out"] for r in read_rows(lake, tables.TOPIC_STATS)] == [0, 7]


def test_one_report_job_per_broker_share_a_lake(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    store(spark, lake, "orders", "broker-a", 0, range(4), spread(0, 4))
    store(spark, lake, "orders", "broker-b", 0, range(6), spread(0, 6))
    src = FakeOffsets()
    src.set("g1", "orders", "broker-a", 0, 1, 4)
    src.set("g1", "orders", "broker-b", 0, 2, 6)
    for broker in ("broker-a", "broker-b"):           # embedded lakes: each reports its own broker
        run_report(spark, lake, run_time(0), src, job=broker, brokers=[broker], backfill_minutes=1)
    src.set("g1", "orders", "broker-a", 0, 4, 4)
    src.set("g1", "orders", "broker-b", 0, 6, 6)
    for broker in ("broker-a", "broker-b"):
        run_report(spark, lake, run_time(1), src, job=broker, brokers=[broker])
    assert [(r["window_start"], r["broker"], r["messages_in"], r["messages_out"])
            for r in read_rows(lake, tables.TOPIC_STATS)] == [
        (at(0), "broker-a", 4, 0), (at(0), "broker-b", 6, 0), (at(1), "broker-a", 0, 3), (at(1), "broker-b", 0, 4)]
    assert [(r["broker"], r["lag"]) for r in read_rows(lake, tables.GROUP_STATS)] == [
        ("broker-a", 3), ("broker-b", 4), ("broker-a", 0), ("broker-b", 0)]


def test_the_report_loop_runs_until_stopped(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    store(spark, lake, "orders", "broker-a", 0, range(3), spread(0, 3))
    reporter = Reporter(lake, None, spark=spark, backfill_minutes=1, clock=lambda: run_time(0))
    stop = threading.Event()
    thread = threading.Thread(target=reporter.loop, args=(stop, 0.05), daemon=True)
    thread.start()
    try:
        wait_until(lambda: reporter.last_window is not None, 120, "the first report window")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert reporter.status()["last_window"] == at(0).isoformat() and reporter.status()["last_error"] is None
    assert [r["messages_in"] for r in read_rows(lake, tables.TOPIC_STATS)] == [3]
