"""The web console (issue 15) in a real browser: headless Debian chromium driven by Playwright, against a real
name server, a broker with its lake (the key index and message trace) and ``sparkmq console``, all processes.

* ``/docs`` of every service renders its operations with no request leaving 127.0.0.1 (Swagger UI bundled);
* a message sent here is found by key and by id, its body shown as text, JSON and hex, its trace timeline
  shows send, store, deliver and consume;
* a topic is created and deleted from the topics page (with the typed confirmation), a bad name is refused
  with the platform's error code;
* an offset reset from the groups page (preview, then apply) moves a running group back, and the lag chart's
  series shows the backlog draining;
* a failing consumer's messages appear on the dead-letters page, a bulk re-drive moves them back (with the
  count) and they are consumed;
* the cluster page shows each broker's version and the disk use of its store;
* the group page shows which member holds which queue (a push and an asyncio member of one group), each queue
  held by exactly one, and after one member stops the other holds them all; a POP member holds none;
* a message is re-sent to one group from the messages page: that group consumes it again, another does not; an
  unknown group is refused with the broker's code and nothing is stored; by msgId through the admin API too;
* the chart range picker's longer ranges read the lake's report tables: rows written into topic_stats and
  group_stats come back from the admin API and are the points of the charts in the browser;
* the alerts page lists the configured rules (name, condition, severity, filters) above the alerts;
* an alert rule made true here (a hung consumer's lag above the threshold) shows as firing on the alerts page;
* with access control on (a second, ACL-enabled broker and console): the console asks for an access key, a
  wrong secret is refused with a clear message, the session lives server-side (HttpOnly cookie, the secret
  never answered or logged); a super user creates and deletes a topic; a user without the policy sees the
  broker's NO_PERMISSION and the topic list is unchanged, actions their policy forbids are disabled;
* every page is photographed at desktop and phone width into ``build/screenshots`` (artefacts, not committed),
  and so are the views that last only while a test runs (a group's members and their queues, a POP member, a
  re-sent message); at phone width nothing is wider than the screen; ``build/screenshots/readme`` gets the
  README's two small pictures (copy them to ``docs/`` when the pages change).

The browser is the system ``chromium`` (``python3 build.py setup`` installs it with apt); without it, or
without Playwright, the module is skipped with the reason.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pyarrow as pa
import pytest
from playwright import sync_api

from conftest import need
from lake_rows import append_rows
from procs import (
    BROKER,
    LAKE_TABLE,
    NAMESRV,
    ProcessHarness,
    ServiceProcess,
    child_env,
    fast_client_config,
    route_has,
    wait_until,
    write_conf,
)
from sparkmq.pipelines import tables
from sparkmq.platform.auth import Credentials
from sparkmq.platform.client import ClientConfig, Message, Producer
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.client.aio import AsyncConsumer
from sparkmq.platform.client.push_consumer import ConsumeStatus, PushConsumer
from sparkmq.platform.client.remoting import SigningAuth
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import parse_held_queue
from sparkmq.platform.common.wire import ReceivedMessage

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]

CHROMIUM = shutil.which("chromium")
need("chromium", CHROMIUM is not None, "none on PATH: `python3 build.py setup` installs Debian's chromium when apt "
     "can be used (as root or with passwordless sudo)", module=True)

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "build" / "screenshots"
#: The README's two pictures (copied by hand into docs/ when the pages change): (page, width) -> file name.
README_SHOTS = {("cluster", "desktop"): "console-cluster.png", ("group", "phone"): "console-phone.png"}
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
LAKE_CONF = f"""
{LAKE_TABLE}trigger_interval_s = 0.5
[lake.spark_conf]
"spark.master" = "local[1]"

[[alerts.rules]]
name = "console-lag"
kind = "lag"
threshold = 5
for_minutes = 1
severity = "critical"
group = "console-alert*"

# Never fires (no such group): the alerts page lists it all the same.
[[alerts.rules]]
name = "console-dlq-growth"
kind = "dlq_growth"
threshold = 100
for_minutes = 2
severity = "warning"
group = "console-never*"
"""


@dataclass
class Cluster:
    """The processes of the module and an admin client over them."""

    namesrv: ServiceProcess
    broker: ServiceProcess
    console: ServiceProcess
    gateway: ServiceProcess
    admin: AdminClient
    config: ClientConfig
    api: httpx.Client
    #: The broker's lake (its report tables).
    lake: Path
    #: Pages worth photographing once the tests have put data on them: (name, hash route).
    pages: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def cluster(module_procs: ProcessHarness) -> Iterator[Cluster]:
    work = module_procs.work_dir
    (work / "lake.toml").write_text(LAKE_CONF)
    ns = module_procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    broker, console, gateway = module_procs.start_many([
        ("broker", BROKER, ["--config", str(work / "lake.toml"), "--lake", "--data-dir", str(work / "broker"),
                            "--broker-name", "broker-a", "--namesrv", ns.addr, "--register-interval-s", "0.5"]),
        ("console", "sparkmq.api.console.main", ["--namesrv", ns.addr]),
        ("gateway", "sparkmq.api.gateway_main", ["--namesrv", ns.addr]),
    ], ready_timeout=180)
    config = fast_client_config(ns.addr, work / "offsets")
    admin = AdminClient(config)
    api = httpx.Client(base_url=console.url + "/api", timeout=30)
    try:
        cluster = Cluster(ns, broker, console, gateway, admin, config, api, work / "broker" / "lake")
        _warm_up_the_lake(cluster)
        yield cluster
    finally:
        api.close()
        admin.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh desktop-sized page; JavaScript errors on it fail the test."""
    context = browser.new_context(viewport=DESKTOP)
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(f"{exc}\n{getattr(exc, 'stack', '')}"))
    p.set_default_timeout(20_000)
    yield p
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def open_page(page: Any, base: str, route: str) -> None:
    """Load the console at ``#/route`` and wait until the page has rendered (``data-ready``)."""
    page.goto(f"{base}/#/{route}")
    page.wait_for_selector(f"main[data-page='{route.split('/')[0]}'][data-ready='true']")


def flash_text(page: Any) -> str:
    return page.locator("#flash").inner_text() if page.locator("#flash").is_visible() else ""


