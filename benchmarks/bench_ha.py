"""Replication benchmarks: a name server, a master and its slave as child processes, this process the client.

    python benchmarks/bench_ha.py [--quick] [--only NAME[,NAME]]

One line of figures each (1 KiB bodies, ASYNC_FLUSH):

* ``ha.sync_master_ratio`` -- batched produce (batches of 256, 4 in flight) into a SYNC_MASTER over the
  same into an ASYNC_MASTER, each with one slave, measured one after the other in this run;
* ``ha.replication_lag_ms`` -- ASYNC_MASTER at a steady 50,000 msgs/s: for each acknowledged batch, the
  time until the slave holds it (the slave's max offset, polled every few ms): p50 / p99;
* ``ha.dledger_ratio`` -- the same batched produce into a 3-member DLedger group over a single master
  (no slave), one after the other in this run;
* ``ha.failover_s`` -- a 3-member DLedger group with the production timings (heartbeat 2 s, leader lost
  after 3 missed beats) and one producer sending without pause: kill -9 of the leader to the first
  acknowledged send that began after the kill, over 20 kills (the killed member restarts and catches up
  before the next one): p50 / p99 / max.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from sparkmq.platform.client import AsyncProducer, ClientConfig, Message, Producer
from sparkmq.platform.common.errors import SparkMQError
from sparkmq.platform.common.message import SendStatus

BODY = os.urandom(1024)
BATCH = 256


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Service:
    """One service process started with ``--port 0``; its ready line gives the address."""

    def __init__(self, module: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"listening on http://(\S+)", ready)
        if match is None:
            self.stop()
            raise SystemExit(f"{module} did not start: {ready!r}")
        self.addr = match.group(1)
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # type: ignore[union-attr]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class Pair:
    """A name server, a master of ``role`` and one slave, in ``root``."""

    def __init__(self, root: Path, role: str) -> None:
        self.namesrv = Service("sparkmq.api.namesrv_main")
        common = ["--namesrv", self.namesrv.addr, "--register-interval-s", "1", "--segment-size", str(1 << 30)]
        self.master = Service("sparkmq.api.broker_main", "--data-dir", str(root / "master"), "--role", role,
                              "--ha-port", "0", *common)
        self.slave = Service("sparkmq.api.broker_main", "--data-dir", str(root / "slave"), "--role", "SLAVE",
                             "--broker-id", "1", *common)
        deadline = time.monotonic() + 60
        while self.ha(self.master).get("in_sync_slaves") != 1:
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("the slave never came in sync")
            time.sleep(0.1)

    @staticmethod
    def ha(service: Service) -> dict:
        return httpx.get(f"http://{service.addr}/broker/ha", timeout=5).json()

    def config(self) -> ClientConfig:
        return ClientConfig(namesrv_addrs=self.namesrv.addr, trace_enabled=False)

    def stop(self) -> None:
        for service in (self.slave, self.master, self.namesrv):
            service.stop()


class DLedgerGroup:
    """A name server and the 3 members n0..n2 of one DLedger group (broker-a) in ``root``; members restartable."""

    MEMBERS = ("n0", "n1", "n2")

    def __init__(self, root: Path, heartbeat_ms: int = 2000) -> None:
        self.root = root
        self.namesrv = Service("sparkmq.api.namesrv_main")
        ports = {}
        for member in self.MEMBERS:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                ports[member] = sock.getsockname()[1]
        peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in ports.items())
        for member in self.MEMBERS:
            (root / f"{member}.toml").write_text(
                f'[broker]\ndata_dir = "{root / member}"\ndledger_enabled = true\ndledger_self_id = "{member}"\n'
                f'dledger_peers = "{peers}"\ndledger_heartbeat_ms = {heartbeat_ms}\n')
        self.members: dict[str, Service] = {}
        for member in self.MEMBERS:
            self.start(member)
        self.wait_leader()

    def start(self, member: str) -> None:
        self.members[member] = Service("sparkmq.api.broker_main", "--config", str(self.root / f"{member}.toml"),
                                       "--namesrv", self.namesrv.addr, "--register-interval-s", "1",
                                       "--segment-size", str(1 << 30))

    def status(self, member: str) -> dict:
        try:
            return httpx.get(f"http://{self.members[member].addr}/broker/ha", timeout=2).json()
        except httpx.HTTPError:
            return {}

    def leader(self, exclude: str | None = None) -> str | None:
        for member in self.MEMBERS:
            if member != exclude and self.members[member].proc.poll() is None \
                    and self.status(member).get("role") == "LEADER":
                return member
        return None

    def wait_leader(self, exclude: str | None = None, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while (leader := self.leader(exclude)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no leader was elected")
            time.sleep(0.05)
        return leader

    def caught_up(self, member: str) -> bool:
        """``member`` follows and the leader has it within 1 MiB of its log's end (sends keep flowing)."""
        leader = self.leader(exclude=member)
        status = self.status(leader) if leader is not None else {}
        peer = status.get("peers", {}).get(member)
        return peer is not None and peer["match_offset"] > 0 and status["log_end"] - peer["match_offset"] < 1 << 20

    def config(self) -> ClientConfig:
        return ClientConfig(namesrv_addrs=self.namesrv.addr, trace_enabled=False)

    def stop(self) -> None:
        for service in (*self.members.values(), self.namesrv):
            if service.proc.poll() is None:
                service.stop()


