"""Disk watermarks (issue 30): early deletion, refusal before the disk is full, recovery by itself.

Unit tests run the store on every implementation with a faked disk use (:class:`DiskGuard`'s ``measure``).
The process test runs a real broker on a 64 MiB tmpfs the test mounts (root is needed; the suite runs as
root) and shows, with every acknowledged message counted and read back at each step:

* expired segments are deleted early above ``disk_max_used_ratio`` (not at the configured hour), but not
  while a consumer group still needs them;
* sends are refused with DISK_FULL (HTTP 507, and over remoting) at ``disk_warning_ratio``, with megabytes
  of the file system left; reads, offset commits (persisted to the Delta table), a clean stop (final
  checkpoint) and a restart on the full disk all work meanwhile; the state shows in ``/health``,
  ``/metrics``, ``GET /broker`` and ``sparkmq admin cluster list``;
* trace writing, failing on every flush during the refusal, logs its first failure and then one summary per
  ``log_summary_interval_s`` (the lines are counted);
* once the group consumes, force-clean deletion frees space and sends are accepted again by themselves.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, child_env, wait_until
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message
from sparkmq.platform.store import GetStatus, MessageStore, StoreConfig
from sparkmq.platform.store.checkpoint import read_checkpoint
from sparkmq.platform.store.disk import DiskGuard, DiskState, DiskUsage, RetentionFloor
from sparkmq.storage_native import encode_batch

# -- the store, with a faked disk use ----------------------------------------------------------------------


class FakeDisk:
    """A file system of 1,000,000 bytes whose use the test sets."""

    def __init__(self, ratio: float = 0.5) -> None:
        self.ratio = ratio

    def __call__(self, path: Path) -> DiskUsage:
        used = int(self.ratio * 1_000_000)
        return DiskUsage(str(path), 1_000_000, used, 1_000_000 - used)


def open_store(root: Path, impl: Any, disk: FakeDisk, **settings: Any) -> MessageStore:
    settings = {"segment_size": 64 * 1024, "max_message_size": 8 * 1024, "max_properties_size": 1000,
                "background_services": False, **settings}
    config = StoreConfig(root=root, **settings)
    store = MessageStore(config, commit_log_class=impl.CommitLog)
    store._disk = DiskGuard(config, measure=disk)
    return store.start()


def not_now() -> tuple[int]:
    """A delete hour that is not this one (so only the disk's use can delete early)."""
    return ((time.localtime().tm_hour + 12) % 24,)


def test_writes_are_refused_at_the_warning_ratio_and_resume_below_the_resume_ratio(tmp_path, impl):
    disk = FakeDisk(0.5)
    store = open_store(tmp_path, impl, disk)
    try:
        first = store.put(Message("T", b"kept"), 0)
        disk.ratio = 0.90
        assert store.check_disk() is DiskState.FULL and not store.writable
        data, _ids, _next = encode_batch([Message("T", b"packed")], "0A0000012A9F00000000", 1_698_796_800_000, 1,
                                         1_700_000_000_000)
        for append in (lambda: store.put(Message("T", b"x"), 0),
                       lambda: store.put_batch("T", 0, [Message("T", b"y")]),
                       lambda: store.put_packed("T", 0, data, 1)):
            with pytest.raises(SparkMQError) as refused:
                append()
            assert refused.value.code is ErrorCode.DISK_FULL
            assert "disk_warning_ratio 90%" in refused.value.message and "below 85%" in refused.value.message
        assert store.log_offsets().max_offset == first.commitlog_offset + first.store_size  # nothing written
        got = store.get_messages("T", 0, 0)
        assert got.status is GetStatus.FOUND and [m.body for m in got.messages] == [b"kept"]  # reads go on
        status = store.disk_status()
        assert (status["state"], status["writable"], status["refused_writes"]) == ("FULL", False, 3)
        assert status["used_ratio"] == 0.9 and status["free_bytes"] == 100_000
        disk.ratio = 0.86  # below the warning ratio, above the resume ratio: still refused (no flapping)
        assert store.check_disk() is DiskState.FULL and not store.writable
        disk.ratio = 0.849
        assert store.check_disk() is DiskState.CLEAN and store.writable
        assert store.put(Message("T", b"again"), 0).queue_offset == 1
    finally:
        store.shutdown()


def test_a_store_opened_on_a_full_disk_refuses_from_the_first_write(tmp_path, impl):
    store = open_store(tmp_path, impl, FakeDisk(0.95))
    try:
        with pytest.raises(SparkMQError) as refused:
            store.put(Message("T", b"x"), 0)
        assert refused.value.code is ErrorCode.DISK_FULL
    finally:
        store.shutdown()


def test_the_native_log_meeting_a_full_file_system_refuses_at_once(tmp_path, impl):
    disk = FakeDisk(0.5)
    store = open_store(tmp_path, impl, disk)
    try:
        store._disk.mark_full("No space left on device")
        assert not store.writable and store.disk_status()["state"] == "FULL"
        disk.ratio = 0.6
        store.check_disk()  # measured with room again: writes resume
        assert store.writable
    finally:
        store.shutdown()


def fill(store: MessageStore, segments: int) -> list[tuple[int, str]]:
    """Messages on T/0 until the log has ``segments`` segments; the segments."""
    i = 0
    while len(store.commit_log.segments()) < segments:
        store.put(Message("T", b"%06d" % i + b"r" * 2000), 0)
        i += 1
    return store.commit_log.segments()


def age(segments: list[tuple[int, str]], hours: float) -> None:
    old = time.time() - hours * 3600
    for _start, path in segments:
        os.utime(path, (old, old))


def test_expired_segments_go_early_above_the_max_used_ratio_but_not_past_the_floor(tmp_path, impl):
    disk = FakeDisk(0.5)
    store = open_store(tmp_path, impl, disk, delete_when_hours=not_now(), file_reserved_hours=1)
    floor: list[RetentionFloor | None] = [None]
    store.set_retention_floor(lambda: floor[0])
    try:
        segments = fill(store, 8)
        age(segments[:5], 2)
        decision = store.run_retention()
        assert decision.segments == 0  # expired, but not the hour, and the disk is fine
        disk.ratio = 0.80  # CLEAN: expired segments go at any hour ...
        floor[0] = RetentionFloor(segments[3][0] + 10, "group g on T/0 at offset 99")  # ... up to the floor
        decision = store.run_retention()
        assert (decision.segments, decision.held_by) == (3, "group g on T/0 at offset 99")
        assert decision.reason == "expired, deleted early: disk use above the max-used ratio"
        assert store.commit_log.min_offset == segments[3][0]
        assert store.disk_status()["held_by"] == "group g on T/0 at offset 99"
        floor[0] = None  # the group moved to the end: the other expired ones go, the young ones stay
        assert store.run_retention().segments == 2 and store.commit_log.min_offset == segments[5][0]
        assert store.disk_status()["held_by"] is None
    finally:
        store.shutdown()


def test_force_clean_deletes_young_segments_only_below_the_floor_unless_told(tmp_path, impl):
    disk = FakeDisk(0.87)
    store = open_store(tmp_path, impl, disk, delete_when_hours=not_now())
    store.set_retention_floor(lambda: RetentionFloor(segments[2][0], "TimerService on rmq_sys_wheel_timer/0"))
    try:
        segments = fill(store, 6)
        decision = store.run_retention()
        assert decision.segments == 2 and decision.reason == "disk use above the force-clean ratio"
        assert decision.held_by == "TimerService on rmq_sys_wheel_timer/0"
    finally:
        store.shutdown()
    # disk_clean_unconsumed: RocketMQ's behaviour, the floor is not even asked
    root = tmp_path / "unconsumed"
    store = open_store(root, impl, disk, delete_when_hours=not_now(), disk_clean_unconsumed=True)
    store.set_retention_floor(lambda: pytest.fail("the floor is not asked with disk_clean_unconsumed"))
    try:
        segments = fill(store, 6)
        assert store.run_retention().segments == 5  # all but the newest
    finally:
        store.shutdown()


def test_a_failing_floor_holds_early_deletion(tmp_path, impl):
    disk = FakeDisk(0.87)
    store = open_store(tmp_path, impl, disk, delete_when_hours=not_now())

    def broken() -> RetentionFloor:
        raise RuntimeError("offsets unavailable")
    store.set_retention_floor(broken)
    try:
        fill(store, 4)
        decision = store.run_retention()
        assert decision.segments == 0 and "the retention floor failed" in (decision.held_by or "")
    finally:
        store.shutdown()


def test_delay_and_timer_messages_wait_while_the_disk_is_full_and_none_is_skipped(tmp_path, impl):
    """A due message whose re-put is refused (DISK_FULL) stays pending and is delivered once writes resume."""
    from sparkmq.platform.broker.schedule import ScheduleService, parse_delay_levels
    from sparkmq.platform.broker.timer import TimerService

    disk = FakeDisk(0.5)
    store = open_store(tmp_path / "store", impl, disk)

    def deliver(message: Message, queue_id: int, parked: Any) -> None:
        store.put(message, queue_id)
    try:
        delays = ScheduleService(store, parse_delay_levels("1s"), tmp_path / "delay.json", deliver)
        timers = TimerService(store, tmp_path / "timer.json", deliver)
        now = int(time.time() * 1000)
        for i in range(3):
            delays.park(Message("Later", b"delay %d" % i), 0, 1)
            timers.park(Message("Later", b"timer %d" % i), 1, now + 100)
        assert store.min_offset("Later", 0) == 0
        disk.ratio = 0.95
        store.check_disk()
        later = now + 5_000
        assert delays.run_once(later) == 1000 and timers.run_once(later) == 1000  # try again in a second
        assert delays.offsets() == {} and timers.watermark == 0  # nothing skipped
        assert delays.needed_offsets() == [("SCHEDULE_TOPIC_XXXX", 0, 0)]
        assert timers.needed_offsets() == [("rmq_sys_wheel_timer", 0, 0)]
        disk.ratio = 0.5
        store.check_disk()
        delays.run_once(later)
        timers.run_once(later + 1_000)
        got = sorted(m.body for q in (0, 1) for m in store.get_messages("Later", q, 0).messages)
        assert got == sorted([b"delay %d" % i for i in range(3)] + [b"timer %d" % i for i in range(3)])
        assert delays.offsets() == {1: 3} and timers.watermark == 3
    finally:
        store.shutdown()


@pytest.mark.parametrize("settings,message", [
    ({"disk_warning_ratio": 1.5}, "disk_warning_ratio must be a ratio in (0, 1], got 1.5"),
    ({"disk_resume_ratio": 0}, "disk_resume_ratio must be a ratio in (0, 1], got 0"),
    ({"disk_max_used_ratio": True}, "disk_max_used_ratio must be a ratio in (0, 1], got True"),
    ({"disk_force_clean_ratio": 0.95}, "disk_force_clean_ratio 0.95 must not be above disk_warning_ratio 0.9"),
    ({"disk_max_used_ratio": 0.9, "disk_force_clean_ratio": 0.8},
     "disk_max_used_ratio 0.9 must not be above disk_force_clean_ratio 0.8"),
    ({"disk_resume_ratio": 0.95}, "disk_resume_ratio 0.95 must not be above disk_warning_ratio 0.9"),
    ({"disk_clean_unconsumed": "yes"}, "disk_clean_unconsumed must be true or false, got 'yes'"),
    ({"disk_check_interval_ms": 0}, "disk_check_interval_ms must be an integer >= 1, got 0"),
    ({"segment_size": 4096 * 3 + 1}, "segment_size must be a multiple of 4096 and at least 4096, got 12289"),
    ({"delete_when_hours": (4, 24)}, "delete_when_hours must be an integer in 0..23, got 24"),
])
def test_bad_disk_settings_name_the_field_and_value(tmp_path, settings, message):
    with pytest.raises(ValueError) as bad:
        StoreConfig(root=tmp_path, **settings)
    assert message in str(bad.value)


# -- a real broker on a 64 MiB tmpfs ------------------------------------------------------------------------

MIB = 1 << 20
TOPIC = "Disk"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
BODY = 4000  # bytes of text per message: about 250 per 1 MiB segment
SUMMARY_S = 2  # the broker's log_summary_interval_s


@pytest.fixture
def small_disk(procs: ProcessHarness, tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted for this test (the broker's data_dir goes on it); unmounted after the processes
    using it are stopped."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    assert done.returncode == 0, f"mounting a tmpfs needs root: {done.stderr}"
    try:
        yield mount
    finally:
        procs.stop_all()
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def broker_conf(path: Path, data_dir: Path) -> Path:
    hour = (time.localtime().tm_hour + 12) % 24  # segments only go early, by the disk's use
    path.write_text(f"""
[broker]
data_dir = "{data_dir}"
log_summary_interval_s = {SUMMARY_S}
offset_persist_interval_s = 0.5
[store]
segment_size = {MIB}
cq_units_per_file = 8192
max_message_size = 524288
max_properties_size = 8192
delete_when_hours = [{hour}]
disk_check_interval_ms = 50
retention_interval_ms = 500
""")
    return path


class Acked:
    """Every acknowledged message of Disk/0 by queue offset (a digest of its body)."""

    def __init__(self) -> None:
        self.digests: dict[int, str] = {}
        self.n = 0

    def batch(self, count: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(count):
            self.n += 1
            head = b"%08d|" % self.n
            out.append({"body": base64.b64encode(head + os.urandom(BODY // 2).hex().encode()[:BODY - len(head)])
                        .decode(), "body_encoding": "base64"})
        return out

    def record(self, sent: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        for message, result in zip(sent, answer["results"], strict=True):
            self.digests[result["queue_offset"]] = hashlib.sha1(base64.b64decode(message["body"])).hexdigest()


def send(http: httpx.Client, acked: Acked, count: int = 16) -> httpx.Response:
    """One batch to Disk/0; recorded when acknowledged."""
    messages = acked.batch(count)
    answer = http.post(f"/topics/{TOPIC}/batch", params={"queue_id": 0}, json={"messages": messages})
    if answer.status_code == 200:
        acked.record(messages, answer.json())
    return answer


def disk_of(http: httpx.Client) -> dict[str, Any]:
    return http.get("/broker").json()["disk"]


def committed(http: httpx.Client, group: str) -> int:
    return http.get(f"/consumers/{group}/offsets/{TOPIC}/0").json()["offset"]


def commit(http: httpx.Client, group: str, offset: int) -> None:
    answer = http.post(f"/consumers/{group}/offsets", json={"offsets": [{"topic": TOPIC, "queue_id": 0,
                                                                         "offset": offset}]})
    assert answer.status_code == 200, answer.text


def check_every_acked_message(http: httpx.Client, acked: Acked, group: str = "g") -> tuple[int, int]:
    """Read the queue from its min offset: every acknowledged message at or above it reads back intact, and
    nothing the group has not consumed is below it.  Returns (min offset, messages read)."""
    offsets = http.get(f"/topics/{TOPIC}/queues/0/offsets").json()
    low, high = offsets["min_offset"], offsets["max_offset"]
    assert high == max(acked.digests) + 1, (high, max(acked.digests))
    assert low <= max(committed(http, group), 0), f"retention deleted messages group {group} had not consumed"
    read, at = 0, low
    while at < high:
        got = http.get(f"/topics/{TOPIC}/queues/0/messages", params={"offset": at, "max": 256}).json()
        assert got["status"] == "FOUND", got
        for m in got["messages"]:
            assert hashlib.sha1(base64.b64decode(m["body"])).hexdigest() == acked.digests[m["queue_offset"]]
            read += 1
        at = got["next_offset"]
    assert read == sum(1 for offset in acked.digests if offset >= low)
    return low, read


def segments_of(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "store" / "commitlog").iterdir())


def trace_failure_lines(broker: ServiceProcess) -> list[str]:
    return [line for line in broker.log().splitlines() if "storing trace events of broker-a" in line]


def console_disk_cell(console_url: str) -> str:
    """The disk cell of broker-a on the console's cluster page, as a browser shows it (photographed into
    ``build/screenshots/cluster-disk-full.png``)."""
    from playwright import sync_api

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.set_default_timeout(20_000)
            page.goto(f"{console_url}/#/cluster")
            page.wait_for_selector("main[data-page='cluster'][data-ready='true']")
            row = page.locator("[data-testid=brokers] tbody tr", has_text="broker-a")
            state = row.locator("[data-testid=disk-state]")
            state.wait_for()
            assert "pill bad" in (state.get_attribute("class") or "")
            assert "DISK_FULL" in (state.get_attribute("title") or "")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "cluster-disk-full.png"), full_page=True)
            return " ".join(row.locator("td", has=page.locator("[data-testid=disk]")).inner_text().split())
        finally:
            browser.close()


def start_broker(procs: ProcessHarness, conf: Path, namesrv: ServiceProcess) -> tuple[ServiceProcess, httpx.Client]:
    broker = procs.start("broker", BROKER, "--config", str(conf), "--namesrv", namesrv.addr,
                         "--register-interval-s", "0.5", "--segment-size", str(MIB))
    return broker, httpx.Client(base_url=broker.url, timeout=30)


def test_a_broker_on_a_small_disk_deletes_early_refuses_before_full_and_recovers(procs: ProcessHarness,
                                                                                  small_disk: Path,
                                                                                  tmp_path: Path) -> None:
    data_dir = small_disk / "broker"
    conf = broker_conf(tmp_path / "broker.toml", data_dir)
    namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    broker, http = start_broker(procs, conf, namesrv)
    assert http.post("/topics", json={"topic": TOPIC, "read_queue_nums": 1, "write_queue_nums": 1}).status_code == 200
    acked = Acked()
    commit(http, "g", 0)  # group g has consumed nothing yet

    # 1. Fill to the CLEAN band (75..85 %): nothing is deleted, nothing has expired.
    while disk_of(http)["used_ratio"] < 0.78:
        assert send(http, acked).status_code == 200
    assert disk_of(http)["state"] == "CLEAN" and http.get("/broker").json()["commitlog"]["min_offset"] == 0
    old = segments_of(data_dir)[:5]
    stamp = time.time() - 4 * 24 * 3600  # 4 days old: past the 72 h retention
    for path in old:
        os.utime(path, (stamp, stamp))
    # Expired, but group g still needs them: early deletion waits (and says who holds it).
    held = wait_until(lambda: disk_of(http)["held_by"], 60, "the retention pass")
    assert held.startswith("group g on Disk/0 at offset 0"), held
    assert http.get("/broker").json()["commitlog"]["min_offset"] == 0
    check_every_acked_message(http, acked)

    # 2. Group g consumes everything: the five expired segments go early (not at the delete hour), the young stay.
    commit(http, "g", max(acked.digests) + 1)
    sixth = int(segments_of(data_dir)[5].name)
    wait_until(lambda: http.get("/broker").json()["commitlog"]["min_offset"] == sixth, 60,
               "the expired segments deleted early")
    assert [p.name for p in segments_of(data_dir)][0] == f"{sixth:020d}" and not any(p.exists() for p in old)
    time.sleep(1)  # further passes delete nothing young below the force-clean ratio
    assert http.get("/broker").json()["commitlog"]["min_offset"] == sixth
    check_every_acked_message(http, acked)

    # 3. g stops consuming; sends go on until refused: force clean deletes what g consumed, then stops at g.
    consumed = max(acked.digests) + 1
    while (answer := send(http, acked)).status_code == 200:
        assert len(acked.digests) < consumed + 20_000, "never refused"  # 64 MiB hold about 16,000
    assert answer.status_code == 507 and answer.json()["code"] == "DISK_FULL", answer.text
    assert "disk_warning_ratio" in answer.json()["message"]  # the watermark refused it, not ENOSPC
    disk = disk_of(http)
    assert disk["state"] == "FULL" and not disk["writable"] and disk["refused_writes"] >= 1
    assert 0.90 <= disk["used_ratio"] < 0.96 and disk["free_bytes"] >= 3 * MIB, disk  # refused before full
    assert disk["held_by"].startswith(f"group g on Disk/0 at offset {consumed}"), disk
    low, _read = check_every_acked_message(http, acked)
    assert low <= consumed < low + 260  # what g consumed went, but for the segment it reads in (about 250)
    health = http.get("/health").json()
    assert health["status"] == "degraded" and health["disk"]["ok"] is False and health["disk"]["state"] == "FULL"
    metrics = http.get("/metrics").text
    assert re.search(r'^sparkmq_disk_writable\{name="broker-a"\} 0\.0$', metrics, re.M), metrics
    assert re.search(r'^sparkmq_disk_used_ratio\{name="broker-a"\} 0\.9', metrics, re.M)
    # ... over remoting too: the producer's retries meet the same refusal
    from sparkmq.platform.client import ClientConfig, Producer

    with Producer("disk-test", ClientConfig(namesrv_addrs=namesrv.addr, send_timeout_s=3.0)) as producer:
        with pytest.raises(SparkMQError) as refused:
            producer.send(Message(TOPIC, b"refused"))
        assert refused.value.code is ErrorCode.DISK_FULL
    # ... and in `sparkmq admin cluster list`
    table = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", namesrv.addr, "cluster",
                            "list"], capture_output=True, text=True, env=child_env(COLUMNS="250"), timeout=60)
    row = next(line for line in table.stdout.splitlines() if "broker-a" in line)
    assert re.search(r"│ 9\d% FULL\s+│ refused \(DISK_FULL\)", row), table.stdout

    # ... and on the console's cluster page (headless Debian chromium)
    console = procs.start("console", "sparkmq.api.console.main", "--namesrv", namesrv.addr)
    shown = console_disk_cell(console.url)
    assert re.fullmatch(r"9\d% · \d+(\.\d+)? MiB free sends refused", shown), shown

    # 4. Reads, offset commits and trace writing while refused.
    for _ in range(3):
        check_every_acked_message(http, acked)
    commit(http, "g2", low + 7)  # another group commits: persisted to the Delta table on the same disk
    wait_until(lambda: http.get("/health").json()["offsets"]["pending"] == 0, 60, "the offsets persisted")
    assert http.get("/health").json()["offsets"]["last_error"] is None
    failed_before = http.get("/health").json()["trace"]["failed"]
    started = time.monotonic()
    while time.monotonic() - started < 3 * SUMMARY_S + 1:  # pulls by a group: deliver events, every trace flush fails
        got = http.get(f"/topics/{TOPIC}/queues/0/messages", params={"offset": low, "max": 8, "group": "reader"})
        assert got.status_code == 200 and got.json()["status"] == "FOUND"
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    trace = http.get("/health").json()["trace"]
    assert trace["failed"] - failed_before >= 50 and "DISK_FULL" in trace["last_error"], trace
    lines = trace_failure_lines(broker)
    assert "failed: " in lines[0] and all("more failure" in line for line in lines[1:]), lines
    assert 2 <= len(lines) <= 2 + elapsed / SUMMARY_S, lines  # the first failure, then one summary per interval

    # 5. A clean stop on the full disk writes its checkpoint and offsets; the restart refuses at once.
    log_end = http.get("/broker").json()["commitlog"]["max_offset"]
    assert broker.stop() == 0
    log_text = broker.log()
    assert "persisting" not in log_text and "Traceback" not in log_text, log_text[-3000:]
    end = max(acked.digests)
    checkpoint = read_checkpoint(data_dir / "store" / "checkpoint")
    assert checkpoint is not None and checkpoint.flushed_offset == log_end  # the final checkpoint was written
    broker, http = start_broker(procs, conf, namesrv)
    health = http.get("/health").json()
    assert health["store"]["clean_start"] is True and health["disk"]["state"] == "FULL"
    assert send(http, acked).status_code == 507
    assert committed(http, "g2") == low + 7 and committed(http, "g") == consumed
    check_every_acked_message(http, acked)
    assert max(acked.digests) == end

    # 6. The groups consume: force clean frees what they read, the disk falls below the resume ratio, sends resume.
    commit(http, "g", end + 1)
    # the slowest group holds it now (the next retention pass says so; a pass is every 0.5 s)
    wait_until(lambda: disk_of(http)["held_by"].startswith(f"group g2 on Disk/0 at offset {low + 7}"), 60,
               lambda: f"group g2 holding the log ({disk_of(http)})")
    commit(http, "g2", end + 1)
    wait_until(lambda: disk_of(http)["writable"], 60, lambda: f"sends accepted again ({disk_of(http)})")
    disk = disk_of(http)
    assert disk["used_ratio"] < 0.85 and disk["state"] in ("OK", "CLEAN"), disk
    for _ in range(5):
        assert send(http, acked).status_code == 200
    check_every_acked_message(http, acked)
    assert http.get("/health").json()["disk"]["ok"] is True