def _warm_up_the_lake(c: Cluster) -> None:
    """Wait until one message is found through the lake's index: Spark's start and the jobs' first micro-batches
    (minutes on a loaded 2-core machine: 4 in a suite run) are over before a test's own wait for the index begins."""
    create_topic(c, "ConsoleWarmUp", queues=1)
    with Producer("console-warm-up", c.config) as producer:
        producer.send(Message("ConsoleWarmUp", b"warm-up", keys=("warm-up",)))
    wait_until(lambda: c.api.get("/messages", params={"topic": "ConsoleWarmUp", "key": "warm-up"}).json()
               .get("messages"), 480, lambda: f"the lake's first index entry; broker log: {c.broker.log()[-2000:]}")


def create_topic(c: Cluster, topic: str, queues: int = 2) -> None:
    c.admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
    wait_until(lambda: route_has(c.admin, topic, queues), 15, f"the route of {topic}")


class Listener:
    """A push listener that records what it consumed, fails while ``failing`` is set, holds while ``gate`` is not."""

    def __init__(self) -> None:
        self.messages: list[ReceivedMessage] = []
        self.failing = False
        #: Cleared: the listener holds every batch (a backlog builds up) until it is set again.
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def __call__(self, batch: list[ReceivedMessage]) -> ConsumeStatus:
        self.gate.wait(60)
        if self.failing:
            return ConsumeStatus.RECONSUME_LATER
        with self.lock:
            self.messages.extend(batch)
        return ConsumeStatus.CONSUME_SUCCESS

    def count(self, prefix: bytes = b"") -> int:
        return len(self.received(prefix))

    def received(self, prefix: bytes = b"") -> list[ReceivedMessage]:
        """The messages consumed whose body starts with ``prefix``, in order."""
        with self.lock:
            return [m for m in self.messages if m.body.startswith(prefix)]


def start_consumer(c: Cluster, group: str, topic: str, listener: Callable[[list[ReceivedMessage]], ConsumeStatus],
                   **kwargs: Any) -> PushConsumer:
    consumer = PushConsumer(group, c.config, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **kwargs)
    consumer.subscribe(topic, "*")
    consumer.register_listener(listener)
    consumer.start()
    return consumer


# -- /docs offline ---------------------------------------------------------------------------------------

def test_docs_render_their_operations_without_leaving_localhost(cluster: Cluster, browser: Any) -> None:
    context = browser.new_context(viewport=DESKTOP)
    try:
        for service in (cluster.namesrv, cluster.broker, cluster.gateway, cluster.console):
            page = context.new_page()
            hosts: set[str] = set()
            page.on("request", lambda request, seen=hosts: seen.add(urlsplit(request.url).hostname or request.url))
            page.goto(f"{service.url}/docs")
            page.wait_for_selector(".opblock", timeout=20_000)  # Swagger UI drew the operations
            # An operation with two tags is drawn under each: compare the distinct (method, path) pairs.
            shown = {(m.lower(), p) for m, p in page.locator(".opblock-summary").evaluate_all(
                "nodes => nodes.map(n => [n.querySelector('.opblock-summary-method').textContent,"
                " n.querySelector('.opblock-summary-path').dataset.path])")}
            openapi = httpx.get(f"{service.url}/openapi.json", timeout=10).json()
            expected = {(method, path) for path, ops in openapi["paths"].items() for method in ops}
            assert shown == expected and expected, (service.kind, shown ^ expected)
            assert hosts == {"127.0.0.1"}, f"{service.kind}'s /docs requested {hosts}"
            page.close()
    finally:
        context.close()


# -- messages and trace ----------------------------------------------------------------------------------

def test_a_sent_message_is_found_by_key_and_by_id_and_its_trace_is_a_timeline(cluster: Cluster, page: Any) -> None:
    topic, group = "ConsoleOrders", "console-orders"
    create_topic(cluster, topic)
    body = json.dumps({"order": 42, "item": "book"}).encode()
    listener = Listener()
    consumer = start_consumer(cluster, group, topic, listener)
    try:
        with Producer("console-producer", cluster.config) as producer:
            sent = producer.send(Message(topic, body, tags="paid", keys=("order-42",), properties={"region": "eu"}))
        wait_until(lambda: listener.count(b"{") == 1, 30, "the consumer to receive the message")
    finally:
        consumer.shutdown()
    # The lake indexes the key within seconds (its dispatch job runs every 0.5 s once Spark is up).
    wait_until(lambda: cluster.api.get("/messages", params={"topic": topic, "key": "order-42"}).json()
               .get("messages"), 180,
               lambda: f"the key in the lake's index; broker log: {cluster.broker.log()[-2000:]}")

    base = cluster.console.url
    open_page(page, base, "messages")
    page.fill("[data-testid=msg-topic]", topic)
    page.fill("[data-testid=msg-key]", "order-42")
    page.click("[data-testid=msg-search]")
    page.wait_for_selector("[data-testid=msg-detail]")
    assert page.inner_text("[data-testid=msg-count]") == "1 found"
    detail = page.inner_text("[data-testid=msg-detail]")
    assert sent.msg_id in detail and "order-42" in detail and "paid" in detail
    assert "region" in page.inner_text("[data-testid=msg-properties]")
    # JSON first (the body parses), then text and hex.
    assert json.loads(page.inner_text("[data-testid=msg-body]")) == {"order": 42, "item": "book"}
    assert "\n" in page.inner_text("[data-testid=msg-body]")  # pretty-printed
    page.click("[data-testid=body-text]")
    assert page.inner_text("[data-testid=msg-body]") == body.decode()
    page.click("[data-testid=body-hex]")
    assert page.inner_text("[data-testid=msg-body]").startswith("00000000  7b 22 6f 72 64 65 72 22")
    cluster.pages["messages"] = "messages"
    cluster.pages["topic"] = f"topics/{topic}"

    # By the producer's id (the lake's index) and by the offsetMsgId (read from the broker's log).
    for msg_id in (sent.msg_id, sent.offset_msg_id):
        open_page(page, base, "messages")
        page.fill("[data-testid=msg-id]", msg_id)
        page.click("[data-testid=msg-search]")
        page.wait_for_selector("[data-testid=msg-detail]")
        assert page.inner_text("[data-testid=msg-count]") == "1 found", msg_id
        assert sent.msg_id in page.inner_text("[data-testid=msg-detail]")

    # The trace: the page keeps looking until the trace job wrote the consume step.
    wait_until(lambda: any(e["event_type"] == "consume" for e in
                           cluster.api.get(f"/trace/{sent.msg_id}").json()["events"]), 120, "the trace's consume step")
    page.click("[data-testid=msg-trace-link]")
    page.wait_for_selector("[data-step=consume]")
    steps = page.locator("[data-testid=trace-step]").evaluate_all("nodes => nodes.map(n => n.dataset.step)")
    assert {"send", "store", "deliver", "consume"} <= set(steps), steps
    assert steps.index("send") < steps.index("deliver") < steps.index("consume") and steps[-1] == "consume", steps
    assert steps.index("store") < steps.index("deliver"), steps
    timeline = page.inner_text("[data-testid=timeline]")
    assert f"{len(steps)} steps" in timeline and "ms" in timeline and group in timeline
    cluster.pages["trace"] = f"trace/{sent.msg_id}"


