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
* every page is photographed at desktop and phone width into ``build/screenshots`` (artefacts, not committed)
  and, at phone width, nothing is wider than the screen.

The browser is the system ``chromium`` (``python3 build.py setup`` installs it with apt); without it, or
without Playwright, the module is skipped with the reason.
"""
from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, fast_client_config, route_has, wait_until
from sparkmq.platform.client import ClientConfig, Message, Producer
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.client.push_consumer import ConsumeStatus, PushConsumer
from sparkmq.platform.common.wire import ReceivedMessage

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]

CHROMIUM = shutil.which("chromium")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install -e .[test])")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH: `python3 build.py setup` installs Debian's chromium when apt can be used "
                "(as root or with passwordless sudo)", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "build" / "screenshots"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
LAKE_CONF = """
[lake]
trigger_interval_s = 0.5
[lake.spark_conf]
"spark.master" = "local[1]"
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
        yield Cluster(ns, broker, console, gateway, admin, config, api)
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
    p.on("pageerror", lambda exc: errors.append(str(exc)))
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


def create_topic(c: Cluster, topic: str, queues: int = 2) -> None:
    c.admin.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
    wait_until(lambda: route_has(c.admin, topic, queues), 15, f"the route of {topic}")


class Listener:
    """A push listener that records what it consumed, fails while ``failing`` is set, holds while ``gate`` is not."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
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
            self.bodies.extend(m.body for m in batch)
        return ConsumeStatus.CONSUME_SUCCESS

    def count(self, prefix: bytes = b"") -> int:
        with self.lock:
            return sum(1 for b in self.bodies if b.startswith(prefix))


def start_consumer(c: Cluster, group: str, topic: str, listener: Listener, **kwargs: Any) -> PushConsumer:
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


# -- every page, photographed ----------------------------------------------------------------------------------

def test_every_page_at_desktop_and_phone_width(cluster: Cluster, browser: Any) -> None:
    # The pages the other tests filled (each page's bare route when run alone).
    routes = {"cluster": "cluster", "topics": "topics", "topic": "topics", "groups": "groups", "group": "groups",
              "messages": "messages", "trace": "trace", "dlq": "dlq", "lake": "lake", **cluster.pages}
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
                assert not flash_text(page), (name, label, flash_text(page))
                path = SCREENSHOTS / f"{name}-{label}.png"
                page.screenshot(path=str(path), full_page=True)
                assert path.stat().st_size > 5000
                if label == "phone":  # tables scroll inside their box; the page itself fits the screen
                    width = page.evaluate("document.documentElement.scrollWidth")
                    assert width <= viewport["width"], (name, width)
        finally:
            context.close()
        assert not errors, errors
