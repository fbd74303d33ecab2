"""Connection limits with real processes: 2,000 idle connections from one address on each of the broker's remoting
and HTTP ports, plus a client trickling an HTTP request head, do not slow a well-behaved client down.

The abusers connect from 127.0.0.1x and 127.0.0.2x (loopback too; a new pair for each measurement), the
well-behaved client from 127.0.0.1.  Its rate (messages sent and received back per second) is measured without and
with the abuse in the same test, in one of up to three measurements (tests/timing.py).
Shown as well: beyond ``max_connections_per_ip`` connections are refused, logged once per address, not once
per connection; idle HTTP connections and the slow head are reaped after ``http_header_timeout_s``.
"""
from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from timing import holds_in_one_of

from procs import ProcessHarness, ServiceProcess, fast_client_config, wait_until, write_conf
from sparkmq.platform.client import Message, Producer, PullConsumer
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.common.limits import ConnectionLimits
from sparkmq.platform.remoting import RemotingConnection, RemotingServer, Reply, new_event_loop

pytestmark = pytest.mark.cluster

IDLE = 2000
PER_IP = 1000
HEADER_TIMEOUT_S = 2.0
TOPIC = "LimitsTopic"


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def _open_idle(target: tuple[str, int], source: str, count: int) -> list[socket.socket]:
    """``count`` connections to ``target`` from ``source`` that never send anything (refused ones included)."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.bind((source, 0))
        sock.connect(target)
        socks.append(sock)
    return socks


def _open_count(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server still holds open (a closed one reads EOF or a reset at once)."""
    open_ = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            if sock.recv(1) == b"":
                continue
        except BlockingIOError:
            open_ += 1
        except OSError:
            continue
    return open_


class SlowHead(threading.Thread):
    """An HTTP client sending its request head one byte every 0.2 s; records when the server closed it."""

    def __init__(self, target: tuple[str, int], source: str) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((source, 0))
        self.sock.connect(target)
        self.started_at = time.monotonic()
        self.closed_after: float | None = None

    def run(self) -> None:
        head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
        try:
            for byte in head:
                self.sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            self.closed_after = time.monotonic() - self.started_at
        finally:
            self.sock.close()


def _round_trip_rate(producer: Producer, consumer: PullConsumer, seconds: float) -> float:
    """Messages sent (batches of 32) and polled back per second, one batch at a time."""
    count = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        tag = uuid.uuid4().hex[:8]
        producer.send_batch([Message(TOPIC, f"{tag}-{i}".encode()) for i in range(32)])
        got = 0
        deadline = time.monotonic() + 10
        while got < 32 and time.monotonic() < deadline:
            got += sum(1 for m in consumer.poll(0.2) if m.body.startswith(tag.encode()))
        assert got == 32, "a batch did not come back within 10 s"
        count += 32
    return count / (time.monotonic() - started)


@pytest.fixture
def platform(procs: ProcessHarness, tmp_path: Path) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 3 * IDLE + 200:  # this process holds every abusive socket
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * IDLE + 200), hard))
    conf = write_conf(tmp_path / "broker.toml", tmp_path / "broker", max_connections_per_ip=PER_IP,
                      http_header_timeout_s=HEADER_TIMEOUT_S)
    yield procs.start_platform(tmp_path / "broker", "--config", str(conf))