# -- topics ----------------------------------------------------------------------------------------------

def test_a_topic_is_created_and_deleted_from_the_topics_page(cluster: Cluster, page: Any) -> None:
    base, topic = cluster.console.url, "ConsoleMade"
    open_page(page, base, "topics")
    page.fill("[data-testid=topic-name]", "bad name!")
    page.click("[data-testid=topic-create]")
    page.wait_for_function("document.getElementById('flash').textContent.startsWith('TOPIC_ILLEGAL: ')")
    assert "bad name!" not in cluster.admin.topic_list()

    page.fill("[data-testid=topic-name]", topic)
    page.click("[data-testid=topic-create]")
    page.wait_for_function("document.getElementById('flash').textContent.includes('created')")
    wait_until(lambda: topic in cluster.admin.topic_list(), 15, "the name server to list the new topic")
    page.fill("[data-testid=topic-search]", "consolemade")  # case-insensitive search
    page.wait_for_function("document.querySelector('[data-testid=pager]').textContent.endsWith(' 1 in all')")
    row = page.locator("[data-testid=topics] tbody tr")
    assert row.count() == 1 and topic in row.inner_text()
    assert "8" in row.inner_text()  # the form's default queue count
    assert route_has(cluster.admin, topic, 8)

    page.click(f"[data-testid=delete-{topic}]")
    assert page.is_disabled("[data-testid=confirm-ok]")  # until the name is typed
    page.fill("[data-testid=confirm-input]", topic)
    page.click("[data-testid=confirm-ok]")
    page.wait_for_function("document.getElementById('flash').textContent.includes('deleted')")
    wait_until(lambda: topic not in cluster.admin.topic_list(), 15, "the topic to be gone from the name servers")
    assert "1 broker(s)" in flash_text(page)


# -- groups: offset reset and the lag chart -----------------------------------------------------------------

def test_an_offset_reset_from_the_groups_page_moves_a_running_group(cluster: Cluster, page: Any) -> None:
    topic, group, n = "ConsoleReset", "console-reset", 60
    create_topic(cluster, topic)
    listener = Listener()
    consumer = start_consumer(cluster, group, topic, listener)
    try:
        with Producer("console-reset-producer", cluster.config) as producer:
            for i in range(n):  # one by one: spread over both queues (a batch goes to one)
                producer.send(Message(topic, b"r%d" % i))
        wait_until(lambda: listener.count(b"r") == n and cluster.admin.group_lag(group).total_lag == 0, 60,
                   lambda: f"{n} consumed and committed; consumed {listener.count(b'r')}")
        base = cluster.console.url
        open_page(page, base, f"groups/{group}")
        page.wait_for_function("document.querySelector('[data-testid=total-lag]').textContent === '0'")
        # The topic's two queues (and the group's retry topic, which every clustering consumer subscribes to).
        assert page.locator("[data-testid=group-queues] tbody tr", has_text=topic).count() == 2
        page.select_option("[data-testid=reset-topic]", topic)
        page.select_option("[data-testid=reset-mode]", "earliest")
        page.click("[data-testid=reset-preview-btn]")
        page.wait_for_selector("[data-testid=reset-preview]")
        assert page.inner_text("[data-testid=reset-result]") == "2 queue(s) would move"
        moves = page.locator("[data-testid=reset-preview] tbody tr td:last-child").all_inner_texts()
        assert sum(int(m.replace(",", "")) for m in moves) == -n, moves
        assert listener.count(b"r") == n  # a preview moves nothing
        listener.gate.clear()  # the consumer holds what it gets: the backlog stays until the chart has seen it
        page.click("[data-testid=reset-apply]")
        page.click("[data-testid=confirm-ok]")
        page.wait_for_function("document.querySelector('[data-testid=reset-result]').textContent.includes('moved')")
        page.wait_for_function("+document.querySelector('[data-testid=total-lag]').textContent.replace(/,/g, '') > 0")
        wait_until(lambda: any(v > 0 for _, v in cluster.api.get("/history", params={"kind": "group", "name": group})
                               .json()["lag"]), 20, "the lag chart's series to see the backlog")
        listener.gate.set()
        # The running consumer follows: everything is consumed again, and the lag drains back to 0.
        wait_until(lambda: listener.count(b"r") >= 2 * n, 60, lambda: f"re-consumption; got {listener.count(b'r')}")
        wait_until(lambda: cluster.admin.group_lag(group).total_lag == 0, 30, "the lag to drain")
        lag = wait_until(lambda: _drained(cluster.api.get("/history", params={"kind": "group", "name": group})
                                          .json()["lag"]), 20, "the lag series to show the backlog draining")
        assert max(v for _, v in lag) > 0 and lag[-1][1] == 0
        page.wait_for_function("document.querySelector('[data-testid=total-lag]').textContent === '0'")
        assert page.locator(".chart canvas").count() >= 1  # the uPlot chart is drawn
        cluster.pages["group"] = f"groups/{group}"
    finally:
        listener.gate.set()
        consumer.shutdown()


def _drained(points: list[list[float]]) -> list[list[float]] | None:
    """The series when it rose above 0 and came back to 0 afterwards."""
    peak = next((i for i, (_, v) in enumerate(points) if v > 0), None)
    return points if peak is not None and points[-1][1] == 0 and len(points) > peak + 1 else None


# -- dead letters --------------------------------------------------------------------------------------------

