"""Builds notebooks 02-05 from the cell lists below (``python notebooks/_build_notebooks.py [names...]``).

The .ipynb files are what ships; this script only keeps their sources reviewable in one place.
Outputs are not stored: tests/test_notebooks.py executes every notebook headless.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
NOTEBOOKS: dict[str, list] = {}


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


def notebook(name: str, *cells) -> None:
    NOTEBOOKS[name] = list(cells)


def write(name: str) -> Path:
    nb = new_notebook(cells=NOTEBOOKS[name], metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}})
    for cell in nb.cells:   # stable files: no random cell ids churn between builds
        cell.pop("id", None)
    nb.nbformat, nb.nbformat_minor = 4, 4
    path = HERE / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


# ======================================================================================
# 02 -- a Structured Streaming subscriber
# ======================================================================================
notebook(
    "02_streaming_subscriber",
    md("""
# A Structured Streaming subscriber

The `sparkmq` Spark data source reads topics the way Spark's Kafka source reads Kafka: one row per
message, offsets per queue (`{"topic": {"broker/queue": next_offset}}`) in the query's checkpoint, and
admission control with `maxMessagesPerTrigger`. With the `group` option, every committed micro-batch
also commits the read offsets to that consumer group on the broker, so the group's lag shows how far
the query is behind.

