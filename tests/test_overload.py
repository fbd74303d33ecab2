"""Overload, shown with real processes (issue 30): fast failure instead of queueing, bounded memory, and a
broker that keeps its latency with thousands of idle connections.

* A producer far faster than the disk (a broker whose syncs run at a few MB/s, ``slow_disk_broker.py``, under
  SYNC_FLUSH, flooded from several connections with many sends in flight each) gets SYSTEM_BUSY answers, each
  within the configured wait (not after the seconds an accepted send waits for its sync); the broker's anonymous
  memory stays bounded; sparkmq's sync and async producers back off and retry, so every send of theirs succeeds;
  after the burst every acknowledged message is there and a sync send is as fast as before it.
* 2,000 idle remoting connections (each said one HEART_BEAT, kept past ``http_header_timeout_s``) leave send and
  pull latency within 20 % of the figure without them.
* A send that waited past ``wait_time_ms_in_send_queue`` and a pull past ``max_held_pulls`` are answered busy and
  not served; the guard's rules on their own.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import os
import random
import resource
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from flood_child import STORED, body, seq_of
from timing import holds_in_one_of

from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, child_env, fast_client_config, wait_until
from sparkmq.platform.client import Producer
from sparkmq.platform.client.broker_remoting import heartbeat_data, properties_text, pull_ext, send_ext
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message, SendStatus
from sparkmq.platform.common.protocol import PULL_OUTCOME_CODES, RequestCode
from sparkmq.platform.remoting import Frame, RemotingConnection
from sparkmq.platform.remoting.codec import encode_frame
from sparkmq.platform.remoting.server import SMALL_REQUEST_BYTES

TESTS = Path(__file__).parent
MiB = 1 << 20

#: The slow disk: 4 MB/s of write bandwidth, 2 ms per sync.
DISK_BYTES_PER_S = 4_000_000
#: The overload settings under test (RocketMQ's defaults are 200 ms and 1000 ms; the busy time is lowered so a
#: burst of a few seconds shows several busy periods).
SEND_WAIT_MS = 200
BUSY_MS = 300
PER_CONNECTION_BYTES = 2 * MiB
BROKER_BYTES = 8 * MiB
#: A busy answer's median must come within the configured wait of a PING's (what any answer costs on the machine
#: at that moment: a load average over 20 was seen on this shared 2-core machine), its p90 within the wait plus
#: this margin of a PING's p90: far below the seconds an accepted send of the burst waits for its sync (and a
#: queued one would).
BUSY_ANSWER_MARGIN_S = 0.5
#: The flood (flood_child.py): 6 connections with 512 sends of 32 KiB in flight each, 96 MiB at most: far more than the
#: broker may hold unanswered (16 MiB), so without the limits its memory would grow by that much.
FLOOD_BODY = 32 * 1024
FLOOD_DEPTH = 512
FLOOD_S = 8.0
#: The steady producer's bodies: four times SMALL_REQUEST_BYTES (smaller requests are always taken).
STEADY_BODY = 4 * SMALL_REQUEST_BYTES


def _start_broker(procs: ProcessHarness, tmp_path: Path, namesrv: ServiceProcess, *, module: str,
                  env: dict[str, str], store: dict[str, object], **broker: object) -> ServiceProcess:
    conf = tmp_path / "broker.toml"
    lines = ["[broker]", f'data_dir = "{tmp_path / "broker"}"']
    lines += [f"{k} = {v!r}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}" for k, v in broker.items()]
    lines += ["[store]"] + [f"{k} = {v!r}" for k, v in store.items()]
    conf.write_text("\n".join(lines) + "\n")
    return procs.start("broker", module, "--config", str(conf), "--namesrv", namesrv.addr,
                       "--register-interval-s", "0.5", "--segment-size", str(64 * MiB), env=env)


def _memory(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of ``pid`` in bytes (from /proc/<pid>/status)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _metric(url: str, name: str) -> dict[str, float]:
    """The samples of metric ``name`` on ``url``'s /metrics: labels text -> value."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith(name):
            labels, _, value = line.rpartition(" ")
            out[labels[len(name):]] = float(value)
    return out