def test_dead_letters_are_re_driven_in_bulk_and_consumed(cluster: Cluster, page: Any) -> None:
    topic, group, n = "ConsoleDlq", "console-dlq", 5
    create_topic(cluster, topic)
    listener = Listener()
    listener.failing = True
    consumer = start_consumer(cluster, group, topic, listener, max_reconsume_times=0)  # first failure: the DLQ
    try:
        with Producer("console-dlq-producer", cluster.config) as producer:
            for i in range(n):
                producer.send(Message(topic, b"d%d" % i))
        wait_until(lambda: len(cluster.admin.dlq_messages(group)) == n, 60, "the failed messages in the DLQ")
        base = cluster.console.url
        open_page(page, base, f"dlq/{group}")
        assert page.inner_text("[data-testid=dlq-count]") == f"{n} dead letter(s)"
        assert page.locator("[data-testid=dlq] tbody tr", has_text=topic).count() == n
        listener.failing = False  # the consumer is fixed: re-driven messages will be consumed
        page.check("[data-testid=dlq-all]")
        page.click("[data-testid=dlq-redrive-selected]")
        page.click("[data-testid=confirm-ok]")
        page.wait_for_function("document.querySelector('[data-testid=dlq-result]').textContent.includes('re-drove')")
        assert page.inner_text("[data-testid=dlq-result]") == f"re-drove {n} message(s) ({n} selected)"
        wait_until(lambda: listener.count(b"d") == n, 60, lambda: f"the re-driven messages consumed; got "
                                                                  f"{listener.count(b'd')}")
        cluster.pages["dlq"] = f"dlq/{group}"
    finally:
        consumer.shutdown()


# -- cluster -------------------------------------------------------------------------------------------------

def test_the_cluster_page_shows_each_brokers_version_and_disk_use(cluster: Cluster, page: Any) -> None:
    from sparkmq import __version__

    open_page(page, cluster.console.url, "cluster")
    row = page.locator("[data-testid=brokers] tbody tr", has_text="broker-a")
    assert row.count() == 1 and __version__ in row.inner_text()
    info = cluster.admin.broker_info(cluster.broker.addr)["disk"]  # what the broker's GET /broker says
    used = round(100 * info["used_ratio"])  # used / (used + available), as df counts it
    disk = row.locator("[data-testid=disk]").inner_text()
    assert disk.endswith(" free") and abs(int(disk.split("%")[0]) - used) <= 1, (disk, info)


# -- alerts --------------------------------------------------------------------------------------------------

def test_an_alert_that_fires_shows_on_the_alerts_page(cluster: Cluster, page: Any) -> None:
    topic, group, n = "ConsoleAlert", "console-alert", 12
    create_topic(cluster, topic)
    release = threading.Event()

    def hold(batch: list[ReceivedMessage]) -> ConsumeStatus:
        release.wait(600)  # a consumer that hangs: it stays a member, commits nothing, its lag stays
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = start_consumer(cluster, group, topic, hold)
    try:
        with Producer("console-alert-producer", cluster.config) as producer:
            for i in range(n):
                producer.send(Message(topic, b"a%d" % i))
        wait_until(lambda: cluster.admin.group_lag(group).total_lag == n, 30, "the backlog above the threshold")
        # The broker's report rules run once a minute on closed windows (+15 s grace): within about 2.5 min.
        alert_id = f"console-lag:group={group} topic={topic}"
        wait_until(lambda: any(a["alert_id"] == alert_id for a in cluster.api.get("/alerts").json()["firing"]), 300,
                   lambda: f"the lag rule to fire; broker alerts: {cluster.api.get('/alerts').json()}")
        open_page(page, cluster.console.url, "alerts")
        row = page.locator(f"[data-testid=alerts-firing] tbody tr[data-alert='{alert_id}']")
        assert row.count() == 1
        text = row.inner_text()
        assert "critical" in text and "console-lag" in text and f"group={group} topic={topic}" in text, text
        assert int(page.inner_text("[data-testid=alerts-firing-count]")) >= 1
        rule = page.locator("[data-testid=alert-rules] tbody tr", has_text="console-lag").inner_text()
        assert "critical" in rule, rule
        # The consumer recovers: the next report window shows no lag, the alert resolves, the page follows.
        release.set()
        wait_until(lambda: cluster.admin.group_lag(group).total_lag == 0, 60, "the backlog consumed")
        page.wait_for_selector(f"[data-testid=alerts-resolved] tbody tr:has-text('group={group} topic={topic}')",
                               timeout=300_000)
        assert page.locator(f"[data-testid=alerts-firing] tbody tr[data-alert='{alert_id}']").count() == 0
        cluster.pages["alerts"] = "alerts"
    finally:
        release.set()
        consumer.shutdown()


# -- which member holds which queue ----------------------------------------------------------------------------

class AioMember:
    """An :class:`AsyncConsumer` of a group on its own event loop thread (the asyncio client's heartbeat)."""

    def __init__(self, config: ClientConfig, group: str, topic: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="aio-member", daemon=True)
        self.thread.start()

        async def start() -> AsyncConsumer:
            consumer = AsyncConsumer(group, config, consume_from_where="FIRST_OFFSET")
            consumer.subscribe(topic)
            return await consumer.start()
        self.consumer = asyncio.run_coroutine_threadsafe(start(), self.loop).result(60)
        self.client_id = self.consumer.client_id

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.consumer.shutdown(), self.loop).result(60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)


def held_by(admin: AdminClient, group: str, topic: str, members: set[str], queues: int) -> dict[int, str] | None:
    """Queue id -> its one holder among ``members`` (the admin API's view), once every queue of ``topic`` has
    exactly one and the group's members are ``members``; else None."""
    clients = admin.group_clients(group)
    if {c.client_id for c in clients} != members:
        return None
    owners: dict[int, list[str]] = {}
    for c in clients:
        for key in c.held_queues:
            t, _, queue_id = parse_held_queue(key)
            if t == topic:
                owners.setdefault(queue_id, []).append(c.client_id)
    if sorted(owners) != list(range(queues)) or any(len(h) != 1 for h in owners.values()):
        return None
    return {q: h[0] for q, h in owners.items()}


def shown_holders(page: Any, topic: str) -> dict[int, str]:
    """The lag table's "held by" cell of each queue of ``topic`` on the group page, by queue id."""
    rows = page.locator(f"[data-testid=group-queues] tbody tr[data-queue^='{topic}@']").evaluate_all(
        "rows => rows.map(r => [r.dataset.queue, r.lastElementChild.textContent])")
    return {parse_held_queue(key)[2]: text for key, text in rows}