This notebook starts its own platform (a name server and a broker on free loopback ports, in this
kernel's process; the lake jobs are off, Spark runs only here), then:

1. sends 200 messages to a topic with 4 queues,
2. runs a streaming query over the whole topic with `maxMessagesPerTrigger = 60` into a `foreachBatch` sink,
3. restarts it from its checkpoint and sees only the messages sent since,
4. keeps a live query running while messages arrive,
5. checks that the group's lag on the broker is zero,
6. dispatches the topic into the lake and streams it back from the Delta table `sparkmq.messages`.

Run it top to bottom; the last cell stops everything it started.
"""),
    code("""
import shutil, tempfile, time
import pandas as pd
from sparkmq.api.embedded import EmbeddedPlatform
from sparkmq.platform.client import AdminClient, ClientConfig, Message, Producer

workdir = tempfile.mkdtemp(prefix="sparkmq-streaming-")
# Free ports, a temporary data dir, no lake; 64 MiB commit-log segments instead of 1 GiB (a demo needs little).
platform = EmbeddedPlatform(namesrv={"port": 0}, broker={"port": 0, "data_dir": f"{workdir}/broker"},
                            store={"segment_size": 64 << 20}).start()
config = ClientConfig(namesrv_addrs=platform.namesrv_addr)
admin = AdminClient(config)
admin.create_topic("Clicks", read_queue_nums=4, write_queue_nums=4)
print("name server", platform.namesrv_addr, "| broker", platform.broker_addr)
"""),
    md("""
## Send a first load
200 click events, round-robin over the 4 queues, each with a key, a tag and a user property.
"""),
    code("""
producer = Producer("clicks-producer", config).start()

def send_clicks(start, n):
    return [producer.send(Message("Clicks", f'{{"click": {i}, "page": "/p/{i % 7}"}}'.encode(),
                                  tags="mobile" if i % 2 else "web", keys=(f"user-{i % 13}",),
                                  properties={"page": f"/p/{i % 7}"}))
            for i in range(start, start + n)]

first = send_clicks(0, 200)
pd.DataFrame([{"queue_id": r.queue_id} for r in first]).value_counts("queue_id").sort_index().to_frame("messages")
"""),
    md("""
## The source
`register(spark)` adds the `sparkmq` format to the session. A batch read of the topic shows the columns
(Kafka-like, plus RocketMQ's: tags, keys, properties, store timestamp, reconsume count). The source reads
through the broker's HTTP pull API with Arrow batches, so the same code runs on a remote cluster.
"""),
    code("""
from sparkmq.pipelines.session import get_spark, stop_spark
from sparkmq.pipelines.source import register

spark = get_spark(log_level="ERROR")
register(spark)
clicks = (spark.read.format("sparkmq").option("namesrv", platform.namesrv_addr)
          .option("subscribe", "Clicks").load())
clicks.printSchema()
"""),
    code("""
(clicks.selectExpr("topic", "broker", "queue_id", "queue_offset", "msg_id", "keys", "tags",
                   "CAST(body AS STRING) AS body", "properties['page'] AS page", "store_timestamp")
 .orderBy("queue_id", "queue_offset").limit(8).toPandas())
"""),
    md("""
## A streaming query with `maxMessagesPerTrigger`
The subscriber is an ordinary `readStream`: it starts at `earliest` (only used when the checkpoint is
new), admits at most 60 messages per micro-batch, and commits its offsets to the group `clicks-spark`
after each batch. The sink is `foreachBatch`: here it just keeps each batch's rows in a list, where a
real job would write a table.

`trigger(availableNow=True)` processes everything available when the query starts — still in batches of
at most 60 — and then stops, which makes the run deterministic.
"""),
    code("""
CHECKPOINT = f"{workdir}/checkpoints/clicks"
batches = []   # (batch_id, rows) for every micro-batch the sink saw

def keep_batch(df, batch_id):
    rows = df.selectExpr("queue_id", "queue_offset", "msg_id", "tags", "CAST(body AS STRING) AS body").collect()
    batches.append((batch_id, [r.asDict() for r in rows]))

def subscriber(trigger):
    stream = (spark.readStream.format("sparkmq")
              .option("namesrv", platform.namesrv_addr)
              .option("subscribe", "Clicks")
              .option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", 60)
              .option("group", "clicks-spark")
              .load())
    return (stream.writeStream.foreachBatch(keep_batch)
            .option("checkpointLocation", CHECKPOINT).trigger(**trigger).start())

t0 = time.monotonic()
query = subscriber({"availableNow": True})
query.awaitTermination(120)
assert query.exception() is None, query.exception()
print(f"first run: {time.monotonic() - t0:.1f} s")
run1 = [(b, len(rows)) for b, rows in batches]
pd.DataFrame(run1, columns=["batch_id", "rows"])
"""),
    md("""
Every micro-batch holds at most 60 messages, and together they hold each of the 200 messages exactly once:
"""),
    code("""
got = [row for _, rows in batches for row in rows]
assert all(n <= 60 for _, n in run1), run1
assert sorted(r["msg_id"] for r in got) == sorted(r.msg_id for r in first)
received = pd.DataFrame(got)
print(len(received), "rows,", received.msg_id.nunique(), "distinct messages")
received.sort_values(["queue_id", "queue_offset"]).head(10)
"""),
    md("""
## The group's lag
The query committed each batch's end offsets to `clicks-spark`, so the broker sees a group that has read
the whole topic:
"""),
    code("""
def lag_table(group):
    lag = admin.group_lag(group, "Clicks")
    return lag.total_lag, pd.DataFrame([{"queue_id": q.queue_id, "broker_offset": q.broker_offset,
                                         "consumer_offset": q.consumer_offset, "lag": q.lag} for q in lag.queues])

total, per_queue = lag_table("clicks-spark")
assert total == 0, per_queue
print("total lag:", total)
per_queue
"""),
    md("""
## Restart from the checkpoint
50 more clicks arrive while the subscriber is down: the group is 50 behind. Starting the same query again
(same checkpoint) reads only those 50 — the checkpoint, not `startingOffsets`, says where to resume.
"""),
    code("""
second = send_clicks(200, 50)
print("lag while the query is down:", admin.group_lag("clicks-spark", "Clicks").total_lag)

seen_before = len(batches)
query = subscriber({"availableNow": True})
query.awaitTermination(120)
assert query.exception() is None, query.exception()
new_rows = [row for _, rows in batches[seen_before:] for row in rows]
assert sorted(r["msg_id"] for r in new_rows) == sorted(r.msg_id for r in second)
print(f"restart read {len(new_rows)} rows in {len(batches) - seen_before} batches "
      f"(batch ids {batches[seen_before][0]}..{batches[-1][0]}, continuing after {run1[-1][0]})")
"""),
    md("""
## A live subscriber
The same query with a processing-time trigger keeps running: messages sent while it runs show up within a
trigger or two, and the group's lag drops back to zero as each batch commits. `lastProgress` is Spark's
view of the last micro-batch.
"""),
    code("""
seen_before = len(batches)
live = subscriber({"processingTime": "1 second"})
third = send_clicks(250, 30)
deadline = time.monotonic() + 60
while sum(len(rows) for _, rows in batches[seen_before:]) < len(third) and time.monotonic() < deadline:
    time.sleep(0.5)
live_rows = [row for _, rows in batches[seen_before:] for row in rows]
assert sorted(r["msg_id"] for r in live_rows) == sorted(r.msg_id for r in third)
# The group's offsets move when Spark commits a batch, just after the sink ran: wait for that before stopping.
while admin.group_lag("clicks-spark", "Clicks").total_lag and time.monotonic() < deadline:
    time.sleep(0.5)
progress = live.lastProgress or {}
print("live query received", len(live_rows), "messages; last batch:",
      {k: progress.get(k) for k in ("batchId", "numInputRows")})
"""),
    code("""
live.stop()
total, per_queue = lag_table("clicks-spark")
assert total == 0, per_queue
print("every message read once:", len(batches), "batches,",
      sum(len(rows) for _, rows in batches), "rows for", len(first) + len(second) + len(third), "messages sent;",
      "group lag", total)
per_queue
"""),
    md("""
## The lake as a stream: `spark.readStream.table("sparkmq.messages")`
A broker's lake (or `sparkmq lake`) dispatches every topic into the Delta table `messages`, registered as
`sparkmq.messages`. Delta's own streaming source reads it like any Delta table: every committed row once per
checkpoint, history beyond the commit log's retention, no load on the broker. Here the dispatch job runs once
(`availableNow`) into a lake of this notebook, then a query streams the table.

Which one: the `sparkmq` source reads the brokers' log directly (milliseconds behind, every topic, tag
filters, no lake needed); `sparkmq.messages` is as fresh as dispatch (about a second behind) and is the
choice for analytics and pipelines that should not touch the brokers or need old history.
"""),
    code("""
from sparkmq.pipelines.dispatch import start_dispatch

lake_root = f"{workdir}/lake"
dispatch = start_dispatch(spark, {platform.broker_service.config.broker_name: platform.broker_addr}, lake_root,
                          f"{workdir}/checkpoints/dispatch", trigger={"availableNow": True})
dispatch.awaitTermination(180)
assert dispatch.exception() is None, dispatch.exception()

from_lake = []
lake_query = (spark.readStream.table("sparkmq.messages").where("topic = 'Clicks'")
              .writeStream.foreachBatch(lambda df, _: from_lake.extend(r.msg_id for r in df.select("msg_id").collect()))
              .option("checkpointLocation", f"{workdir}/checkpoints/lake-clicks").trigger(availableNow=True).start())
lake_query.awaitTermination(120)
assert sorted(from_lake) == sorted(r.msg_id for r in first + second + third)
print(len(from_lake), "messages from sparkmq.messages, each once;",
      spark.sql("DESCRIBE HISTORY sparkmq.messages").count(), "versions of the table")
"""),
    md("""
## Stop
Stop everything this notebook started, and delete its temporary directory.
"""),
    code("""
for q in spark.streams.active:
    q.stop()
producer.shutdown()
admin.close()
platform.stop()
stop_spark()
shutil.rmtree(workdir, ignore_errors=True)
"""),
)


# ======================================================================================
# 04 -- dead letters: inspection and re-drive
# ======================================================================================
notebook(
    "04_dlq",
    md("""
# Dead letters: inspect and re-drive

A push consumer whose listener fails hands the message back to the broker (send-back), which redelivers it
through `%RETRY%<group>` after a delay that grows with each attempt. After `max_reconsume_times` retries the
broker moves it to the group's dead-letter topic `%DLQ%<group>`, with the reason, the original topic and the
original message id as properties. Once the bug is fixed, an operator re-drives the dead letters: they go
back to their original topic, and the group consumes them again.

This notebook starts its own platform with **short delay levels** (every level 200 ms instead of
1 s … 2 h), so the retries take seconds, and uses a consumer that gives up after **2 retries**.
"""),
    code("""
import shutil, tempfile, threading, time
import pandas as pd
from sparkmq.api.embedded import EmbeddedPlatform
from sparkmq.platform.client import AdminClient, ClientConfig, ConsumeStatus, Message, Producer, PushConsumer

workdir = tempfile.mkdtemp(prefix="sparkmq-dlq-")
# Free ports, a temporary data dir, no lake, 64 MiB commit-log segments, and every delay level 200 ms.
platform = EmbeddedPlatform(namesrv={"port": 0},
                            broker={"port": 0, "data_dir": f"{workdir}/broker",
                                    "message_delay_level": " ".join(["200ms"] * 18)},
                            store={"segment_size": 64 << 20}).start()
# Fast client timings for a demo: heartbeats, rebalances and offset commits every fraction of a second.
config = ClientConfig(namesrv_addrs=platform.namesrv_addr, heartbeat_interval_s=0.3, rebalance_interval_s=0.5,
                      offset_commit_interval_s=0.2, long_poll_wait_ms=1000, reconsume_delay_s=0.2,
                      route_refresh_interval_s=0.5, offset_store_dir=f"{workdir}/offsets")
admin = AdminClient(config)
admin.create_topic("Payments", read_queue_nums=2, write_queue_nums=2)
GROUP = "payments-cg"
print("name server", platform.namesrv_addr, "| broker", platform.broker_addr)
"""),
    md("""
## A consumer that always fails
The listener raises for every message (a bug in the payment handler). Each attempt is recorded: which
topic the message came from, and its reconsume count.
"""),
    code("""
import logging
# The client logs every failed delivery with its traceback (ERROR); 30 expected ones would bury this notebook.
logging.getLogger("sparkmq.client").setLevel(logging.CRITICAL)
attempts, lock = [], threading.Lock()

def broken_handler(msgs):
    with lock:
        attempts.extend({"body": m.body.decode(), "topic": m.topic, "reconsume_times": m.reconsume_times,
                         "at": time.time()} for m in msgs)
    raise ValueError(f"card processor rejected {msgs[0].keys[0]}: unknown currency XBT")

failing = PushConsumer(GROUP, config, consume_from_where="CONSUME_FROM_FIRST_OFFSET", max_reconsume_times=2)
failing.subscribe("Payments")
failing.register_listener(broken_handler)
failing.start()
print("subscriptions:", sorted(failing.subscriptions))   # the retry topic is subscribed too
"""),
    code("""
producer = Producer("payments-producer", config).start()
sent = [producer.send(Message("Payments", f"payment {i}: 12.{i:02d} XBT".encode(), keys=(f"pay-{i}",),
                              tags="card", properties={"customer": f"c{i % 3}"}))
        for i in range(10)]
sent_ids = {r.msg_id for r in sent}

deadline = time.monotonic() + 60
dead = []
while time.monotonic() < deadline:
    dead = admin.dlq_messages(GROUP)
    if len({m.properties.get("ORIGIN_MESSAGE_ID", m.msg_id) for m in dead} & sent_ids) == len(sent):
        break
    time.sleep(0.5)
print(len(dead), "dead letters; consumer stats:", failing.stats)
"""),
    md("""
Each message was delivered 3 times: once from `Payments`, then twice through the retry topic, with the
reconsume count going 0 → 1 → 2 (the listener sees the original topic each time). The third failure
exceeded `max_reconsume_times = 2`, so the broker dead-lettered it instead of retrying again.
"""),
    code("""
failing.shutdown()
logging.getLogger("sparkmq.client").setLevel(logging.NOTSET)
tries = pd.DataFrame(attempts)
tries["at"] = (tries["at"] - tries["at"].min()).round(2)
per_message = tries.groupby("body").agg(deliveries=("topic", "size"),
                                         reconsume_counts=("reconsume_times", lambda s: sorted(s)),
                                         seconds_first_to_last=("at", lambda s: round(s.max() - s.min(), 2)))
assert (per_message.deliveries == 3).all(), per_message
per_message.head()
"""),
    md("""
## Inspect the dead letters
`AdminClient.dlq_messages(group)` reads `%DLQ%<group>` on every master. The interesting facts are properties
the broker set when it dead-lettered the message: `DLQ_ORIGIN_TOPIC`, `ORIGIN_MESSAGE_ID`, `DLQ_REASON`
(the listener's exception) and the reconsume count (3: the failed deliveries).
"""),
    code("""
letters = pd.DataFrame([{
    "msg_id": m.msg_id,
    "origin_msg_id": m.properties.get("ORIGIN_MESSAGE_ID", m.msg_id),
    "dlq_topic": m.topic,
    "origin_topic": m.properties.get("DLQ_ORIGIN_TOPIC"),
    "reconsume_times": m.reconsume_times,
    "reason": m.properties.get("DLQ_REASON"),
    "key": " ".join(m.keys),
    "customer": m.properties.get("customer"),
    "body": m.body.decode(),
    "stored": pd.Timestamp(m.store_timestamp, unit="ms", tz="UTC"),
} for m in dead])
assert set(letters.origin_msg_id) == sent_ids and (letters.origin_topic == "Payments").all()
letters[["key", "origin_topic", "dlq_topic", "reconsume_times", "reason", "stored"]]
"""),
    md("""
A summary by reason and customer. (The same letters are a topic like any other for the `sparkmq` Spark
source — `option("subscribe", "%DLQ%payments-cg")` — when they should be explored with SQL; notebook 02
shows the source. This notebook stays without Spark, so it runs in seconds.)
"""),
    code("""
letters.assign(error=letters.reason.str.extract(r"^(\\w+):", expand=False)).groupby(
    ["origin_topic", "error", "customer"]).agg(letters=("msg_id", "size"), max_reconsume=("reconsume_times", "max"))
"""),
    md("""
## Fix the consumer, re-drive
A healthy consumer joins the same group. Nothing new arrives for it: the failed messages are in the DLQ,
which no consumer reads. `AdminClient.redrive(group, msg_ids=…)` (or `all=True`) sends dead letters back
to their original topic with a fresh reconsume count; we re-drive two first, then the other eight.
"""),
    code("""
received, rlock = [], threading.Lock()

def fixed_handler(msgs):
    with rlock:
        received.extend(msgs)
    return ConsumeStatus.CONSUME_SUCCESS

healthy = PushConsumer(GROUP, config, consume_from_where="CONSUME_FROM_FIRST_OFFSET", max_reconsume_times=2)
healthy.subscribe("Payments")
healthy.register_listener(fixed_handler)
healthy.start()
time.sleep(2)
print("received before the re-drive:", len(received))

def wait_received(n, timeout=30):
    deadline = time.monotonic() + timeout
    while len(received) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(received)

first_two = letters.sort_values("key").msg_id.tolist()[:2]
print(admin.redrive(GROUP, msg_ids=first_two)["redriven"], "re-driven by id ->", wait_received(2), "received")
"""),
    code("""
rest = [i for i in letters.msg_id if i not in first_two]
result = admin.redrive(GROUP, msg_ids=rest)
print("re-driven:", result["redriven"], "->", wait_received(len(sent)), "received")
time.sleep(1)   # nothing more arrives: each dead letter was re-driven once
assert result["redriven"] == len(rest) and len(received) == len(sent), len(received)
"""),
    md("""
The healthy consumer got every payment back, on its original topic, as a fresh delivery. The
dead letters themselves stay in `%DLQ%<group>` as the record of what failed (a second `redrive(all=True)`
would send them again — re-drive is an operator's decision, not an automatic retry).
"""),
    code("""
back = pd.DataFrame([{"key": " ".join(m.keys), "topic": m.topic, "reconsume_times": m.reconsume_times,
                      "body": m.body.decode()} for m in received]).sort_values("key")
assert sorted(back.body) == sorted(f"payment {i}: 12.{i:02d} XBT" for i in range(10))
assert (back.topic == "Payments").all()
back.reset_index(drop=True)
"""),
    md("""
## Stop
Stop everything this notebook started, and delete its temporary directory.
"""),
    code("""
healthy.shutdown()
producer.shutdown()
admin.close()
platform.stop()
shutil.rmtree(workdir, ignore_errors=True)
"""),
)


# ======================================================================================
# 03 -- reports: TPS and lag per minute, an alert for a stuck group
# ======================================================================================
notebook(
    "03_reports",
    md("""
# Reports: TPS and lag per minute, and an alert for a stuck group

A broker with the lake runs a **reporter** once a minute: every *closed* minute window becomes rows of
`topic_stats` (messages and bytes in/out, TPS per topic) and `group_stats` (consumed, TPS and lag per
group and queue), and the **alert rules** of the `[alerts]` config are evaluated on the newest window —
raising rows in `alerts`, a webhook POST, and `GET /alerts` on the broker.

This notebook starts a platform with the lake's dispatch job (commit log → `consume_queue`, which the
reports count), sends a known load of 6,000 orders, lets one consumer group (`billing`) drain it while
another (`audit`) is stuck, and plots the reports.

**About time.** Real reports close one window per wall-clock minute (plus a 15 s grace for the dispatch
job). Waiting for five minutes would make a slow notebook, so the notebook drives the same `Reporter`
itself with an explicit `now=`: each run *declares* the next minute closed. All messages are sent before
the first such run (a message stored in a window already declared closed would be missed), so the counts
stay exact; the windows after the load are "simulated minutes" in which `billing` consumes a known
chunk. That is why the lake's own `reports` job is left out of `[lake] jobs` below — it would run on the
wall clock next to ours.
"""),
    md("""
## Configuration and platform
A webhook receiver (a tiny HTTP server on a free port) stands in for the on-call system. The TOML file
holds the lake settings and two alert rules for the stuck group: its lag above 5,000 for 2 minutes, and
consuming nothing for 2 minutes while 100+ messages wait.
"""),
    code("""
import datetime as dt, http.server, json, shutil, tempfile, threading, time
from pathlib import Path
import io
import matplotlib
matplotlib.use("Agg")            # headless: no display, no %matplotlib magic
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, display

def show(fig):
    # Agg's plt.show() draws nothing in a notebook: render the figure to PNG and display that as the output.
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    display(Image(buf.getvalue()))

hooks = []
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        hooks.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass

webhook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
threading.Thread(target=webhook.serve_forever, daemon=True).start()

workdir = Path(tempfile.mkdtemp(prefix="sparkmq-reports-"))
conf = workdir / "platform.toml"
conf.write_text(f'''
[lake]
enabled = true
jobs = ["dispatch"]          # the reports job is driven by this notebook (see above)

[store]
segment_size = 67108864      # 64 MiB commit-log segments (default 1 GiB)

[alerts]
webhook_url = "http://127.0.0.1:{webhook.server_port}/hook"

[[alerts.rules]]
name = "lag-high"
kind = "lag"
threshold = 5000
for_minutes = 2
severity = "warning"

[[alerts.rules]]
name = "stuck-group"
kind = "idle_group"
threshold = 100
for_minutes = 2
severity = "critical"
''')
print(conf.read_text())
"""),
    code("""
from sparkmq.api.embedded import EmbeddedPlatform
from sparkmq.pipelines.session import get_spark, stop_spark
from sparkmq.platform.client import AdminClient, ClientConfig, Message, Producer, PullConsumer

# The process has one SparkSession: created here (quiet logs), the broker's lake then runs its jobs in it.
spark = get_spark(log_level="ERROR")
platform = EmbeddedPlatform.from_toml(conf, data_dir=workdir / "broker", namesrv_port=0, broker_port=0,
                                      offset_persist_interval_s=1).start()
lake_root = workdir / "broker" / "lake"
config = ClientConfig(namesrv_addrs=platform.namesrv_addr, heartbeat_interval_s=0.5, rebalance_interval_s=0.5,
                      pull_batch_size=500, offset_store_dir=str(workdir / "offsets"))
admin = AdminClient(config)
admin.create_topic("Orders", read_queue_nums=4, write_queue_nums=4)
assert platform.broker_service.lake.wait_started(180), platform.broker_service.lake.status()
print("name server", platform.namesrv_addr, "| broker", platform.broker_addr, "| lake",
      platform.broker_service.lake.status()["state"])
"""),
    md("""
## Two consumer groups and the reporter
`billing` will consume in known chunks; `audit` subscribes and then never polls (a consumer stuck on a
lock, say) — it is alive, so the broker reports it, and its lag grows with every order.

The reporter is the lake's own `Reporter` over this broker (same job name and offsets source the lake
service would use). Its first run is a baseline: it reports the minutes before the load and takes the
first offsets sample of both groups.
"""),
    code("""
from sparkmq.pipelines.alerts import AlertConfig
from sparkmq.pipelines.reports import Reporter, offsets_source

billing = PullConsumer("billing", config, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
billing.subscribe("Orders")
billing.start()
audit = PullConsumer("audit", config, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
audit.subscribe("Orders")
audit.start()
deadline = time.monotonic() + 30
while not {"billing", "audit"} <= set(admin.group_list()) and time.monotonic() < deadline:
    time.sleep(0.2)

broker = platform.broker_service.config.broker_name
reporter = Reporter(lake_root, offsets_source({broker: platform.broker_addr}), spark=spark, job=broker,
                    brokers=[broker], backfill_minutes=3,
                    alerts=AlertConfig.from_mapping(platform.lake_settings.alerts))

MINUTE = dt.timedelta(minutes=1)
def run_at(minute_start):
    # A run just after `minute_start` + 1 min + grace: the minute starting at `minute_start` is closed.
    return reporter.run(now=minute_start + MINUTE + dt.timedelta(seconds=reporter.grace_s + 1))

def floor_minute(t):
    return t.replace(second=0, microsecond=0)

start = dt.datetime.now(dt.UTC)
baseline = run_at(floor_minute(start) - MINUTE)   # the minute before this one: entirely in the past
print("baseline windows:", [w.strftime("%H:%M") for w in baseline.windows], "| group rows:", baseline.group_rows)
"""),
    md("""
## A known load
6,000 orders in batches of 100, spread unevenly over the queues (900 / 1,200 / 1,500 / 2,400), so the
per-queue lag lines differ. Then we wait until the dispatch job has put every one of them into
`consume_queue` — the reports count from there.
"""),
    code("""
from sparkmq.pipelines import tables

PER_QUEUE = {0: 900, 1: 1200, 2: 1500, 3: 2400}
N = sum(PER_QUEUE.values())
producer = Producer("orders-producer", config).start()

def to_queue(queue_id):
    return lambda queues, msg: next(q for q in queues if q.queue_id == queue_id)

t0 = time.monotonic()
for queue_id, count in PER_QUEUE.items():
    for first in range(0, count, 100):
        batch = [Message("Orders", f'{{"order": "{queue_id}-{i}", "amount": {i % 90 + 10}}}'.encode(), tags="new")
                 for i in range(first, first + 100)]
        producer.send_batch(batch, queue_selector=to_queue(queue_id))
load_end = dt.datetime.now(dt.UTC)
print(f"sent {N} messages in {time.monotonic() - t0:.1f} s")

tables.register_tables(spark, lake_root)   # the lake's tables as sparkmq.<table> (the lake made them)

def dispatched():
    return spark.table("sparkmq.consume_queue").where("topic = 'Orders'").count()

# A Delta commit takes a second or two here, and the first micro-batches of a freshly started job far longer
# on a busy machine: wait minutes, not seconds, and say how long it took.
t0 = time.monotonic()
deadline = t0 + 300
while (n := dispatched()) < N and time.monotonic() < deadline:
    time.sleep(1)
assert n == N, f"consume_queue holds {n} of {N} orders after {time.monotonic() - t0:.0f} s"
print(f"consume_queue holds all {n} orders ({time.monotonic() - t0:.0f} s after the last send)")
"""),
    md("""
## Minute by minute
Run 1 closes the minute(s) of the load. Before each run, `billing` consumes about 2,000 messages (polls
return whole pulls, so a little more) and commits, until the backlog is gone; by runs 4 and 5 it has
nothing left. `audit` never moves, so both rules fire as
soon as two reported windows show it stuck.
"""),
    code("""
def consume(n):
    taken = 0
    deadline = time.monotonic() + 30
    while taken < n and time.monotonic() < deadline:
        taken += len(billing.poll(0.5))
    billing.commit()
    return taken

consumed, runs = [], []
minute = floor_minute(load_end)
for step in range(5):
    t0 = time.monotonic()
    consumed.append(consume(min(2000, N - sum(consumed))) if sum(consumed) < N else 0)
    t1 = time.monotonic()
    result = run_at(minute + step * MINUTE)
    runs.append({"run": step + 1, "billing consumed": consumed[-1], "consume s": round(t1 - t0, 1),
                 "report s": round(time.monotonic() - t1, 1),
                 "windows reported": ", ".join(w.strftime("%H:%M") for w in result.windows),
                 "topic rows": result.topic_rows, "group rows": result.group_rows,
                 "alerts raised": ", ".join(a["alert_id"] for a in result.alerts.raised) if result.alerts else ""})
assert sum(consumed) == N, consumed
pd.DataFrame(runs)
"""),
    md("""
## `topic_stats`: TPS in and out
Every table is a Delta table in the session's catalog (`sparkmq.<table>`), so plain Spark SQL reads it. In:
what was stored per window. Out: what the groups consumed, summed over groups. The counts are exact: 6,000
in, 6,000 out (all `billing`).
"""),
    code("""
topic = spark.sql('''
    SELECT window_start, messages_in, messages_out, bytes_in, bytes_out,
           round(tps_in, 2) AS tps_in, round(tps_out, 2) AS tps_out
    FROM sparkmq.topic_stats WHERE topic = 'Orders' ORDER BY window_start''').toPandas()
assert topic.messages_in.sum() == N and topic.messages_out.sum() == N, topic
topic
"""),
    code("""
# Every minute of the run, also those without rows (nothing came in or went out); toPandas gives UTC wall times.
windows = pd.date_range(floor_minute(start) - 3 * MINUTE, minute + 4 * MINUTE, freq="1min").tz_localize(None)
tps = topic.set_index("window_start")[["tps_in", "tps_out"]].reindex(windows, fill_value=0)
ax = tps.plot.bar(figsize=(9, 3.5), color=["#4C72B0", "#DD8452"], width=0.8)
ax.set_xticklabels([w.strftime("%H:%M") for w in tps.index], rotation=0)
ax.set_ylabel("messages / s (per-minute average)")
ax.set_title("Orders: TPS in and out per minute (windows after the load are simulated minutes)")
show(ax.figure)
"""),
    md("""
## `group_stats`: lag per queue
One row per (window, group, queue) for each run that sampled the brokers. `billing` drains every queue;
`audit`'s lag is the whole topic, queue by queue, and never moves.
"""),
    code("""
groups = spark.sql('''
    SELECT window_start, `group`, queue_id, messages_out, round(tps_out, 2) AS tps_out,
           committed_offset, max_offset, lag
    FROM sparkmq.group_stats WHERE topic = 'Orders' ORDER BY `group`, window_start, queue_id''').toPandas()
assert groups[groups.group == "billing"].messages_out.sum() == N
assert groups[groups.group == "audit"].messages_out.sum() == 0
groups.pivot_table(index="window_start", columns="group", values=["messages_out", "lag"], aggfunc="sum")
"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
for ax, group in zip(axes, ["billing", "audit"], strict=True):
    lag = groups[groups.group == group].pivot(index="window_start", columns="queue_id", values="lag")
    for queue_id in lag.columns:
        ax.plot(lag.index, lag[queue_id], marker="o", label=f"queue {queue_id}")
    ax.set_title(f"group {group}: lag per queue")
    ax.set_xticks(lag.index)
    ax.set_xticklabels([w.strftime("%H:%M") for w in lag.index])
    ax.grid(alpha=0.3)
axes[0].set_ylabel("messages behind")
axes[1].legend()
fig.tight_layout()
show(fig)
"""),
    md("""
## Alerts for the stuck group
`lag-high` fired when `audit` had been above 5,000 behind for two windows; `stuck-group` when it had
consumed nothing for two windows with work waiting. Each is a row in `alerts`, was POSTed once to the
webhook, and is listed by the broker's `GET /alerts` (read with delta-rs, no Spark). `billing` raised
nothing: its lag never stayed above the thresholds.
"""),
    code("""
alerts = spark.sql('''
    SELECT alert_id, severity, value, threshold, raised_at, resolved_at, detail
    FROM sparkmq.alerts ORDER BY raised_at, alert_id''').toPandas()
assert set(alerts.alert_id) == {"lag-high:group=audit topic=Orders", "stuck-group:group=audit"}, alerts
alerts
"""),
    code("""
import httpx
open_now = httpx.get(f"http://{platform.broker_addr}/alerts").json()["alerts"]
print("GET /alerts:", [a["alert_id"] for a in open_now])
print("webhook received:", [(h["event"], h["alert_id"], h["severity"]) for h in hooks])
assert sorted(h["alert_id"] for h in hooks) == sorted(alerts.alert_id)
"""),
    md("""
## Stop
Stop everything this notebook started, and delete its temporary directory.
"""),
    code("""
billing.shutdown()
audit.shutdown()
producer.shutdown()
admin.close()
platform.stop()          # stops the lake's dispatch job too
webhook.shutdown()
stop_spark()
shutil.rmtree(workdir, ignore_errors=True)
"""),
)


# ======================================================================================
# 05 -- SQL over message_trace
# ======================================================================================
notebook(
    "05_trace_sql",
    md("""
# SQL over the message trace

With tracing on (the default), every hop of a message leaves an event in the system topic
`RMQ_SYS_TRACE_TOPIC`: the producer's `send` (with its cost), the broker's `store`, `deliver`, `retry` and
`dlq`, and the push consumer's `consume` result (with the listener's cost). The **trace job** — a
Structured Streaming query over that topic — writes them with delta-spark to the Delta table
`message_trace`, registered in the session's catalog as `sparkmq.message_trace`: `sparkmq admin trace <msgId>`
and `GET /trace/{msg_id}` look a message up, and plain Spark SQL works on everything.

This notebook starts its own platform (delay levels of 200 ms so retries are quick), sends 60 orders to a
consumer whose work takes a varying time and which cannot handle one poison order, runs the trace job,
and asks the table:

1. the path of one message, step by step, with timings;
2. the path of the poison message: retries and the DLQ hop;
3. events by type and status (a `GROUP BY`);
4. the slowest consume steps, and cost percentiles per step.
"""),
    code("""
import shutil, tempfile, threading, time
import httpx
from sparkmq.api.embedded import EmbeddedPlatform
from sparkmq.platform.client import AdminClient, ClientConfig, ConsumeStatus, Message, Producer, PushConsumer

workdir = tempfile.mkdtemp(prefix="sparkmq-trace-")
# Free ports, a temporary data dir, 64 MiB commit-log segments, every delay level 200 ms; tracing is on by default.
platform = EmbeddedPlatform(namesrv={"port": 0},
                            broker={"port": 0, "data_dir": f"{workdir}/broker",
                                    "message_delay_level": " ".join(["200ms"] * 18)},
                            store={"segment_size": 64 << 20}).start()
config = ClientConfig(namesrv_addrs=platform.namesrv_addr, heartbeat_interval_s=0.3, rebalance_interval_s=0.5,
                      offset_commit_interval_s=0.2, long_poll_wait_ms=1000, route_refresh_interval_s=0.5,
                      offset_store_dir=f"{workdir}/offsets")
admin = AdminClient(config)
admin.create_topic("Orders", read_queue_nums=4, write_queue_nums=4)
http = httpx.Client(base_url=f"http://{platform.broker_addr}", timeout=10)
print("name server", platform.namesrv_addr, "| broker", platform.broker_addr,
      "| trace:", http.get("/health").json()["trace"])
"""),
    md("""
## Traffic worth tracing
The `shipping` consumer sleeps 5–60 ms per order (the bigger the order, the longer), and asks for a
redelivery of order 13 every time (`RECONSUME_LATER`); with `max_reconsume_times = 2` that order ends in
`%DLQ%shipping` after three attempts.
"""),
    code("""
import logging
logging.getLogger("sparkmq.client").setLevel(logging.CRITICAL)   # the failed deliveries are expected here

done, lock = set(), threading.Lock()

def ship(msgs):
    for m in msgs:
        order = int(m.keys[0].split("-")[1])
        if order == 13:
            return ConsumeStatus.RECONSUME_LATER
        time.sleep((5 + order % 12 * 5) / 1000)
        with lock:
            done.add(m.msg_id)
    return ConsumeStatus.CONSUME_SUCCESS

shipping = PushConsumer("shipping", config, consume_from_where="CONSUME_FROM_FIRST_OFFSET", max_reconsume_times=2)
shipping.subscribe("Orders")
shipping.register_listener(ship)
shipping.start()

producer = Producer("orders-producer", config).start()
sent = {i: producer.send(Message("Orders", f"order {i}".encode(), tags="express" if i % 4 == 0 else "standard",
                                 keys=(f"order-{i}",))).msg_id
        for i in range(60)}

deadline = time.monotonic() + 60
while (len(done) < 59 or shipping.stats["dlq"] < 1) and time.monotonic() < deadline:
    time.sleep(0.2)
print("consumed", len(done), "| consumer stats:", shipping.stats)
"""),
    md("""
Clients send their events to the broker in batches, and the broker appends them to the trace topic in
batches. Shutting the clients down flushes theirs; then we wait until the broker has nothing buffered.
"""),
    code("""
shipping.shutdown()
producer.shutdown()
logging.getLogger("sparkmq.client").setLevel(logging.NOTSET)
deadline = time.monotonic() + 20
while http.get("/health").json()["trace"]["buffered"] and time.monotonic() < deadline:
    time.sleep(0.2)
trace_topic = http.get("/topics/RMQ_SYS_TRACE_TOPIC/stats").json()["queues"]
print("trace topic messages:", sum(q["max_offset"] for q in trace_topic), "| broker trace:",
      http.get("/health").json()["trace"])
"""),
    md("""
## The trace job
`start_trace_job` reads `RMQ_SYS_TRACE_TOPIC` with the `sparkmq` source and appends the decoded events to
`message_trace` (exactly once per micro-batch: Delta's `txnAppId`/`txnVersion`). With `availableNow` it
catches up and stops; a broker's lake runs it continuously. The table lives in the broker's lake
directory, where `GET /trace/{msg_id}` reads it; `get_spark(lake_root=...)` registers the lake's tables as
`sparkmq.<table>`.
"""),
    code("""
from sparkmq.pipelines.session import get_spark, stop_spark
from sparkmq.pipelines.trace_job import start_trace_job, trace_stats

lake_root = f"{workdir}/broker/lake"
spark = get_spark(log_level="ERROR", lake_root=lake_root)
query = start_trace_job(spark, {platform.broker_service.config.broker_name: platform.broker_addr}, lake_root,
                        f"{workdir}/checkpoints/trace", trigger={"availableNow": True})
query.awaitTermination(120)
stats = trace_stats(query)
assert stats is not None and stats.last_error is None, stats
print("events written:", stats.rows, "in", stats.batches, "batch(es)")
spark.sql("SELECT count(*) AS events, count(DISTINCT msg_id) AS messages FROM sparkmq.message_trace").toPandas()
"""),
    md("""
## 1. A message's path, with timings
Every event of one message in time order; `step_ms` is the time since the previous event, `total_ms` since
the first (the send). `cost_ms` is what the step itself reported: the producer's round trip, the
listener's run time (a `consume` event is stamped when the listener was called, so its cost comes after it).
"""),
    code("""
PATH_SQL = '''
    SELECT event_type, status, `group`, topic, queue_id, queue_offset, reconsume_times, cost_ms,
           date_format(event_ts, 'HH:mm:ss.SSS') AS at,
           CAST((unix_micros(event_ts) - unix_micros(lag(event_ts) OVER w)) / 1000 AS BIGINT) AS step_ms,
           CAST((unix_micros(event_ts) - unix_micros(first(event_ts) OVER w)) / 1000 AS BIGINT) AS total_ms,
           detail
    FROM sparkmq.message_trace WHERE msg_id = '{msg_id}'
    WINDOW w AS (ORDER BY event_ts, CASE event_type WHEN 'send' THEN 0 WHEN 'store' THEN 1 WHEN 'deliver' THEN 2
                                                    WHEN 'consume' THEN 3 WHEN 'retry' THEN 4 ELSE 5 END)
    ORDER BY event_ts, CASE event_type WHEN 'send' THEN 0 WHEN 'store' THEN 1 WHEN 'deliver' THEN 2
                                       WHEN 'consume' THEN 3 WHEN 'retry' THEN 4 ELSE 5 END
'''
good = spark.sql(PATH_SQL.format(msg_id=sent[7])).toPandas()
assert list(good.event_type) == ["send", "store", "deliver", "consume"], good
good
"""),
    md("""
## 2. The poison message: retries and the DLQ hop
Order 13 went `send → store → deliver → consume (RECONSUME_LATER)`, then twice through the retry topic
(`retry → store` in `%RETRY%shipping` `→ deliver → consume`), and after the third failure the broker moved
it to `%DLQ%shipping`. The broker's `GET /trace/{msg_id}` answers the same path from the same table.
"""),
    code("""
poison = spark.sql(PATH_SQL.format(msg_id=sent[13])).toPandas()
assert poison.event_type.tolist().count("consume") == 3 and poison.event_type.iloc[-1] == "dlq", poison
poison[["event_type", "status", "topic", "reconsume_times", "cost_ms", "at", "step_ms", "total_ms", "detail"]]
"""),
    code("""
api_path = http.get(f"/trace/{sent[13]}").json()["events"]
print("GET /trace:", " -> ".join(e["event_type"] for e in api_path))
assert [e["event_type"] for e in api_path] == poison.event_type.tolist()
"""),
    md("""
## 3. Events by type and status
"""),
    code("""
spark.sql('''
    SELECT event_type, status, count(*) AS events, count(DISTINCT msg_id) AS messages,
           round(avg(cost_ms), 1) AS avg_cost_ms
    FROM sparkmq.message_trace
    GROUP BY event_type, status
    ORDER BY CASE event_type WHEN 'send' THEN 0 WHEN 'store' THEN 1 WHEN 'deliver' THEN 2 WHEN 'consume' THEN 3
                             WHEN 'retry' THEN 4 ELSE 5 END, status''').toPandas()
"""),
    md("""
## 4. The slowest consume steps, and cost percentiles
The listener's cost is in each `consume` event: the slowest ones are the big orders (the handler sleeps
longer for them). Percentiles per step show where time goes: the producer's round trip vs the listener.
"""),
    code("""
spark.sql('''
    SELECT t.msg_id, t.keys, t.tags, t.queue_id, t.cost_ms, t.status,
           date_format(t.event_ts, 'HH:mm:ss.SSS') AS at
    FROM sparkmq.message_trace t
    WHERE t.event_type = 'consume'
    ORDER BY t.cost_ms DESC, t.keys
    LIMIT 10''').toPandas()
"""),
    code("""
spark.sql('''
    SELECT event_type, count(*) AS events,
           percentile(cost_ms, 0.5) AS p50_ms, percentile(cost_ms, 0.9) AS p90_ms,
           percentile(cost_ms, 0.99) AS p99_ms, max(cost_ms) AS max_ms
    FROM sparkmq.message_trace WHERE cost_ms IS NOT NULL
    GROUP BY event_type ORDER BY event_type''').toPandas()
"""),
    md("""
And end to end: from the producer's `send` to the call of the listener that succeeded, per message, by tag
(order 13 never succeeded, so it is not counted).
"""),
    code("""
spark.sql('''
    WITH per_message AS (
        SELECT msg_id, max(tags) AS tags,
               min(CASE WHEN event_type = 'send' THEN event_ts END) AS sent_at,
               max(CASE WHEN event_type = 'consume' AND status = 'CONSUME_SUCCESS' THEN event_ts END) AS done_at
        FROM sparkmq.message_trace GROUP BY msg_id)
    SELECT tags, count(*) AS messages,
           round(avg((unix_micros(done_at) - unix_micros(sent_at)) / 1000), 1) AS avg_send_to_consumed_ms,
           max((unix_micros(done_at) - unix_micros(sent_at)) / 1000) AS max_send_to_consumed_ms
    FROM per_message WHERE done_at IS NOT NULL
    GROUP BY tags ORDER BY tags''').toPandas()
"""),
    md("""
## 5. History and time travel
`message_trace` is a Delta table: every micro-batch of the trace job is a version. `DESCRIBE HISTORY` lists
them, and `VERSION AS OF` reads the table as it was (here: right after it was created, empty).
"""),
    code("""
history = spark.sql("DESCRIBE HISTORY sparkmq.message_trace").select("version", "timestamp", "operation",
                                                                     "operationMetrics.numOutputRows").toPandas()
print(spark.sql("SELECT count(*) AS events FROM sparkmq.message_trace VERSION AS OF 0").first().events,
      "events at version 0")
history
"""),
    md("""
## Stop
Stop everything this notebook started, and delete its temporary directory.
"""),
    code("""
http.close()
admin.close()
platform.stop()
stop_spark()
shutil.rmtree(workdir, ignore_errors=True)
"""),
)


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(NOTEBOOKS)
    for name in names:
        print("wrote", write(name))