def _remoting_connections(url: str) -> int:
    """The broker's open remoting connections (its /health)."""
    return int(httpx.get(f"{url}/health", timeout=10).json()["remoting"]["connections"])


def _overload(url: str) -> dict[str, object]:
    return httpx.get(f"{url}/health", timeout=10).json()["overload"]


async def _probe(addr: str, topic: str, seconds: float, size: int, *, connections: int = 3
                 ) -> tuple[list[float], list[float], set[int], list[float]]:
    """One send at a time on each of ``connections`` connections of their own for ``seconds``, a random pause
    after each answer (so that the probes do not come back just as a sync frees room): the latency of each
    SYSTEM_BUSY answer and of each accepted send (how long a producer waits for its answer from the overloaded
    broker), the acknowledged sequence numbers (from 10**9 on, apart from the flood's), and the latency of a PING
    before each send: what any answer costs on this machine now (answered by the remoting server itself, no
    queue), the reference a busy answer is held to."""
    busy: list[float] = []
    pings: list[float] = []
    ok: list[float] = []
    acked: set[int] = set()
    seqs = itertools.count(10**9)
    end = time.monotonic() + seconds
    rng = random.Random(30)

    async def one(conn: RemotingConnection) -> None:
        while time.monotonic() < end:
            began = time.monotonic()
            await conn.request(RequestCode.SPARKMQ_PING, timeout=30)
            pings.append(time.monotonic() - began)
            seq = next(seqs)
            ext = p.ext_fields(p.SendMessageRequestHeader("probe", topic, bornTimestamp=int(time.time() * 1000)))
            began = time.monotonic()
            try:
                await conn.request(RequestCode.SEND_MESSAGE, ext, body(seq, size), timeout=30, ok=STORED)
            except SparkMQError as exc:
                if exc.code is not ErrorCode.SYSTEM_BUSY:
                    raise
                busy.append(time.monotonic() - began)
            else:
                ok.append(time.monotonic() - began)
                acked.add(seq)
            await asyncio.sleep(rng.uniform(0.05, 0.25))

    conns = [await RemotingConnection.connect(addr) for _ in range(connections)]
    try:
        await asyncio.gather(*(one(c) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
    return busy, ok, acked, pings


def _read_all(url: str, topic: str, queues: int = 4) -> dict[str, bytes]:
    """Every message of ``topic``: msg_id -> body (64 at a time: the flood's bodies are large)."""
    found: dict[str, bytes] = {}
    with httpx.Client(base_url=url, timeout=30) as http:
        for queue_id in range(queues):
            offset = 0
            while True:
                answer = http.get(f"/topics/{topic}/queues/{queue_id}/messages",
                                  params={"offset": offset, "max": 64}).json()
                for m in answer.get("messages", []):
                    found[m["msg_id"]] = base64.b64decode(m["body"])
                if not answer.get("messages") or answer["next_offset"] == offset:
                    break
                offset = answer["next_offset"]
    return found


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _timed_sends(producer: Producer, topic: str, n: int) -> list[float]:
    took = []
    for i in range(n):
        began = time.monotonic()
        result = producer.send(Message(topic, b"probe %d" % i))
        took.append(time.monotonic() - began)
        assert result.status is SendStatus.SEND_OK
    return took


@pytest.mark.serial
def test_a_producer_faster_than_the_disk_gets_system_busy_at_once_and_nothing_acknowledged_is_lost(
        procs: ProcessHarness, tmp_path: Path) -> None:
    """Fast failure under overload (RocketMQ's SYSTEM_BUSY), bounded memory, client back-off, nothing lost."""
    namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    env = child_env(SLOW_DISK_BYTES_PER_S=str(DISK_BYTES_PER_S))
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env["PYTHONPATH"]])
    broker = _start_broker(procs, tmp_path, namesrv, module="slow_disk_broker", env=env,
                           store={"flush_mode": "SYNC_FLUSH"}, wait_time_ms_in_send_queue=SEND_WAIT_MS,
                           os_page_cache_busy_timeout_ms=BUSY_MS, trace_enabled=False,
                           max_unanswered_bytes_per_connection=PER_CONNECTION_BYTES, max_unanswered_bytes=BROKER_BYTES)
    topic = "OverloadTopic"
    cfg = fast_client_config(namesrv.addr, tmp_path / "offsets", send_timeout_s=20.0)
    busy_logged: list[str] = []

    class _BusyLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "answered busy" in record.getMessage():
                busy_logged.append(record.getMessage())
    client_log = logging.getLogger("sparkmq.client")
    handler, old_level = _BusyLog(), client_log.level
    client_log.addHandler(handler)
    client_log.setLevel(logging.DEBUG)
    try:
        with Producer("probe", cfg) as probe, Producer("steady", cfg) as steady, \
                Producer("async", fast_client_config(namesrv.addr, tmp_path / "o2", send_timeout_s=20.0)) as batcher:
            probe.send(Message(topic, b"create"))  # auto-creates the topic (4 queues)
            wait_until(lambda: probe.send(Message(topic, b"routed")).status is SendStatus.SEND_OK, 30, "route")
            before = _timed_sends(probe, topic, 30)
            idle = _memory(broker.proc.pid)

            # -- the burst: raw sends far faster than the disk, and sparkmq's producers sending meanwhile ---------
            samples: list[dict[str, int]] = []
            steady_ids: list[str] = []
            steady_errors: list[BaseException] = []
            async_futures = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    samples.append(_memory(broker.proc.pid))
                    stop.wait(0.1)

            def steady_sends() -> None:
                # Bodies above SMALL_REQUEST_BYTES: the broker-wide unanswered-bytes limit applies to them, so this
                # producer meets SYSTEM_BUSY whichever limit the flood fills first on the day's machine.
                n = 0
                while not stop.is_set():
                    try:
                        body = (b"steady %d " % n).ljust(STEADY_BODY, b".")
                        steady_ids.append(steady.send(Message(topic, body)).msg_id)
                    except BaseException as exc:  # noqa: BLE001  # the assertion below reports it
                        steady_errors.append(exc)
                    n += 1

            def async_sends() -> None:
                n = 0
                while not stop.is_set():
                    async_futures.append(batcher.send_async(Message(topic, b"async %d" % n)))
                    n += 1
                    time.sleep(0.002)

            threads = [threading.Thread(target=f, daemon=True) for f in (sample, steady_sends, async_sends)]
            for t in threads:
                t.start()
            out = tmp_path / "flood.json"
            flooder = procs.spawn("flood", [sys.executable, str(TESTS / "flood_child.py"), broker.addr, topic,
                                            str(FLOOD_S), "6", str(FLOOD_DEPTH), str(FLOOD_BODY), str(out)])
            try:
                time.sleep(1.0)  # the flood has the broker busy
                probe_busy, probe_ok, probe_acked, pings = asyncio.run(
                    _probe(broker.addr, topic, FLOOD_S - 2, FLOOD_BODY))
                assert flooder.proc.wait(60) == 0, flooder.log()[-3000:]
            finally:
                stop.set()
                for t in threads:
                    t.join(30)
            async_ids = [f.result(timeout=30).msg_id for f in async_futures]
            flood = json.loads(out.read_text())
            acked = set(flood["acked"]) | probe_acked

            # -- the broker answered busy at once, and counted it --------------------------------------------
            print(f"flood: {len(flood['acked'])} acknowledged, {len(flood['busy'])} busy {flood['reasons']}, "
                  f"accepted p50 {_quantile(flood['ok'], 0.5) * 1000:.0f} ms "
                  f"max {max(flood['ok'], default=0) * 1000:.0f} ms")
            print(f"ping (reference): p50 {_quantile(pings, 0.5) * 1000:.1f} ms "
                  f"p90 {_quantile(pings, 0.9) * 1000:.1f} ms")
            print(f"probe: {len(probe_busy)} busy, p50 {_quantile(probe_busy, 0.5) * 1000:.1f} ms p99 "
                  f"{_quantile(probe_busy, 0.99) * 1000:.1f} ms max {max(probe_busy, default=0) * 1000:.0f} ms; "
                  f"{len(probe_ok)} accepted, p50 {_quantile(probe_ok, 0.5) * 1000:.0f} ms max "
                  f"{max(probe_ok, default=0) * 1000:.0f} ms")
            assert not flood["other"], flood["other"][:5]
            assert len(flood["busy"]) > 100 and flood["acked"], "the flood was not faster than the disk"
            # An accepted send waited seconds for its sync: a queued one would have too.
            assert max(flood["ok"] + probe_ok) > 1.0
            assert len(probe_busy) >= 10, "the probe was hardly ever answered busy"
            # Within the configured wait of what any answer costs now (a PING's round trip on the same connection:
            # on a machine loaded by others both are slower), not after the seconds a queued send would wait.
            wait = SEND_WAIT_MS / 1000
            assert _quantile(probe_busy, 0.5) < _quantile(pings, 0.5) + wait, "SYSTEM_BUSY answers were queued"
            assert _quantile(probe_busy, 0.9) < _quantile(pings, 0.9) + wait + BUSY_ANSWER_MARGIN_S, \
                "SYSTEM_BUSY answers were queued"
            counted = _metric(broker.url, "sparkmq_system_busy_total")
            assert sum(counted.values()) >= len(flood["busy"]) + len(probe_busy), counted
            # The disk's backlog shows as a busy page cache, or first as unanswered bytes piling up on the
            # flood's connections (which of the two fires first depends on the machine); either is overload.
            assert counted.get('{reason="PC_SYNCHRONIZED"}', 0) + counted.get('{reason="UNANSWERED_BYTES_FULL"}', 0) \
                > 0, counted

            # -- memory stayed bounded --------------------------------------------------------------------------
            peak_anon = max(s["RssAnon"] for s in samples)
            print(f"broker RssAnon idle {idle['RssAnon'] / MiB:.0f} MiB, peak {peak_anon / MiB:.0f} MiB; VmRSS peak "
                  f"{max(s['VmRSS'] for s in samples) / MiB:.0f} MiB (page cache of the log included)")
            assert peak_anon - idle["RssAnon"] < BROKER_BYTES + 32 * MiB

            # -- sparkmq's clients backed off and retried: every send of theirs succeeded -------------------------
            assert not steady_errors, steady_errors[:3]
            assert steady_ids and async_ids
            assert busy_logged, "no sparkmq producer was answered busy (nothing shows it backed off)"

            # -- after the burst: the sends waiting drain, a sync send is as fast as before ---------------------
            wait_until(lambda: _overload(broker.url)["pending_acks"] == 0, 30, "the burst's sends synced")
            after = _timed_sends(probe, topic, 30)
            print(f"sync send p50 before {statistics.median(before) * 1000:.1f} ms, after "
                  f"{statistics.median(after) * 1000:.1f} ms")
            assert statistics.median(after) < 2 * statistics.median(before) + 0.02
    finally:
        client_log.removeHandler(handler)
        client_log.setLevel(old_level)

    # -- every acknowledged message is there -------------------------------------------------------------------
    stored = _read_all(broker.url, topic)
    seqs = {s for data in stored.values() if (s := seq_of(data)) is not None}
    missing = acked - seqs
    assert not missing, f"{len(missing)} acknowledged flood sends are missing, e.g. {sorted(missing)[:5]}"
    assert set(steady_ids) <= set(stored) and set(async_ids) <= set(stored)