def test_the_group_page_shows_which_member_holds_which_queue(cluster: Cluster, page: Any) -> None:
    topic, group, n = "ConsoleHeld", "console-held", 4
    create_topic(cluster, topic, queues=n)
    push = start_consumer(cluster, group, topic, Listener())
    aio: AioMember | None = None
    try:
        aio = AioMember(cluster.config, group, topic)
        members = {push.client_id, aio.client_id}
        # The two members split the queues, and what the brokers show is what each one says it holds.
        owners = wait_until(lambda: held_by(cluster.admin, group, topic, members, n), 30,
                            lambda: f"each queue held by one member; clients: {cluster.admin.group_clients(group)}")
        assert set(owners.values()) == members, owners
        for member, held in ((push.client_id, push.assignment()), (aio.client_id, aio.consumer.assignment())):
            assert {q for q, c in owners.items() if c == member} == {mq.queue_id for mq in held if mq.topic == topic}

        open_page(page, cluster.console.url, f"groups/{group}")
        wait_until(lambda: shown_holders(page, topic) == owners, 15,
                   lambda: f"the page's 'held by' column to show {owners}; shows {shown_holders(page, topic)}")
        member_rows = page.locator("[data-testid=group-members] tbody tr")
        assert member_rows.count() == 2
        for member in members:
            row = page.locator(f"[data-testid=group-members] tbody tr[data-client='{member}']").inner_text()
            mine = sorted(q for q, c in owners.items() if c == member)
            assert f"{topic} {','.join(map(str, mine))} on broker-a" in row and "PUSH" in row, row
        photograph(page, "group-held")

        # One member leaves: the other takes every queue within a few heartbeats of its rebalance.
        aio.stop()
        everything = {q: push.client_id for q in range(n)}
        wait_until(lambda: held_by(cluster.admin, group, topic, {push.client_id}, n) == everything, 15,
                   lambda: f"{push.client_id} to hold every queue; clients: {cluster.admin.group_clients(group)}")
        wait_until(lambda: shown_holders(page, topic) == everything, 15,
                   lambda: f"the page to follow; shows {shown_holders(page, topic)}")
        page.wait_for_function("document.querySelectorAll('[data-testid=group-members] tbody tr').length === 1")
    finally:
        if aio is not None:
            aio.stop()
        push.shutdown()

    # A POP member (a RocketMQ 5 client over gRPC) is handed messages by the broker: it holds no queue.
    pop_group = "console-pop"
    heartbeat = {"client_id": "pop-client-1", "consumers": [{"group": pop_group, "consume_type": "POP",
                                                             "subscriptions": [{"topic": topic}]}]}
    assert httpx.post(f"{cluster.broker.url}/clients/heartbeat", json=heartbeat, timeout=10).status_code == 200
    open_page(page, cluster.console.url, f"groups/{pop_group}")
    row = page.locator("[data-testid=group-members] tbody tr[data-client='pop-client-1']").inner_text()
    assert "POP" in row and "no queues" in row, row
    photograph(page, "group-pop")


# -- re-send a message to a group -------------------------------------------------------------------------------

def retry_end(c: Cluster, group: str) -> int:
    """The end of ``%RETRY%<group>``'s queue on the broker (read over HTTP: not through the console)."""
    stats = httpx.get(f"{c.broker.url}/topics/%25RETRY%25{group}/stats", timeout=10).json()
    return sum(q["max_offset"] for q in stats["queues"])


def test_a_message_is_re_sent_to_one_group_from_the_messages_page(cluster: Cluster, page: Any) -> None:
    topic, again, other, body = "ConsoleResend", "console-resend-a", "console-resend-b", b"resend-me"
    create_topic(cluster, topic)
    mine, listener = Listener(), Listener()
    first = start_consumer(cluster, again, topic, mine)
    second = start_consumer(cluster, other, topic, listener)
    try:
        with Producer("console-resend-producer", cluster.config) as producer:
            sent = producer.send(Message(topic, body, tags="t1", keys=("resend-1",)))
        wait_until(lambda: mine.count(body) == 1 and listener.count(body) == 1, 30, "both groups to consume it")

        open_page(page, cluster.console.url, "messages")
        page.fill("[data-testid=msg-id]", sent.offset_msg_id)
        page.click("[data-testid=msg-search]")
        page.wait_for_selector("[data-testid=msg-detail]")
        page.fill("[data-testid=resend-group]", again)
        page.click("[data-testid=resend-go]")
        page.click("[data-testid=confirm-ok]")
        page.wait_for_function("document.querySelector('[data-testid=resend-result]').textContent"
                               ".startsWith('re-sent to ')")
        assert f"%RETRY%{again}" in page.inner_text("[data-testid=resend-result]")
        photograph(page, "message-resent")
        # That group consumes it again, as it was sent (its own topic, reconsume count 0) ...
        wait_until(lambda: mine.count(body) == 2, 30, "the group to consume the re-sent message")
        copy = mine.received(body)[1]
        assert (copy.topic, copy.msg_id, copy.reconsume_times, copy.tags) == (topic, sent.msg_id, 0, "t1")
        # ... and the other group does not (its consumer is running and pulls its own retry topic too).
        time.sleep(3)
        assert listener.count(body) == 1

        # An unknown group: the broker's code on the page, nothing stored.
        end = retry_end(cluster, again)
        page.fill("[data-testid=resend-group]", "console-nobody")
        page.click("[data-testid=resend-go]")
        page.click("[data-testid=confirm-ok]")
        page.wait_for_function("document.getElementById('flash').textContent.startsWith('GROUP_NOT_EXIST: ')")
        for msg_id, code in (("not an id", ErrorCode.MESSAGE_ID_ILLEGAL), ("0" * 32, ErrorCode.MESSAGE_NOT_FOUND)):
            with pytest.raises(SparkMQError) as refused:
                cluster.admin.resend(msg_id, again)
            assert refused.value.code is code
        out = sparkmq_cli(cluster, "admin", "--json", "msg", "resend", sent.offset_msg_id, "--group", "console-nobody",
                          expect=1)
        assert json.loads(out)["code"] == "GROUP_NOT_EXIST"
        assert retry_end(cluster, again) == end and mine.count(body) == 2

        # By the producer's msgId (the lake's index finds the original among its retry copy), to the other group.
        wait_until(lambda: cluster.api.get("/messages", params={"msg_id": sent.msg_id}).json().get("messages"), 180,
                   "the message in the lake's index")
        answer = json.loads(sparkmq_cli(cluster, "admin", "--json", "msg", "resend", sent.msg_id, "--group", other))
        assert answer["origin_topic"] == topic and answer["topic"] == f"%RETRY%{other}", answer
        wait_until(lambda: listener.count(body) == 2, 30, "the other group to consume it again")
        time.sleep(1)
        assert mine.count(body) == 2
    finally:
        first.shutdown()
        second.shutdown()


