"""Console benchmark: page loads in a real headless browser on a cluster of 1,000 topics and 1,000 groups.

    python benchmarks/bench_console.py [--quick]

``sparkmq dev`` (no lake) in a child process gets 1,000 topics (2 queues each) and 1,000 consumer groups
(each with a member, subscribed to one topic, held by heartbeats); ``sparkmq console`` runs in a second
child; headless Debian chromium (Playwright, ``executable_path``) loads every page from scratch -- a new
navigation, the page's own API calls, until the page says it has rendered (``main[data-ready]``):

* ``console.page_load_ms`` -- p95 (and p50, max) over every page and round: the target is p95 <= 1000;
* ``console.page_load_ms.<page>`` -- p95 of each page.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from bench_messaging import Platform, line, pct  # the benchmarks' one line format (this folder is on the path)

from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.common.system_topics import is_system_topic

TOPICS = 1000
GROUPS = 1000
PAGES = ("cluster", "topics", "topics/BenchTopic-0500", "groups", "groups/bench-group-0500", "messages", "trace",
         "dlq", "lake")


def populate(admin: AdminClient, topics: int, groups: int) -> tuple[str, dict]:
    """Create the topics on the master and join one member to every group; returns (broker addr, heartbeat)."""
    [broker] = admin.masters().values()
    names = [f"BenchTopic-{i:04d}" for i in range(topics)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda t: admin.create_topic(t, read_queue_nums=2, write_queue_nums=2,
                                                   broker_addrs=[broker]), names))
    heartbeat = {"client_id": "127.0.0.1@bench-console", "consumers": [
        {"group": f"bench-group-{i:04d}", "subscriptions": [{"topic": names[i % topics]}]} for i in range(groups)]}
    httpx.post(f"http://{broker}/clients/heartbeat", json=heartbeat, timeout=60).raise_for_status()
    return broker, heartbeat


def start_console(namesrv: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "sparkmq.api.console.main", "--namesrv", namesrv, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready = proc.stdout.readline()  # type: ignore[union-attr]
    if " listening on " not in ready:
        proc.kill()
        raise SystemExit(f"the console did not start: {ready!r}")
    return proc, ready.split(" on ", 1)[1].strip()


def measure(url: str, rounds: int) -> dict[str, list[float]]:
    """Milliseconds from navigation start until each page has rendered, ``rounds`` times per page."""
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {page: [] for page in PAGES}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
            page.goto(f"{url}/#/cluster")  # the first load fills the browser's cache, as for any user
            page.wait_for_selector("main[data-ready='true']")
            for _ in range(rounds):
                for route in PAGES:
                    page.goto("about:blank")
                    started = time.perf_counter()
                    page.goto(f"{url}/#/{route}")
                    page.wait_for_selector(f"main[data-page='{route.split('/')[0]}'][data-ready='true']",
                                           timeout=30_000)
                    times[route].append((time.perf_counter() - started) * 1000)
                    flash = page.locator("#flash")
                    if flash.is_visible():
                        raise SystemExit(f"page {route} reported an error: {flash.inner_text()}")
        finally:
            browser.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 10")
    args = parser.parse_args()
    if shutil.which("chromium") is None:
        raise SystemExit("console benchmark skipped: no chromium on PATH (python3 build.py setup installs it)")
    with tempfile.TemporaryDirectory(prefix="sparkmq-bench-console-") as data_dir:
        platform = Platform(data_dir)
        console = None
        try:
            admin = AdminClient(platform.config())
            broker, heartbeat = populate(admin, TOPICS, GROUPS)
            # The name server lists the topics after the broker's next registration (every 30 s by default).
            deadline = time.monotonic() + 90
            while sum(1 for t in admin.topic_list() if t.startswith("BenchTopic-")) < TOPICS \
                    and time.monotonic() < deadline:
                time.sleep(1)
            found_topics = sum(1 for t in admin.topic_list() if not is_system_topic(t))  # not the groups' %RETRY%
            found_groups = len(admin.group_list())
            console, url = start_console(platform.namesrv)
            times = measure(url, 3 if args.quick else 10)
            httpx.post(f"http://{broker}/clients/heartbeat", json=heartbeat, timeout=60)  # still members
            admin.close()
        finally:
            if console is not None:
                console.terminate()
                console.wait(15)
            platform.stop()
    every = [t for samples in times.values() for t in samples]
    line("console.page_load_ms", p95=pct(every, 0.95), p50=pct(every, 0.5), max=max(every), samples=len(every),
         topics=found_topics, groups=found_groups, target_p95=1000)
    for route, samples in times.items():
        line(f"console.page_load_ms.{route.split('/')[0]}{'_detail' if '/' in route else ''}",
             p95=pct(samples, 0.95), p50=pct(samples, 0.5))


if __name__ == "__main__":
    main()