@pytest.mark.serial  # compares round-trip rates: a parallel neighbour's load would decide the ratio
def test_idle_flood_and_slow_head_do_not_slow_a_well_behaved_client(platform: tuple[ServiceProcess, ServiceProcess],
                                                                    tmp_path: Path) -> None:
    namesrv, broker = platform
    config = fast_client_config(namesrv.addr, tmp_path / "offsets", trace_enabled=False, long_poll_wait_ms=200)
    with AdminClient(config) as admin:
        admin.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
        wait_until(lambda: _routed(admin), 20, "the topic's route")
    remoting = _addr(httpx.get(f"{broker.url}/broker", timeout=5).json().get("remoting_addr")
                     or _remoting_from_cluster(namesrv))
    http = _addr(broker.addr)
    producer = Producer("pg-limits", config).start()
    consumer = PullConsumer("cg-limits", config, consume_from_where="LAST_OFFSET")
    consumer.subscribe(TOPIC)
    consumer.start()
    # One port serves HTTP and remoting: a connection that never sends a byte is neither yet, and counts
    # against max_connections_per_ip as a silent connection, to either address the broker names.
    assert remoting == http, (remoting, http)
    abusers: list[str] = []

    def measure(attempt: int) -> tuple[float, float]:
        """The round-trip rate alone, then under a fresh abuse from addresses of this attempt's own."""
        abusive: list[socket.socket] = []
        idle_from, slow_from = f"127.0.0.{10 + attempt}", f"127.0.0.{20 + attempt}"
        abusers.append(idle_from)
        try:
            baseline = max(_round_trip_rate(producer, consumer, 2.0) for _ in range(2))
            abusive += _open_idle(http, idle_from, IDLE)
            slow = SlowHead(http, slow_from)
            slow.start()
            # Beyond the limit per address the broker refused: PER_IP silent connections stay, the rest are closed.
            wait_until(lambda: _open_count(abusive) == PER_IP, 10,
                       lambda: f"{PER_IP} of the silent connections open (now {_open_count(abusive)})")
            under_abuse = max(_round_trip_rate(producer, consumer, 2.0) for _ in range(2))

            # The slow head and the silent connections are reaped after the head deadline; past it, the
            # well-behaved client still makes round trips.
            slow.join(HEADER_TIMEOUT_S + 10)
            assert slow.closed_after is not None and slow.closed_after < HEADER_TIMEOUT_S + 3, slow.closed_after
            wait_until(lambda: _open_count(abusive) == 0, HEADER_TIMEOUT_S + 10, "the silent connections reaped")
            time.sleep(HEADER_TIMEOUT_S + 1)
            assert _round_trip_rate(producer, consumer, 1.0) > 0
            return baseline, under_abuse
        finally:
            for sock in abusive:
                with contextlib.suppress(OSError):
                    sock.close()

    try:
        _round_trip_rate(producer, consumer, 1.0)  # warm-up: routes, connections
        holds_in_one_of(measure, lambda rates: rates[1] >= 0.8 * rates[0],
                        lambda rates: f"round trips: {rates[0]:.0f} msgs/s alone, {rates[1]:.0f} msgs/s under abuse "
                        f"({rates[1] / rates[0]:.2f}; at least 0.80)")
    finally:
        consumer.shutdown()
        producer.shutdown()
    # Logged once per address, not once per refused connection.
    log = broker.log()
    for address in abusers:
        assert log.count(f"connections not yet identified: refusing connections from {address}:") == 1, log[-3000:]


def _routed(admin: AdminClient) -> bool:
    try:
        return len(admin.topic_route(TOPIC).read_queues) == 1
    except Exception:
        return False


def _remoting_from_cluster(namesrv: ServiceProcess) -> str:
    live = httpx.get(f"{namesrv.url}/cluster", timeout=5).json()["live_brokers"]
    return next(info["remoting_addr"] for info in live.values() if info.get("remoting_addr"))


def test_a_connection_with_too_many_requests_in_flight_is_not_read_until_answers_go_out() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        held: list[asyncio.Future[Reply]] = []

        def handler(conn: object, frame: object) -> asyncio.Future[Reply]:
            fut: asyncio.Future[Reply] = loop.create_future()
            held.append(fut)
            return fut
        server = await RemotingServer(handler, limits=ConnectionLimits(max_inflight_per_connection=4)).start()
        conn = await RemotingConnection.connect(f"127.0.0.1:{server.port}")
        try:
            pending = []
            for _ in range(10):  # one at a time, so each request is its own read
                pending.append(asyncio.ensure_future(conn.request(100, timeout=10)))
                await asyncio.sleep(0.05)
            assert len(held) == 4  # the fifth is not read while four are being answered
            for fut in held[:3]:
                fut.set_result(Reply(0))
            await asyncio.sleep(0.2)
            assert len(held) > 4  # answers went out: reading resumed
            while not all(p.done() for p in pending):
                for fut in held:
                    if not fut.done():
                        fut.set_result(Reply(0))
                await asyncio.sleep(0.02)
            assert all(p.result().code == 0 for p in pending)
        finally:
            await conn.close()
            await server.stop(1)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(run())