# -- 2,000 idle connections -------------------------------------------------------------------------------------

IDLE_CONNECTIONS = 2000
#: The head timeout of the broker under test: a connection that said nothing within it is closed, one that spoke
#: (the idle ones here said one HEART_BEAT) is kept.
HEAD_TIMEOUT_S = 2.0
#: How long the connections idle before a phase with them is measured.  For the first ~0.2 s after 2,000 connects
#: every request is answered ~60 us slower, with the broker nearly idle (0.01 s of CPU in that time): a cost of the
#: burst of connecting, not of holding idle connections, which this test is about.
IDLE_SETTLE_S = 1.0
#: Allowed slowdown of sends and pulls with the idle connections open (issue 30: within 20 %).
ALLOWED_SLOWDOWN = 1.20
#: Samples of each phase (one send and one pull each), and the rounds of phases A B (A: without them).  Short
#: phases, many rounds, and the median of the rounds' ratios: a burst of load from elsewhere on the machine spoils
#: a few phases, not the figure.
SAMPLES = 300
ROUNDS = 12


def _raise_open_files(wanted: int) -> None:
    """Raise this process's soft limit of open files to ``wanted`` (the broker started after inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"open files are limited to {hard}; the test needs {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _open_idle(addr: str, n: int) -> list[socket.socket]:
    """``n`` remoting connections that each sent one HEART_BEAT (a producer's) and read its answer, then idle."""
    host, port = addr.rsplit(":", 1)
    out = []
    for i in range(n):
        sock = socket.create_connection((host, int(port)), timeout=10)
        body = heartbeat_data({"client_id": f"idle-{i}", "producer_groups": ["idle"]})  # the same ids each time
        data = encode_frame(RequestCode.HEART_BEAT, 0, i + 1, None, body)
        sock.sendall(data if isinstance(data, bytes) else b"".join(data))
        out.append(sock)
    for sock in out:  # each answer: 4-byte length, then that many bytes
        head = _recv_exactly(sock, 4)
        _recv_exactly(sock, int.from_bytes(head, "big"))
    return out


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AssertionError("the broker closed an idle connection that had spoken")
        data += chunk
    return data


def _still_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the broker has not closed (nothing to read, no EOF)."""
    open_ = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            closed = sock.recv(1) == b""
        except BlockingIOError:
            closed = False
        except OSError:
            closed = True
        open_ += not closed
        sock.setblocking(True)
    return open_


async def _measure(addr: str, topic: str, samples: int, queue_id: int, warm_up: int = 20
                   ) -> tuple[list[float], list[float]]:
    """``samples`` sends of 1 KiB each followed by a pull of it, one at a time on a new connection: their latencies
    (after ``warm_up`` pairs not counted)."""
    conn = await RemotingConnection.connect(addr)
    sends, pulls = [], []
    body_ = b"b" * 1024
    try:
        for i in range(samples + warm_up):
            ext = send_ext("probe", topic, queue_id, properties_text({}, msg_id=f"IDLE{os.getpid()}{i:08d}"),
                           born_timestamp=int(time.time() * 1000))
            began = time.perf_counter()
            answer = await conn.request(RequestCode.SEND_MESSAGE_V2, ext, body_, timeout=10)
            sends.append(time.perf_counter() - began)
            offset = int(answer.ext["queueOffset"])
            began = time.perf_counter()
            pulled = await conn.request(RequestCode.SPARKMQ_PULL_PACKED, pull_ext(None, topic, queue_id, offset, 1),
                                        timeout=10, ok=PULL_OUTCOME_CODES)
            pulls.append(time.perf_counter() - began)
            assert pulled.code == 0 and pulled.ext["msgCount"] == "1", (pulled.code, pulled.ext)
    finally:
        await conn.close()
    return sends[warm_up:], pulls[warm_up:]


@pytest.mark.serial
def test_two_thousand_idle_connections_leave_send_and_pull_latency_within_20_percent(
        procs: ProcessHarness, tmp_path: Path) -> None:
    """2,000 idle remoting connections (each sent one HEART_BEAT; kept past the head timeout) do not slow sends and
    pulls by more than 20 %: rounds of phases A B (A without them), the median over the rounds of each round's
    ratio of p50 (and of p90) with them to without them (in one of up to three measurements: tests/timing.py)."""
    _raise_open_files(IDLE_CONNECTIONS + 1024)
    namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    broker = _start_broker(procs, tmp_path, namesrv, module=BROKER, env=child_env(), store={},
                           max_connections_per_ip=IDLE_CONNECTIONS + 500, http_header_timeout_s=HEAD_TIMEOUT_S,
                           trace_enabled=False)
    topic = "IdleTopic"
    asyncio.run(_measure(broker.addr, topic, 50, 0))  # creates the topic, warms up both paths

    def measure(attempt: int) -> dict[str, tuple[float, float, float]]:
        latency: dict[str, dict[str, list[float]]] = {"A": {"send": [], "pull": []}, "B": {"send": [], "pull": []}}
        rounds: dict[str, dict[str, list[list[float]]]] = {"A": {"send": [], "pull": []},
                                                          "B": {"send": [], "pull": []}}
        idle: list[socket.socket] = []
        try:
            for round_ in range(ROUNDS):
                for phase in "AB":
                    if phase == "B":
                        idle = _open_idle(broker.addr, IDLE_CONNECTIONS)
                        if attempt == round_ == 0:  # they outlive the head timeout: having spoken, they are remoting's
                            time.sleep(HEAD_TIMEOUT_S + 1.0)
                            assert _still_open(idle) == IDLE_CONNECTIONS
                        else:
                            time.sleep(IDLE_SETTLE_S)
                    sends, pulls = asyncio.run(_measure(broker.addr, topic, SAMPLES, round_ % 4))
                    latency[phase]["send"] += sends
                    latency[phase]["pull"] += pulls
                    rounds[phase]["send"].append(sends)
                    rounds[phase]["pull"].append(pulls)
                    if phase == "B":
                        assert _still_open(idle) == IDLE_CONNECTIONS, "idle connections were closed meanwhile"
                        for sock in idle:
                            sock.close()
                        idle = []
                        wait_until(lambda: _remoting_connections(broker.url) <= 2, 30, "the idle connections closed")
                        time.sleep(0.5)  # the broker has forgotten them (their objects freed) before A is measured
        finally:
            for sock in idle:
                sock.close()
        figures = {}
        for kind in ("send", "pull"):
            for q in (0.5, 0.9):
                a_all, b_all = _quantile(latency["A"][kind], q), _quantile(latency["B"][kind], q)
                ratios = [_quantile(b, q) / _quantile(a, q) for a, b in zip(rounds["A"][kind], rounds["B"][kind],
                                                                             strict=True)]
                figures[f"{kind} p{round(q * 100)}"] = (a_all, b_all, statistics.median(ratios))
        return figures

    holds_in_one_of(measure, lambda figures: all(ratio <= ALLOWED_SLOWDOWN for _, _, ratio in figures.values()),
                    lambda figures: "idle connections, without -> with (pooled; median of the rounds' ratios): "
                    + "; ".join(f"{name} {a * 1e6:.0f} -> {b * 1e6:.0f} us ({(r - 1) * 100:+.1f} %)"
                                for name, (a, b, r) in figures.items()))


# -- the queue wait and the held pulls ----------------------------------------------------------------------------

def test_a_send_that_waited_past_its_limit_and_a_pull_past_the_held_limit_are_answered_busy_and_not_served(
        procs: ProcessHarness, tmp_path: Path) -> None:
    """``wait_time_ms_in_send_queue`` (1 ms here): of 2,000 sends written at once, those that waited behind the others
    of their read are answered SYSTEM_BUSY and are not stored; ``max_held_pulls`` (2): a third long poll is answered
    SYSTEM_BUSY at once while two are held.  Both counted on /metrics by reason."""
    namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    broker = _start_broker(procs, tmp_path, namesrv, module=BROKER, env=child_env(), store={},
                           wait_time_ms_in_send_queue=1, max_held_pulls=2, trace_enabled=False)
    topic = "WaitedTopic"

    async def run() -> tuple[list[Frame], list[tuple[float, int | str]]]:
        conn = await RemotingConnection.connect(broker.addr)
        try:
            await conn.request(RequestCode.SEND_MESSAGE_V2, send_ext("w", topic, 0, "", born_timestamp=1), b"first")
            # 2,000 sends in one write: the broker reads them in a few reads and answers each in turn
            sends = [conn.request(RequestCode.SEND_MESSAGE_V2, send_ext("w", topic, 1, "", born_timestamp=1),
                                  b"m%d" % i, timeout=60, ok=frozenset({0, 2})) for i in range(2000)]
            answers = await asyncio.gather(*sends)

            async def pull() -> tuple[float, int | str]:
                began = time.monotonic()
                try:
                    answer = await conn.request(RequestCode.SPARKMQ_PULL_PACKED,
                                                pull_ext(None, topic, 0, 1, 32, wait_ms=3000), timeout=10,
                                                ok=PULL_OUTCOME_CODES)
                except SparkMQError as exc:
                    return time.monotonic() - began, exc.code.name
                return time.monotonic() - began, answer.code
            pulls = []
            for _ in range(3):  # held in this order: the third finds two held
                pulls.append(asyncio.ensure_future(pull()))
                await asyncio.sleep(0.2)
            return answers, list(await asyncio.gather(*pulls))
        finally:
            await conn.close()

    answers, pulls = asyncio.run(run())
    busy = [a for a in answers if a.code == 2]
    served = len(answers) - len(busy)
    print(f"{served} sends served, {len(busy)} answered busy; pulls (seconds, outcome): {pulls}")
    assert busy and served, "expected both: the first of each read served, the ones behind it refused"
    assert all("[TIMEOUT_CLEAN_QUEUE]" in (a.remark or "") for a in busy)
    stored = httpx.get(f"{broker.url}/topics/{topic}/queues/1/offsets", timeout=10).json()
    assert stored["max_offset"] == served, (stored, served)  # a busy send was not stored
    (held1, code1), (held2, code2), (refused, code3) = pulls
    assert code1 == code2 == 19 and held1 > 2.0 and held2 > 2.0  # held, then nothing new
    assert code3 == "SYSTEM_BUSY" and refused < 1.0
    counted = _metric(broker.url, "sparkmq_system_busy_total")
    assert counted.get('{reason="TIMEOUT_CLEAN_QUEUE"}') == len(busy), counted
    assert counted.get('{reason="HELD_PULLS_FULL"}') == 1, counted


# -- the rules themselves -----------------------------------------------------------------------------------------

def test_the_overload_guard_refuses_while_the_disk_is_behind_and_after_a_stalled_append() -> None:
    """OverloadGuard's rules without a broker: sends are taken while the oldest one waiting for its sync is younger
    than the busy time, refused (PC_SYNCHRONIZED) once it is older, taken again as soon as a sync answers; refused
    beyond max_pending_acks; refused for the busy time after an append that took longer; pulls beyond the held
    limit refused.  Every refusal is counted by reason."""
    from sparkmq.platform.broker.overload import OverloadGuard

    heard: list[str] = []
    guard = OverloadGuard(send_wait_s=0.2, pull_wait_s=5.0, busy_s=0.1, max_pending_acks=3, max_held_pulls=2,
                          on_busy=heard.append)

    def refused() -> str | None:
        try:
            guard.check_send()
        except SparkMQError as exc:
            assert exc.code is ErrorCode.SYSTEM_BUSY
            return exc.message.partition("]")[0].lstrip("[")
        return None

    assert refused() is None
    guard.ack_waiting()
    assert refused() is None  # waiting, but not for long
    time.sleep(0.15)
    assert refused() == "PC_SYNCHRONIZED" and guard.page_cache_busy
    guard.ack_done()  # a sync answered it
    assert refused() is None and not guard.page_cache_busy
    for _ in range(3):
        guard.ack_waiting()
    assert refused() == "PENDING_ACKS_FULL"
    for _ in range(3):
        guard.ack_done()
    guard.stored(0.05)
    assert refused() is None
    guard.stored(0.15)  # the append stalled longer than the busy time
    assert refused() == "PC_SYNCHRONIZED" and guard.page_cache_busy
    time.sleep(0.15)
    assert refused() is None and not guard.page_cache_busy
    guard.check_hold(1)
    with pytest.raises(SparkMQError, match="HELD_PULLS_FULL"):
        guard.check_hold(2)
    with pytest.raises(SparkMQError, match="TIMEOUT_CLEAN_QUEUE"):
        guard.check_waited(5.1, pull=True)
    guard.check_waited(4.9, pull=True)
    assert heard == ["PC_SYNCHRONIZED", "PENDING_ACKS_FULL", "PC_SYNCHRONIZED", "HELD_PULLS_FULL",
                     "TIMEOUT_CLEAN_QUEUE"]
    assert guard.status()["busy_answers"]["PC_SYNCHRONIZED"] == 2