class Single:
    """A name server and one master without a slave."""

    def __init__(self, root: Path) -> None:
        self.namesrv = Service("sparkmq.api.namesrv_main")
        self.master = Service("sparkmq.api.broker_main", "--data-dir", str(root / "master"), "--namesrv",
                              self.namesrv.addr, "--register-interval-s", "1", "--segment-size", str(1 << 30))

    def config(self) -> ClientConfig:
        return ClientConfig(namesrv_addrs=self.namesrv.addr, trace_enabled=False)

    def stop(self) -> None:
        for service in (self.master, self.namesrv):
            service.stop()


def produce_batched(pair: Pair | DLedgerGroup | Single, seconds: float) -> float:
    """Batches of 256, 4 in flight: msgs/s."""
    batch = [Message("HaBench", BODY) for _ in range(BATCH)]

    async def run() -> float:
        async with AsyncProducer("ha-bench", pair.config()) as producer:
            await producer.send_batch(batch)
            started = time.perf_counter()
            stop = started + seconds

            async def sender() -> int:
                sent = 0
                while time.perf_counter() < stop:
                    await producer.send_batch(batch)
                    sent += BATCH
                return sent
            count = sum(await asyncio.gather(*(sender() for _ in range(4))))
            return count / (time.perf_counter() - started)
    return asyncio.run(run())


def bench_sync_ratio(seconds: float) -> None:
    rates = {}
    for role in ("ASYNC_MASTER", "SYNC_MASTER"):
        with tempfile.TemporaryDirectory() as tmp:
            pair = Pair(Path(tmp), role)
            try:
                rates[role] = produce_batched(pair, seconds)
            finally:
                pair.stop()
    line("ha.sync_master_ratio", ratio=rates["SYNC_MASTER"] / rates["ASYNC_MASTER"],
         sync_msgs_per_s=rates["SYNC_MASTER"], async_msgs_per_s=rates["ASYNC_MASTER"])


def bench_dledger_ratio(seconds: float) -> None:
    rates = {}
    for kind in ("single", "dledger"):
        with tempfile.TemporaryDirectory() as tmp:
            setup: Single | DLedgerGroup = Single(Path(tmp)) if kind == "single" else DLedgerGroup(Path(tmp))
            try:
                rates[kind] = produce_batched(setup, seconds)
            finally:
                setup.stop()
    line("ha.dledger_ratio", ratio=rates["dledger"] / rates["single"], dledger_msgs_per_s=rates["dledger"],
         single_msgs_per_s=rates["single"])