def sparkmq_cli(c: Cluster, *args: str, expect: int = 0) -> str:
    """``sparkmq <args>`` against the module's name server; its stdout."""
    result = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", *args], capture_output=True, text=True,
                            timeout=120, env=child_env(SPARKMQ_NAMESRV=c.namesrv.addr))
    assert result.returncode == expect, result.stdout + result.stderr
    return result.stdout


# -- charts from the report tables --------------------------------------------------------------------------------

def test_the_longer_chart_ranges_draw_the_report_tables(cluster: Cluster, page: Any, spark: Any) -> None:
    topic, group = "ConsoleReport", "console-report"
    create_topic(cluster, topic)
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    ago = {m: now - dt.timedelta(minutes=m) for m in (100, 150, 200, 2 * 24 * 60)}
    # Rows as the report job writes them; one of another broker sharing the lake, which is not this one's.
    topic_rows = [(ago[200], "broker-a", 600), (ago[150], "broker-a", 120), (ago[100], "broker-a", 60),
                  (ago[150], "broker-z", 999), (ago[2 * 24 * 60], "broker-a", 6)]
    # (written with delta-spark like the report job's rows; the lake may not have reported yet)
    append_rows(spark, cluster.lake, tables.TOPIC_STATS, pa_table(tables.TOPIC_STATS, [
        {"window_start": w, "topic": topic, "broker": b, "messages_in": n, "bytes_in": n, "messages_out": n // 2,
         "bytes_out": n // 2, "tps_in": n / 60, "tps_out": n / 120} for w, b, n in topic_rows]), 1,
        app_id="console-test")
    group_rows = [(ago[200], q, 40 + q) for q in (0, 1)] + [(ago[100], q, 10 + q) for q in (0, 1)]
    append_rows(spark, cluster.lake, tables.GROUP_STATS, pa_table(tables.GROUP_STATS, [
        {"window_start": w, "group": group, "topic": topic, "broker": "broker-a", "queue_id": q, "messages_in": 0,
         "messages_out": 30, "bytes_out": 30, "tps_out": 0.5, "committed_offset": 0, "max_offset": lag, "lag": lag}
        for w, q, lag in group_rows]), 2, app_id="console-test")

    # The admin API: this broker's rows of the topic, one point per minute window over 6 hours.
    minutes = [int(ago[m].timestamp()) for m in (200, 150, 100)]
    series = cluster.admin.report_series("topic", topic, "6h")
    assert [(p.t, p.messages_in) for p in series.points] == list(zip(minutes, [600, 120, 60], strict=True))
    history = cluster.api.get("/history", params={"kind": "topic", "name": topic, "range_s": 21600}).json()
    assert history["source"] == "reports" and history["tps"] == [[t, n / 60] for t, n in
                                                                  zip(minutes, [600, 120, 60], strict=True)]
    lag = cluster.admin.report_series("group", group, "24h")
    assert [p.lag for p in lag.points] == [81, 21] and [p.messages_out for p in lag.points] == [60, 60]

    # The browser: the short ranges are live, the longer ones are these points.
    open_page(page, cluster.console.url, f"topics/{topic}")
    assert page.get_attribute("[data-testid=topic-chart]", "data-source") == "live"
    page.select_option("[data-testid=range]", "21600")
    page.wait_for_selector("[data-testid=topic-chart][data-source=reports]")
    assert page.get_attribute("[data-testid=topic-chart]", "data-points") == "3"
    assert page.evaluate("state.charts[0].plot.data[0]") == minutes
    assert page.evaluate("state.charts[0].plot.data[1]") == [10, 2, 1]
    page.select_option("[data-testid=range]", "604800")  # a week: the row of two days ago too, half-hour buckets
    page.wait_for_function("document.querySelector('[data-testid=topic-chart]').dataset.points === '4'")
    assert sum(p.messages_in for p in cluster.admin.report_series("topic", topic, "7d").points) == 786
    page.select_option("[data-testid=range]", "900")
    page.wait_for_selector("[data-testid=topic-chart][data-source=live]")
    assert not flash_text(page)

    open_page(page, cluster.console.url, f"groups/{group}")
    page.select_option("[data-testid=range]", "86400")
    page.wait_for_selector("[data-testid=group-chart][data-source=reports]")
    assert page.get_attribute("[data-testid=group-chart]", "data-points") == "4"  # lag and consumed/s, 2 each
    assert page.evaluate("state.charts[0].plot.data[1]") == [81, 21]
    assert not flash_text(page)
    cluster.pages["topic-reports"] = f"topics/{topic}"


def pa_table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    """``rows`` as an Arrow table of report table ``name``'s schema."""
    return pa.Table.from_pylist(rows, schema=tables.get_spec(name).schema)


# -- alert rules ---------------------------------------------------------------------------------------------------

def test_the_alerts_page_lists_the_configured_rules_above_the_alerts(cluster: Cluster, page: Any) -> None:
    rules = {r["name"]: r for answer in cluster.admin.alert_rules().values() for r in answer["rules"]}
    assert rules["console-dlq-growth"] == {"name": "console-dlq-growth", "kind": "dlq_growth", "threshold": 100,
                                           "for_minutes": 2, "severity": "warning", "group": "console-never*",
                                           "topic": None}
    assert set(rules) == {"console-lag", "console-dlq-growth"}
    open_page(page, cluster.console.url, "alerts")
    shown = page.locator("[data-testid=alert-rules] tbody tr").evaluate_all("rows => rows.map(r => r.dataset.rule)")
    assert shown == ["console-dlq-growth", "console-lag"]
    assert page.inner_text("[data-testid=alert-rules-count]") == "2"
    growth = page.inner_text("[data-testid=alert-rules] tbody tr[data-rule=console-dlq-growth]")
    assert "dead letters / min > 100 for 2 min" in growth and "warning" in growth, growth
    assert "group console-never*" in growth and "broker-a" in growth, growth
    lag = page.inner_text("[data-testid=alert-rules] tbody tr[data-rule=console-lag]")
    assert "lag > 5 for 1 min" in lag and "critical" in lag, lag
    headings = [h.strip().lower() for h in page.locator("main h2").all_inner_texts()]
    assert headings.index("rules") < headings.index("firing") < headings.index("resolved"), headings
    assert "null" not in page.inner_text("main") and "undefined" not in page.inner_text("main")


# -- every page, photographed ----------------------------------------------------------------------------------

def readme_png(png: bytes, path: Path) -> Path:
    """``png`` made small enough to commit (a 64-colour palette, when Pillow is there) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        from PIL import Image
    except ImportError:  # not a test dependency: keep the full-colour picture
        path.write_bytes(png)
        return path
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def shoot(page: Any, name: str, label: str, viewport: dict[str, int]) -> None:
    """``page`` as it is now into ``SCREENSHOTS/<name>-<label>.png``; at phone width nothing is wider than the
    screen (tables scroll inside their box)."""
    assert not flash_text(page), (name, label, flash_text(page))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}-{label}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5000
    if (name, label) in README_SHOTS:
        small = readme_png(page.screenshot(), SCREENSHOTS / "readme" / README_SHOTS[name, label])
        assert 5000 < small.stat().st_size < 150_000, (small, small.stat().st_size)
    if label == "phone":
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], (name, width)


def photograph(page: Any, name: str) -> None:
    """A view that only lasts while its test runs (members online, a result shown), at both widths."""
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(viewport)
        page.evaluate("window.scrollTo(0, 0)")  # a page scrolled by a click would draw its sticky header mid-picture
        page.wait_for_timeout(300)  # the charts follow a resize (debounced 150 ms)
        shoot(page, name, label, viewport)
    page.set_viewport_size(DESKTOP)


def test_every_page_at_desktop_and_phone_width(cluster: Cluster, browser: Any) -> None:
    # The pages the other tests filled (each page's bare route when run alone).
    routes = {"cluster": "cluster", "topics": "topics", "topic": "topics", "groups": "groups", "group": "groups",
              "messages": "messages", "trace": "trace", "dlq": "dlq", "alerts": "alerts", "lake": "lake",
              **cluster.pages}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        context = browser.new_context(viewport=viewport)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc, seen=errors: seen.append(str(exc)))
        try:
            for name, route in routes.items():
                open_page(page, cluster.console.url, route)
                if name == "messages" and "messages" in cluster.pages:  # with a search result
                    page.fill("[data-testid=msg-topic]", "ConsoleOrders")
                    page.fill("[data-testid=msg-key]", "order-42")
                    page.click("[data-testid=msg-search]")
                    page.wait_for_selector("[data-testid=msg-count]")
                if name == "topic-reports":  # the chart over the report tables' longer range
                    page.select_option("[data-testid=range]", "21600")
                    page.wait_for_selector("[data-testid=topic-chart][data-source=reports]")
                shoot(page, name, label, viewport)
                page.evaluate("state.range = 900")  # the picked range outlives the page: the next one starts live
        finally:
            context.close()
        assert not errors, errors


# -- access control: sign-in, and only what the user may -----------------------------------------------------

ROOT_KEYS = ("root", "root-secret-1")
#: May create, delete and read ``team-*`` topics and list the cluster: nothing else.
DAVE_KEYS = ("dave", "dave-secret-1")
#: May only look (list and read the cluster).
VIEWER_KEYS = ("viewer", "viewer-secret-1")
COOKIE = "sparkmq_console_session"


@dataclass
class AclCluster:
    """A name server, a broker with ACL on, and a console over them; ``admin`` signs as the super user."""

    namesrv: ServiceProcess
    broker: ServiceProcess
    console: ServiceProcess
    admin: AdminClient


@pytest.fixture(scope="module")
def acl_cluster(module_procs: ProcessHarness) -> Iterator[AclCluster]:
    work = module_procs.work_dir / "acl"
    work.mkdir()
    conf = write_conf(work / "broker.toml", work / "broker", acl_enabled=True,
                      acl_super_user_access_key=ROOT_KEYS[0], acl_super_user_secret_key=ROOT_KEYS[1])
    ns = module_procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    broker, console = module_procs.start_many([
        ("broker", BROKER, ["--config", str(conf), "--namesrv", ns.addr, "--register-interval-s", "0.5"]),
        ("console", "sparkmq.api.console.main", ["--namesrv", ns.addr]),
    ])
    admin = AdminClient(fast_client_config(ns.addr, work / "offsets", access_key=ROOT_KEYS[0],
                                           secret_key=ROOT_KEYS[1]))
    try:
        wait_until(admin.masters, 20, "the ACL broker to register")
        admin.create_user(*DAVE_KEYS)
        admin.put_policy(DAVE_KEYS[0], [{"resource": "Topic:team-*", "actions": ["Create", "Delete", "Get"]},
                                        {"resource": "Cluster", "actions": ["List", "Get"]}])
        admin.create_user(*VIEWER_KEYS)
        admin.put_policy(VIEWER_KEYS[0], [{"resource": "Cluster", "actions": ["List", "Get"]}])
        yield AclCluster(ns, broker, console, admin)
    finally:
        admin.close()


def sign_in(page: Any, base: str, keys: tuple[str, str], route: str = "topics") -> None:
    """Open ``#/route``, which shows the sign-in form first, and sign in with ``keys``."""
    page.goto(f"{base}/#/{route}")
    page.wait_for_selector("main[data-page='signin'][data-ready='true']")
    page.fill("[data-testid=signin-access-key]", keys[0])
    page.fill("[data-testid=signin-secret-key]", keys[1])
    page.click("[data-testid=signin-submit]")
    page.wait_for_selector(f"main[data-page='{route}'][data-ready='true']")
    assert page.inner_text("[data-testid=whoami]").startswith(keys[0])


def settled_topics(admin: AdminClient) -> list[str]:
    """The topic list once it stopped changing (two reads three registration intervals apart agree)."""
    def read() -> list[str] | None:
        first = admin.topic_list()
        time.sleep(1.5)
        return first if admin.topic_list() == first else None
    return wait_until(read, 20, "the topic list to settle")


def test_with_acl_on_a_wrong_secret_is_refused_and_a_super_user_creates_and_deletes_a_topic(
        acl_cluster: AclCluster, page: Any) -> None:
    base, topic = acl_cluster.console.url, "ConsoleAclMade"
    # Nothing without a session: the page asks for keys, the API answers 401.
    assert httpx.get(f"{base}/api/topics", timeout=10).json()["code"] == "AUTHENTICATION_FAILED"
    page.goto(f"{base}/#/topics")
    page.wait_for_selector("main[data-page='signin'][data-ready='true']")
    page.fill("[data-testid=signin-access-key]", ROOT_KEYS[0])
    page.fill("[data-testid=signin-secret-key]", "wrong-secret-1")
    page.click("[data-testid=signin-submit]")
    page.wait_for_function("document.getElementById('flash').textContent.startsWith("
                           "'AUTHENTICATION_FAILED: sign-in refused: ')")
    assert "root" in flash_text(page) and "does not match" in flash_text(page)
    assert page.locator("main[data-page='signin']").count() == 1
    assert not [c for c in page.context.cookies() if c["name"] == COOKIE]

    page.fill("[data-testid=signin-secret-key]", ROOT_KEYS[1])
    page.click("[data-testid=signin-submit]")
    page.wait_for_selector("main[data-page='topics'][data-ready='true']")  # the page asked for before sign-in
    assert "super user" in page.inner_text("[data-testid=whoami]")
    cookie = next(c for c in page.context.cookies() if c["name"] == COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and ROOT_KEYS[1] not in cookie["value"]
    assert page.evaluate("document.cookie") == ""  # out of the page's scripts' reach
    session = page.evaluate("fetch('/api/session').then(r => r.text())")
    assert '"access_key":"root"' in session and ROOT_KEYS[1] not in session

    page.fill("[data-testid=topic-name]", topic)
    page.click("[data-testid=topic-create]")
    page.wait_for_function("document.getElementById('flash').textContent.includes('created')")
    wait_until(lambda: topic in acl_cluster.admin.topic_list(), 15, "the name server to list the new topic")
    page.fill("[data-testid=topic-search]", topic)
    page.wait_for_function("document.querySelector('[data-testid=pager]').textContent.endsWith(' 1 in all')")
    page.click(f"[data-testid=delete-{topic}]")
    page.fill("[data-testid=confirm-input]", topic)
    page.click("[data-testid=confirm-ok]")
    page.wait_for_function("document.getElementById('flash').textContent.includes('deleted')")
    wait_until(lambda: topic not in acl_cluster.admin.topic_list(), 15, "the topic to be gone")

    page.click("[data-testid=signout]")
    page.wait_for_selector("main[data-page='signin'][data-ready='true']")
    assert page.evaluate("fetch('/api/topics').then(r => r.status)") == 401  # the session is gone server-side
    log = acl_cluster.console.log()
    assert ROOT_KEYS[1] not in log and "wrong-secret-1" not in log  # secrets are never logged


def test_with_acl_on_a_user_without_the_policy_is_refused_with_a_clear_message(
        acl_cluster: AclCluster, browser: Any) -> None:
    base, kept, denied = acl_cluster.console.url, "ConsoleAclKept", "ConsoleAclDenied"
    # The broker's GET /acl/whoami, which the console reads at sign-in: any signed user, about themselves only.
    whoami = f"{acl_cluster.broker.url}/acl/whoami"
    assert httpx.get(whoami, timeout=10).json()["code"] == "AUTHENTICATION_FAILED"
    me = httpx.get(whoami, timeout=10, auth=SigningAuth(Credentials(*DAVE_KEYS))).json()
    assert (me["acl_enabled"], me["access_key"], me["super_user"], me["peer_ip"]) == (True, "dave", False, "127.0.0.1")
    assert {e["resource"]: e["actions"] for e in me["entries"]} == {
        "Topic:team-*": ["Create", "Delete", "Get"], "Cluster": ["Get", "List"]}
    assert DAVE_KEYS[1] not in json.dumps(me)
    acl_cluster.admin.create_topic(kept, read_queue_nums=2, write_queue_nums=2)
    wait_until(lambda: route_has(acl_cluster.admin, kept, 2), 15, f"the route of {kept}")
    before = settled_topics(acl_cluster.admin)
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(20_000)
    try:
        sign_in(page, base, DAVE_KEYS)
        assert "super user" not in page.inner_text("[data-testid=whoami]")
        # dave may create team-* topics, so the form is offered; this name is refused by the broker.
        assert not page.is_disabled("[data-testid=topic-create]")
        page.fill("[data-testid=topic-name]", denied)
        page.click("[data-testid=topic-create]")
        page.wait_for_function("document.getElementById('flash').textContent.startsWith('NO_PERMISSION: ')")
        assert f"user 'dave' may not Create on Topic:{denied}" in flash_text(page), flash_text(page)
        # The topic he may not delete: its button is disabled, and the console's API refuses it too.
        page.fill("[data-testid=topic-search]", kept)
        page.wait_for_function("document.querySelector('[data-testid=pager]').textContent.endsWith(' 1 in all')")
        assert page.is_disabled(f"[data-testid=delete-{kept}]")
        refused = page.evaluate(f"fetch('/api/topics/{kept}', {{method: 'DELETE'}})"
                                ".then(async r => [r.status, await r.json()])")
        assert refused[0] == 403 and refused[1]["code"] == "NO_PERMISSION", refused
        assert f"may not Delete on Topic:{kept}" in refused[1]["message"]
        assert settled_topics(acl_cluster.admin) == before  # nothing changed, read through the admin API

        # What his policy allows works with his own keys: create and delete a team-* topic.
        page.fill("[data-testid=topic-name]", "team-console")
        page.click("[data-testid=topic-create]")
        page.wait_for_function("document.getElementById('flash').textContent.includes('created')")
        wait_until(lambda: "team-console" in acl_cluster.admin.topic_list(), 15, "dave's topic listed")
        page.fill("[data-testid=topic-search]", "team-console")
        page.wait_for_function("document.querySelector('[data-testid=pager]').textContent.endsWith(' 1 in all')")
        page.click("[data-testid=delete-team-console]")
        page.fill("[data-testid=confirm-input]", "team-console")
        page.click("[data-testid=confirm-ok]")
        page.wait_for_function("document.getElementById('flash').textContent.includes('deleted')")
        wait_until(lambda: "team-console" not in acl_cluster.admin.topic_list(), 15, "dave's topic gone")

        # A user who may only look is not offered the create form at all.
        page.click("[data-testid=signout]")
        sign_in(page, base, VIEWER_KEYS)
        assert page.is_disabled("[data-testid=topic-create]")
        assert page.is_disabled(f"[data-testid=delete-{kept}]")
    finally:
        context.close()
    assert not errors, errors