def bench_failover(kills: int) -> None:
    """kill -9 of the leader to the first acknowledged send begun after it, ``kills`` times (production timings)."""
    with tempfile.TemporaryDirectory() as tmp:
        group = DLedgerGroup(Path(tmp))
        acks: list[tuple[float, float]] = []  # (send began, SEND_OK came)
        stop = threading.Event()
        producer = Producer("failover-bench", ClientConfig(namesrv_addrs=group.namesrv.addr, trace_enabled=False,
                                                           retry_times=0, send_timeout_s=3.0)).start()

        def send() -> None:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    if producer.send(Message("FailoverBench", BODY)).status is SendStatus.SEND_OK:
                        acks.append((began, time.monotonic()))
                except SparkMQError:
                    time.sleep(0.01)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        delays: list[float] = []
        try:
            while not acks:
                time.sleep(0.05)
            for _ in range(kills):
                leader = group.wait_leader()
                seen = len(acks)
                while len(acks) < seen + 10:  # sends flow through this leader first
                    time.sleep(0.01)
                killed_at = time.monotonic()
                os.kill(group.members[leader].proc.pid, signal.SIGKILL)
                group.members[leader].proc.wait()
                deadline = killed_at + 120
                while not (after := [done for began, done in list(acks) if began > killed_at]):
                    if time.monotonic() > deadline:
                        raise RuntimeError("no send was acknowledged within 120 s of a kill")
                    time.sleep(0.01)
                delays.append(min(after) - killed_at)
                group.start(leader)
                deadline = time.monotonic() + 120
                while not group.caught_up(leader):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{leader} did not catch up after its restart")
                    time.sleep(0.1)
        finally:
            stop.set()
            sender.join(10)
            producer.shutdown()
            group.stop()
    line("ha.failover_s", p50_s=statistics.median(delays), p99_s=pct(delays, 0.99), max_s=max(delays),
         min_s=min(delays), kills=len(delays), acked=len(acks))


def bench_replication_lag(seconds: float, rate: int = 50_000) -> None:
    """Batches of 500 every 10 ms (50,000 msgs/s); the slave's max offset polled every ~2 ms."""
    per_batch = 500
    with tempfile.TemporaryDirectory() as tmp:
        pair = Pair(Path(tmp), "ASYNC_MASTER")
        samples: list[tuple[float, int]] = []
        stop = threading.Event()

        def poll() -> None:
            with httpx.Client(base_url=f"http://{pair.slave.addr}", timeout=5) as http:
                while not stop.is_set():
                    offset = http.get("/broker/ha").json()["max_offset"]
                    samples.append((time.perf_counter(), offset))
                    time.sleep(0.002)

        acks: list[tuple[float, int]] = []  # (acknowledged at, log end offset of the batch)

        async def produce() -> None:
            batch = [Message("HaLag", BODY) for _ in range(per_batch)]
            async with AsyncProducer("ha-lag", pair.config()) as producer:
                await producer.send_batch(batch)
                tick = per_batch / rate
                started = time.perf_counter()
                pending: set[asyncio.Task[None]] = set()

                async def one() -> None:
                    results = await producer.send_batch(batch)
                    last = max(int(r.offset_msg_id[-16:], 16) for r in results)
                    acks.append((time.perf_counter(), last + 1))

                n = 0
                while time.perf_counter() - started < seconds:
                    due = started + n * tick
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    task = asyncio.create_task(one())
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    n += 1
                await asyncio.gather(*pending)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            sent_at = time.perf_counter()
            asyncio.run(produce())
            achieved = len(acks) * per_batch / (time.perf_counter() - sent_at)
            time.sleep(1.0)
        finally:
            stop.set()
            poller.join(10)
            pair.stop()
    lags = []
    index = 0
    for acked_at, end in acks:
        while index < len(samples) and samples[index][1] < end:
            index += 1
        if index == len(samples):
            break
        lags.append(max(0.0, samples[index][0] - acked_at) * 1000)
    if not lags:
        line("ha.replication_lag_ms", error="'no batch was seen on the slave'")
        return
    line("ha.replication_lag_ms", p50_ms=statistics.median(lags), p99_ms=pct(lags, 0.99), batches=len(lags),
         msgs_per_s=achieved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs for a CI smoke run")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (without 'ha.')")
    args = parser.parse_args()
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    seconds = 2.0 if args.quick else 8.0
    benches = [("sync_master_ratio", lambda: bench_sync_ratio(seconds)),
               ("replication_lag_ms", lambda: bench_replication_lag(3.0 if args.quick else 15.0)),
               ("dledger_ratio", lambda: bench_dledger_ratio(seconds)),
               ("failover_s", lambda: bench_failover(3 if args.quick else 20))]
    for name, run in benches:
        if not only or name in only:
            try:
                run()
            except Exception as exc:  # one broken benchmark must not hide the others' figures
                line(f"ha.{name}", error=repr(str(exc)[:160]))


if __name__ == "__main__":
    main()
